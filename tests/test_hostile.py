"""A corpus of hostile job files sent to a real server: YAML bombs, deep nesting, huge and
binary files, Unicode, absurd resources, path tricks, shell metacharacters, NUL bytes,
duplicate keys. Each must get a clear 422 naming the field (and line where there is one),
quickly and briefly; nothing may be stored; the server must stay up and keep scheduling.
Some look hostile but are legitimate (a shell pipeline in ``run``, Unicode output): those run."""

from __future__ import annotations

import contextlib
import json
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psutil
import pytest

from conftest import POOL, shared_account, submit, wait_state


def _bomb(levels: int = 9) -> str:
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\nrun: echo\n"


# (case id, YAML text, field the error names ("" for the file as a whole), a word of the message, line or None)
REFUSED = [
    ("billion-laughs", _bomb(), "", "YAML nodes", None),
    ("recursive-alias", "a: &a [*a]\nrun: echo\n", "", "", None),
    ("deep-lists", "run: echo\nx: " + "[" * 5000 + "]" * 5000 + "\n", "", "nests deeper", 2),
    ("deep-maps", "run: echo\nx: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n", "", "nests deeper", 2),
    ("huge-file", "run: echo\n# " + "x" * (2 << 20) + "\n", "", "larger than", None),
    ("binary", bytes(range(256)).decode("latin-1"), "", "invalid YAML", None),
    ("control-chars", "run: echo\x07\x1b[31m\n", "", "invalid YAML", None),
    ("tabs", "run: echo\nresources:\n\tcpus: 1\n", "", "invalid YAML", 3),
    ("python-tag", "run: !!python/object/apply:os.system ['touch /tmp/pwned']\n", "", "constructor", 1),
    ("not-a-mapping", "- run: echo\n", "", "mapping", 1),
    ("empty", "# nothing here\n", "", "no task", None),
    ("duplicate-key", "name: a\nrun: echo\nname: b\n", "", "line 1 and again on line 3", 3),
    ("nested-duplicate", "run: echo\nresources:\n  cpus: 1\n  cpus: 2\n", "", "duplicate key 'cpus'", 4),
    ("non-string-key", "1: x\nrun: echo\n", "[1]", "", 1),
    ("unhashable-key", "? [a, b]\n: c\nrun: echo\n", "", "unhashable", None),
    ("unicode-name", "name: 训练\nrun: echo\n", "name", "letters, digits", 1),
    ("shell-name", "name: 'a;rm -rf ~'\nrun: echo\n", "name", "letters, digits", 1),
    ("path-name", "name: ../../etc/passwd\nrun: echo\n", "name", "letters, digits", 1),
    ("long-name", "name: " + "n" * 10_000 + "\nrun: echo\n", "name", "at most 63", 1),
    ("shell-env-key", "envs: {'A;B': x}\nrun: echo\n", "envs", "environment variable", 1),
    ("nul-run", 'run: "echo \\0 hi"\n', "run", "NUL", 1),
    ("nul-env", 'envs: {A: "x\\0y"}\nrun: echo\n', "envs.A", "NUL", 1),
    ("nul-key", 'envs: {"A\\0": x}\nrun: echo\n', "envs.A\\0", "NUL", 1),
    ("run-boolean", "run: true\n", "run", "quote it", 1),
    ("run-date", "run: 2024-01-01\n", "run", "quote it", 1),
    ("gpus-infinite", "resources: {accelerators: 'H100:1e309'}\nrun: echo\n", "resources.accelerators", "finite", 1),
    ("gpus-nan", "resources: {accelerators: {H100: .nan}}\nrun: echo\n", "resources.accelerators", "finite", 1),
    ("gpus-fraction", "resources: {accelerators: H100:0.5}\nrun: echo\n", "resources.accelerators", "fractional", 1),
    ("gpus-absurd", "resources: {accelerators: H100:1000000}\nrun: echo\n", "resources", "", None),
    ("memory-infinite", "resources: {memory: .inf}\nrun: echo\n", "resources.memory", ">= 0", 1),
    ("cpus-negative", "resources: {cpus: -4}\nrun: echo\n", "resources.cpus", "> 0", 1),
    ("nodes-absurd", "num_nodes: 99999999999999999999999\nrun: echo\n", "num_nodes", "4096", 1),
    ("port-out-of-range", "ports: {http: 99999}\nrun: echo\n", "ports", "1..65535", 1),
    ("grace-negative", "grace_period: -5\nrun: echo\n", "grace_period", ">= 0", 1),
    ("workdir-escape", "workdir: ../../../../../../../nonexistent-dir\nrun: echo\n", "workdir", "not a directory", 1),
    ("many-documents", "execution: parallel\n" + "---\nrun: x\n" * 5000, "name", "needs a name", None),
]

