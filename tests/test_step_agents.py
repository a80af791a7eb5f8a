"""A batch script's ``srun`` steps on the local executor run each task where Slurm would: a
task of node 2 inside node 2's holder replica (its host name, address and cgroup), not in the
batch script's. Signals reach each task once; a task outlives neither its ``srun`` nor its job;
and only the job's own account can reach a holder's agent."""

from __future__ import annotations

import json
import os
import signal
import stat
import time
from pathlib import Path

import psutil
import pytest

from conftest import cli_for, shared_account, wait_for

NODES = """
nodes:
  - {name: n1, gpus: 2, gpu_type: H100, cpus: 4, memory: 16}
  - {name: n2, gpus: 2, gpu_type: H100, cpus: 4, memory: 16}
"""


@pytest.fixture
def corral(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(NODES + shared_account(NODES))
    run = cli_for(home, cwd=tmp_path, timeout=120)
    yield run
    run.stop()


def _status(corral, job: str) -> dict:
    return json.loads(corral("status", job, "--json", check=True).stdout)


def _replicas(data: dict) -> dict[str, dict]:
    return {f"{t['name']}-{r['rank']}": r for t in data["tasks"] for r in t["replicas"]}


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_each_task_runs_in_its_node_s_holder(corral, tmp_path: Path) -> None:
    script = tmp_path / "where.sbatch"
    script.write_text(f"""#!/bin/bash
#SBATCH -J where -N2 --ntasks-per-node=1 --gpus-per-node=1
srun -l bash -c 'echo "host=$(hostname) node=$SLURMD_NODENAME addr=$CORRAL_ADDR task=$CORRAL_TASK \\
cg=$(grep ^0:: /proc/self/cgroup | cut -d: -f3) rank=$SLURM_PROCID"' | sort > {tmp_path}/where.out
srun bash -c 'exit $((SLURM_PROCID * 5))'
echo "exit $?" >> {tmp_path}/where.out
""")
    job = corral("sbatch", "--parsable", str(script), check=True).stdout.strip()
    running = wait_for(lambda: (s := _status(corral, job))["state"] in ("SUCCEEDED", "FAILED") and s, timeout=60)
    assert running["state"] == "SUCCEEDED", running
    lines = (tmp_path / "where.out").read_text().splitlines()
    assert lines[-1] == "exit 5"  # the highest task exit code, the remote task's
    assert f"srun: error: {_replicas(running)['node-0']['node']}: task 1: Exited with exit code 5" \
        in corral("logs", job, check=True).stdout  # which task failed, and how, as Slurm's srun says
    tasks = [dict(w.split("=", 1) for w in line.split(": ", 1)[1].split()) for line in lines[:-1]]
    replicas = _replicas(running)
    batch, holder = replicas["batch-0"], replicas["node-0"]
    assert [t["node"] for t in tasks] == [batch["node"], holder["node"]]
    assert [t["host"] for t in tasks] == [batch["node"], holder["node"]]  # as on Slurm: the node's name
    assert [t["task"] for t in tasks] == ["batch", "node"]
    assert tasks[0]["addr"] != tasks[1]["addr"]
    cgroups = [t["cg"] for t in tasks]
    if all(cgroups):  # where the server has cgroups: each task is in its own replica's
        assert cgroups[0].endswith(".batch.0.a1") and cgroups[1].endswith(".node.0.a1"), cgroups


def test_a_cancel_signals_each_task_once_and_leaves_nothing(corral, tmp_path: Path) -> None:
    script = tmp_path / "traps.sbatch"
    script.write_text(f"""#!/bin/bash
#SBATCH -J traps -N2 --ntasks-per-node=1
srun bash -c 'trap "echo TERM >> {tmp_path}/term.\\$SLURM_PROCID; exit 0" TERM
echo $$ > {tmp_path}/pid.$SLURM_PROCID; while :; do sleep 0.1; done'
""")
    job = corral("sbatch", "--parsable", str(script), check=True).stdout.strip()
    wait_for(lambda: all((tmp_path / f"pid.{r}").exists() for r in (0, 1)), timeout=60)
    pids = [int((tmp_path / f"pid.{r}").read_text()) for r in (0, 1)]
    assert corral("cancel", job, timeout=60).returncode == 0
    wait_for(lambda: _status(corral, job)["state"] == "CANCELLED", timeout=60)
    wait_for(lambda: all(_gone(p) for p in pids), timeout=20)
    # the TERM came through srun to each task, once (not again from its holder's own stop)
    assert [(tmp_path / f"term.{r}").read_text() for r in (0, 1)] == ["TERM\n", "TERM\n"]


def test_a_task_ends_with_its_srun(corral, tmp_path: Path) -> None:
    script = tmp_path / "orphan.sbatch"
    script.write_text(f"""#!/bin/bash
#SBATCH -J orphan -N2 --ntasks-per-node=1
srun -N1 -w "$(scontrol show hostnames "$SLURM_JOB_NODELIST" | tail -n1)" \\
  bash -c 'echo $$ > {tmp_path}/remote.pid; exec sleep 300' &
echo $! > {tmp_path}/srun.pid
wait
echo "srun ended $?" > {tmp_path}/after
sleep 300
""")
    job = corral("sbatch", "--parsable", str(script), check=True).stdout.strip()
    wait_for(lambda: (tmp_path / "remote.pid").exists() and (tmp_path / "srun.pid").exists(), timeout=60)
    remote = int((tmp_path / "remote.pid").read_text())
    holder = _replicas(_status(corral, job))["node-0"]
    assert holder["pid"] in [p.pid for p in psutil.Process(remote).parents()]  # a child of node 2's holder
    os.kill(int((tmp_path / "srun.pid").read_text()), signal.SIGKILL)
    wait_for(lambda: _gone(remote), timeout=20)  # as Slurm ends a step whose srun is gone
    wait_for(lambda: (tmp_path / "after").exists(), timeout=20)
    assert _status(corral, job)["state"] == "RUNNING"  # the job lives on: only the step ended
    assert corral("cancel", job, timeout=60).returncode == 0


def test_only_the_job_s_account_reaches_a_holder_s_agent(corral, tmp_path: Path) -> None:
    script = tmp_path / "hold.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH -J hold -N2\nsleep 300\n")
    job = corral("sbatch", "--parsable", str(script), check=True).stdout.strip()
    holder = wait_for(lambda: (r := _replicas(_status(corral, job))["node-0"])["pid"] and r, timeout=60)
    env = psutil.Process(holder["pid"]).environ()
    directory = Path(env["CORRAL_STEP_AGENTS"])
    sock = wait_for(lambda: (p := directory / f"{holder['node']}.sock").exists() and p, timeout=30)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700 and stat.S_IMODE(sock.stat().st_mode) == 0o600
    if os.geteuid() == 0:  # another account cannot even reach the socket
        child = os.fork()
        if child == 0:
            code = 1
            try:
                os.setgid(65534)
                os.setuid(65534)
                import socket

                s = socket.socket(socket.AF_UNIX)
                try:
                    s.connect(str(sock))
                except PermissionError:
                    code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    assert corral("cancel", job, timeout=60).returncode == 0
    wait_for(lambda: _status(corral, job)["state"] == "CANCELLED", timeout=60)
    time.sleep(0.5)
    assert not sock.exists() or not directory.exists()  # the agent removed its socket (or the job its files)


