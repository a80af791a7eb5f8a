"""corral on a real Slurm (the slurm-lab: Slurm 22.05, 4 nodes x 8 fake H100s, started by
.ci/run): a job group as one Slurm job (names, readiness, a killed replica restarted as a new
step, a server restart adopting the steps, cancel ending the Slurm job, Slurm's pending reason,
Slurm's time-limit signal reaching a replica) and a corral server inside an sbatch allocation
running several jobs. Skipped, with the reason, only where no Slurm answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import cli_for, wait_for
from slurm_env import slurm_env



ENV = slurm_env()


def _why_no_slurm() -> str | None:
    os.environ.setdefault("SLURM_CONF", ENV.get("SLURM_CONF", ""))
    from corral.executors.slurm.cli import available

    reason = available(timeout=5)  # a controller that does not answer fails fast, not after Slurm's own timeout
    if reason is None:
        out = subprocess.run(["sinfo", "-h", "-o", "%D %G"], capture_output=True, text=True, env=ENV).stdout
        nodes = sum(int(line.split()[0]) for line in out.splitlines() if line.split() and "gpu" in line)
        if nodes < 4:
            reason = f"the Slurm lab has {nodes} GPU nodes; these tests need 4 (NODES=4 ./start-slurm.sh)"
    return reason


@pytest.fixture(autouse=True, scope="module")
def usable_slurm() -> None:
    """Asked when the first test of the module runs, never while tests are collected."""
    why = _why_no_slurm()
    if why is not None:
        pytest.skip(f"no usable Slurm here: {why}")

SITE = """
partitions:
  - {name: here, nodes: ["*"]}
  - {name: gpu, infra: slurm, slurm_partition: gpu}
"""

RL_GROUP = """
name: rl
execution: parallel
primary_tasks: [trainer]
---
name: trainer
num_nodes: 2
resources: {accelerators: H100:8}
depends_on: [{task: reward}]   # starts once the reward service is ready
run: |
  echo "trainer $CORRAL_REPLICA step=$SLURM_JOB_ID.$SLURM_STEP_ID gpus=$CUDA_VISIBLE_DEVICES"
  getent hosts reward-0.rl
  python3 -c "import urllib.request; urllib.request.urlopen('http://reward-0.rl:8000/'); print('reward answered')"
  sleep 600
---
name: rollout
num_nodes: 2
resources: {accelerators: H100:4}
restart: {policy: always, backoff: {initial: 0.1s}}
run: echo "rollout $CORRAL_REPLICA step=$SLURM_STEP_ID gpus=$CUDA_VISIBLE_DEVICES"; sleep 600
---
name: reward
resources: {accelerators: H100:1}
ports: {http: 8000}
readiness_probe: {http: {path: /, port: http}, period: 0.5s}
run: exec python3 -m http.server $CORRAL_PORT_HTTP
---
name: buffer
run: echo buffer; sleep 600
"""


# Slurm jobs this test process submits by hand are named under this prefix, so a clean-up
# cancels them and never another run's (other agents and test runs share the lab).
OWN = f"ctest-{os.getpid()}-"


def _cancel_ours(home: Path | None = None) -> None:
    """Cancel this process's own Slurm jobs: those it submitted by hand, and those the corral
    server of ``home`` submitted (named under its scope)."""
    prefixes = [OWN]
    if home is not None:
        from corral.executors import scope_of
        from corral.settings import Settings

        prefixes.append(f"corral-{scope_of(Settings(home=home, db_url='sqlite://'))}-")
    out = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True, env=ENV).stdout
    ids = [line.split()[0] for line in out.splitlines() if line.split()[1:] and
           line.split()[1].startswith(tuple(prefixes))]
    if ids:
        subprocess.run(["scancel", *ids], env=ENV, capture_output=True)
        wait_for(lambda: not _squeue_ids(ids), timeout=30)


def _squeue_ids(ids: list[str]) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, env=ENV).stdout.split()
    return [i for i in ids if i in out]


def _steps(slurm_id: str) -> dict[str, str]:
    out = subprocess.run(["squeue", "--steps", "-h", "-o", "%i %j", "-j", slurm_id], capture_output=True, text=True,
                         env=ENV).stdout
    return {line.split()[1]: line.split()[0] for line in out.splitlines() if len(line.split()) == 2}


@pytest.fixture
def slurm_home(tmp_path: Path):
    """A CORRAL_HOME (on the filesystem the lab's nodes share with us) whose site has a
    Slurm partition; the server is started by the CLI and stopped after."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(SITE)
    run = cli_for(home, {k: v for k, v in ENV.items() if k != "SLURM_JOB_ID"})
    run.env.pop("SLURM_JOB_ID", None)

    def corral(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        return run(*args, check=check, timeout=timeout)

    corral.home, corral.env = home, run.env
    yield corral
    run.stop()
    _cancel_ours(home)


def _job(corral, job_id: str) -> dict:
    job = json.loads(corral("status", job_id, "--json").stdout)
    job["replicas"] = [{**r, "task": t["name"]} for t in job["tasks"] for r in t["replicas"]]
    return job


def _slurm_job_of(corral, job_id: str) -> str:
    out = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True, env=ENV).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].startswith("corral-") and parts[1].endswith(f"-{job_id}"):
            return parts[0]
    raise AssertionError(f"no Slurm job for corral job {job_id}: {out}")


