"""End-to-end through the real `corral` command: an embedded server started on first use,
real replica processes, and a server stop/start while jobs run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from conftest import cli_for, wait_for


@pytest.fixture
def corral(corral_home: Path):
    run = cli_for(corral_home)
    yield run
    run.stop()


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def status(corral, job: str) -> dict:
    return json.loads(corral("status", job, "--json", check=True).stdout)


def test_launch_streams_prefixed_logs_and_exit_code(corral, tmp_path: Path) -> None:
    ok = corral("launch", str(write(tmp_path, "ok.yaml", "name: hello\nnum_nodes: 2\nrun: echo rank $CORRAL_REPLICA\n")))
    assert ok.returncode == 0, ok.stderr
    assert "hello-0 | rank 0" in ok.stdout and "hello-1 | rank 1" in ok.stdout
    assert "SUCCEEDED" in ok.stderr
    bad = corral("launch", str(write(tmp_path, "bad.yaml", "name: sad\nrun: echo oops; exit 3\n")))
    assert bad.returncode == 1 and "sad-0 | oops" in bad.stdout and "exit code 3" in bad.stderr
    data = status(corral, "sad")
    assert data["state"] == "FAILED" and data["exit_code"] == 3
    for key in ("id", "name", "user", "state", "reason", "exit_code", "submitted_at", "started_at", "ended_at"):
        assert key in data
    replica = data["tasks"][0]["replicas"][0]
    for key in ("rank", "state", "hostname", "node", "pid", "gpus", "exit_code", "restarts"):
        assert key in replica
    assert data["tasks"][0]["primary"] is True and data["tasks"][0]["num_nodes"] == 1


def test_detach_name_and_env_overrides(corral, tmp_path: Path) -> None:
    out = tmp_path / "out"
    spec = write(tmp_path, "t.yaml", f"name: orig\nenvs: {{WHO: nobody}}\nrun: echo $WHO $EXTRA > {out}\n")
    proc = corral("launch", "-d", "--name", "renamed", "--env", "WHO=alice", "--env", "EXTRA=1", str(spec), check=True)
    job_id = proc.stdout.strip()
    assert job_id.isdigit()
    wait_for(lambda: status(corral, job_id)["state"] == "SUCCEEDED")
    assert status(corral, job_id)["name"] == "renamed"
    assert out.read_text().strip() == "alice 1"
    assert corral("launch", "--env", "NOEQUALS", str(spec)).returncode == 2


def test_sky_launch_s_task_overrides(corral, tmp_path: Path) -> None:
    """``--num-nodes``, ``--gpus``, ``--cpus``, ``--memory``, ``--image-id`` over a one-task
    file's fields, as ``sky launch`` takes them; refused for a group and a batch script."""
    spec = write(tmp_path, "t.yaml", "name: over\nresources: {cpus: 1}\nrun: echo n=$CORRAL_NUM_REPLICAS\n")
    ran = corral("launch", "--num-nodes", "2", "--cpus", "0.5", "--memory", "1", str(spec))
    assert ran.returncode == 0, ran.stderr
    assert "over-1 | n=2" in ran.stdout, ran.stdout
    resources = status(corral, "over")["tasks"][0]
    assert resources["num_nodes"] == 2, resources
    too_many = corral("launch", "--gpus", "H100:64", str(spec))
    assert too_many.returncode != 0 and "64 GPUs" in too_many.stderr, too_many.stderr
    group = write(tmp_path, "g.yaml", "name: g\nexecution: parallel\n---\nname: a\nrun: 'true'\n")
    refused = corral("launch", "--num-nodes", "2", str(group))
    assert refused.returncode != 0 and "a file with one task" in refused.stderr, refused.stderr
    script = write(tmp_path, "s.sh", "#!/bin/bash\n#SBATCH -N 1\ntrue\n")
    assert corral("launch", "--gpus", "H100:1", str(script)).returncode == 2
    for wrong in ("\u0663", "two", "0", "1.5"):  # an Arabic-Indic three is not a count here
        bad = corral("launch", "--num-nodes", wrong, str(spec))
        assert bad.returncode == 2 and "--num-nodes" in bad.stderr, (wrong, bad.stderr)


