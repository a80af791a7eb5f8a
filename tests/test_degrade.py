"""Degrade, don't die: an infra whose engine does not answer makes its partitions DOWN with
the reason (``corral nodes``, ``corral queue``, ``/v1/partitions``, ``/metrics``) while the
rest runs on; they come back by themselves when it answers; the server always starts; and
``corral server status`` never contradicts the next command.

Through the core with a fake executor (unit), a real server loading a fake infra whose
reachability a file flips, and the slurm-lab reached through a copy of its slurm.conf whose
controller port nobody serves (the shared lab itself is never touched)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import cli_events, cli_for, wait_for
from corral.admission import Admitted, Refusal, admit
from corral.control.inventory import Inventory
from corral.pool import NodeSpec
from corral.site import Site
from corral.scheduler.policy import Partition, Policy
from corral.spec.loader import load_job
from fake_executor import FakeExecutor
import fake_infra

DOWN = "Fake engine at 10.9.9.9:1 does not answer: connection refused"


class Flipping(FakeExecutor):
    """The fake executor of the loop tests, with Reachability: ``down(why)`` / ``up()``."""

    def __init__(self, nodes, wake):  # noqa: ANN001
        super().__init__(nodes, wake)
        self.all_nodes, self.why = list(nodes), None

    def unreachable(self) -> str | None:
        return self.why

    def down(self, why: str) -> None:
        self.why = why
        with self.lock:
            self._nodes, self.version = [], self.version + 1

    def up(self) -> None:
        self.why = None
        with self.lock:
            self._nodes, self.version = list(self.all_nodes), self.version + 1


# -- the core ---------------------------------------------------------------------------------


def test_an_unreachable_infra_makes_its_partitions_down_and_they_come_back() -> None:
    local = FakeExecutor([NodeSpec(name="here", gpus=0, cpus=4, memory=8)], lambda: None)
    engine = Flipping([NodeSpec(name="fk-0", gpus=4, gpu_type="H100", cpus=8, memory=64)], lambda: None)
    engine.name = "fake"
    inventory = Inventory({"local": local, "fake": engine}, {"gpu": "fake", "also": "fake", "cpu": "local"})
    assert inventory.refresh() and inventory.down_partitions == {} and inventory.up("fk-0")
    engine.down(DOWN)
    assert inventory.refresh()  # a flip is a change: the scheduler looks again
    assert inventory.unreachable == {"fake": DOWN}
    assert inventory.down_partitions == {"gpu": DOWN, "also": DOWN}
    assert not inventory.up("fk-0") and "fk-0" in inventory.down_nodes and inventory.up("here")
    assert not inventory.refresh()  # nothing changed since
    engine.why = "Fake engine: another reason"
    assert inventory.refresh() and inventory.down_partitions["gpu"] == "Fake engine: another reason"
    engine.up()
    assert inventory.refresh()
    assert inventory.unreachable == {} and inventory.down_partitions == {} and inventory.up("fk-0")
    assert "fk-0" not in inventory.down_nodes


def test_an_executor_that_cannot_say_counts_as_not_answering() -> None:
    engine = Flipping([], lambda: None)

    def broken() -> str | None:
        raise RuntimeError("boom")

    engine.unreachable = broken
    inventory = Inventory({"fake": engine}, {"gpu": "fake"})
    inventory.refresh()
    assert "boom" in inventory.down_partitions["gpu"]


def _site(pool: list[NodeSpec]) -> Site:
    from corral.executors.registry import infras

    policy = replace(Policy.named("corral"), partitions=(Partition("cpu", ("here",)), Partition("gpu", ("fk-*",)),
                                                         Partition("any", ("*",))))
    return Site(pool, policy, partition_infra={"gpu": "fake"},
                infras={"local": infras()["local"].config(), "fake": fake_infra.FakeConfig(down_file="/nowhere"),
                        "slurm": infras()["slurm"].config()})


def test_admission_queues_jobs_of_a_down_partition_and_names_the_unreachable_infra(monkeypatch) -> None:
    import corral.admission
    from corral.executors.registry import infras

    known = {**infras(), "fake": fake_infra.INFRA}
    monkeypatch.setattr(corral.admission, "infras", lambda: known)
    site = _site([NodeSpec(name="here", gpus=0, cpus=4, memory=8)])
    never = lambda job: False  # noqa: E731
    # the engine answers but has no node yet: the old refusal, unchanged
    refused = admit(_in("gpu"), "ann", site, never)
    assert isinstance(refused, Refusal) and "does not answer" not in refused.message
    # DOWN: its nodes are unknown, so the job is queued (it waits with PartitionDown)
    outages = ({"gpu": DOWN}, {"fake": DOWN})
    assert isinstance(admit(_in("gpu"), "ann", site, never, outages=outages), Admitted)
    # a partition of any infra refused for what the pool lacks now: the refusal says why
    refused = admit(_in("any"), "ann", site, never, outages=outages)
    assert isinstance(refused, Refusal) and "infra fake does not answer" in refused.message and DOWN in refused.message
    # Slurm's nodes are each one job's, never the shared pool's: its silence is not the cause
    refused = admit(_in("any"), "ann", site, never, outages=({}, {"slurm": "Slurm is silent"}))
    assert isinstance(refused, Refusal) and "does not answer" not in refused.message


def _in(partition: str):  # noqa: ANN202 - a JobSpec
    return load_job("resources: {accelerators: H100:1}\nrun: x\n", scheduling={"partition": partition}).spec


def test_slurms_controller_check_names_the_cause_and_backs_off(tmp_path: Path) -> None:
    from corral.executors.slurm.cli import SlurmCli
    from corral.executors.slurm.controller import BACKOFF_S, CHECK_EVERY_S, Controller

    now = [100.0]
    changes: list[str | None] = []
    missing = tmp_path / "nowhere" / "slurm.conf"
    controller = Controller(SlurmCli({"SLURM_CONF": str(missing), "PATH": os.environ.get("PATH", "")}),
                            lambda: changes.append(controller.why), clock=lambda: now[0])
    assert not controller.check()
    assert controller.why == f"Slurm cannot be reached: SLURM_CONF names {missing}, which is not a file"
    pauses = []
    for _ in range(len(BACKOFF_S) + 2):  # asked again after a growing pause, never more often
        start = now[0]
        assert not controller.due()
        while not controller.due():
            now[0] += 0.5
        pauses.append(now[0] - start)
        controller.check()
    assert pauses == [max(p, 0.5) for p in BACKOFF_S] + [BACKOFF_S[-1]] * 2
    assert changes == [controller.why]  # told once, not at every check that says the same
    controller.answered()
    assert controller.why is None and changes[-1] is None
    assert not controller.due()
    now[0] += CHECK_EVERY_S
    assert controller.due()


def test_a_slurm_executor_is_built_without_slurm_and_defers_adoption(tmp_path: Path, monkeypatch) -> None:
    from corral.executors.slurm.executor import SrunExecutor
    from corral.settings import Settings

    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing.conf"))
    settings = Settings(home=tmp_path / "home", db_url="sqlite://")
    settings.ensure_dirs()
    woken: list[int] = []
    executor = SrunExecutor(settings, "scope", lambda: woken.append(1))  # no raise, no wait
    try:
        assert "SLURM_CONF names" in executor.unreachable() and executor.nodes() == []
        executor.adopt([("1.t.0.a1", {"key": "1.t.0.a1", "slurm": "7", "node": "s7-gpu001"})])
        assert executor.drain() == []  # not taken for gone (nor started): adopted once Slurm answers
        executor.release(1)  # kept until Slurm answers, without asking it
    finally:
        executor.close()


# -- a real server with a local partition and a fake infra's ------------------------------------

FAKE_SITE = """
infra: {{fake: {{down_file: {down}, build_delay: {delay}}}}}
partitions:
  - {{name: cpu, nodes: ["*"]}}
  - {{name: gpu, infra: fake}}