ACCEPTED = [
    ("shell-pipeline", "name: pipe\nrun: |\n  echo \"$HOME\" | tr a-z A-Z > /dev/null; echo 'a;b' && (exit 0)\n", "a;b"),
    ("unicode-output", "name: uni\nenvs: {GREETING: 'héllo 训练 🚀'}\nrun: echo \"$GREETING\"\n", "héllo 训练 🚀"),
    ("quoted-true", "name: quoted\nrun: 'true'\n", ""),
]


def test_hostile_files_get_a_clear_error_and_nothing_is_stored(server, tmp_path) -> None:
    problems = []
    for case, text, field, words, line in REFUSED:
        t0 = time.monotonic()
        response = server.post("/v1/jobs", json={"yaml": text, "source": f"{case}.yaml", "base_dir": str(tmp_path)})
        took = time.monotonic() - t0
        if response.status_code != 422:
            problems.append(f"{case}: {response.status_code} {response.text[:200]}")
            continue
        errors = response.json()["detail"]["errors"]
        first = errors[0]
        if not any(e["field"] == field and words in e["message"] for e in errors):
            problems.append(f"{case}: no error on {field!r} saying {words!r}: {errors[:2]}")
        if line is not None and not any(e["line"] == line for e in errors):
            problems.append(f"{case}: line {line} not named: {first}")
        if len(response.content) > 20_000 or took > 5:
            problems.append(f"{case}: {len(response.content)} bytes in {took:.1f}s")
    assert not problems, "\n".join(problems)
    assert server.get("/v1/jobs", params={"all": True}).json() == []
    assert server.get("/v1/health").json()["status"] == "ok"


