"""A shell whose client vanishes mid-stream, against a real server (uvicorn over TCP): the
process is ended and the server's log says nothing went wrong. Starlette's test client never
drops a connection the way a closed laptop or a killed ``corral shell`` does, so this cannot be
seen in-process: a send to a peer that left raises uvicorn's ``ClientDisconnected`` (an
``OSError``), which the relay must take for the caller leaving, not for a failure."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import socket
import time
from pathlib import Path

import psutil
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from conftest import cli_for, wait_for
from corral.credentials import read_local_token


@pytest.fixture
def corral(corral_home: Path):
    run = cli_for(corral_home)
    yield run
    run.stop()


def _streamers(marker: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline", "status"])
            if (p.info["cmdline"] or [""])[:2] == ["yes", marker] and p.info["status"] != psutil.STATUS_ZOMBIE]


def test_a_client_that_vanishes_mid_stream_ends_the_process_and_logs_no_error(corral, corral_home: Path,
                                                                              tmp_path: Path) -> None:
    spec = tmp_path / "quiet.yaml"
    spec.write_text("name: quiet\nrun: exec sleep 300\n")
    corral("launch", "-d", str(spec), check=True)
    wait_for(lambda: json.loads(corral("status", "quiet", "--json", check=True).stdout)["state"] == "RUNNING",
             timeout=60)
    url = json.loads((corral_home / "server.json").read_text())["url"].replace("http", "ws", 1)
    token = read_local_token(corral_home)
    marker = f"vanish-{time.monotonic_ns()}"
    log = corral_home / "server.log"
    before = log.read_text(errors="replace") if log.exists() else ""
    for attempt in range(6):  # a few times: the send that meets the closed socket is a race
        # the first ones leave before the output starts (the exit code then goes to nobody), the
        # others while it flows; every other one resets the connection, the rest close it
        quick = attempt < 2
        command = ["sh", "-c", f"sleep 0.3; exec yes {marker} | head -c 3000000"] if quick else ["yes", marker]
        with contextlib.suppress(OSError, ConnectionClosed), \
                connect(f"{url}/v1/jobs/quiet/shell", additional_headers={"Authorization": f"Bearer {token}"}) as ws:
            ws.send(json.dumps({"command": command}))
            assert "started" in json.loads(ws.recv(timeout=30))
            if not quick:
                for _ in range(20):  # output is flowing
                    ws.recv(timeout=30)
            # gone without a closing handshake, as a killed client
            if attempt % 2:
                ws.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            ws.socket.close()
        wait_for(lambda: not _streamers(marker), timeout=20)
    time.sleep(1)  # what the server logs about it comes after the process ended
    said = (log.read_text(errors="replace") if log.exists() else "")[len(before):]
    assert "Traceback" not in said and "ERROR" not in said and "was never retrieved" not in said, said
    assert "shell relay failed" not in said, said


class _Vanished(OSError):
    """What uvicorn raises from a send to a peer that left (``ClientDisconnected``)."""


class _Gone:
    """A connection whose peer left: every send fails, and its leaving is seen late."""

    client_state = None

    async def send_bytes(self, data: bytes) -> None:
        raise _Vanished("the peer left")

    send_text = send_bytes

    async def receive(self) -> dict:
        await asyncio.sleep(0.2)
        return {"type": "websocket.disconnect"}


class _Chatty:
    """A process whose output never stops."""

    def read(self) -> tuple[int, bytes]:
        return 1, b"y\n"

    def wait(self) -> int:
        return 0


def test_a_send_to_a_vanished_client_is_its_leaving_not_a_failure(caplog) -> None:
    from types import SimpleNamespace

    from corral.api.routes.shell import _relay

    state = SimpleNamespace(tokens=SimpleNamespace(live=lambda _: True))
    who = SimpleNamespace(token_id=1)

    async def scenario() -> None:
        await _relay(state, who, _Gone(), _Chatty())
        await asyncio.sleep(0.5)  # the cancelled tasks end
        gc.collect()

    with caplog.at_level(logging.DEBUG):
        asyncio.run(scenario())
        gc.collect()
    said = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not said, [r.getMessage() for r in said]