def test_a_step_for_a_node_whose_holder_ended_fails_and_never_runs_elsewhere(corral, tmp_path: Path) -> None:
    """Cancelled, a script that traps the stop and goes on starting a step: node 2's holder has
    ended, so its task fails at once, never runs in the batch replica with node 2's name (and
    GPUs that may be another job's by now)."""
    script = tmp_path / "late.sbatch"
    script.write_text(f"""#!/bin/bash
#SBATCH -J late -N2 --ntasks-per-node=1
trap 'echo stopped > {tmp_path}/stopped' TERM
touch {tmp_path}/up
while [ ! -e {tmp_path}/stopped ]; do sleep 0.1; done
srun -N1 -w "$(scontrol show hostnames "$SLURM_JOB_NODELIST" | tail -n1)" touch {tmp_path}/ran
echo "srun exit $?" > {tmp_path}/after
""")
    job = corral("sbatch", "--parsable", str(script), check=True).stdout.strip()
    wait_for(lambda: (tmp_path / "up").exists(), timeout=60)
    holder = wait_for(lambda: (r := _replicas(_status(corral, job))["node-0"])["state"] == "RUNNING" and r, timeout=30)
    started = time.monotonic()
    assert corral("cancel", job, timeout=60).returncode == 0
    wait_for(lambda: (tmp_path / "after").exists(), timeout=25)
    assert time.monotonic() - started < 9  # not after srun's wait for a holder that may still come
    assert (tmp_path / "after").read_text() == "srun exit 1\n"
    assert not (tmp_path / "ran").exists()
    wait_for(lambda: _status(corral, job)["state"] == "CANCELLED", timeout=60)
    log = corral("logs", job, check=True).stdout
    assert f"srun: error: {holder['node']}: task 0: its holder on {holder['node']} has ended" in log, log