"""


@pytest.fixture
def fake_home(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    down = tmp_path / "down"
    pythonpath = fake_infra.install(tmp_path / "plugins")

    def make(delay: float = 0.0):  # noqa: ANN202
        (home / "config.yaml").write_text(FAKE_SITE.format(down=down, delay=delay))
        run = cli_for(home, {"PYTHONPATH": pythonpath}, cwd=tmp_path)
        run.down = down
        made.append(run)
        return run

    made: list = []
    yield make
    for run in made:
        run.stop()


def _http(home: Path, path: str) -> str:
    info = json.loads((home / "server.json").read_text())
    request = urllib.request.Request(info["url"] + path,
                                     headers={"Authorization": f"Bearer {(home / 'local.token').read_text().strip()}"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return answer.read().decode()


def test_a_down_infra_leaves_the_rest_running_and_its_jobs_start_when_it_answers(fake_home, tmp_path: Path) -> None:
    corral = fake_home()
    corral.down.write_text(DOWN)
    (tmp_path / "cpu.yaml").write_text("run: echo local-ran\n")
    (tmp_path / "gpu.yaml").write_text("resources: {accelerators: H100:1}\nrun: echo gpu-ran\n")
    local = corral("launch", "-d", "-p", "cpu", str(tmp_path / "cpu.yaml")).stdout.strip()
    gpu = corral("launch", "-d", "-p", "gpu", str(tmp_path / "gpu.yaml"))  # queued, not refused
    assert gpu.returncode == 0, gpu.stderr
    gpu_id = gpu.stdout.strip()
    wait_for(lambda: json.loads(corral("status", local, "--json").stdout)["state"] == "SUCCEEDED", timeout=60)
    job = wait_for(lambda: (j := json.loads(corral("status", gpu_id, "--json").stdout))["reason"] and j,
                   timeout=60)
    assert job["state"] == "PENDING" and job["reason"] == f"PartitionDown ({DOWN})"
    queue = corral("queue").stdout
    assert "PartitionDown" in queue and "does not answer" in queue
    nodes = corral("nodes")
    assert f"partition gpu (fake) is DOWN: {DOWN}" in nodes.stderr
    partitions = {p["name"]: p for p in json.loads(_http(corral.home, "/v1/partitions"))}
    assert partitions["gpu"]["state"] == "DOWN" and partitions["gpu"]["reason"] == DOWN
    assert partitions["cpu"]["state"] == "UP"
    metrics = _http(corral.home, "/metrics")
    assert 'corral_infra_up{infra="fake"} 0.0' in metrics and 'corral_infra_up{infra="local"} 1.0' in metrics
    assert 'corral_partition_up{infra="fake",partition="gpu"} 0.0' in metrics
    assert 'corral_partition_up{infra="",partition="cpu"} 1.0' in metrics
    assert 'corral_jobs_pending{partition="gpu",reason="PartitionDown"} 1.0' in metrics
    health = json.loads(_http(corral.home, "/v1/health"))
    assert health["status"] == "ok" and health["unreachable"] == {"fake": DOWN}
    assert f"infra fake does not answer, its partitions are DOWN: {DOWN}" in corral("server", "status").stdout
    # the engine answers again: the partition is UP by itself and the job that waited runs there
    corral.down.write_text("")
    done = wait_for(lambda: (j := json.loads(corral("status", gpu_id, "--json").stdout))["state"] == "SUCCEEDED" and j,
                    timeout=60)
    assert done["tasks"][0]["replicas"][0]["node"] == "fk-0"
    assert "DOWN" not in corral("nodes").stderr
    assert 'corral_partition_up{infra="fake",partition="gpu"} 1.0' in _http(corral.home, "/metrics")


# -- server status and the next command agree ---------------------------------------------------


def test_server_status_says_what_the_next_command_finds(fake_home, tmp_path: Path) -> None:
    corral = fake_home(delay=8.0)  # building its executors takes a while: the server is slow to answer
    server = subprocess.Popen([sys.executable, "-m", "corral.server"], env=corral.env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        status = wait_for(lambda: (s := corral("server", "status", "--json", check=False)).returncode == 0 and s,
                          timeout=30, interval=0.1)
        said = json.loads(status.stdout)
        assert said["running"] and said["pid"] == server.pid
        assert not said["answering"], "the server was expected to be still starting"
        # the next command finds that same server (waits for it), never starts a second one
        queue = corral("queue", check=False, timeout=120)
        assert queue.returncode == 0, queue.stderr
        said = json.loads(corral("server", "status", "--json").stdout)
        assert said["pid"] == server.pid and said["answering"]
        assert server.poll() is None
    finally:
        corral("server", "stop", timeout=60)
        server.wait(timeout=60)
    # a server.json left behind by a server that died names nobody: status says none runs, and
    # the next command starts one (quick to build this time)
    (corral.home / "config.yaml").write_text(FAKE_SITE.format(down=corral.down, delay=0))
    (corral.home / "server.json").write_text(json.dumps({"pid": os.getpid(), "url": "http://127.0.0.1:9",
                                                         "home": str(corral.home), "db": "sqlite"}))
    status = corral("server", "status", check=False)
    assert status.returncode == 1 and "no corral server is running" in status.stdout
    assert corral("queue", check=False, timeout=120).returncode == 0
    assert json.loads(corral("server", "status", "--json").stdout)["answering"]


# -- Slurm's controller unreachable --------------------------------------------------------------

LAB_CONF = Path(os.environ.get("CORRAL_SLURM_LAB", "/tmp/slurmlab")) / "etc" / "slurm.conf"

SLURM_SITE = """
partitions:
  - {name: here, nodes: ["*"]}
  - {name: gpu, infra: slurm, slurm_partition: gpu}