def test_invalid_file_reports_file_line_and_field(corral, tmp_path: Path) -> None:
    spec = write(tmp_path, "typo.yaml", "name: t\nresources:\n  acelerators: H100:1\nrun: echo\n")
    proc = corral("launch", str(spec))
    assert proc.returncode == 2
    assert f"{spec}:3:" in proc.stderr and "resources.acelerators" in proc.stderr and "accelerators" in proc.stderr
    assert json.loads(corral("queue", "--all", "--json", check=True).stdout) == []
    missing = corral("launch", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "nope.yaml" in missing.stderr
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("name: t\nrun: echo café\n".encode("latin-1"))
    proc = corral("launch", str(latin1))
    assert proc.returncode == 2 and "not UTF-8 text" in proc.stderr and "line 2" in proc.stderr
    assert "Traceback" not in proc.stderr
    boolean = corral("launch", str(write(tmp_path, "bool.yaml", "run: true\n")))
    assert boolean.returncode == 2 and "quote it" in boolean.stderr and "'true'" in boolean.stderr
    for bad_name, words in (("my job", "not a valid job name"), ("x" * 10_000, "not a valid job name")):
        proc = corral("launch", "--name", bad_name, str(write(tmp_path, "ok.yaml", "run: echo\n")))
        assert proc.returncode == 2 and words in proc.stderr and len(proc.stderr) < 2000, proc.stderr[:300]
    proc = corral("launch", "--env", "A B=1", str(write(tmp_path, "ok.yaml", "run: echo\n")))
    assert proc.returncode == 2 and "'A B' is not a valid environment variable name" in proc.stderr
    assert json.loads(corral("queue", "--all", "--json", check=True).stdout) == []


def test_queue_events_nodes_and_cancel(corral, tmp_path: Path) -> None:
    long = write(tmp_path, "long.yaml", "name: sleeper\nresources: {accelerators: H100:4}\nrun: sleep 60\n")
    ids = [corral("launch", "-d", "--name", f"sleeper{i}", str(long), check=True).stdout.strip() for i in range(3)]
    wait_for(lambda: status(corral, ids[1])["state"] == "RUNNING")
    table = corral("queue", check=True).stdout
    assert "ID" in table and "REASON" in table and "sleeper" in table and "Resources" in table
    queued = json.loads(corral("queue", "--json", check=True).stdout)
    assert [(j["state"], j["reason"]) for j in queued] == [("RUNNING", None), ("RUNNING", None),
                                                          ("PENDING", "Resources")]
    sprio = corral("queue", "--priority", check=True).stdout  # like sprio: one row per pending job
    header, *rows = [line.split() for line in sprio.strip().splitlines()]
    assert header[6:11] == ["PRIORITY", "AGE", "FAIRSHARE", "JOBSIZE", "PART"] and "EXPANSION" in header
    assert len(rows) == 1 and rows[0][0] == ids[2] and rows[0][-1] == "Resources"
    nodes = json.loads(corral("nodes", "--json", check=True).stdout)
    assert [n["name"] for n in nodes] == ["gpu-0", "gpu-1"] and all(n["free_gpus"] == [] for n in nodes)
    assert "gpu-0" in corral("nodes", check=True).stdout
    cancelled = corral("cancel", *ids, check=True).stdout
    assert cancelled.count("cancelling") == 3
    for job_id in ids:
        wait_for(lambda: status(corral, job_id)["state"] == "CANCELLED")
    events = json.loads(corral("events", ids[0], "--json", check=True).stdout)
    assert [e["cause"] for e in events][:2] == ["submitted", "scheduled"]
    assert events[-1]["to_state"] == "CANCELLED"
    assert "cancel_requested" in corral("events", ids[0], check=True).stdout
    assert corral("cancel", "424242").returncode == 2  # no such job: bad input


def test_termination_delay_is_honoured(corral, tmp_path: Path) -> None:
    spec = write(tmp_path, "g.yaml", """
name: delayed
execution: parallel
primary_tasks: [main]
termination_delay: {default: 0s, slow: 2s}
---
name: main
run: sleep 0.5
---
name: slow
run: sleep 60
---
name: fast
run: sleep 60
""")
    proc = corral("launch", str(spec))
    assert proc.returncode == 0, proc.stderr
    events = json.loads(corral("events", "delayed", "--json", check=True).stdout)

    def at(subject: str, to_state: str) -> float:
        e = next(e for e in events if e["subject"] == subject and e["to_state"] == to_state)
        return datetime.fromisoformat(e["ts"]).timestamp()

    primary_done = at("main-0", "SUCCEEDED")
    assert 1.8 <= at("slow-0", "KILLED") - primary_done <= 3.0
    assert at("fast-0", "KILLED") - primary_done <= 1.0


def test_ctrl_c_detaches_and_the_job_keeps_running(corral, tmp_path: Path) -> None:
    release = tmp_path / "release"  # the job ends when the test says so, not after a sleep a slow CI may outlast
    run = f"echo started; while [ ! -e {release} ]; do sleep 0.1; done; echo finished"
    spec = write(tmp_path, "s.yaml", f"name: detachme\nrun: {run}\n")
    # as from a terminal: SIGINT handled (a test run in the background inherits it ignored,
    # and Python then never raises KeyboardInterrupt)
    proc = subprocess.Popen([sys.executable, "-m", "corral.cli.main", "launch", str(spec)], env=corral.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout.readline().strip() == "detachme-0 | started"
    proc.send_signal(signal.SIGINT)
    try:  # a busy CI machine can take seconds to run the exit; a hang would outlast this
        _, stderr = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"Ctrl-C did not end `corral launch`: {proc.communicate()[1]}") from None
    assert proc.returncode == 130 and "corral logs" in stderr and "keeps running" in stderr
    assert status(corral, "detachme")["state"] == "RUNNING"
    release.touch()
    wait_for(lambda: status(corral, "detachme")["state"] == "SUCCEEDED", timeout=10)
    assert corral("logs", "detachme", check=True).stdout == "started\nfinished\n"


def test_server_restart_adopts_running_replicas_and_loses_nothing(corral, tmp_path: Path) -> None:
    starts, release, go = tmp_path / "starts", tmp_path / "release", tmp_path / "go"
    long = write(tmp_path, "long.yaml", f"""
name: survivor
resources: {{accelerators: H100:4}}
num_nodes: 2
run: |
  echo $CORRAL_REPLICA >> {starts}
  while [ ! -f {release} ]; do sleep 0.05; done
  echo done $CORRAL_REPLICA
""")
    short = write(tmp_path, "short.yaml", f"name: shortlived\nrun: while [ ! -f {go} ]; do sleep 0.05; done; exit 6\n")
    queued = write(tmp_path, "queued.yaml", "name: waiter\nresources: {accelerators: H100:1}\nrun: echo waited\n")
    survivor = corral("launch", "-d", str(long), check=True).stdout.strip()
    shortlived = corral("launch", "-d", str(short), check=True).stdout.strip()
    waiter = corral("launch", "-d", str(queued), check=True).stdout.strip()
    wait_for(lambda: status(corral, survivor)["state"] == "RUNNING" and status(corral, shortlived)["state"] == "RUNNING")
    before = status(corral, survivor)
    assert status(corral, waiter)["state"] == "PENDING"
    assert "stopped" in corral("server", "stop", check=True).stdout
    assert corral("server", "status").returncode == 1
    go.touch()  # shortlived exits while no server runs
    time.sleep(0.5)
    assert "corral server" in corral("server", "start", check=True).stdout
    after = status(corral, survivor)
    assert after["state"] == "RUNNING"
    assert [r["pid"] for r in after["tasks"][0]["replicas"]] == [r["pid"] for r in before["tasks"][0]["replicas"]]
    wait_for(lambda: status(corral, shortlived)["state"] == "FAILED")
    assert status(corral, shortlived)["exit_code"] == 6  # recorded though it exited while the server was down
    assert status(corral, waiter)["state"] == "PENDING"  # still queued, not lost
    release.touch()
    wait_for(lambda: status(corral, survivor)["state"] == "SUCCEEDED", timeout=20)
    wait_for(lambda: status(corral, waiter)["state"] == "SUCCEEDED", timeout=20)
    assert sorted(starts.read_text().split()) == ["0", "1"]  # no replica started twice
    assert corral("logs", survivor, "survivor-1", check=True).stdout == "done 1\n"
    causes = [e["cause"] for e in json.loads(corral("events", survivor, "--json", check=True).stdout)]
    assert causes.count("adopted") == 2
    history = json.loads(corral("queue", "--all", "--json", check=True).stdout)
    assert {j["name"]: j["state"] for j in history} == {"survivor": "SUCCEEDED", "shortlived": "FAILED",
                                                        "waiter": "SUCCEEDED"}
    # AGE is the time since submission, ended or not (it stopped at the end: a job that ran
    # for no time showed 0s minutes after it was submitted)
    def age() -> int:
        import re

        rows = [line.split() for line in corral("queue", "--all", check=True).stdout.splitlines()[1:]]
        shown = next(row[-1] for row in rows if "shortlived" in row)
        parts = re.fullmatch(r"(?:(\d+)m)?(\d+)s", shown)
        assert parts, rows
        return int(parts[1] or 0) * 60 + int(parts[2])

    before = age()
    time.sleep(2.5)
    assert age() >= before + 2


def test_server_crash_recovers_and_reports_replicas_lost_while_down(corral, tmp_path: Path) -> None:
    release = tmp_path / "release"
    spec = write(tmp_path, "g.yaml", f"""
name: crashy
execution: parallel
primary_tasks: [main]
---
name: main
run: while [ ! -f {release} ]; do sleep 0.05; done
---
name: side
run: sleep 120
""")
    job_id = corral("launch", "-d", str(spec), check=True).stdout.strip()
    wait_for(lambda: status(corral, job_id)["state"] == "RUNNING")
    side_pid = status(corral, job_id)["tasks"][1]["replicas"][0]["pid"]
    info = json.loads((corral.home / "server.json").read_text())
    os.kill(info["pid"], signal.SIGKILL)  # a crash, not a clean stop
    wait_for(lambda: corral("server", "status").returncode == 1)
    os.killpg(side_pid, signal.SIGKILL)  # dies while no server runs, leaving no exit code
    release.touch()
    wait_for(lambda: status(corral, job_id)["state"] in ("FAILED", "SUCCEEDED"), timeout=20)
    data = status(corral, job_id)
    main, side = (t["replicas"][0] for t in data["tasks"])
    assert main["state"] == "SUCCEEDED" and main["exit_code"] == 0
    assert side["state"] == "FAILED" and side["exit_code"] is None
    assert data["state"] == "FAILED"
    causes = {(e["subject"], e["cause"]) for e in json.loads(corral("events", job_id, "--json", check=True).stdout)}
    assert ("side-0", "lost") in causes and ("main-0", "exited") in causes, sorted(causes)


def test_a_replica_killed_by_corral_at_its_grace_end_after_a_crash_is_killed_not_lost(corral, tmp_path: Path) -> None:
    """Cancelled, the server killed -9 during the grace period and started again: the replica
    it adopted is SIGKILLed at the grace end and recorded KILLED with 137, not as lost."""
    spec = write(tmp_path, "g6.yaml", "name: g6\ngrace_period: 3s\nrun: |\n  trap '' TERM\n"
                                      "  while true; do sleep 0.05; done\n")
    job_id = corral("launch", "-d", str(spec), check=True).stdout.strip()
    wait_for(lambda: status(corral, job_id)["state"] == "RUNNING")
    corral("cancel", job_id, check=True)
    info = json.loads((corral.home / "server.json").read_text())
    os.kill(info["pid"], signal.SIGKILL)
    wait_for(lambda: corral("server", "status").returncode == 1)
    corral("server", "start", check=True)
    wait_for(lambda: status(corral, job_id)["state"] == "CANCELLED", timeout=30)
    replica = status(corral, job_id)["tasks"][0]["replicas"][0]
    assert replica["state"] == "KILLED" and replica["exit_code"] == 137, replica
    told = [e["message"] or "" for e in json.loads(corral("events", job_id, "--json", check=True).stdout)]
    assert not any("while corral was down" in m for m in told), told


def test_daily_habits_hold_release_requeue_cancel_filters_and_tail(corral, tmp_path: Path) -> None:
    spin = write(tmp_path, "spin.yaml", "resources: {accelerators: H100:1}\nrun: |\n"
                                        "  for i in $(seq 1 30); do echo tick $i; done\n  trap 'exit 0' TERM\n"
                                        "  while true; do sleep 0.05; done\n")
    held = corral("launch", "-d", "-H", "--name", "parked", str(spin), check=True).stdout.strip()
    queue = corral("queue", check=True).stdout.splitlines()  # piped: tab-separated with a header
    assert queue[0].split("\t")[:5] == ["ID", "NAME", "USER", "PARTITION", "STATE"]
    row = next(line.split("\t") for line in queue[1:] if line.split("\t")[0] == held)
    assert row[4] == "PENDING" and row[5] == "JobHeldUser"
    assert corral("release", held, check=True).stdout.strip() == f"Job {held} released"
    wait_for(lambda: status(corral, held)["state"] == "RUNNING")
    wait_for(lambda: "tick 30" in corral("logs", held).stdout)
    assert corral("logs", held, "--tail", "2", check=True).stdout.splitlines() == ["tick 29", "tick 30"]
    assert corral("requeue", held, check=True).stdout.strip() == f"Job {held} requeueing"
    wait_for(lambda: (lambda d: d["state"] == "RUNNING" and d["requeues"] == 1)(status(corral, held)), timeout=30)
    refused = corral("hold", held)
    assert refused.returncode == 1 and "only a pending job can be held" in refused.stderr
    others = [corral("launch", "-d", "--name", f"other{i}", str(spin), check=True).stdout.strip() for i in range(2)]
    wait_for(lambda: all(status(corral, j)["state"] == "RUNNING" for j in others))
    nothing = corral("cancel", "-u", "nobody-here")
    assert nothing.returncode == 0 and "no active job matches" in nothing.stderr
    bulk = corral("cancel", "-u", status(corral, held)["user"], "--state", "running", "-n", "other1", check=True)
    assert bulk.stdout.strip() == f"Job {others[1]}: cancelling"
    wait_for(lambda: status(corral, others[1])["state"] == "CANCELLED")
    assert status(corral, others[0])["state"] == "RUNNING"
    corral("cancel", "--state", "RUNNING", check=True)
    wait_for(lambda: all(status(corral, j)["state"] == "CANCELLED" for j in (held, others[0])))
    usage = corral("cancel")
    assert usage.returncode == 2 and "-u/-t/-n/-p" in usage.stderr


def test_acct_lists_times_exit_codes_and_gpu_hours(corral, tmp_path: Path) -> None:
    ok = corral("launch", "-d", "--name", "ok", str(write(tmp_path, "ok.yaml",
                "resources: {accelerators: H100:2}\nrun: sleep 1\n")), check=True).stdout.strip()
    bad = corral("launch", "-d", "--name", "bad", str(write(tmp_path, "bad.yaml", "run: exit 3\n")), check=True).stdout.strip()
    wait_for(lambda: status(corral, ok)["state"] == "SUCCEEDED" and status(corral, bad)["state"] == "FAILED")
    import csv
    import io

    rows = {r["id"]: r for r in csv.DictReader(io.StringIO(corral("acct", "--format", "csv", check=True).stdout))}
    assert set(rows) == {ok, bad}
    assert rows[ok]["state"] == "SUCCEEDED" and rows[ok]["exit_code"] == "0" and rows[ok]["gpus"] == "2"
    elapsed = float(rows[ok]["elapsed_s"])
    assert 0.9 <= elapsed < 10
    assert abs(float(rows[ok]["gpu_hours"]) - 2 * elapsed / 3600) < 1e-3
    assert rows[bad]["state"] == "FAILED" and rows[bad]["exit_code"] == "3" and rows[bad]["gpu_hours"] == "0.0"
    failed = json.loads(corral("acct", "-s", "failed", "--json", check=True).stdout)
    assert [r["id"] for r in failed] == [int(bad)]
    assert json.loads(corral("acct", "-S", "now-1d", "-E", "now", "--json", check=True).stdout) != []
    assert json.loads(corral("acct", "-S", "2000-01-01", "-E", "2000-01-02", "--json", check=True).stdout) == []
    assert json.loads(corral("acct", "-u", "nobody", "--json", check=True).stdout) == []
    piped = corral("acct", check=True).stdout.splitlines()
    assert piped[0].split("\t")[:6] == ["ID", "NAME", "USER", "ACCOUNT", "PARTITION", "STATE"]
    garbage = corral("acct", "-S", "yesterday-ish")
    assert garbage.returncode == 2 and "--starttime" in garbage.stderr
    backwards = corral("acct", "-S", "now", "-E", "now-1d")
    assert backwards.returncode == 2 and "--endtime" in backwards.stderr


def test_expected_starts_and_the_pending_line_of_launch(corral, tmp_path: Path) -> None:
    hog = corral("launch", "-d", "-t", "6s", "--name", "hog", str(write(tmp_path, "hog.yaml",
                 "num_nodes: 2\nresources: {accelerators: H100:4}\nrun: sleep 60\n")), check=True).stdout.strip()
    wait_for(lambda: status(corral, hog)["state"] == "RUNNING")
    started = time.time()
    waiter = write(tmp_path, "waiter.yaml", "resources: {accelerators: H100:4}\nrun: echo finally\n")
    done = corral("launch", "--name", "waiter", str(waiter), timeout=60)  # blocks: pending, then runs
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "pending" in line]
    assert lines and "(Resources)" in lines[0] and "expected start" in lines[0], done.stderr
    assert "waiter-0 | finally" in done.stdout
    assert time.time() - started >= 3  # it waited for the hog's time limit
    # the same estimate through queue --start while a job waits behind a limited one
    corral("launch", "-d", "-t", "10m", "--name", "hog2", str(write(tmp_path, "hog2.yaml",
           "num_nodes: 2\nresources: {accelerators: H100:4}\nrun: sleep 60\n")), check=True)
    wait_for(lambda: status(corral, "hog2")["state"] == "RUNNING")
    late = corral("launch", "-d", "--name", "late", str(waiter), check=True).stdout.strip()

    def estimate():
        job = status(corral, late)
        return job["expected_start"]

    expected = datetime.fromisoformat(wait_for(estimate))
    assert 500 < expected.timestamp() - time.time() <= 600
    rows = corral("queue", "--start", check=True).stdout.splitlines()
    assert rows[0].split("\t")[:6] == ["ID", "NAME", "USER", "PARTITION", "STATE", "START_TIME"]
    (row,) = [r.split("\t") for r in rows[1:]]
    assert row[0] == late and row[5] != "N/A"
    corral("cancel", "--state", "RUNNING", "--state", "PENDING", check=True)


