"""Identities, tokens, roles and the audit trail over real HTTP to a real server (started the
way the CLI starts it): what each role may and may not do, with the sentence a refusal says;
tokens stored only as digests, expiring on the server's clock, refused once revoked; a header
naming someone else refused; a server on every address refusing anonymous requests; TLS with a
certificate made here; the CLI's token, login, whoami and audit commands end to end."""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from conftest import POOL, kill_leftovers

from corral.client import Client, Forbidden, Unauthorized, Unavailable
from corral.credentials import read_local_token

ON_POSTGRESQL = True  # what the store keeps: checked on PostgreSQL too (conftest)

SITE = POOL + """
accounts:
  - {name: ml, users: [ann, bob]}
  - {name: physics, users: [pat]}
operators: [olga]
"""

SLEEPER = "name: {name}\nrun: sleep 60\n"


@pytest.fixture
def site_config() -> str:
    return SITE


def _env(home: Path, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(CORRAL_HOME=str(home), XDG_CONFIG_HOME=str(tmp_path / "xdg"))
    return env


class Served:
    """A server started with ``corral server start [options]``, its owner's admin client, and
    one token (and client) per user asked for."""

    def __init__(self, home: Path, tmp_path: Path, db_url: str, options: list[str]):
        self.home, self.env, self.db_url = home, _env(home, tmp_path), db_url
        self.env["CORRAL_DB_URL"] = db_url
        self.cli([*["server", "start"], *options], check=True)
        self.info = json.loads((home / "server.json").read_text())
        self.url = self.info["url"]
        self.admin = Client(self.url, read_local_token(home), pinned_cert=self.info.get("tls_cert"))
        self.tokens: dict[str, str] = {}
        self.clients: list[Client] = [self.admin]

    def cli(self, args: list[str], check: bool = False, input: str | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "corral.cli.main", *args], env=env or self.env,
                              capture_output=True, text=True, timeout=120, input=input)
        if check:
            assert done.returncode == 0, done.stdout + done.stderr
        return done

    def token(self, user: str, role: str | None = None, **extra) -> str:
        made = self.admin.create_token(user, role, **extra)
        self.tokens[user] = made["token"]
        return made["token"]

    def client(self, user: str, role: str | None = None) -> Client:
        client = Client(self.url, self.token(user, role), pinned_cert=self.info.get("tls_cert"))
        self.clients.append(client)
        return client

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        self.cli(["server", "stop"])
        kill_leftovers(self.home)


@pytest.fixture
def served(corral_home: Path, tmp_path: Path, db_url: str):
    started: list[Served] = []

    def start(*options: str) -> Served:
        server = Served(corral_home, tmp_path, db_url, list(options))
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _refusal(call, status: int = 403) -> str:
    with pytest.raises((Forbidden, Unauthorized)) as refused:
        call()
    assert refused.value.status == status, refused.value.message
    return refused.value.message