"""


def _lab_answers() -> bool:
    if not LAB_CONF.exists() or shutil.which("scontrol") is None:
        return False
    done = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "SLURM_CONF": str(LAB_CONF)})
    return done.returncode == 0


def _cancel_ours(home: Path) -> None:
    from types import SimpleNamespace

    from corral.executors import scope_of

    scope = scope_of(SimpleNamespace(home=home))  # (it reads only the home)
    env = {**os.environ, "SLURM_CONF": str(LAB_CONF)}
    out = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True, env=env).stdout
    ours = [line.split()[0] for line in out.splitlines() if scope in line]
    if ours:
        subprocess.run(["scancel", *ours], env=env, capture_output=True)



class _LabCopy:
    """A server of its own home whose Slurm is the lab through a copy of its configuration,
    which ``silence`` points at a controller port nobody serves and ``restore`` points back."""

    def __init__(self, tmp_path: Path):
        if not _lab_answers():
            pytest.skip("no slurm-lab answers here")
        self.conf = tmp_path / "slurm-etc"
        shutil.copytree(LAB_CONF.parent, self.conf)
        self.good = (self.conf / "slurm.conf").read_text()
        self.bad = "\n".join("SlurmctldPort=6999" if line.startswith("SlurmctldPort=") else line
                             for line in self.good.splitlines()) + "\n"
        self.home = tmp_path / "home"
        self.home.mkdir()
        (self.home / "config.yaml").write_text(SLURM_SITE)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        self.corral = cli_for(self.home, {**env, "SLURM_CONF": str(self.conf / "slurm.conf")}, cwd=tmp_path)
        self.corral.env.pop("SLURM_JOB_ID", None)

    def silence(self) -> None:
        (self.conf / "slurm.conf").write_text(self.bad)

    def restore(self) -> None:
        (self.conf / "slurm.conf").write_text(self.good)

    def close(self) -> None:
        self.corral.stop()
        _cancel_ours(self.home)


def test_slurm_unreachable_the_server_starts_and_its_partition_comes_back(tmp_path: Path) -> None:
    lab = _LabCopy(tmp_path)
    lab.silence()  # from the start
    corral, conf, home = lab.corral, lab.conf, lab.home
    try:
        started = time.monotonic()
        corral("server", "start", timeout=120)
        assert time.monotonic() - started < 60
        (tmp_path / "here.yaml").write_text("run: echo here-ran\n")
        (tmp_path / "gpu.yaml").write_text("resources: {accelerators: H100:1}\nrun: echo slurm-ran\n")
        here = corral("launch", "-d", "-p", "here", str(tmp_path / "here.yaml")).stdout.strip()
        gpu = corral("launch", "-d", "-p", "gpu", str(tmp_path / "gpu.yaml")).stdout.strip()
        wait_for(lambda: json.loads(corral("status", here, "--json").stdout)["state"] == "SUCCEEDED", timeout=60)
        job = wait_for(lambda: (j := json.loads(corral("status", gpu, "--json").stdout))["reason"] and j,
                       timeout=60)
        assert job["state"] == "PENDING" and job["reason"].startswith("PartitionDown (Slurm's controller does not "
                                                                      "answer")
        assert str(conf / "slurm.conf") in job["reason"]
        assert "partition gpu (slurm) is DOWN: Slurm's controller does not answer" in corral("nodes").stderr
        assert "PartitionDown (Slurm" in corral("queue").stdout
        metrics = _http(home, "/metrics")
        assert 'corral_partition_up{infra="slurm",partition="gpu"} 0.0' in metrics
        assert 'corral_infra_up{infra="slurm"} 0.0' in metrics
        # the configuration is fixed: Slurm answers, the partition is UP and the job runs there
        lab.restore()
        done = wait_for(lambda: (j := json.loads(corral("status", gpu, "--json").stdout))["state"]
                        in ("SUCCEEDED", "FAILED") and j, timeout=180, interval=1)
        assert done["state"] == "SUCCEEDED", done
        assert done["tasks"][0]["replicas"][0]["node"].startswith("s")
        assert 'corral_partition_up{infra="slurm",partition="gpu"} 1.0' in _http(home, "/metrics")
    finally:
        lab.close()


def test_a_slurm_job_running_when_the_server_restarts_blind_is_kept_and_adopted_later(tmp_path: Path) -> None:
    """Slurm does not answer when the server starts: its running job is neither failed nor
    started again; once Slurm answers, the job is adopted and ends as it ran."""
    lab = _LabCopy(tmp_path)
    corral = lab.corral
    marker, release = tmp_path / "ran", tmp_path / "release"
    # it runs until the test releases it, once adopted (before, a fixed 40 s that mostly waited)
    (tmp_path / "gpu.yaml").write_text(f"resources: {{accelerators: H100:1}}\n"
                                       f"run: echo x >> {marker}; while [ ! -e {release} ]; do sleep 0.2; done; "
                                       f"echo finished\n")
    try:
        gpu = corral("launch", "-d", "-p", "gpu", str(tmp_path / "gpu.yaml"), timeout=120).stdout.strip()
        wait_for(lambda: json.loads(corral("status", gpu, "--json").stdout)["state"] == "RUNNING", timeout=120,
                 interval=1)
        corral("server", "stop", timeout=120)
        lab.silence()
        corral("server", "start", timeout=120)
        wait_for(lambda: "is DOWN" in corral("nodes").stderr, timeout=60, interval=1)
        time.sleep(5)  # some cycles with Slurm silent
        assert json.loads(corral("status", gpu, "--json").stdout)["state"] == "RUNNING"
        lab.restore()
        # adopted while it still runs, then it ends by itself
        wait_for(lambda: any(e["cause"] == "adopted" for e in cli_events(corral, gpu)), timeout=120, interval=1)
        release.touch()
        done = wait_for(lambda: (j := json.loads(corral("status", gpu, "--json").stdout))["state"]
                        in ("SUCCEEDED", "FAILED", "CANCELLED") and j, timeout=180, interval=1)
        if done["state"] != "SUCCEEDED":
            _skip_if_cancelled_by_others(corral, gpu)
        assert done["state"] == "SUCCEEDED", done
        assert marker.read_text().count("x") == 1  # started once, never again
    finally:
        lab.close()


def _skip_if_cancelled_by_others(corral, job: str) -> None:  # noqa: ANN001
    """The slurm-lab is shared: other test runs cancel every ``corral-*`` Slurm job (test_slurm's
    clean-up). A Slurm job of ours that Slurm's accounting shows CANCELLED was not ended by this
    test: say so rather than fail on someone else's clean-up."""
    import re

    events = corral("events", job).stdout
    ids = re.findall(r"Slurm job (\d+)", events)
    env = {**os.environ, "SLURM_CONF": str(LAB_CONF)}
    for slurm_id in ids:
        state = subprocess.run(["sacct", "-n", "-X", "-j", slurm_id, "-o", "State"], capture_output=True,
                               text=True, env=env).stdout.strip()
        if state.startswith("CANCELLED"):
            pytest.skip(f"Slurm job {slurm_id} was cancelled from outside this test (the shared lab's clean-up)")


