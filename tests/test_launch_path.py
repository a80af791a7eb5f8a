"""The launch path on the local executor: the wrapper moves itself into its attempt's cgroup
(no helper process of its own) before the user's first instruction runs, whichever way its
namespaces are made."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from corral.executors.contract import Kind, Launch
from corral.executors.local.executor import LocalExecutor
from corral.pool import NodeSpec
from corral.settings import Settings


def _executor(tmp_path: Path) -> LocalExecutor:
    settings = Settings(home=tmp_path, db_url="sqlite://")
    return LocalExecutor([NodeSpec(name="n0", gpus=2, cpus=2)], settings, scope=f"lp{os.getpid()}{tmp_path.name[-6:]}")


def test_a_wrapper_that_makes_its_own_namespaces_runs_the_replica_in_its_cgroup(tmp_path: Path) -> None:
    """Without the namespace thread (it could not be made, or srun starts the wrapper), the
    wrapper binds the hosts file with ``mount`` in the background while it moves itself into
    its cgroup: the user's first instruction already sees both."""
    executor = _executor(tmp_path)
    runner = executor.runner
    if runner.trees.mode != "cgroup" or runner.hosts_mode != "mount-namespace":
        executor.close()
        pytest.skip("needs per-attempt cgroups and mount/UTS namespaces (root)")
    runner._spawner_tried, runner._spawner = True, None  # no namespace thread: the wrapper's own unshare
    out = tmp_path / "out"
    try:
        executor.publish(17, {"n0"}, "127.9.9.17\tw-0.own w-0\n", "{}")
        for attempt in range(1, 4):
            key = f"17.w.0.a{attempt}"
            executor.start(Launch(key=key, job_id=17, label="w-0", node="n0", gpus=(), cpus=0.1, memory=0.0,
                                  setup=None, run=f"cat /proc/self/cgroup > {out}{attempt}; "
                                                  f"getent hosts w-0.own >> {out}{attempt}",
                                  env={"PATH": os.environ["PATH"], "CORRAL_HOSTNAME": "w-0.own"}))
            events = []
            deadline = time.monotonic() + 60
            while not events and time.monotonic() < deadline:
                events = executor.drain()
                time.sleep(0.02)
            assert [(e.kind, e.code) for e in events] == [(Kind.EXITED, 0)]
            lines = Path(f"{out}{attempt}").read_text().splitlines()
            unified = next(line for line in lines if line.startswith("0::"))
            assert unified.endswith(f"/{key}"), unified
            assert lines[-1].split()[0] == "127.9.9.17"
    finally:
        executor.close()