@pytest.mark.parametrize("case,text,output", ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_hostile_looking_but_legitimate_files_run(server, case: str, text: str, output: str) -> None:
    job = submit(server, text)
    done = wait_state(server, job["id"], "SUCCEEDED", "FAILED")
    assert done["state"] == "SUCCEEDED", done
    assert output in server.get(f"/v1/jobs/{job['id']}/logs").content.decode()


# Numbers no id column can hold (PostgreSQL's INTEGER is 32 bits, SQLite's driver binds 64),
# in every place a route reads an id or a cursor: each is "no such job" (404) or a 422 naming
# the parameter, never a 500.
HUGE = ("2147483648", "3000000000", "9223372036854775807", "99999999999999999999", "1" + "0" * 5000)
JOB_ROUTES = [("GET", ""), ("GET", "/events"), ("GET", "/endpoints"), ("GET", "/logs"), ("POST", "/cancel"),
              ("POST", "/hold"), ("POST", "/release"), ("POST", "/requeue")]


def test_ids_and_cursors_no_row_could_have_get_404_or_422_naming_the_field(server) -> None:
    admin = {"Authorization": f"Bearer {server.state.local_token}"}
    job = submit(server, "name: odd\nrun: sleep 30\n")
    problems = []

    def expect(response, status: int, words: str, what: str) -> None:
        if response.status_code != status or words not in response.text:
            problems.append(f"{what}: {response.status_code} {response.text[:160]}")

    for number in HUGE:
        for ident in (number, f"{job['id']}_{number}", f"{number}_0", f"{number}_{number}"):
            for method, tail in JOB_ROUTES:
                response = server.request(method, f"/v1/jobs/{ident}{tail}")
                expect(response, 404, "no job", f"{method} /v1/jobs/{ident[:30]}{tail}")
        for method, path, body in (("POST", f"/v1/jobs/{number}/scale", {"task": "odd", "replicas": 1}),
                                   ("POST", f"/v1/jobs/{number}/priority", {"nice": 5})):
            expect(server.request(method, path, json=body), 404, "no job", path[:40])
        for path, name in (("/v1/jobs", "after"), ("/v1/jobs", "array"), ("/v1/audit", "after")):
            response = server.get(path, params={name: number}, headers=admin)
            expect(response, 422, f'"{name}"', f"{path}?{name}={number[:30]}")
        response = server.post(f"/v1/tokens/{number}/revoke", headers=admin)
        expect(response, 422, '"token_id"', f"/v1/tokens/{number[:30]}/revoke")
        response = server.post("/v1/jobs", json={"yaml": f"name: dep\ndependency: afterok:{number}\nrun: echo\n"})
        expect(response, 422, '"dependency"', f"dependency afterok:{number[:30]}")
        response = server.post("/v1/jobs", json={"yaml": "name: dep\nrun: echo\n",
                                                 "scheduling": {"dependency": f"afterany:{job['id']}:{number}"}})
        expect(response, 422, '"dependency"', f"--dependency afterany:{number[:30]}")
    # the largest id a row can have is still an id: no such job, or the empty page above it
    expect(server.get("/v1/jobs/2147483647"), 404, "no job '2147483647'", "the largest id")
    assert server.get("/v1/jobs", params={"after": 2147483647}).json() == []
    # a NUL byte in a token's note (PostgreSQL's text cannot hold one) or a boolean lifetime
    for body, field in (({"user": "x", "note": "a\u0000b"}, "note"), ({"user": "x", "role": "user\u0000"}, "role"),
                        ({"user": "x", "expires": True}, "expires"), ({"user": "x", "expires": False}, "expires")):
        response = server.post("/v1/tokens", json=body, headers=admin)
        expect(response, 422, f'"{field}"', f"token {body}")
    assert [t["user"] for t in server.get("/v1/tokens", headers=admin).json()] == ["alice"]
    assert not problems, "\n".join(problems)
    assert server.get(f"/v1/jobs/{job['id']}").json()["state"] in ("PENDING", "STARTING", "RUNNING")
    server.post(f"/v1/jobs/{job['id']}/cancel")


# --- hostile HTTP against a real server (uvicorn over a socket) ---------------------------------


@pytest.fixture
def real_server(corral_home: Path, tmp_path: Path, db_url: str):
    """Starts a server as the CLI starts it (config.yaml plus ``extra``); what it serves is
    measured from outside."""
    from test_auth import Served

    started = []

    def start(extra: str = "") -> Served:
        (corral_home / "config.yaml").write_text(POOL + extra + shared_account(POOL + extra))
        started.append(Served(corral_home, tmp_path, db_url, []))
        return started[-1]

    yield start
    for served in started:
        served.stop()


def _post(url: str, path: str, headers: dict[str, str], total: int, announce: int | None = None,
          chunk: int = 1 << 16) -> tuple[int, bytes, int]:
    """POST up to ``total`` bytes with ``Transfer-Encoding: chunked`` (a size the server cannot
    know in advance), or plain with ``Content-Length: announce``, stopping as soon as the server
    answers or stops reading: (status, body, bytes sent)."""
    parts = urlsplit(url)
    framing = "Transfer-Encoding: chunked" if announce is None else f"Content-Length: {announce}"
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        head = (f"POST {path} HTTP/1.1\r\nHost: {parts.hostname}\r\nContent-Type: application/json\r\n{framing}\r\n"
                + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n")
        sock.sendall(head.encode())
        piece = (b"%x\r\n" % chunk + b" " * chunk + b"\r\n") if announce is None else b" " * chunk
        sent = 0
        try:
            while sent < total and not select.select([sock], [], [], 0)[0]:
                sock.sendall(piece)
                sent += chunk
            if sent >= total and announce is None:
                sock.sendall(b"0\r\n\r\n")  # the end of a chunked body
        except OSError:  # the server answered and closed: what it said is read below
            pass
        answer = b""
        try:
            while b"\r\n\r\n" not in answer or len(answer.partition(b"\r\n\r\n")[2]) < _length(answer):
                data = sock.recv(1 << 16)
                if not data:
                    break
                answer += data
        except OSError:
            pass
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]) if head else 0, body, sent


