"""The control loop on the executor contract, with a real server and real processes: every
limit holds while a job grows (growth goes through the scheduler), and a crash between
committing an attempt and launching it never records a run that did not happen."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from pathlib import Path

import pytest

from conftest import POOL, submit, wait_for, wait_state

ON_POSTGRESQL = True  # what the store keeps: checked on PostgreSQL too (conftest)

QOS_SITE = POOL + """
qos:
  - {name: normal, max_gpus_per_user: 2}
"""


@pytest.fixture
def site_config() -> str:
    return QOS_SITE


def _gpus_held(server, user_jobs: list[int]) -> int:
    # One request, so both jobs' replicas come from one read: two GETs could see the first job
    # before a replica of it ended and the second after it started, and count a GPU twice.
    held = 0
    for job in server.get("/v1/jobs", params={"all": "true"}).json():
        if job["id"] in user_jobs:
            for task in job["tasks"]:
                held += sum(len(r["gpus"]) for r in task["replicas"] if r["state"] in ("STARTING", "RUNNING"))
    return held


def test_scale_up_respects_qos_limits_at_every_instant(server, tmp_path: Path) -> None:
    job = submit(server, """
name: elastic
execution: parallel
primary_tasks: [trainer]
---
name: rollout
num_nodes: {min: 1, max: 4, initial: 2}
resources: {accelerators: H100:1}
run: sleep 60
---
name: trainer
run: sleep 60
""")
    wait_state(server, job["id"], "RUNNING")
    assert server.post(f"/v1/jobs/{job['id']}/scale", json={"task": "rollout", "replicas": 4}).status_code == 200
    other = submit(server, "name: small\nresources: {accelerators: H100:1}\nrun: sleep 60\n")
    samples = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(_gpus_held(server, [job["id"], other["id"]]))
            time.sleep(0.05)

    watcher = threading.Thread(target=sample)
    watcher.start()
    try:
        # the new replicas wait with the user's other job: the QOS allows 2 GPUs at once
        reasons = wait_for(lambda: (lambda j: j if j["reason"] == "QOSMaxGPUsPerUser" else None)(
            server.get(f"/v1/jobs/{other['id']}").json()))
        assert reasons["state"] == "PENDING"
        time.sleep(1.0)
        grown = server.get(f"/v1/jobs/{job['id']}").json()
        rollout = next(t for t in grown["tasks"] if t["name"] == "rollout")["replicas"]
        assert sorted(r["state"] for r in rollout) == ["PENDING", "PENDING", "RUNNING", "RUNNING"]
        # shrinking frees GPUs: the waiting job starts, and the growth still may not
        assert server.post(f"/v1/jobs/{job['id']}/scale", json={"task": "rollout", "replicas": 1}).status_code == 200
        wait_state(server, other["id"], "RUNNING")
    finally:
        stop.set()
        watcher.join()
    assert samples and max(samples) <= 2, max(samples)
    for job_id in (job["id"], other["id"]):
        server.post(f"/v1/jobs/{job_id}/cancel")


class _Crash(BaseException):
    """Ends the control loop's thread the way a kill -9 ends the server: mid-cycle."""


