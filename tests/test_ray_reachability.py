"""The Ray executor when no Ray answers: built at once without raising, the server's own
process untouched, ``unreachable()`` naming Ray and its address, no nodes, starts refused
with that reason, and a signal kept for when Ray answers. No Ray cluster is needed."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="ray is not installed (pip install 'corral[ray]')")

from corral.executors.contract import Launch, LaunchError, Reachability  # noqa: E402
from corral.executors.ray.executor import RayExecutor, instance  # noqa: E402
from corral.executors.ray.plugin import RayConfig  # noqa: E402
from corral.settings import Settings  # noqa: E402


def _unserved() -> str:
    with socket.socket() as sock:  # a port nobody listens on (closed right away)
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_an_unreachable_cluster_is_reported_not_raised(tmp_path: Path) -> None:
    address = _unserved()
    settings = Settings(tmp_path, f"sqlite:///{tmp_path / 'corral.db'}")
    began = time.monotonic()
    executor = RayExecutor(RayConfig(address=address), settings, "test", lambda: None)
    try:
        built = time.monotonic() - began
        assert built < 20, built  # the server's start does not hang on Ray
        assert isinstance(executor, Reachability)
        reason = executor.unreachable()
        assert reason is not None and f"Ray at {address}" in reason and "does not answer" in reason, reason
        assert executor.nodes() == []
        launch = Launch(key="1.t.0.a0", job_id=1, label="t-0", node="ray-x", gpus=(0,), cpus=1, memory=0,
                        setup=None, run="true")
        with pytest.raises(LaunchError, match=f"Ray at {address}"):
            executor.start(launch)
        with pytest.raises(LaunchError, match="does not answer"):
            executor.reserve(1, 0, [("t-0", "ray-x", (0,), 1.0, 0.0)])
        ok, said = executor.exec_probe({"key": "1.t.0.a0"}, "true", {}, None, 1.0)
        assert not ok and "does not answer" in said
        assert executor.signal({"key": "1.t.0.a0", "actor": "x", "node": "ray-x"}, 9)  # kept for later
        executor.adopt([("1.t.0.a0", {"key": "1.t.0.a0", "actor": "x", "node": "ray-x"})])  # reported later
        assert executor.drain() == []
        time.sleep(3)  # it keeps trying in the background, and this process runs on
        assert executor.unreachable() is not None and executor.nodes() == []
    finally:
        executor.close()
    assert os.getpid() > 0


def test_a_home_made_anew_gets_a_new_instance(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    first = instance(home)
    assert instance(home) == first  # stable for the home's life
    assert (home / "ray.instance").stat().st_mode & 0o777 == 0o600
    (home / "ray.instance").unlink()  # the home deleted and made again at the same path
    assert instance(home) != first