def _length(answer: bytes) -> int:
    for line in answer.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def test_a_body_is_bounded_while_it_streams_and_refused_unread_without_a_token(real_server) -> None:
    server = real_server()
    proc = psutil.Process(server.info["pid"])
    token = {"Authorization": f"Bearer {server.token('ann')}"}
    server.admin.submit("name: warm\nrun: 'true'\n")  # the first requests load what every later one uses
    baseline = proc.memory_info().rss
    big = 200 << 20

    # no token, or a bad one: 401 before a byte of the body is read, whatever its size
    for headers, words in (({}, "needs a token"), ({"Authorization": "Bearer corral_bogus"}, "not valid on this server"),
                           ({"Authorization": "Basic YTpi"}, "needs a token")):
        t0 = time.monotonic()
        status, body, sent = _post(server.url, "/v1/jobs", headers, big)
        assert status == 401 and words in body.decode(), (status, body[:200])
        assert sent < 32 << 20 and time.monotonic() - t0 < 5, sent
    assert proc.memory_info().rss - baseline < 32 << 20
    announced = httpx.post(server.url + "/v1/jobs", content=b"{}", headers={"Content-Type": "application/json"})
    assert announced.status_code == 401 and announced.headers["www-authenticate"].startswith("Bearer")

    # a token: the body is read as it comes, and refused with 413 once past 8 MiB
    status, body, sent = _post(server.url, "/v1/jobs", token, big)
    assert status == 413 and "larger than 8 MiB" in body.decode(), (status, body[:200])
    assert 8 << 20 < sent < 48 << 20, sent
    status, body, _ = _post(server.url, "/v1/tokens", token, big)  # any route taking a body
    assert status == 413
    assert proc.memory_info().rss - baseline < 48 << 20, (proc.memory_info().rss - baseline) >> 20
    status, body, sent = _post(server.url, "/v1/jobs", token, big, announce=600 << 20)
    assert status == 413 and "larger than 8 MiB" in body.decode() and sent < 32 << 20, (status, sent)

    # a chunked body within bounds is an ordinary submission
    status, body, _ = _post(server.url, "/v1/jobs", token, 0)
    assert status == 422  # no body at all: FastAPI says the field is missing
    small = json.dumps({"yaml": "name: chunked\nrun: 'true'\n"}).encode()
    with httpx.Client() as client:
        accepted = client.post(server.url + "/v1/jobs", content=iter([small[:10], small[10:]]),
                               headers={**token, "Content-Type": "application/json"})
    assert accepted.status_code == 201, accepted.text
    assert httpx.get(server.url + "/v1/health").json()["status"] == "ok"


TICKER = "name: {name}\nrun: 'while true; do echo tick; sleep 0.2; done'\n"


class Followers:
    """Log streams held open (``follow=true``) as some user, each with its chunks (kept: a
    dropped iterator closes its connection)."""

    def __init__(self, server, user: str):  # noqa: ANN001 - a test_auth.Served
        self.http = httpx.Client(base_url=server.url, timeout=30,
                                 headers={"Authorization": f"Bearer {server.tokens[user]}"})
        self.stack = contextlib.ExitStack()

    def follow(self, job_id: int) -> tuple[httpx.Response, Iterator[bytes]]:
        response = self.stack.enter_context(self.http.stream("GET", f"/v1/jobs/{job_id}/logs", params={"follow": True}))
        return response, response.iter_bytes()

    def close(self) -> None:
        self.stack.close()
        self.http.close()


