"""A corpus of hostile job files sent to a real server: YAML bombs, deep nesting, huge and
binary files, Unicode, absurd resources, path tricks, shell metacharacters, NUL bytes,
duplicate keys. Each must get a clear 422 naming the field (and line where there is one),
quickly and briefly; nothing may be stored; the server must stay up and keep scheduling.
Some look hostile but are legitimate (a shell pipeline in ``run``, Unicode output): those run."""

from __future__ import annotations

import time

import pytest

from test_api import submit, wait_state


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
