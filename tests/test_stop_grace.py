"""A stop's grace period counts from when the signal is sent, not from the cycle that decided
it: the send comes after a commit, and on a loaded server or a slow engine (one ``scancel``
per replica of a large job) that can take a good part of the grace away."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from conftest import cli_for, shared_account, submit, wait_for, wait_state


def test_the_grace_period_counts_from_the_signal_s_send(server, tmp_path: Path) -> None:
    term, beat = tmp_path / "term-at", tmp_path / "beat-at"
    job = submit(server, f"""
name: stubborn
grace_period: 2s
run: |
  trap 'date +%s.%N > {term}' TERM
  while true; do date +%s.%N > {beat}.new; mv {beat}.new {beat}; sleep 0.05; done
""")
    wait_state(server, job["id"], "RUNNING")
    wait_for(lambda: beat.exists(), timeout=20)
    executor = server.state.loop.inventory.executors["local"]
    real_signal = executor.signal

    def slow_signal(handle, signum):  # an engine that takes 1.5 s to deliver a stop signal
        if signum == signal.SIGTERM:
            time.sleep(1.5)
        return real_signal(handle, signum)

    executor.signal = slow_signal
    assert server.post(f"/v1/jobs/{job['id']}/cancel").json()["cancelled"] is True
    done = wait_state(server, job["id"], "CANCELLED", timeout=30)
    assert done["tasks"][0]["replicas"][0]["exit_code"] == 137  # it trapped TERM and was killed
    lived = float(beat.read_text()) - float(term.read_text())
    # its last heartbeat came the whole grace period after SIGTERM reached it (0.5 s when the
    # grace was counted from the decision); the heartbeat's 0.05 s period is the slack
    assert lived >= 1.85, lived


PROGRAM = """
import signal, sys, time
log = open(sys.argv[1], "a", buffering=1)
def on(signum, frame):
    log.write(f"got {signal.Signals(signum).name} {time.time()}\\n")
    if signum == signal.SIGTERM:  # save a checkpoint, then end well
        time.sleep(float(sys.argv[3]) if len(sys.argv) > 3 else 1.5)
        log.write(f"saved {time.time()}\\n")
        sys.exit(0)
signal.signal(signal.SIGTERM, on)
signal.signal(signal.SIGUSR1, on)
open(sys.argv[1] + ".ready", "w").close()  # its handlers are in place
for _ in range(int(sys.argv[2])):
    time.sleep(0.1)
