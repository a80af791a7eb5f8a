"""The shell route's own promises, on an in-process server with the local executor and real
processes (the world a process enters on every infra is ``tests/conformance/test_shell.py``'s):

* refusals before anything starts: no token (401), a start that is not valid (422, naming the
  field), another user's job (403, audited), a job that is not running (409);
* a replica in a container: the process runs inside it, with a terminal when asked;
* the process ends with the connection, with the replica, and when the caller's token is
  revoked: nothing started for a shell outlives what it belongs to."""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import contextmanager

import psutil
import pytest

from conftest import POOL, bearer, submit, wait_for, wait_state

SLEEPER = "name: sleeper\nrun: exec sleep 300\n"


@contextmanager
def _open(server, job: int, start: dict, headers: dict | None = None, replica: str | None = None):
    query = f"?replica={replica}" if replica else ""
    with server.websocket_connect(f"/v1/jobs/{job}/shell{query}", headers=dict(headers or {})) as ws:
        ws.send_text(json.dumps(start))
        yield ws


def _said(ws) -> dict:
    message = ws.receive()
    assert message.get("text") is not None, message
    return json.loads(message["text"])


def _run(ws) -> tuple[int, bytes, bytes]:
    out, err = b"", b""
    while True:
        message = ws.receive()
        if message.get("bytes") is not None:
            kind, data = message["bytes"][0], message["bytes"][1:]
            if kind == 1:
                out += data
            else:
                err += data
            continue
        said = json.loads(message["text"])
        if "exit" in said:
            return said["exit"], out, err
        assert "started" in said, said


def _running(server) -> int:
    job = submit(server, SLEEPER)["id"]
    wait_state(server, job, "RUNNING")
    return job