def test_a_crash_between_commit_and_launch_records_no_run(corral_home: Path, db_url: str, tmp_path: Path) -> None:
    from corral.control.loop import ControlLoop
    from corral.server import build_state
    from corral.settings import Settings
    from corral.store import repository
    from corral.spec import load_job

    markers = tmp_path / "markers"
    settings = Settings(home=corral_home, db_url=db_url, poll_interval_s=0.1)
    state = build_state(settings)
    first: ControlLoop = state.loop
    real_start = first.inventory.executors["local"].start
    calls = []

    def start_then_crash(launch):
        calls.append(launch.key)
        if len(calls) == 2:  # the restart is committed (its key too); the process never starts
            raise _Crash()
        return real_start(launch)

    first.inventory.executors["local"].start = start_then_crash
    first.start()
    spec = load_job(f"""
name: flaky
run: echo $CORRAL_LAUNCH_KEY >> {markers}; exit 3
restart: {{policy: on_failure, max_restarts: 2, backoff: {{initial: 0s}}}}
""", source="flaky.yaml").spec
    with state.sessions() as s:
        job = repository.create_job(s, spec, "alice", time.time(), partition="", account="alice", qos="normal")
        s.commit()
        job_id = job.id
    first.notify()
    wait_for(lambda: len(calls) >= 2 and not first._thread.is_alive())
    first.inventory.executors["local"].close()
    first.probes.close()

    second = ControlLoop(settings, state.sessions, state.site)
    second.start()
    try:
        def ended():
            with state.sessions() as s:
                row = repository.load_job(s, job_id)
                return row if row.state == "FAILED" else None

        row = wait_for(ended, timeout=30)
        ran = markers.read_text().split()
        assert len(ran) == len(set(ran)) == 3  # three attempts ran, each under its own key
        assert calls[1] not in ran  # the crashed launch ran nothing
        with state.sessions() as s:
            exits = [e for e in repository.job_events(s, job_id) if e.cause in ("exited", "restart_scheduled")]
        # one recorded exit per attempt that really ran, no more
        assert len(exits) == 3, [(e.cause, e.message) for e in exits]
        assert row.replicas[0].restarts == 2
    finally:
        second.stop()


def test_a_bad_stored_job_fails_alone_and_the_loop_keeps_scheduling(server, tmp_path: Path) -> None:
    """A row written around the API (or by an older version) that the loop cannot run must
    fail with a reason, not stop scheduling for every other job."""
    from sqlalchemy import update

    from corral.spec import load_job
    from corral.store import repository
    from corral.store.tables import Job

    state = server.state
    spec = load_job("name: bad\nrun: 'true'\n", source="bad.yaml").spec
    with state.sessions() as s:
        bad = repository.create_job(s, spec, "alice", time.time(), account="alice", qos="normal").id
        broken = spec.model_dump(mode="json")
        broken["tasks"][0]["run"] = "true\x00"
        broken["tasks"][0]["restart"] = {"policy": "sometimes"}
        s.execute(update(Job).where(Job.id == bad).values(spec=broken))
        s.commit()
    good = submit(server, "name: good\nrun: 'true'\n")
    assert wait_state(server, good["id"], "SUCCEEDED")["state"] == "SUCCEEDED"
    failed = wait_state(server, bad, "FAILED")
    assert failed["reason"] == "InvalidSpec" and "invalid stored job" in failed["message"]
    assert state.loop.failing_cycles == 0


def test_a_node_that_does_not_answer_at_placement_loses_its_replica_not_the_cycle(server, monkeypatch) -> None:
    """An engine that does not answer while a replica is bound (a Ray worker dead but not yet
    declared so): the replica is lost with its node and its job requeued, once: the node gets
    nothing new for a while. The cycle, and every other job placed in it, goes on."""
    from corral.control import inventory
    from corral.executors.contract import LaunchError

    monkeypatch.setattr(inventory, "SILENT_S", 2.0)

    loop = server.state.loop
    executor = loop.inventory.executors["local"]
    real_bind = executor.bind
    silent = [1]

    def bind(job_id, replica_id, node, ports, previous):  # on the loop's thread: its book is readable
        job = loop.book.active.get(job_id)
        if job is not None and job.name == "victim" and silent[0]:
            silent[0] -= 1
            raise LaunchError(f"could not pick ports on {node}: GetTimeoutError")
        return real_bind(job_id, replica_id, node, ports, previous)

    executor.bind = bind
    try:
        victim = submit(server, "name: victim\nrun: sleep 60\n")
        bystander = submit(server, "name: bystander\nrun: sleep 60\n")
        for job in (victim, bystander):
            wait_state(server, job["id"], "RUNNING")
    finally:
        executor.bind = real_bind
    assert silent == [0]
    assert loop.failing_cycles == 0 and loop.last_error is None
    seen = server.get(f"/v1/jobs/{victim['id']}").json()
    assert seen["requeues"] == 1, seen
    told = server.get(f"/v1/jobs/{victim['id']}/events").json()
    lost = [e for e in told if "did not answer" in (e["message"] or "") and "GetTimeoutError" in e["message"]]
    placed = [e for e in told if e["cause"] == "scheduled" and e["subject"] == "job"]
    assert len(lost) == 1 and len(placed) == 2, told
    node = lost[0]["message"].split("node ", 1)[1].split()[0]
    waited = datetime.fromisoformat(placed[1]["ts"]) - datetime.fromisoformat(lost[0]["ts"])
    # not placed on the silent node again at once (the pool's other node is free)
    assert not placed[1]["message"].endswith(f" {node}") or waited.total_seconds() >= 1.9, told
    for job in (victim, bystander):
        server.post(f"/v1/jobs/{job['id']}/cancel")