def _ticking(server, *users: str) -> list[int]:  # noqa: ANN001 - a test_auth.Served
    """A job printing a line every 0.2 s for each user, running."""
    jobs = []
    for user in users:
        client = server.client(user)
        jobs.append(client.submit(TICKER.format(name=f"{user}-tick"))["job"]["id"])
        client.wait(jobs[-1], states=("RUNNING",), timeout=30)
    return jobs


def test_log_streams_are_capped_per_user_with_a_sentence_saying_so(real_server) -> None:
    server = real_server("api: {max_streams_per_user: 3}\n")
    ann_job, bob_job = _ticking(server, "ann", "bob")
    ann, bob = Followers(server, "ann"), Followers(server, "bob")
    try:
        opened = [ann.follow(ann_job) for _ in range(3)]
        assert all(r.status_code == 200 and b"tick" in next(chunks) for r, chunks in opened)
        refused, _ = ann.follow(ann_job)
        assert refused.status_code == 429, refused.status_code
        refused.read()
        assert refused.json()["detail"] == ("ann has 3 log streams or shells open already, as many as one user "
                                            "may (api: {max_streams_per_user: 3} in the server's config.yaml); end "
                                            "one (a `corral logs -f`, a `corral shell`, a dashboard job page) and "
                                            "try again")
        assert ann.http.get(f"/v1/jobs/{ann_job}/logs").status_code == 429  # a whole log is a stream too
        # the cap is per user: bob follows his own job, and the server answers others at once
        other, others = bob.follow(bob_job)
        assert other.status_code == 200 and b"tick" in next(others)
        t0 = time.monotonic()
        assert httpx.get(server.url + "/v1/health").status_code == 200 and time.monotonic() - t0 < 1
        # a stream the client leaves gives its place back
        opened.pop()[0].close()
        deadline = time.monotonic() + 10
        while (again := ann.http.get(f"/v1/jobs/{ann_job}/logs", params={"tail": 1})).status_code == 429:
            assert time.monotonic() < deadline, "the closed stream's place was not given back"
            time.sleep(0.2)
        assert again.status_code == 200 and again.text.startswith("tick\n")
        assert ann.follow(ann_job)[0].status_code == 200
    finally:
        ann.close()
        bob.close()
    for job in (ann_job, bob_job):
        server.admin.cancel(job)


def test_a_log_stream_ends_within_seconds_of_its_tokens_revocation(real_server) -> None:
    server = real_server()
    ann_job, bob_job = _ticking(server, "ann", "bob")
    ann, bob = Followers(server, "ann"), Followers(server, "bob")
    try:
        streams = [ann.follow(ann_job), ann.follow(ann_job)]
        other, others = bob.follow(bob_job)
        assert all(r.status_code == 200 and b"tick" in next(chunks) for r, chunks in [*streams, (other, others)])
        server.admin.revoke_token(server.admin.tokens(revoked=True)[0]["id"])  # ann's, the first made
        t0 = time.monotonic()
        for _, chunks in streams:
            for _ in chunks:  # what was sent, then the end when the server ends the stream
                assert time.monotonic() - t0 < 5, "a stream of a revoked token is still open"
        assert time.monotonic() - t0 < 5
        assert b"tick" in next(others)  # bob's token is live: his stream goes on
        assert ann.http.get("/v1/whoami").status_code == 401
    finally:
        ann.close()
        bob.close()
    for job in (ann_job, bob_job):
        server.admin.cancel(job)


def test_the_api_description_needs_a_token_and_its_browser_pages_are_not_served(real_server) -> None:
    server = real_server()
    for path in ("/openapi.json", "/docs", "/redoc", "/docs/oauth2-redirect"):
        anonymous = httpx.get(server.url + path)
        assert anonymous.status_code in (401, 404) and "openapi" not in anonymous.text.lower(), path
    assert httpx.get(server.url + "/openapi.json").status_code == 401
    described = httpx.get(server.url + "/openapi.json", headers={"Authorization": f"Bearer {server.token('vic', 'viewer')}"})
    assert described.status_code == 200 and "/v1/jobs/{job}/logs" in described.json()["paths"]
    assert "/openapi.json" not in described.json()["paths"]