def test_slurm_habits_minutes_short_states_requeue_hold(corral, tmp_path: Path) -> None:
    spin = write(tmp_path, "spin.yaml", "run: |\n  trap 'exit 0' TERM\n  while true; do sleep 0.05; done\n")
    job = corral("launch", "-d", "-t", "5", str(spin), check=True).stdout.strip()
    assert status(corral, job)["time_limit"] == 300  # sbatch -t 5: five minutes
    wait_for(lambda: status(corral, job)["state"] == "RUNNING")
    assert corral("requeue", "--hold", job, check=True).stdout.strip() == f"Job {job} requeueing"
    wait_for(lambda: (lambda d: d["state"] == "PENDING" and d["reason"] == "JobHeldUser")(status(corral, job)), timeout=20)
    pending = corral("logs", job)
    assert pending.returncode == 0 and "pending (JobHeldUser)" in pending.stderr
    short = json.loads(corral("acct", "-s", "PD,R", "--json", check=True).stdout)
    assert [r["id"] for r in short] == [int(job)]
    assert corral("acct", "-s", "XX").returncode == 2
    assert corral("hold", "424242").returncode == 2 and corral("release", job, check=True).returncode == 0
    wait_for(lambda: status(corral, job)["state"] == "RUNNING")
    assert corral("cancel", "-t", "R", check=True).stdout.strip() == f"Job {job}: cancelling"
    wait_for(lambda: status(corral, job)["state"] == "CANCELLED")
    status_text = corral("status", job, check=True).stdout
    assert any(line.startswith("REPLICA\t") and "GPU IDS" in line for line in status_text.splitlines())