def test_job_group_runs_as_one_slurm_job(slurm_home, tmp_path):
    corral = slurm_home
    spec = tmp_path / "rl.yaml"
    spec.write_text(RL_GROUP)
    job_id = corral("launch", "--slurm", "-d", str(spec)).stdout.strip()

    def all_ready():
        job = _job(corral, job_id)
        reps = job["replicas"]
        return job["state"] == "RUNNING" and all(r["state"] == "RUNNING" for r in reps) and \
            next(r for r in reps if r["task"] == "reward")["ready"] and job
    job = wait_for(all_ready, timeout=60, interval=0.5)
    slurm_id = _slurm_job_of(corral, job_id)
    info = subprocess.run(["squeue", "-h", "-j", slurm_id, "-o", "%D %T"], capture_output=True, text=True,
                          env=ENV).stdout.split()
    assert info == ["4", "RUNNING"]  # 2 trainers on 2 nodes, 2 rollouts on one, reward + buffer on one
    # every replica is a Slurm step named after its attempt, on the node corral chose
    steps = wait_for(lambda: (s := _steps(slurm_id)) and len([n for n in s if n.startswith("corral-")]) == 6 and s,
                     timeout=30, interval=0.5)
    for r in job["replicas"]:  # named {scope}-{job}.{task}.{rank}.a{attempt}
        assert any(f"-{job_id}.{r['task']}.{r['rank']}.a1" in name for name in steps), steps
    nodes = {r["node"] for r in job["replicas"]}
    assert all(n.startswith(f"s{slurm_id}-gpu") for n in nodes)
    # names resolve on the nodes for programs other than Python, and readiness gated the group
    logs = wait_for(lambda: (out := corral("logs", job_id).stdout).count("reward answered") == 2 and out,
                    timeout=30, interval=0.5)
    assert "reward-0.rl" in logs
    gpus = {line.split("gpus=")[1] for line in logs.splitlines() if "trainer " in line and "gpus=" in line}
    assert gpus == {"0,1,2,3,4,5,6,7"}  # Slurm's GRES binding: each trainer has its node's 8 GPUs

    # a killed replica is restarted as a new step, on the same node, under the same name
    rollout = next(r for r in job["replicas"] if r["task"] == "rollout" and r["rank"] == 0)
    old = next(sid for name, sid in steps.items() if ".rollout.0.a" in name)
    subprocess.run(["scancel", "--signal=KILL", old], env=ENV, check=True)

    def restarted():
        r = next(x for x in _job(corral, job_id)["replicas"] if x["task"] == "rollout" and x["rank"] == 0)
        return r["restarts"] >= 1 and r["state"] == "RUNNING" and r
    again = wait_for(restarted, timeout=30, interval=0.5)
    assert again["node"] == rollout["node"] and again["hostname"] == rollout["hostname"]
    new_steps = wait_for(lambda: (s := _steps(slurm_id)) and any(".rollout.0.a2" in n for n in s) and s,
                         timeout=30, interval=0.5)
    assert old not in new_steps.values()

    # a server restart adopts the running steps and starts nothing twice
    before = {n: s for n, s in new_steps.items() if n.startswith("corral-")}
    corral("server", "stop")
    time.sleep(1)
    corral("server", "start")
    time.sleep(4)
    after = {n: s for n, s in _steps(slurm_id).items() if n.startswith("corral-")}
    assert after == before
    assert _job(corral, job_id)["state"] == "RUNNING"

    # cancel ends the Slurm job
    corral("cancel", job_id)
    wait_for(lambda: _job(corral, job_id)["state"] == "CANCELLED", timeout=40, interval=0.5)
    wait_for(lambda: not _squeue_ids([slurm_id]), timeout=30, interval=0.5)