def test_each_role_may_do_its_part_and_is_told_which_role_the_rest_needs(served) -> None:
    server = served()
    ann, bob, olga, vic = (server.client("ann"), server.client("bob"), server.client("olga"),
                           server.client("vic", "viewer"))
    assert server.admin.whoami()["role"] == "admin" and server.admin.whoami()["source"] == "local"
    assert ann.whoami() == {"user": "ann", "role": "user", "source": "127.0.0.1", "token": 1}
    assert olga.whoami()["role"] == "operator"  # config.yaml's operators:
    assert vic.whoami()["role"] == "viewer"

    # a user: submits, reads the queue, nodes, fair share and priority; acts on their own jobs only
    anns = ann.submit(SLEEPER.format(name="anns"))["job"]
    bobs = bob.submit(SLEEPER.format(name="bobs"), scheduling={"hold": True})["job"]
    assert {j["id"] for j in ann.jobs()} == {anns["id"], bobs["id"]}
    assert ann.nodes() and isinstance(ann.share(), list) and isinstance(ann.priority(), list)
    assert ann.job(bobs["id"])["user"] == "bob" and ann.endpoints(bobs["id"])["job_id"] == bobs["id"]
    for action, doing in (("cancel", "cancelling"), ("hold", "holding"), ("release", "releasing"),
                          ("requeue", "requeueing")):
        message = _refusal(lambda: getattr(ann, action)(bobs["id"]))
        assert message == (f"{doing} another user's job (job {bobs['id']}, bob's) needs the operator role "
                           "(you are ann, a user)")
    assert "scaling another user's job" in _refusal(lambda: ann.scale(bobs["id"], "bobs", 2))
    assert _refusal(lambda: list(ann.logs(bobs["id"]))) == ("reading another user's logs needs the operator "
                                                            "role (you are ann, a user)")
    assert all(e["message"] is None for e in ann.events(bobs["id"]))  # transitions and causes, no details
    assert any(e["message"] for e in bob.events(bobs["id"]))  # its owner sees them
    assert _refusal(lambda: ann.submit("name: vip\nrun: 'true'\n", scheduling={"priority": 10})) == (
        "setting a job's priority needs the operator role (you are ann, a user)")
    assert "account 'physics' does not list ann" in _refusal(
        lambda: ann.submit("name: x\nrun: 'true'\n", scheduling={"account": "physics"}))
    assert ann.submit("name: charged\nrun: 'true'\n", scheduling={"account": "ml"})["job"]["account"] == "ml"
    assert _refusal(ann.tokens) == "listing tokens needs the admin role (you are ann, a user)"
    assert _refusal(lambda: ann.create_token("ann", "admin")) == "creating tokens needs the admin role (you are ann, a user)"
    assert _refusal(ann.audit) == "reading the audit trail needs the admin role (you are ann, a user)"
    assert ann.cancel(anns["id"])["cancelled"] is True

    # a viewer reads what a user reads and changes nothing
    assert {j["id"] for j in vic.jobs(all=True)} >= {anns["id"], bobs["id"]} and vic.nodes()
    assert _refusal(lambda: vic.submit("name: v\nrun: 'true'\n")) == ("submitting a job needs the user role "
                                                                      "(you are vic, a viewer)")
    assert _refusal(lambda: vic.cancel(bobs["id"])).startswith("cancelling another user's job")
    assert "reading another user's logs" in _refusal(lambda: list(vic.logs(bobs["id"])))

    # an operator acts on anyone's job, reads their logs, but manages no tokens
    assert olga.hold(bobs["id"])["hold"] == "admin"  # held by an operator: JobHeldAdmin
    assert _refusal(lambda: bob.release(bobs["id"])) == (
        f"releasing job {bobs['id']}, which an operator held (JobHeldAdmin), needs the operator role "
        "(you are bob, a user)")
    assert list(olga.logs(bobs["id"])) == []
    assert olga.submit("name: vip\nrun: 'true'\n", scheduling={"priority": 10})["job"]["name"] == "vip"
    assert olga.cancel(bobs["id"])["cancelled"] is True
    assert "needs the admin role (you are olga, an operator)" in _refusal(lambda: olga.revoke_token(1))

    # the admin (the server's owner, through the local token) manages tokens and reads the audit
    listed = {t["user"]: t for t in server.admin.tokens()}
    assert listed["vic"]["role"] == "viewer" and listed["olga"]["role"] == "operator" and listed["olga"]["role_from_config"]
    assert listed["ann"]["last_used_at"] is not None and listed["bob"]["expires_at"] is None
    assert all(server.tokens[u] not in json.dumps(listed) for u in server.tokens)


def test_the_audit_trail_says_who_did_what_from_where_and_pages(served) -> None:
    server = served()
    ann, olga = server.client("ann"), server.client("olga")
    job = ann.submit(SLEEPER.format(name="audited"), scheduling={"hold": True})["job"]
    olga.hold(job["id"])
    _refusal(lambda: ann.release(job["id"]))
    olga.release(job["id"])
    ann.cancel(job["id"])
    vip = olga.submit("name: vip\nrun: 'true'\n", scheduling={"priority": 5})["job"]
    token = server.admin.create_token("tmp", "viewer", expires="1h")["info"]["id"]
    server.admin.revoke_token(token)
    trail = server.admin.audit()
    seen = [(e["user"], e["role"], e["action"], e["target"], e["outcome"]) for e in trail]
    me = server.admin.whoami()["user"]
    assert seen[:2] == [(me, "admin", "token_create", "token 1", "ok"), (me, "admin", "token_create", "token 2", "ok")]
    assert seen[2:] == [
        ("ann", "user", "submit", f"job {job['id']}", "ok"),
        ("olga", "operator", "hold", f"job {job['id']}", "ok"),
        ("ann", "user", "release", f"job {job['id']}", "refused"),
        ("olga", "operator", "release", f"job {job['id']}", "ok"),
        ("ann", "user", "cancel", f"job {job['id']}", "ok"),
        ("olga", "operator", "submit", f"job {vip['id']}", "ok"),
        ("olga", "operator", "priority", f"job {vip['id']}", "ok"),
        (me, "admin", "token_create", f"token {token}", "ok"),
        (me, "admin", "token_revoke", f"token {token}", "ok")]
    assert {e["source"] for e in trail if e["user"] == me} == {"local"}
    assert {e["source"] for e in trail if e["user"] != me} == {"127.0.0.1"}
    assert trail[4]["detail"] == "held by an operator"
    # filters and pages, like /v1/jobs
    assert [e["action"] for e in server.admin.audit(user="olga")] == ["hold", "release", "submit", "priority"]
    assert [e["user"] for e in server.admin.audit(action="cancel")] == ["ann"]
    assert server.admin.audit(since="2999-01-01") == []
    first = httpx.get(server.url + "/v1/audit", params={"limit": 4, "after": 0}, headers=_bearer(server.admin))
    assert [e["id"] for e in first.json()] == [1, 2, 3, 4] and first.headers["x-next-after"] == "4"
    assert [e["id"] for e in server.admin.audit(limit=4, after=4)] == [5, 6, 7, 8]
    bad = httpx.get(server.url + "/v1/audit", params={"action": "launch"}, headers=_bearer(server.admin))
    assert bad.status_code == 422 and "not an audited action" in bad.text


