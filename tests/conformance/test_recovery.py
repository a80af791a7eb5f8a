"""The first law across crashes, restarts and lost nodes, on every infra: after a kill -9 of
the server a running replica is adopted, never started again, and one that ended while the
server was down reports its exit; a replica restarted again and again never has two
attempts alive at once (each attempt holds the replica's flock, with a detached child, for as
long as anything of it lives); and a replica whose node or allocation is lost from under it
is recorded lost with the reason, nothing of it running on. The loss comes last: the
harness brings the node back only for the next module."""

from __future__ import annotations

import time

from conformance.driver import Corral, runs, wait_for
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
    time.sleep(1)
    corral.start()

    def adopted() -> bool:
        return sum(e["cause"] == "adopted" for e in corral.events(long)) == 2

    wait_for(adopted, timeout=60, what="both replicas of the running job adopted")
    done = corral.wait_job(ender)
    assert (done["state"], done["exit_code"]) == ("FAILED", 3), describe(done)
    data = corral.status(long)
    assert data["state"] == "RUNNING", describe(data)
    assert all(r["state"] == "RUNNING" and r["restarts"] == 0 for r in corral.replicas(long).values())
    time.sleep(1)  # a second start would have shown by now
    keys = _lines(starts)
    assert len(keys) == len(set(keys)) == 3, keys
    corral.client().cancel(long)
    assert corral.wait_job(long)["state"] == "CANCELLED"


def test_a_replica_never_has_two_live_attempts_across_restarts_and_a_crash(corral: Corral, work) -> None:
    lock, starts, double = work / "replica.lock", work / "starts", work / "double"
    job = corral.launch("flocked", f"""
restart: {{policy: on_failure, max_restarts: 3, backoff: {{initial: 0s}}}}
run: |
  exec 9>>{lock}
  if ! flock -n 9; then echo $CORRAL_LAUNCH_KEY >> {double}; exit 42; fi
  echo $CORRAL_LAUNCH_KEY >> {starts}
  setsid sleep 311 &   # holds the lock (fd 9) as long as it lives, out of the attempt's process group
  sleep 0.5
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
    assert len(keys) == len(set(keys)) == 4, keys  # the first run and three restarts, each once
    assert done["tasks"][0]["replicas"][0]["restarts"] == 3


def test_a_lost_node_or_allocation_is_reported_lost_with_a_reason(corral: Corral, harness, work) -> None:
    starts, pid = work / "starts", work / "pid"
    job = corral.launch("doomed", f"""
resources: {{accelerators: {harness.gpu_type}:1}}
run: echo $CORRAL_LAUNCH_KEY >> {starts}; echo $BASHPID > {pid}; exec sleep 313
""")
    node = corral.wait_running(job)["doomed-0"]["node"]
    wait_for(lambda: pid.exists() and pid.read_text().strip(), timeout=30, what="the replica's pid")
    word = harness.lose(node, job)

    def lost():
        # its end, recorded as lost (FAILED; KILLED if the job was being stopped meanwhile)
        return next((e for e in corral.events(job) if e["subject"] == "doomed-0"
                     and e["to_state"] in ("FAILED", "KILLED") and "lost" in (e["message"] or "")), None)

    try:
        event = wait_for(lost, timeout=60, what="the replica recorded lost")
    except AssertionError:
        story = "\n".join(f"{e['subject']} {e['cause']} {e['to_state']} {e['message']}" for e in corral.events(job))
        raise AssertionError(f"{describe(corral.status(job))}\n{story}") from None
    assert word in event["message"], event
    assert not runs(int(pid.read_text()), "sleep 313"), "the lost attempt runs on"
    keys = starts.read_text().split()
    assert len(keys) == len(set(keys)), keys
    corral.client().cancel(job)
    corral.wait_job(job, timeout=90)