def test_a_cancel_while_slurm_s_controller_does_not_answer_leaves_no_step_running(tmp_path: Path) -> None:
    """The controller goes silent while replicas run in Slurm steps, then their jobs are
    cancelled. One stays silent: after the grace period the step is killed through its srun
    client (which reaches the nodes' slurmd without the controller) and nothing of it runs on.
    Before, the srun client was SIGKILLed and the step ran on unseen. For the other, Slurm
    answers again within the grace period: the replica gets its stop signal then."""
    import re

    copy = _LabCopy(tmp_path)
    corral = copy.corral
    lab = {**os.environ, "SLURM_CONF": str(LAB_CONF)}

    def launch(name: str, grace: str) -> tuple[str, Path, str]:
        said = tmp_path / f"said-{name}"
        (tmp_path / f"{name}.yaml").write_text(
            f"resources: {{accelerators: H100:1}}\ngrace_period: {grace}\n"
            f"run: |\n  trap 'echo got-term >> {said}; exit 0' TERM\n  echo started >> {said}\n"
            f"  while :; do sleep 0.2; done\n")
        job = corral("launch", "-d", "-p", "gpu", "--name", name, str(tmp_path / f"{name}.yaml"),
                     timeout=120).stdout.strip()
        wait_for(lambda: said.exists() and "started" in said.read_text(), timeout=120, interval=0.5)
        (slurm_id,) = set(re.findall(r"Slurm job (\d+)", corral("events", job).stdout))
        return job, said, slurm_id

    def steps(slurm_id: str) -> list[str]:  # asked of the real lab, which answers us
        out = subprocess.run(["squeue", "-h", "-s", "-j", slurm_id, "-o", "%i"], capture_output=True, text=True,
                             env=lab).stdout.split()
        return [s for s in out if not s.endswith((".batch", ".extern"))]

    def ended(job: str) -> dict:
        return wait_for(lambda: (j := json.loads(corral("status", job, "--json").stdout))["state"]
                        in ("SUCCEEDED", "FAILED", "CANCELLED") and j, timeout=120, interval=1)

    try:
        silent, silent_said, silent_id = launch("silent", "3s")
        back, back_said, back_id = launch("back", "60s")
        assert steps(silent_id) and steps(back_id)
        copy.silence()
        silenced = time.monotonic()
        wait_for(lambda: "is DOWN" in corral("nodes").stderr, timeout=90, interval=1)
        # asked every 5 s on a thread of its own, not behind the watcher's squeue, which retries
        # a silent controller (the partition was seen DOWN only after ~20 s that way)
        assert time.monotonic() - silenced < 14, time.monotonic() - silenced
        corral("cancel", silent, back)
        # the silent one's grace period over: its step is ended through its srun client, while
        # corral, unable to learn its exit from Slurm, does not yet call it ended
        wait_for(lambda: steps(silent_id) == [], timeout=60, interval=0.5)
        assert json.loads(corral("status", silent, "--json").stdout)["state"] == "RUNNING"
        assert "got-term" not in silent_said.read_text()  # (its stop signal could not be delivered in time)
        assert "got-term" not in back_said.read_text() and steps(back_id)
        copy.restore()  # Slurm answers within the other's grace period
        wait_for(lambda: "got-term" in back_said.read_text(), timeout=50, interval=0.5)
        assert ended(back)["state"] == "CANCELLED" and ended(silent)["state"] == "CANCELLED"
        assert steps(back_id) == []
        assert silent_said.read_text().count("started") == back_said.read_text().count("started") == 1
    finally:
        copy.close()