def _processes(marker: str) -> list[psutil.Process]:
    """The processes whose command is ``marker`` or starts with it (a sleep itself, not a
    program on the way to it whose arguments name it)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if " ".join(proc.info["cmdline"] or ()).startswith(marker) and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def test_refusals_say_why_and_start_nothing(server) -> None:
    job = _running(server)
    anonymous = server.websocket_connect(f"/v1/jobs/{job}/shell", headers={"Authorization": ""})
    with anonymous as ws:
        assert _said(ws) == {"error": "not authenticated: send Authorization: Bearer TOKEN", "status": 401}
    with _open(server, job, {"command": ["true"], "rows": 0}) as ws:
        said = _said(ws)
        assert said["status"] == 422 and said["error"].startswith("the first message is not a valid start: rows:")
    with _open(server, job, {"command": ["true"], "shell": True}) as ws:
        assert "shell: Extra inputs are not permitted" in _said(ws)["error"]
    with server.websocket_connect("/v1/jobs/1%00/shell") as ws:
        ws.send_text(json.dumps({"command": ["true"]}))
        assert _said(ws) == {"error": "the job and replica must not hold a NUL byte", "status": 422}
    with _open(server, job, {"command": ["true"]}, replica="sleeper-3") as ws:
        assert _said(ws) == {"error": f"job {job} has no replica 'sleeper-3'; it has sleeper-0", "status": 404}
    with _open(server, job, {"command": ["id"]}, headers=bearer(server.state, "bob")) as ws:
        assert _said(ws) == {"error": f"exec into another user's job (job {job}, alice's) needs the operator role "
                                      "(you are bob, a user)", "status": 403}
    entries = [(e["user"], e["action"], e["outcome"]) for e in
               server.get("/v1/audit", params={"action": "exec"}, headers=bearer(server.state, "root", "admin")).json()]
    assert entries == [("bob", "exec", "refused")], entries
    held = submit(server, "name: held\nrun: sleep 1\n", scheduling={"hold": True})["id"]
    with _open(server, held, {"command": ["true"]}) as ws:
        assert _said(ws) == {"error": f"job {held} is PENDING; a process can be started only in a running job's "
                                      "replicas", "status": 409}


def test_an_operator_may_and_the_owner_s_entry_names_the_command(server) -> None:
    job = _running(server)
    with _open(server, job, {"command": ["sh", "-c", "echo $CORRAL_JOB_ID; exit 5"]},
               headers=bearer(server.state, "olga", "operator")) as ws:
        assert _run(ws) == (5, f"{job}\n".encode(), b"")
    with _open(server, job, {"command": ["sh", "-c", "read x; echo got-$x"]}) as ws:
        assert _said(ws) == {"started": {"job": job, "replica": "sleeper-0"}}
        ws.send_bytes(b"it\n")
        ws.send_text(json.dumps({"eof": True}))
        assert _run(ws) == (0, b"got-it\n", b"")
    entries = [(e["user"], e["action"], e["target"], e["outcome"], e["detail"]) for e in
               server.get("/v1/audit", params={"action": "exec"}, headers=bearer(server.state, "root", "admin")).json()]
    assert entries == [("olga", "exec", f"job {job}", "ok", "sleeper-0: sh -c 'echo $CORRAL_JOB_ID; exit 5'"),
                       ("alice", "exec", f"job {job}", "ok", "sleeper-0: sh -c 'read x; echo got-$x'")], entries


def test_the_process_ends_with_the_connection_the_replica_and_the_token(server) -> None:
    job = _running(server)
    # the connection: the client leaves, the process (and what it started) is ended
    connection = _open(server, job, {"command": ["sh", "-c", "sleep 3011 & exec sleep 3012"]})
    ws = connection.__enter__()
    assert "started" in _said(ws)
    wait_for(lambda: len(_processes("sleep 301")) == 2, timeout=10)
    connection.__exit__(None, None, None)
    wait_for(lambda: not _processes("sleep 301"), timeout=10)
    # the token: revoked while its shell runs, the shell ends and says why
    record, token = server.state.tokens.create("alice", None, None, None, "test")
    headers = {"Authorization": f"Bearer {token}"}
    with _open(server, job, {"command": ["sleep", "3033"], "tty": True}, headers=headers) as ws:
        assert "started" in _said(ws)
        wait_for(lambda: _processes("sleep 3033"), timeout=10)
        server.post(f"/v1/tokens/{record.id}/revoke", headers=bearer(server.state, "root", "admin"))
        said = _said(ws)
        assert said == {"error": "the token this connection was opened with was revoked or expired", "status": 401}
    wait_for(lambda: not _processes("sleep 3033"), timeout=10)
    # the replica: cancelled while a shell runs in it, the shell ends with it
    with _open(server, job, {"command": ["sleep", "3044"]}) as ws:
        assert "started" in _said(ws)
        wait_for(lambda: _processes("sleep 3044"), timeout=10)
        started = time.monotonic()
        server.post(f"/v1/jobs/{job}/cancel")
        code, out, err = _run(ws)
        assert code in (137, 143) and time.monotonic() - started < 20, (code, out, err)
    assert not _processes("sleep 3044")


def test_the_process_ends_with_the_connection_when_the_handler_is_cancelled(server, monkeypatch) -> None:
    """A server may cancel the route's handler rather than let it return (uvicorn past its
    graceful shutdown; Starlette's test client right after it has said it leaves): the process
    is ended all the same. The handler here sees the client's leaving late, as on a busy event
    loop, so that it is cancelled before it has returned."""
    from starlette.websockets import WebSocket

    receive = WebSocket.receive

    async def late(self):
        message = await receive(self)
        if message["type"] == "websocket.disconnect":
            await asyncio.sleep(1)
        return message

    monkeypatch.setattr(WebSocket, "receive", late)
    job = _running(server)
    with _open(server, job, {"command": ["sh", "-c", "sleep 3021 & exec sleep 3022"]}) as ws:
        assert "started" in _said(ws)
        wait_for(lambda: len(_processes("sleep 302")) == 2, timeout=10)
    wait_for(lambda: not _processes("sleep 302"), timeout=10)


@pytest.fixture
def site_config() -> str:
    from container_lab import SITE

    return POOL + SITE


def test_a_replica_in_a_container_is_entered_by_its_engine(server) -> None:
    from container_lab import IMAGE, MARKER, ensure_image

    ensure_image()
    job = submit(server, f"name: boxed\nresources: {{image_id: docker:{IMAGE}}}\nrun: exec sleep 300\n")["id"]
    wait_state(server, job, "RUNNING", timeout=60)
    with _open(server, job, {"command": ["sh", "-c", f"cat {MARKER} >/dev/null && echo inside; hostname; pwd; "
                                                     "echo $CORRAL_REPLICA; exit 6"]}) as ws:
        code, out, err = _run(ws)
    lines = out.decode().split() + [""] * 4
    assert (code, lines[0], lines[1], lines[3]) == (6, "inside", "boxed-0.boxed", "0"), (code, out, err)
    with _open(server, job, {"command": ["sh", "-c", "[ -t 0 ] && echo tty-$TERM"], "tty": True,
                             "term": "xterm-test"}) as ws:
        code, out, _ = _run(ws)
    assert (code, out.strip()) == (0, b"tty-xterm-test"), out
