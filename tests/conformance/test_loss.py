"""A node or allocation lost from under a replica, on every infra that can lose one without
losing the server: the replica is recorded lost with the reason (naming what was lost),
nothing of its attempt runs on, and the job goes on as its policy says (requeued elsewhere
or ended), never with two attempts alive."""

from __future__ import annotations

import psutil

from conformance.driver import Corral, wait_for
from conformance.harnesses import describe


def test_a_lost_node_or_allocation_is_reported_lost_with_a_reason(corral: Corral, harness, work) -> None:
    starts, pid = work / "starts", work / "pid"
    job = corral.launch("doomed", f"""
resources: {{accelerators: {harness.gpu_type}:1}}
run: echo $CORRAL_LAUNCH_KEY >> {starts}; echo $BASHPID > {pid}; exec sleep 313
""")
    node = corral.wait_running(job)["doomed-0"]["node"]
    wait_for(lambda: pid.exists() and pid.read_text().strip(), timeout=30, what="the replica's pid")
    try:
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
        assert not _runs(int(pid.read_text()), "sleep 313"), "the lost attempt runs on"
        keys = starts.read_text().split()
        assert len(keys) == len(set(keys)), keys
    finally:
        harness.recover()
    corral.client().cancel(job)
    corral.wait_job(job, timeout=90)


def _runs(pid: int, command: str) -> bool:
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and command in " ".join(proc.cmdline())
    except psutil.Error:
        return False