def test_pending_in_slurm_shows_slurms_reason_and_cancel_withdraws_it(slurm_home, tmp_path):
    corral = slurm_home
    blocker = subprocess.run(["sbatch", "--parsable", "-J", f"{OWN}blocker", "-N4", "--exclusive", "-t", "5",
                              "-o", str(tmp_path / "blocker-%j.out"), "--wrap", "sleep 300"], capture_output=True, text=True, env=ENV, check=True).stdout.strip()
    wait_for(lambda: subprocess.run(["squeue", "-h", "-j", blocker, "-o", "%T"], capture_output=True, text=True,
                                    env=ENV).stdout.strip() == "RUNNING", timeout=30)
    spec = tmp_path / "one.yaml"
    spec.write_text("name: waits\nresources: {accelerators: H100:8}\nrun: echo hi\n")
    job_id = corral("launch", "--slurm", "-d", str(spec)).stdout.strip()
    queue = wait_for(lambda: (q := [j for j in json.loads(corral("queue", "--json").stdout) if str(j["id"]) == job_id])
                     and q[0]["reason"] in ("Resources", "Priority") and q[0], timeout=30, interval=0.5)
    assert queue["state"] == "PENDING"
    table = corral("queue").stdout
    assert "PENDING" in table and queue["reason"] in table
    slurm_id = _slurm_job_of(corral, job_id)
    corral("cancel", job_id)
    wait_for(lambda: not _squeue_ids([slurm_id]), timeout=30, interval=0.5)
    assert _job(corral, job_id)["state"] == "CANCELLED"
    subprocess.run(["scancel", blocker], env=ENV)


def test_slurm_time_limit_signal_reaches_the_replica(slurm_home, tmp_path):
    corral = slurm_home
    marker = tmp_path / "signalled"
    spec = tmp_path / "sig.yaml"
    spec.write_text(textwrap.dedent(f"""\
        name: sig
        grace_period: 50s
        run: |
          trap 'echo "got TERM" > {marker}; exit 0' TERM
          echo started
          while true; do sleep 0.2; done
        """))
    job_id = corral("launch", "--slurm", "-d", str(spec)).stdout.strip()
    wait_for(lambda: _job(corral, job_id)["state"] == "RUNNING", timeout=30, interval=0.5)
    slurm_id = _slurm_job_of(corral, job_id)
    # an administrator shortens the Slurm job's limit to one minute: Slurm signals every step
    # its grace period (50 s) before the limit, that is about now
    subprocess.run(["scontrol", "update", f"JobId={slurm_id}", "TimeLimit=1"], env=ENV, check=True)
    wait_for(marker.exists, timeout=75, interval=0.5)
    assert marker.read_text().strip() == "got TERM"
    wait_for(lambda: _job(corral, job_id)["state"] in ("SUCCEEDED", "CANCELLED", "FAILED"), timeout=90, interval=1)


