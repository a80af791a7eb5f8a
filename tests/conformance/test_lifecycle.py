"""An attempt's life on every infra, through a real server: it starts on its node with its
GPUs, its exit code is the replica's, its stop signal comes before SIGKILL after the grace
period, nothing of its process tree outlives the end the store records, its log is complete
and streams while it runs, and its peers reach it by name."""

from __future__ import annotations

import threading
import time
from datetime import datetime

from conformance.driver import Corral, runs, wait_for
from conformance.harnesses import describe


def _ts(event: dict) -> float:
    return datetime.fromisoformat(event["ts"]).timestamp()


def _log_lines(corral: Corral, job: int, replica: str) -> list[str]:
    return corral("logs", str(job), replica).stdout.splitlines()


def test_a_replica_runs_on_its_node_with_the_gpus_it_is_shown(corral: Corral, harness) -> None:
    # another job holds a GPU meanwhile, so the free ones are not simply the first of a node
    holder = corral.launch("holder", f"resources: {{accelerators: {harness.gpu_type}:1}}\nrun: exec sleep 300\n")
    corral.wait_running(holder)
    job = corral.launch("runs", f"""
num_nodes: 2
resources: {{accelerators: {harness.gpu_type}:2}}
run: echo "gpus=$CUDA_VISIBLE_DEVICES node=$CORRAL_NODE"; exec sleep 300
""")
    reps = corral.wait_running(job)
    seen = {}
    for label, replica in reps.items():
        assert replica["node"] and replica["addr"], describe(corral.status(job))
        assert len(replica["gpus"]) == 2, replica
        line = wait_for(lambda: next((x for x in _log_lines(corral, job, label) if x.startswith("gpus=")), None),
                        timeout=20, what=f"{label}'s first line")
        gpus, node = (part.split("=", 1)[1] for part in line.split())
        assert gpus == ",".join(str(g) for g in replica["gpus"]), (label, line, replica["gpus"])
        assert node == replica["node"]
        seen[label] = (replica["node"], tuple(replica["gpus"]))
    a, b = seen.values()
    assert a[0] != b[0] or not set(a[1]) & set(b[1]), seen  # two replicas on one node never share a GPU
    for ended in (job, holder):
        corral.client().cancel(ended)
        corral.wait_job(ended)


def test_exit_codes_are_the_replicas(corral: Corral) -> None:
    ok = corral.launch("ok", "run: echo fine; exit 0\n")
    three = corral.launch("three", "run: exit 3\n")
    # its program dies of SIGUSR1 (10); the run's own shell carries on through USR1/USR2 (they
    # warn a program before its time limit), so the program is a process of its own
    signalled = corral.launch("signalled", "run: bash -c 'kill -USR1 $$'\n")
    done = corral.wait_job(ok)
    assert (done["state"], done["exit_code"]) == ("SUCCEEDED", 0), describe(done)
    done = corral.wait_job(three)
    assert (done["state"], done["exit_code"]) == ("FAILED", 3), describe(done)
    assert done["tasks"][0]["replicas"][0]["exit_code"] == 3
    done = corral.wait_job(signalled)
    assert (done["state"], done["exit_code"]) == ("FAILED", 128 + 10), describe(done)


def test_a_failed_setup_and_a_missing_command_say_why_in_the_job_s_message(corral: Corral) -> None:
    setup = corral.launch("setupfails", "setup: echo installing; exit 4\nrun: echo never ran\n")
    missing = corral.launch("missing", "run: no-such-program-here --train\n")
    done = corral.wait_job(setup)
    assert (done["state"], done["exit_code"]) == ("FAILED", 4), describe(done)
    assert "exit code 4 (setup failed, so its run was not started)" in (done.get("message") or ""), describe(done)
    assert "never ran" not in corral("logs", str(setup)).stdout
    done = corral.wait_job(missing)
    assert (done["state"], done["exit_code"]) == ("FAILED", 127), describe(done)
    message = done.get("message") or ""
    assert "no-such-program-here" in message and "not found" in message, describe(done)


def test_the_stop_signal_comes_first_and_sigkill_after_the_grace_period(corral: Corral, harness) -> None:
    stubborn = corral.launch("stubborn", """
grace_period: 4s
run: |
  trap 'echo "got TERM"' TERM
  echo trapping
  while true; do sleep 0.1; done
""")
    meek = corral.launch("meek", "grace_period: 60s\nrun: echo waiting; exec sleep 300\n")
    for job, label, first in ((stubborn, "stubborn-0", "trapping"), (meek, "meek-0", "waiting")):
        corral.wait_running(job)
        wait_for(lambda: first in _log_lines(corral, job, label), timeout=20, what=f"{label} ready for signals")
    corral.client().cancel(stubborn)
    corral.client().cancel(meek)
    for job, label, grace in ((stubborn, "stubborn-0", 4.0), (meek, "meek-0", None)):
        done = corral.wait_job(job, timeout=90)
        assert done["state"] == "CANCELLED", describe(done)
        story = [e for e in corral.events(job) if e["subject"] == label]
        stop = next(e for e in story if "SIGTERM sent" in (e["message"] or ""))
        end = next(e for e in story if e["to_state"] == "KILLED")
        took = _ts(end) - _ts(stop)
        killed = [e for e in story if e["cause"] == "killed"]
        if grace is None:  # it ended on its stop signal: no SIGKILL, no waiting for one
            assert not killed and took < harness.report_slack, (took, story)
        else:  # it trapped SIGTERM and lived on: SIGKILL once its grace period was over
            assert killed and grace - 0.5 <= took < grace + harness.report_slack, (took, story)
            assert "got TERM" in _log_lines(corral, job, label)