def test_every_command_says_a_bad_config_yaml_in_sentences_not_a_traceback(corral, tmp_path: Path) -> None:
    config = corral.home / "config.yaml"
    config.write_text("nodes: [{name: a, gpus: -1}]\npartitions: 3\n")
    job = write(tmp_path, "job.yaml", "name: j\nrun: echo hi\n")
    script = write(tmp_path, "job.sh", "#!/bin/bash\n#SBATCH -J j\necho hi\n")
    commands = [["queue"], ["launch", str(job)], ["launch", "-d", str(job)], ["launch", str(script)],
                ["sbatch", str(script)], ["status", "1"], ["logs", "1"], ["cancel", "1"], ["hold", "1"],
                ["update", "1", "--nice", "3"], ["scale", "1", "t", "2"], ["token", "list"], ["dashboard"],
                ["server", "start"]]
    for command in commands:
        done = corral(*command)
        assert done.returncode == 2, (command, done.returncode, done.stderr)
        assert "Traceback" not in done.stderr and done.stdout == "", (command, done.stderr)
        assert done.stderr.splitlines() == [
            f"error: {config} is not valid, so the corral server cannot start",
            "  line 1: config: nodes[0].gpus: Input should be greater than or equal to 0",
            "  line 2: config: partitions: Input should be a valid list"], command
    assert not (corral.home / "server.json").exists()
    # fixed, the same commands reach the server it starts
    config.write_text("nodes: [{name: a, cpus: 2, memory: 4}]\n")
    assert corral("launch", str(job)).returncode == 0