INSIDE = """#!/bin/bash
#SBATCH -J {own}inside -N 2 --gres=gpu:8 --exclusive -t 10
set -e
export CORRAL_HOME={home}
corral server start
for i in 1 2 3; do corral launch -d --name job$i {spec}; done
corral launch -d --name slow {slow}
sleep 3
corral server stop        # restarted inside the allocation: running steps are adopted
corral server start
for i in 1 2 3 4; do
  until corral status $i --json | python3 -c "import json,sys; sys.exit(json.load(sys.stdin)['state'] not in ('SUCCEEDED','FAILED','CANCELLED'))"; do sleep 0.5; done
done
corral nodes > {nodes}
corral queue -a --json > {out}.part && mv {out}.part {out}
corral server stop
"""


def test_corral_server_inside_an_sbatch_allocation(tmp_path):
    home = tmp_path / "home"
    spec = tmp_path / "job.yaml"
    spec.write_text(textwrap.dedent(f"""\
        num_nodes: 2
        resources: {{accelerators: H100:4}}
        run: echo "$CORRAL_REPLICA on $SLURMD_NODENAME step $SLURM_STEP_ID gpus $CUDA_VISIBLE_DEVICES" >> {tmp_path}/ran
        """))
    slow = tmp_path / "slow.yaml"
    slow.write_text(f"run: echo start >> {tmp_path}/slow; sleep 8; echo end >> {tmp_path}/slow\n")
    out, nodes = tmp_path / "queue.json", tmp_path / "nodes.txt"
    script = INSIDE.format(own=OWN, home=home, spec=spec, slow=slow, out=out, nodes=nodes)
    env = {k: v for k, v in ENV.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
    slurm_id = subprocess.run(["sbatch", "--parsable", f"--output={tmp_path}/batch.out"], input=script,
                              capture_output=True, text=True, env=env, check=True).stdout.strip()
    try:
        wait_for(out.exists, timeout=120, interval=1)
        time.sleep(0.5)
    finally:
        subprocess.run(["scancel", slurm_id], env=ENV)
    jobs = json.loads(out.read_text())
    assert sorted(j["state"] for j in jobs) == ["SUCCEEDED"] * 4, (tmp_path / "batch.out").read_text()
    ran = (tmp_path / "ran").read_text().splitlines()
    assert len(ran) == 6  # 3 jobs x 2 replicas, each once
    assert all(" step " in line and line.split(" step ")[1].split()[0].isdigit() for line in ran)
    assert {line.split(" on ")[1].split()[0] for line in ran} <= {"gpu001", "gpu002", "gpu003", "gpu004"}
    assert (tmp_path / "slow").read_text().split() == ["start", "end"]  # adopted, not started twice
    table = nodes.read_text()
    assert "slurm" in table and table.count("\tUP\t") == 2


CORPUS = Path(__file__).parent / "data" / "sbatch"


@pytest.fixture
def corpus(slurm_home, tmp_path):
    """The sbatch corpus (tests/data/sbatch) copied to a work directory the nodes share."""
    import shutil

    work = tmp_path / "work"
    shutil.copytree(CORPUS, work)

    def launch(script: str, *options: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "corral.cli.main", "launch", "--slurm", *options, script],
                              env=slurm_home.env, cwd=work, capture_output=True, text=True, timeout=120)
    launch.work, launch.corral = work, slurm_home
    return launch