def test_nothing_of_a_replica_outlives_its_recorded_end(corral: Corral, work) -> None:
    """A daemon (forked twice, in a session of its own: out of the replica's process group, and
    no descendant of its process any more) is ended before the replica's end is recorded: whether the replica exits, is cancelled and ends on
    its stop signal, or ignores it and is killed after its grace period."""
    cases = {"exits": ("", "exit 0"), "cancelled": ("", "exec sleep 300"),
             "killed": ("grace_period: 1s\n", "trap '' TERM; while true; do sleep 0.1; done")}
    jobs = {}
    for name, (head, then) in cases.items():
        marker = work / f"{name}.pid"
        jobs[name] = (corral.launch(name, f"""{head}
run: |
  (setsid bash -c 'echo $$ > {marker}; exec sleep 307' &)  # a daemon: forked twice, in a session of its own
  until [ -s {marker} ]; do sleep 0.05; done
  until ps -o args= -p "$(cat {marker})" | grep -q "sleep 307"; do sleep 0.05; done
  echo "child $(cat {marker}) runs"
  {then}
"""), marker)
    for name, (job, marker) in jobs.items():
        if name != "exits":
            corral.wait_running(job)
            wait_for(lambda: any(x.endswith(" runs") for x in _log_lines(corral, job, f"{name}-0")), timeout=30,
                     what="the child runs")
            corral.client().cancel(job)
        done = corral.wait_job(job)
        child = marker.read_text().strip()
        assert f"child {child} runs" in _log_lines(corral, job, f"{name}-0")
        # the end is recorded: nothing of the replica may run now
        assert not runs(int(child), "sleep 307"), f"{name}: pid {child} outlived {describe(done)}"
        assert done["state"] == ("SUCCEEDED" if name == "exits" else "CANCELLED"), describe(done)
        if name == "killed":
            assert any(e["cause"] == "killed" for e in corral.events(job)), "not killed after its grace period"


def test_logs_are_complete_after_the_end_and_follow_streams_them_as_written(corral: Corral) -> None:
    job = corral.launch("chatty", """
run: |
  for i in 1 2 3 4 5 6; do echo "tick $i"; sleep 1.2; done
  seq 1 3000 | sed 's/^/bulk /'
  echo "last line"
""")
    corral.wait_job(job, ("RUNNING",) + ("SUCCEEDED", "FAILED"))
    follower = corral.popen("logs", "-f", str(job))
    got: list[tuple[float, str]] = []

    def read() -> None:
        for line in follower.stdout:
            got.append((time.monotonic(), line.rstrip("\n")))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    done = corral.wait_job(job)
    ended = time.monotonic()
    assert done["state"] == "SUCCEEDED", describe(done)
    try:
        follower.wait(timeout=15)  # -f ends by itself once the job has ended
    finally:
        follower.kill()
    reader.join(timeout=5)
    assert follower.returncode == 0, follower.stderr.read()
    lines = [text for _, text in got]
    expected = [f"tick {i}" for i in range(1, 7)] + [f"bulk {i}" for i in range(1, 3001)] + ["last line"]
    assert [x for x in lines if x.startswith(("tick", "bulk", "last"))] == expected, lines[:20]
    at = {text: t for t, text in got}
    # streamed as written: the first tick was read seconds before the last was written (6 s of
    # ticks: a follower that attaches late on a loaded machine still sees them spread out)
    assert at["tick 6"] - at["tick 1"] > 2.0, (at["tick 1"], at["tick 6"])
    assert at["tick 1"] < ended - 2.0
    after = [x for x in corral.log(job).splitlines() if x.startswith(("tick", "bulk", "last"))]
    assert after == expected, (len(after), after[-3:])


def test_peers_resolve_each_other_by_name(corral: Corral) -> None:
    job = corral.launch("peers", """
num_nodes: 2
run: |
  peer="$CORRAL_TASK-$((1 - CORRAL_REPLICA)).$CORRAL_JOB_NAME"
  for i in $(seq 1 100); do found=$(getent hosts "$peer") && break; sleep 0.2; done
  echo "peer $peer at ${found%% *}"
  sleep 3  # both live while the other looks
""")
    done = corral.wait_job(job, timeout=90)
    assert done["state"] == "SUCCEEDED", describe(done)
    reps = corral.replicas(job)
    for rank in (0, 1):
        lines = [x for x in _log_lines(corral, job, f"peers-{rank}") if x.startswith("peer ")]
        peer = reps[f"peers-{1 - rank}"]
        assert lines == [f"peer peers-{1 - rank}.peers at {peer['addr']}"], (lines, peer)