def test_health_reports_a_loop_that_keeps_failing(server) -> None:
    loop = server.state.loop
    real = loop.inventory.refresh
    assert server.get("/v1/health").json()["status"] == "ok"

    def broken(force: bool = False) -> bool:
        raise RuntimeError("the store is unreachable")

    loop.inventory.refresh = broken
    try:
        response = wait_for(lambda: (r := server.get("/v1/health")).status_code == 503 and r, timeout=20)
        assert response.json()["status"] == "failing" and "unreachable" in response.json()["loop_error"]
    finally:
        loop.inventory.refresh = real
    wait_for(lambda: server.get("/v1/health").status_code == 200, timeout=20)


def test_a_job_without_workdir_runs_where_its_file_is(server, tmp_path: Path) -> None:
    here = tmp_path / "project"
    here.mkdir()
    response = server.post("/v1/jobs", json={"yaml": "name: where\nrun: pwd > where.txt\n",
                                             "source": str(here / "where.yaml"), "base_dir": str(here)})
    assert response.status_code == 201, response.text
    wait_state(server, response.json()["job"]["id"], "SUCCEEDED")
    assert (here / "where.txt").read_text().strip() == str(here.resolve())


def test_cancel_takes_effect_at_once_during_restart_backoff(server) -> None:
    job = submit(server, """
name: backoff
run: exit 1
restart: {policy: always, max_restarts: 5, backoff: {initial: 30s}}
""")
    wait_for(lambda: server.get(f"/v1/jobs/{job['id']}").json()["tasks"][0]["replicas"][0]["state"] == "RESTARTING")
    started = time.monotonic()
    assert server.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200
    ended = wait_state(server, job["id"], "CANCELLED", timeout=10)
    assert time.monotonic() - started < 5
    assert ended["tasks"][0]["replicas"][0]["state"] == "KILLED"


def test_a_cancel_in_the_same_cycle_as_a_restart_is_not_lost(server, tmp_path: Path) -> None:
    """Restart due and cancel requested together: the cancel wins, nothing runs on."""
    job = submit(server, f"""
name: racy
num_nodes: 3
run: echo $CORRAL_LAUNCH_KEY >> {tmp_path / 'starts'}; exit 1
restart: {{policy: always, max_restarts: 1000, backoff: {{initial: 0s}}}}
""")
    wait_for(lambda: (tmp_path / "starts").exists() and len((tmp_path / "starts").read_text().split()) > 6)
    assert server.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200
    ended = wait_state(server, job["id"], "CANCELLED", timeout=10)
    assert all(r["state"] == "KILLED" for r in ended["tasks"][0]["replicas"])
    count = len((tmp_path / "starts").read_text().split())
    time.sleep(1.0)
    assert len((tmp_path / "starts").read_text().split()) == count  # nothing started after the end


def test_a_readiness_probe_that_never_passes_fails_the_start_with_its_error(server) -> None:
    job = submit(server, """
name: never
run: sleep 60
readiness_probe: {tcp: 1, period: 0.2s}
startup_timeout: 1s
restart: {policy: on_failure, max_restarts: 1, backoff: {initial: 0s}}
""")
    ended = wait_state(server, job["id"], "FAILED", timeout=20)
    replica = ended["tasks"][0]["replicas"][0]
    assert replica["restarts"] == 1  # restarted once per its policy, then failed
    story = server.get(f"/v1/jobs/{job['id']}/events").json()
    timeouts = [e for e in story if e["cause"] == "startup_timeout"]
    assert len(timeouts) == 2 and "readiness probe failing: " in timeouts[0]["message"]
    assert "refused" in timeouts[0]["message"].lower() or "error" in timeouts[0]["message"].lower()