def test_sbatch_scripts_run_unchanged_on_slurm(corpus):
    # a multi-node script's srun spans the job's nodes with Slurm's own srun and variables
    proc = corpus("multi_srun.sbatch")
    lines = (corpus.work / "multi.tasks").read_text().splitlines()
    assert len(lines) == 4, proc.stdout + proc.stderr
    tasks = [dict(w.split("=") for w in line.split(": ", 1)[1].split()) for line in lines]
    assert sorted(t["rank"] for t in tasks) == ["0", "1", "2", "3"]
    assert {t["ntasks"] for t in tasks} == {"4"}
    hosts = {t["host"] for t in tasks}
    assert len(hosts) == 2 and hosts <= {"gpu001", "gpu002", "gpu003", "gpu004"}
    for t in tasks:  # Slurm bound one GPU per task (--gpus-per-task=1)
        assert len(t["gpus"].split(",")) == 1 and t["node"] == str(int(t["rank"]) // 2)
    last = (corpus.work / "multi.last").read_text().splitlines()
    assert last[0].split()[0] in hosts and last[1] == "srun exit 4"  # srun's exit code: the highest task's
    assert proc.returncode == 0  # the script itself ended 0

    # the OpenRLHF/veRL launcher shape: a Ray head on the first node, workers on the others
    proc = corpus("ray_cluster.sbatch")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    joined = (corpus.work / "ray.status").read_text().splitlines()
    assert len(joined) == 3 and len({line.split()[0] for line in joined}) == 3
    assert "driver done" in proc.stdout


def test_sbatch_array_on_slurm_keeps_its_throttle(corpus):
    proc = corpus("array.sbatch")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    spans = []
    for index in range(6):
        array_id, task, _, start, end = (corpus.work / f"sweep.{index}").read_text().split()
        assert task == str(index)
        spans.append((float(start), float(end)))
    for start, _ in spans:  # %2: never more than two elements at once
        assert sum(1 for s, e in spans if s <= start < e) <= 2


def test_a_job_slurm_requeues_is_requeued_by_corral_under_the_same_id(slurm_home, tmp_path):
    corral = slurm_home
    spec = tmp_path / "rq.yaml"
    spec.write_text("name: rq\nresources: {accelerators: H100:1}\nrun: sleep 300\n")
    job_id = corral("launch", "--slurm", "-d", str(spec)).stdout.strip()
    wait_for(lambda: _job(corral, job_id)["state"] == "RUNNING", timeout=30, interval=0.5)
    slurm_id = _slurm_job_of(corral, job_id)
    subprocess.run(["scontrol", "requeue", slurm_id], env=ENV, check=True)
    # the replica is lost with the requeue (not failed), the job pending again with Slurm's reason,
    # waiting for the same Slurm job rather than a new one
    job = wait_for(lambda: (j := _job(corral, job_id))["state"] == "PENDING" and j["requeues"] == 1 and j,
                   timeout=30, interval=0.5)
    assert job["reason"] not in (None, "Resources")  # Slurm's own (BeginTime while it waits out the requeue)
    assert _slurm_job_of(corral, job_id) == slurm_id
    events = corral("events", job_id).stdout
    assert "Slurm requeued its allocation" in events
    assert not [line for line in events.splitlines() if "\tjob\t" in line and "FAILED" in line]  # the job never failed
    corral("cancel", job_id)
    wait_for(lambda: not _squeue_ids([slurm_id]), timeout=30, interval=0.5)


def test_corral_requeue_of_a_slurm_job_runs_it_again_in_a_new_allocation(slurm_home, tmp_path):
    """``corral requeue`` (as ``scontrol requeue``): the job is pending again under the same id
    and runs again in a new Slurm allocation, never on the nodes of the one being given back
    (placed there, it failed to launch and the job FAILED), and its first attempt's step is
    gone before the second starts."""
    corral = slurm_home
    trail = tmp_path / "trail"
    spec = tmp_path / "again.yaml"
    spec.write_text("name: again\nresources: {accelerators: H100:1}\nrun: |\n"
                    f"  trap 'echo stop $CORRAL_RESTART_COUNT >> {trail}; exit 0' TERM\n"
                    f"  echo start $CORRAL_RESTART_COUNT $SLURM_JOB_ID >> {trail}\n"
                    "  sleep 300 & wait\n")
    job_id = corral("launch", "--slurm", "-d", str(spec)).stdout.strip()
    wait_for(lambda: _job(corral, job_id)["state"] == "RUNNING", timeout=30, interval=0.5)
    old = _slurm_job_of(corral, job_id)
    corral("requeue", job_id)
    job = wait_for(lambda: (j := _job(corral, job_id))["requeues"] == 1 and j["state"] in ("RUNNING", "FAILED") and j,
                   timeout=60, interval=0.5)
    events = corral("events", job_id).stdout
    assert job["state"] == "RUNNING", events
    assert not [line for line in events.splitlines() if "FAILED" in line], events  # a requeue is never a failure
    # its node is one of a new allocation's (s<slurm id>-<host>; the old one may still be ending
    # under the job's Slurm name, so the name alone does not tell which is which)
    new = job["replicas"][0]["node"].split("-", 1)[0].removeprefix("s")
    assert new != old and _squeue_ids([new]) == [new], (old, new, job["replicas"])
    wait_for(lambda: not _squeue_ids([old]), timeout=30, interval=0.5)  # the old allocation was given back
    # nothing ran twice: the first attempt stopped (its trap ran) before the second started
    lines = wait_for(lambda: (t := trail.read_text().splitlines()) and len(t) >= 3 and t, timeout=15, interval=0.5)
    assert lines == ["start 0 " + old, "stop 0", "start 1 " + new], lines
    corral("cancel", job_id)
    wait_for(lambda: not _squeue_ids([new]), timeout=30, interval=0.5)


def test_an_allocation_cancelled_outside_corral_ends_the_job_cancelled_in_slurms_words(slurm_home, tmp_path):
    """Not "cancelled by request" (nobody asked corral), not a lost node to recover from: the
    job ends as Slurm ended its allocation, and says so."""
    corral = slurm_home
    spec = tmp_path / "gone.yaml"
    spec.write_text("name: gone\nresources: {accelerators: H100:1}\nrestart: {policy: always, max_restarts: 3}\n"
                    "run: exec sleep 300\n")
    job_id = corral("launch", "--slurm", "-d", str(spec)).stdout.strip()
    wait_for(lambda: _job(corral, job_id)["state"] == "RUNNING", timeout=30, interval=0.5)
    slurm_id = _slurm_job_of(corral, job_id)
    subprocess.run(["scancel", slurm_id], env=ENV, check=True)
    job = wait_for(lambda: (j := _job(corral, job_id))["state"] in ("CANCELLED", "FAILED", "PENDING") and j,
                   timeout=40, interval=0.5)
    assert job["state"] == "CANCELLED", job
    assert f"Slurm ended its allocation (job {slurm_id}: cancelled)" in job["message"]
    assert job["requeues"] == 0 and _slurm_job_of_or_none(corral, job_id) is None  # nothing asked of Slurm again


def _slurm_job_of_or_none(corral, job_id: str) -> str | None:
    try:
        return _slurm_job_of(corral, job_id)
    except AssertionError:
        return None


def test_a_job_no_slurm_node_can_hold_is_refused_at_submit(slurm_home, tmp_path):
    corral = slurm_home
    spec = tmp_path / "big.yaml"
    spec.write_text("name: big\nresources: {accelerators: H100:16}\nrun: 'true'\n")
    refused = corral("launch", "--slurm", "-d", str(spec), check=False)
    assert refused.returncode == 2
    assert "16 GPUs" in refused.stderr and "8 GPUs" in refused.stderr  # what it asks, what a node has
    assert json.loads(corral("queue", "--json").stdout) == []  # nothing stored, nothing sent to Slurm


def test_sbatch_container_image_runs_the_script_in_its_container_on_slurm(slurm_home, tmp_path):
    # #SBATCH --container-image (Pyxis's): the batch script runs in that container on the
    # Slurm node's Podman (the lab has no Pyxis), inside the job's Slurm step
    from container_lab import MARKER, SITE as CONTAINERS, ensure_image

    image = ensure_image()
    (slurm_home.home / "config.yaml").write_text((slurm_home.home / "config.yaml").read_text() + CONTAINERS)
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "boxed.sbatch"
    script.write_text(f"#!/bin/sh\n#SBATCH --container-image={image}\n#SBATCH --container-mounts={out}:/out\n"
                      f"cat {MARKER} > /out/seen; echo \"$SLURM_JOB_ID\" >> /out/seen\n")
    proc = subprocess.run([sys.executable, "-m", "corral.cli.main", "launch", "--slurm", str(script)],
                          env=slurm_home.env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = (out / "seen").read_text().split()
    assert seen[0] == "inside" and seen[1].isdigit()