def _bearer(client: Client) -> dict[str, str]:
    return {"Authorization": client.headers["Authorization"]}


def test_tokens_are_stored_as_digests_refused_once_revoked_and_a_header_cannot_change_who_acts(served) -> None:
    server = served()
    ann, bob = server.client("ann"), server.client("bob")
    bobs = bob.submit(SLEEPER.format(name="bobs"))["job"]
    # the database holds digests only: no column (and on SQLite no byte of the file or its journal) has a token
    engine = create_engine(server.db_url)
    with engine.connect() as db:
        rows = [tuple(r) for r in db.execute(text('SELECT "user", digest FROM api_tokens ORDER BY id'))]
        dump = json.dumps([list(r) for r in db.execute(text("SELECT * FROM api_tokens"))])
    engine.dispose()
    assert rows == [(u, hashlib.sha256(t.encode()).hexdigest()) for u, t in server.tokens.items()]
    assert not any(t in dump for t in server.tokens.values())
    if server.db_url.startswith("sqlite"):
        path = Path(server.db_url.removeprefix("sqlite:///"))
        raw = b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*") if p.is_file())
        assert not any(t.encode() in raw for t in server.tokens.values())
        assert read_local_token(server.home).encode() not in raw
    assert oct((server.home / "local.token").stat().st_mode & 0o777) == "0o600"

    # a header naming someone else is refused, not acted on
    spoofed = httpx.post(f"{server.url}/v1/jobs/{bobs['id']}/cancel", headers={**_bearer(ann), "X-Corral-User": "bob"})
    assert spoofed.status_code == 403 and "the acting user comes from the token alone" in spoofed.json()["detail"]
    anonymous = httpx.post(f"{server.url}/v1/jobs/{bobs['id']}/cancel", headers={"X-Corral-User": "bob"})
    assert anonymous.status_code == 401 and "needs a token" in anonymous.json()["detail"]
    assert anonymous.headers["www-authenticate"].startswith("Bearer")
    assert bob.job(bobs["id"])["cancel_requested"] is False
    same = httpx.get(f"{server.url}/v1/whoami", headers={**_bearer(ann), "X-Corral-User": "ann"})
    assert same.json()["user"] == "ann"  # naming oneself changes nothing
    garbage = httpx.get(f"{server.url}/v1/jobs", headers={"Authorization": "Bearer corral_not-a-token"})
    assert garbage.status_code == 401 and "not valid on this server" in garbage.json()["detail"]
    assert httpx.get(f"{server.url}/v1/health").status_code == 200  # the one route open to all

    # revoked: refused from the next request on; revoking again says so
    ann_id = ann.whoami()["token"]
    assert server.admin.revoke_token(ann_id)["revoked_at"] is not None
    assert _refusal(ann.whoami, 401) == f"token {ann_id} (of ann) was revoked; ask an admin for a new one"
    assert server.admin.revoke_token(ann_id)["revoked_at"] is not None
    assert [t["id"] for t in server.admin.tokens()] == [bob.whoami()["token"]]
    assert {t["id"] for t in server.admin.tokens(revoked=True)} == {ann_id, bob.whoami()["token"]}
    for field, value, words in (("role", "root", "not a role"), ("expires", "soon", "duration"),
                                ("expires", 0, "more than 0 seconds"), ("user", "a b", "pattern")):
        bad = httpx.post(server.url + "/v1/tokens", json={"user": "x", field: value}, headers=_bearer(server.admin))
        assert bad.status_code == 422 and field in bad.text and words in bad.text, bad.text
    assert httpx.post(server.url + "/v1/tokens/999/revoke", headers=_bearer(server.admin)).status_code == 404
    bob.cancel(bobs["id"])