log.write("finished\\n")
"""


def handling(log: Path) -> bool:
    """PROGRAM writing to ``log`` has its signal handlers in place (a stop sent before would
    end it by the signal's default action: no checkpoint, and the test would have raced it)."""
    return Path(f"{log}.ready").exists()


@pytest.mark.parametrize("form", ["python3 {program} {log} 600", "python3 {program} {log} 600 & wait"])
def test_a_program_under_the_run_shell_gets_its_grace_and_its_exit_stands(server, tmp_path: Path, form: str) -> None:
    """``run: python train.py`` (no exec), or in the background: the shell around the program
    used to die of the stop signal at once, and the attempt with it, so the program was killed
    mid-checkpoint."""
    program, log = tmp_path / "train.py", tmp_path / "train.log"
    program.write_text(PROGRAM)
    command = form.format(program=program, log=log)
    job = submit(server, f"name: ckpt\ngrace_period: 10s\nrun: |\n  {command}\n  echo after\n")
    wait_state(server, job["id"], "RUNNING")
    wait_for(lambda: handling(log), timeout=20)
    assert server.post(f"/v1/jobs/{job['id']}/cancel").json()["cancelled"] is True
    done = wait_state(server, job["id"], "CANCELLED", timeout=30)
    lines = log.read_text().splitlines()
    assert lines[0].startswith("got SIGTERM") and lines[1].startswith("saved"), lines  # the checkpoint was saved
    replica = done["tasks"][0]["replicas"][0]
    # its own exit, not a kill (in the background: the shell's wait, cut by the signal); the script did not go on
    assert replica["exit_code"] == (0 if "&" not in form else 143), replica
    assert "after" not in server.get(f"/v1/jobs/{job['id']}/logs").text


def test_a_warning_signal_before_the_time_limit_leaves_the_run_running(server, tmp_path: Path) -> None:
    """``signal_before_timeout`` with a program that handles it: the run's shell used to die of
    SIGUSR1 (exit 138, FAILED) long before the limit."""
    program, log = tmp_path / "train.py", tmp_path / "train.log"
    program.write_text(PROGRAM)
    job = submit(server, f"""
name: warned
time_limit: 8s
signal_before_timeout: {{signal: SIGUSR1, seconds: 5}}
run: |
  python3 {program} {log} 50
  echo "then $?"
""")
    done = wait_state(server, job["id"], "SUCCEEDED", "FAILED", "TIMEOUT", timeout=40)
    lines = log.read_text().splitlines()
    assert lines[0].startswith("got SIGUSR1") and lines[-1] == "finished", lines
    assert done["state"] == "SUCCEEDED", done  # it ran to its end (5 s) after the warning at 3 s
    assert "then 0" in server.get(f"/v1/jobs/{job['id']}/logs").text


def test_a_batch_script_s_program_gets_its_grace(tmp_path: Path) -> None:
    """A plain ``python3 train.py`` in a batch script, cancelled: the script's shell dies of
    SIGTERM (as under Slurm) but the program it ran keeps its grace to save its work."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(shared_account(""))
    corral = cli_for(home, cwd=tmp_path, timeout=120)
    program, log = tmp_path / "train.py", tmp_path / "train.log"
    program.write_text(PROGRAM)
    script = tmp_path / "train.sbatch"
    # a checkpoint longer than the 2 s the batch shell gives its output files after the script
    script.write_text(f"#!/bin/bash\n#SBATCH -J train\npython3 {program} {log} 600 4\n")
    try:
        job = corral("sbatch", "--parsable", str(script), check=True).stdout.strip()
        wait_for(lambda: handling(log), timeout=30)
        assert corral("cancel", job).returncode == 0
        wait_for(lambda: '"CANCELLED"' in corral("status", job, "--json", check=True).stdout, timeout=60)
        lines = log.read_text().splitlines()
        assert lines[0].startswith("got SIGTERM") and lines[1].startswith("saved"), lines
    finally:
        corral.stop()


def test_an_auxiliary_that_ends_well_on_its_stop_signal_succeeded(server, tmp_path: Path) -> None:
    """Once the primaries are done each auxiliary is stopped; one that exits 0 on the signal
    (a buffer that flushes) is done, as Slurm's accounting records it, not killed."""
    job = submit(server, """
name: aux
execution: parallel
primary_tasks: [main]
termination_delay: 0s
---
name: main
run: sleep 1
---
name: flusher
run: |
  trap 'echo flushed; exit 0' TERM
  while :; do sleep 0.1; done
---
name: plain
run: sleep 300
""")
    done = wait_state(server, job["id"], "SUCCEEDED", "FAILED", timeout=60)
    assert done["state"] == "SUCCEEDED", done
    states = {t["name"]: (t["replicas"][0]["state"], t["replicas"][0]["exit_code"]) for t in done["tasks"]}
    assert states == {"main": ("SUCCEEDED", 0), "flusher": ("SUCCEEDED", 0), "plain": ("KILLED", 143)}, states


def test_a_stopped_script_starts_nothing_new_whatever_its_stop_signal(server, tmp_path: Path) -> None:
    """After a stop the script goes no further: not from setup to run, and not to its next
    command when the task's stop_signal is one the shell otherwise carries on through."""
    program, log = tmp_path / "train.py", tmp_path / "train.log"
    program.write_text(PROGRAM.replace("if signum == signal.SIGTERM:", "if signum == signal.SIGUSR1:"))
    custom = submit(server, f"""
name: custom
stop_signal: SIGUSR1
grace_period: 20s
run: |
  python3 {program} {log} 600 0.5
  echo next >> {log}
  sleep 300
""")
    stages, staged = tmp_path / "stages.py", tmp_path / "stages.log"
    stages.write_text(PROGRAM)
    setup = submit(server, f"""
name: staged
grace_period: 20s
setup: python3 {stages} {staged} 600 0.5
run: echo run started >> {staged}
""")
    for job, path in ((custom, log), (setup, staged)):
        wait_state(server, job["id"], "RUNNING")
        wait_for(lambda: handling(path), timeout=20)
    started = time.monotonic()
    for job in (custom, setup):
        assert server.post(f"/v1/jobs/{job['id']}/cancel").json()["cancelled"] is True
    for job in (custom, setup):
        wait_state(server, job["id"], "CANCELLED", timeout=40)
    assert time.monotonic() - started < 15  # neither waited out its 20 s grace
    assert [line.split()[0] for line in log.read_text().splitlines()] == ["got", "saved"]
    assert [line.split()[0] for line in staged.read_text().splitlines()] == ["got", "saved"]


def test_the_job_s_own_variables_cannot_pass_for_a_stop(server, tmp_path: Path) -> None:
    out = tmp_path / "ran"
    job = submit(server, f"""
name: named
envs: {{stopping: "1", corral_stopping: "1"}}
setup: echo setup >> {out}
run: echo run >> {out}
""")
    assert wait_state(server, job["id"], "SUCCEEDED", "FAILED")["state"] == "SUCCEEDED"
    assert out.read_text().split() == ["setup", "run"]
