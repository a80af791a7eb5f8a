"""A server stopped inside a process that goes on (embedded use, the tests) gives back what
it opened: its database connections, the local executor's pipe and process descriptors, the
cgroup helper's open ``cgroup.procs``. Each in-process server of the test suite once kept 8
descriptors, so a long run passed 1024 of them and a child handed such a number to
``select()`` failed."""

from __future__ import annotations

import os
from pathlib import Path

from fastapi.testclient import TestClient

from conftest import bearer, submit, wait_state
from corral.api.app import create_app
from corral.server import build_state
from corral.settings import Settings

ON_POSTGRESQL = True  # its connections too


def _open() -> dict[int, str]:
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[int(fd)] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass  # the listing's own descriptor
    return out


def test_a_stopped_server_keeps_no_descriptor_open(corral_home: Path, db_url: str) -> None:
    before = _open()
    state = build_state(Settings(home=corral_home, db_url=db_url, poll_interval_s=0.2))
    with TestClient(create_app(state), headers=bearer(state, "alice")) as client:
        for i in range(3):
            job = submit(client, f"name: j{i}\nrun: sleep 0.2\n")
        wait_state(client, job["id"], "SUCCEEDED")
        during = _open()
    after = _open()
    assert len(during) > len(before)  # it did open some
    left = {fd: target for fd, target in after.items() if before.get(fd) != target}
    assert left == {}, left