def test_a_token_expires_on_the_servers_clock(corral_home: Path, db_url: str) -> None:
    from fastapi.testclient import TestClient

    from corral.api.app import create_app
    from corral.server import build_state
    from corral.settings import Settings

    now = [1_800_000_000.0]
    state = build_state(Settings(home=corral_home, db_url=db_url), clock=lambda: now[0])
    with TestClient(create_app(state, manage_loop=False)) as client:
        admin = {"Authorization": f"Bearer {state.local_token}"}
        made = client.post("/v1/tokens", json={"user": "ann", "expires": "30d"}, headers=admin).json()
        assert made["info"]["expires_at"] == "2027-02-14T08:00:00Z"
        ann = {"Authorization": f"Bearer {made['token']}"}
        now[0] += 30 * 86400 - 1
        assert client.get("/v1/whoami", headers=ann).json()["user"] == "ann"
        now[0] += 1
        expired = client.get("/v1/whoami", headers=ann)
        assert expired.status_code == 401 and expired.json()["detail"] == (
            f"token {made['info']['id']} (of ann) expired; ask an admin for a new one")
        assert client.get("/v1/whoami", headers=admin).json()["role"] == "admin"  # the local token never expires


def _outside_address() -> str | None:
    """An address of this machine other than loopback, if it has one."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if ipaddress.ip_address(address).is_loopback else address


def test_a_server_on_every_address_refuses_anonymous_requests(served) -> None:
    server = served("--host", "0.0.0.0")
    port = int(server.url.rsplit(":", 1)[1])
    assert server.url.startswith("http://127.0.0.1:")  # the owner's commands reach it on loopback
    token = server.token("ann")
    for host in filter(None, ["127.0.0.1", _outside_address()]):
        anonymous = httpx.get(f"http://{host}:{port}/v1/jobs")
        assert anonymous.status_code == 401 and "needs a token" in anonymous.json()["detail"], host
        assert httpx.get(f"http://{host}:{port}/v1/whoami", headers={"Authorization": f"Bearer {token}"}).json()[
            "user"] == "ann"
    assert "tokens travel in clear" in (server.home / "server.log").read_text()
    mine = server.cli(["whoami"], check=True).stdout
    assert "(admin)" in mine and "local token" in mine


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "corral test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "server.crt", tmp_path / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_tls_round_trip_with_a_certificate_made_here(served, tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    server = served("--tls-cert", str(cert), "--tls-key", str(key))
    assert server.url.startswith("https://127.0.0.1:")
    assert "(admin)" in server.cli(["whoami"], check=True).stdout  # the owner's CLI pins the server's certificate
    token = server.token("ann")
    with Client(server.url, token, ca_bundle=str(cert)) as ann:
        assert ann.whoami()["user"] == "ann"
        job = ann.submit("name: tls\nrun: echo over tls\n")["job"]
        assert ann.wait(job["id"], timeout=30)["state"] == "SUCCEEDED"
        assert b"".join(ann.logs(job["id"])).decode().strip() == "over tls"
    with pytest.raises(Unavailable) as untrusted, Client(server.url, token) as plain:
        assert plain.ca_bundle is None and plain.pinned_cert is None  # the system's CAs only
        plain.whoami()
    assert "CERTIFICATE_VERIFY_FAILED" in untrusted.value.message
    env = dict(server.env, CORRAL_SERVER=server.url, CORRAL_CA_BUNDLE=str(cert), CORRAL_TOKEN=token)
    assert server.cli(["whoami"], env=env, check=True).stdout.startswith("ann (user) on https://127.0.0.1:")


def test_the_cli_creates_lists_and_revokes_tokens_logs_in_and_out_and_reads_the_audit(served, tmp_path: Path) -> None:
    server = served()
    made = server.cli(["token", "create", "ann", "--expires", "30d", "--note", "laptop"], check=True)
    token = made.stdout.strip()
    assert token.startswith("corral_") and len(token) > 40 and "\n" not in token  # stdout: the token alone
    assert "shown this once" in made.stderr and "role user" in made.stderr
    viewer = server.cli(["token", "create", "vic", "--role", "viewer"], check=True).stdout.strip()
    listed = server.cli(["token", "list"], check=True).stdout
    assert token not in listed and viewer not in listed
    rows = [line.split("\t") for line in listed.strip().splitlines()]
    assert rows[0][:6] == ["ID", "USER", "ROLE", "CREATED", "EXPIRES", "LAST USED"]
    assert [r[:3] for r in rows[1:]] == [["1", "ann", "user (config)"], ["2", "vic", "viewer"]]
    assert rows[2][4] == "never" and rows[1][4] != "never"
    bad = server.cli(["token", "create", "ann", "--expires", "soon"])
    assert bad.returncode == 2 and "expires" in bad.stderr

    # login: checks the token, saves it 0600; later commands and corral.Client() act as ann
    refused = server.cli(["login", server.url, "--token", "corral_wrong"])
    assert refused.returncode == 1 and "not valid on this server" in refused.stderr
    assert not (tmp_path / "xdg" / "corral" / "credentials.json").exists()
    logged = server.cli(["login", server.url], input=token + "\n", check=True)  # read from stdin, not argv
    assert "as ann (user)" in logged.stdout
    saved = tmp_path / "xdg" / "corral" / "credentials.json"
    assert oct(saved.stat().st_mode & 0o777) == "0o600" and token in saved.read_text()
    whoami = server.cli(["whoami"], check=True)
    assert whoami.stdout.startswith(f"ann (user) on {server.url}, token 1")
    # CORRAL_HOME is set too (as here): the login wins, and the command says so
    assert f"using {server.url} (your `corral login`), not the server of CORRAL_HOME=" in whoami.stderr
    job = tmp_path / "job.yaml"
    job.write_text("name: mine\nrun: echo from ann\n")
    launched = server.cli(["launch", str(job)], check=True)
    assert "mine-0 | from ann" in launched.stdout or "from ann" in launched.stdout
    queue = server.cli(["queue", "--all", "--json"], check=True)
    assert [j["user"] for j in json.loads(queue.stdout)] == ["ann"]
    sdk = subprocess.run([sys.executable, "-c", "import corral; print(corral.Client().whoami()['user'])"],
                         env=server.env, capture_output=True, text=True, timeout=60)
    assert sdk.stdout.strip() == "ann", sdk.stderr
    denied = server.cli(["token", "list"])
    assert denied.returncode == 1 and "listing tokens needs the admin role (you are ann, a user)" in denied.stderr
    assert "Forgot the token for" in server.cli(["logout"], check=True).stdout
    assert "(admin)" in server.cli(["whoami"], check=True).stdout  # back to the owner's local token
    assert server.cli(["logout"]).returncode == 1

    # revoke, and the audit trail of it all
    assert "Token 2 of vic revoked" in server.cli(["token", "revoke", "2"], check=True).stdout
    assert server.cli(["token", "revoke", "99"]).returncode == 2
    env = dict(server.env, CORRAL_SERVER=server.url, CORRAL_TOKEN=viewer)
    gone = server.cli(["queue"], env=env)
    assert gone.returncode == 1 and "was revoked" in gone.stderr
    trail = server.cli(["audit"], check=True).stdout.strip().splitlines()
    assert trail[0].split("\t")[:7] == ["TIME", "USER", "ROLE", "SOURCE", "ACTION", "TARGET", "OUTCOME"]
    actions = [(r.split("\t")[1], r.split("\t")[4], r.split("\t")[5]) for r in trail[1:]]
    me = server.admin.whoami()["user"]
    assert actions == [(me, "token_create", "token 1"), (me, "token_create", "token 2"), ("ann", "submit", "job 1"),
                       (me, "token_revoke", "token 2")]
    only = json.loads(server.cli(["audit", "-u", "ann", "-a", "submit", "--json"], check=True).stdout)
    assert [(e["user"], e["action"], e["source"]) for e in only] == [("ann", "submit", "127.0.0.1")]


def test_secrets_stay_out_of_answers_events_and_the_server_log(served, tmp_path: Path) -> None:
    server = served()
    secret = "s3cr3t-" + hashlib.sha256(str(time.time()).encode()).hexdigest()[:12]
    seen = tmp_path / "seen"
    text = (f"name: keeper\nsecrets: {{API_KEY: {secret}}}\nenvs: {{PLAIN: x}}\n"
            f"run: test \"$API_KEY\" = {secret} && echo ok > {seen}; echo key has ${{#API_KEY}} chars\n")
    job = server.admin.submit(text)["job"]
    assert server.admin.wait(job["id"], timeout=30)["state"] == "SUCCEEDED"
    assert seen.read_text().strip() == "ok"  # the replica has it
    flags = server.admin.submit("name: flagged\nsecrets: {TOKEN: null}\nrun: 'true'\n", env={"TOKEN": secret})["job"]
    server.admin.wait(flags["id"], timeout=30)
    bad = httpx.post(server.url + "/v1/jobs", headers=_bearer(server.admin),
                     json={"yaml": f"name: bad\nsecrets: {{API_KEY: {secret}}}\nrun: 'true'\nnum_nodes: -1\n"})
    assert bad.status_code == 422
    listed = httpx.post(server.url + "/v1/jobs", headers=_bearer(server.admin),
                        json={"yaml": f"name: bad\nsecrets: {{API_KEY: [{secret}]}}\nrun: 'true'\n"})
    assert listed.status_code == 422 and "environment value" in listed.text
    answers = [bad.text, listed.text, json.dumps([server.admin.job(j["id"]) for j in (job, flags)]),
               json.dumps(server.admin.jobs(all=True)), json.dumps(server.admin.events(job["id"])),
               json.dumps(server.admin.endpoints(job["id"])), json.dumps(server.admin.audit()),
               server.cli(["status", str(job["id"]), "--json"], check=True).stdout,
               server.cli(["events", str(flags["id"])], check=True).stdout,
               server.cli(["queue", "--all"], check=True).stdout,
               httpx.get(server.url + "/metrics", headers=_bearer(server.admin)).text]
    for answer in answers:
        assert secret not in answer
    server.cli(["server", "stop"], check=True)
    assert secret not in (server.home / "server.log").read_text()


def test_an_operator_changes_a_pending_jobs_priority_and_an_owner_only_lowers_their_own(served) -> None:
    server = served()
    ann, bob, olga = server.client("ann"), server.client("bob"), server.client("olga")
    blocker = ann.submit("name: blocker\nnum_nodes: 2\nresources: {accelerators: H100:4}\nrun: sleep 60\n")["job"]
    ann.wait(blocker["id"], states=("RUNNING",), timeout=30)
    gpu = "resources: {accelerators: H100:4}\nrun: 'true'\n"
    first, second = (ann.submit(f"name: first\n{gpu}")["job"], bob.submit(f"name: second\n{gpu}")["job"])

    assert _refusal(lambda: bob.set_priority(second["id"], priority=10**6)) == (
        "setting a job's priority needs the operator role (you are bob, a user)")
    assert "changing the priority of another user's job" in _refusal(lambda: bob.set_priority(first["id"], nice=5))
    assert "a negative nice (-5, raising the job above others) needs the operator role" in _refusal(
        lambda: bob.set_priority(second["id"], nice=-5))
    assert ann.set_priority(first["id"], nice=100)["nice"] == 100  # an owner may lower their own job
    olga.set_priority(second["id"], priority=10**6)

    def ranked() -> list[tuple[int, float, int]]:
        return [(p["id"], p["priority"], p["nice"]) for p in ann.priority()]

    deadline = time.monotonic() + 15  # the view shows the last scheduling pass's scores
    while ranked()[:1] != [(second["id"], 10.0**6, 0)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ranked()[0] == (second["id"], 10.0**6, 0) and ranked()[1][::2] == (first["id"], 100)
    assert ("job", "reprioritized") in {(e["subject"], e["cause"]) for e in bob.events(second["id"])}
    # the CLI, as the owner (admin): back to the formula; a running job's priority is not pending's to change
    changed = server.cli(["update", str(second["id"]), "--priority", "formula", "--nice", "0"], check=True)
    assert f"Job {second['id']}: priority from the formula, nice 0" in changed.stdout
    late = server.cli(["update", str(blocker["id"]), "--nice", "1"])
    assert late.returncode == 1 and "only a pending job's priority can change" in late.stderr
    assert server.cli(["update", str(first["id"])]).returncode == 2
    trail = [(e["user"], e["outcome"]) for e in server.admin.audit(action="priority")]
    me = server.admin.whoami()["user"]
    assert trail == [("bob", "refused"), ("bob", "refused"), ("bob", "refused"), ("ann", "ok"), ("olga", "ok"),
                     (me, "ok"), (me, "failed")]
    for job in (blocker, first, second):
        server.admin.cancel(job["id"])