def test_queue_shows_the_running_jobs_and_the_first_pending_ones_with_a_line_on_the_rest(corral, tmp_path: Path) -> None:
    from corral.client import Client
    from corral.credentials import read_local_token

    runs = corral("launch", "-d", str(write(tmp_path, "runs.yaml", "name: runs\nrun: sleep 60\n")), check=True)
    job_id = runs.stdout.strip()
    wait_for(lambda: status(corral, job_id)["state"] == "RUNNING")
    url = json.loads((corral.home / "server.json").read_text())["url"]
    with Client(url, read_local_token(corral.home)) as client:
        for i in range(150):
            client.submit(f"name: waits{i}\nrun: 'true'\n", scheduling={"hold": True})
    shown = corral("queue", check=True)
    header, *rows = shown.stdout.splitlines()
    assert header.split("\t")[:5] == ["ID", "NAME", "USER", "PARTITION", "STATE"]
    assert [r.split("\t")[4] for r in rows] == ["RUNNING"] + ["PENDING"] * 100
    assert rows[1].split("\t")[1] == "waits0" and rows[-1].split("\t")[1] == "waits99"  # the oldest first
    assert shown.stderr.strip() == ("151 live jobs: 1 running, 150 pending (150 held); the first 100 pending shown, "
                                    "50 more not (corral queue --all lists every one; --json too, for scripts)")
    every = corral("queue", "--all", check=True)
    assert len(every.stdout.splitlines()) == 152 and every.stderr == ""
    assert len(json.loads(corral("queue", "--json", check=True).stdout)) == 151
    mine = corral("queue", "-u", "nobody", check=True)
    assert mine.stdout.splitlines()[1:] == [] and mine.stderr == ""
    corral("cancel", "-t", "PD", check=True)
    corral("cancel", job_id, check=True)
