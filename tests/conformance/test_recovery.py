"""The first law across crashes and restarts, on every infra: after a kill -9 of the server a
running replica is adopted, never started again, and one that ended while the server was
down reports its exit; and a replica restarted again and again never has two attempts alive
at once (each attempt holds the replica's flock, with a detached child, for as long as
anything of it lives)."""

from __future__ import annotations

import time

from conformance.driver import Corral, wait_for
from conformance.harnesses import describe


def _lines(path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_a_server_killed_with_kill_9_adopts_its_replicas_and_starts_none_twice(corral: Corral, work) -> None:
    starts, go = work / "starts", work / "go"
    long = corral.launch("long", f"""
num_nodes: 2
run: echo $CORRAL_LAUNCH_KEY >> {starts}; exec sleep 300
""")
    ender = corral.launch("ender", f"""
run: |
  echo $CORRAL_LAUNCH_KEY >> {starts}
  until [ -e {go} ]; do sleep 0.1; done
  exit 3
""")
    corral.wait_running(long)
    corral.wait_running(ender)
    wait_for(lambda: len(_lines(starts)) == 3, timeout=30, what="three attempts started")
    corral.crash()
    go.touch()  # the ender exits while no server watches it
    time.sleep(2)
    corral.start()

    def adopted() -> bool:
        return sum(e["cause"] == "adopted" for e in corral.events(long)) == 2

    wait_for(adopted, timeout=60, what="both replicas of the running job adopted")
    done = corral.wait_job(ender)
    assert (done["state"], done["exit_code"]) == ("FAILED", 3), describe(done)
    data = corral.status(long)
    assert data["state"] == "RUNNING", describe(data)
    assert all(r["state"] == "RUNNING" and r["restarts"] == 0 for r in corral.replicas(long).values())
    time.sleep(2)  # a second start would have shown by now
    keys = _lines(starts)
    assert len(keys) == len(set(keys)) == 3, keys
    corral.client().cancel(long)
    assert corral.wait_job(long)["state"] == "CANCELLED"


def test_a_replica_never_has_two_live_attempts_across_restarts_and_a_crash(corral: Corral, work) -> None:
    lock, starts, double = work / "replica.lock", work / "starts", work / "double"
    job = corral.launch("flocked", f"""
restart: {{policy: on_failure, max_restarts: 4, backoff: {{initial: 0s}}}}
run: |
  exec 9>>{lock}
  if ! flock -n 9; then echo $CORRAL_LAUNCH_KEY >> {double}; exit 42; fi
  echo $CORRAL_LAUNCH_KEY >> {starts}
  setsid sleep 311 &   # holds the lock (fd 9) as long as it lives, out of the attempt's process group
  sleep 1
  exit 1
""")
    wait_for(lambda: len(_lines(starts)) >= 2, timeout=60, what="the second attempt")
    corral.crash()  # mid-way: attempts go on ending while no server watches
    time.sleep(1.5)
    corral.start()
    done = corral.wait_job(job, timeout=120)
    assert (done["state"], done["exit_code"]) == ("FAILED", 1), describe(done)
    assert not double.exists(), f"attempts {_lines(double)} found the replica's lock held by an earlier attempt"
    keys = _lines(starts)
    assert len(keys) == len(set(keys)) == 5, keys  # the first run and four restarts, each once
    assert done["tasks"][0]["replicas"][0]["restarts"] == 4
