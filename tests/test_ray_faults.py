"""corral on a Ray cluster whose parts die (``ray_lab``: a head and two workers, each worker
in its own network namespace where this machine allows it), driven through the real
``corral`` command and server:

* a raylet killed under a running replica: the replica restarts elsewhere and the old
  attempt is dead before the new one runs (its fence ends it), and nothing runs after cancel;
* a worker that dies while its job's gang is being placed or reserved: the replica is lost
  and the job requeued, not failed;
* the head's death: the server lives on (local partitions too), a new server starts while
  the head is down, and the Ray partition comes back with the head;
* a home deleted and made again: its job 1 runs beside what the old home left on the nodes,
  and replica logs on the nodes are private.

Nodes are declared dead after 20 missed health checks (20 s), so a job submitted right after
a worker's death is still placed on it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import cli_events, cli_for, cli_status, replicas_by_label, wait_for

pytest.importorskip("ray", reason="ray is not installed (pip install 'corral[ray]')")

from ray_lab import RayLab, leave_as_found, site_config, start_lab  # noqa: E402


@pytest.fixture(scope="module")
def lab():
    lab = start_lab(workers=2, gpus=4, misses=20)
    yield lab
    lab.stop()


def _config(lab: RayLab) -> str:
    return site_config(lab)


def _runner(home: Path):
    return cli_for(home, timeout=120)


@pytest.fixture
def corral(lab: RayLab, tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(_config(lab))
    run = _runner(home)
    yield run
    leave_as_found(run, home)
    for node in lab.nodes:  # every node back, for the next test
        if not node.alive():
            lab.revive(node)
    lab.wait_nodes(len(lab.nodes), timeout=120)


status, replicas, events = cli_status, replicas_by_label, cli_events


def ray_nodes(corral) -> dict[str, str]:
    return {n["name"]: n["state"] for n in json.loads(corral("nodes", "--json", check=True).stdout)
            if n.get("infra") == "ray"}


def _lines(path: Path) -> list[tuple[str, str, float]]:
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        parts = line.split()
        if len(parts) == 3:
            out.append((parts[0], parts[1], float(parts[2])))
    return out


def test_a_killed_raylet_s_replica_is_dead_before_its_next_attempt_runs(corral, lab: RayLab,
                                                                      tmp_path: Path) -> None:
    beats = tmp_path / "beats"
    spec = tmp_path / "fenced.yaml"
    spec.write_text(f"""
name: fenced
resources: {{accelerators: H100:1}}
restart: {{policy: on_failure, backoff: {{initial: 0s}}}}
run: |
  echo "start $CORRAL_LAUNCH_KEY $(date +%s.%N)" >> {beats}
  while true; do echo "beat $CORRAL_LAUNCH_KEY $(date +%s.%N)" >> {beats}; sleep 0.05; done
""")
    job = corral("launch", "-d", "-p", "gpu", str(spec), check=True).stdout.strip()
    wait_for(lambda: status(corral, job)["state"] == "RUNNING" and any(k == "beat" for k, _, _ in _lines(beats)),
             timeout=90)
    before = replicas(status(corral, job))["fenced-0"]
    victim = next(w for w in lab.workers if w.is_named(before["node"]))
    os.kill(lab.raylet(victim), signal.SIGKILL)  # the raylet alone: the machine and the replica's process live on
    starts = wait_for(lambda: (lambda s: s if len(s) == 2 else None)(
        [(key, at) for kind, key, at in _lines(beats) if kind == "start"]), timeout=120)
    (old, _), (new, new_at) = starts
    wait_for(lambda: any(k == "beat" and key == new for k, key, _ in _lines(beats)), timeout=30)
    time.sleep(1.0)  # an old attempt still alive has beaten again by now
    old_last = max(at for kind, key, at in _lines(beats) if key == old)
    assert old_last < new_at, f"the old attempt beat {old_last - new_at:.2f}s after the new one started"
    after = replicas(status(corral, job))["fenced-0"]
    assert after["node"] != before["node"] and after["restarts"] == 1
    lost = [e["message"] for e in events(corral, job) if e["subject"] == "fenced-0" and e["cause"] == "restart_scheduled"]
    assert len(lost) == 1 and before["node"] in lost[0] and "fence" in lost[0], lost
    corral("cancel", job, check=True)
    wait_for(lambda: status(corral, job)["state"] == "CANCELLED", timeout=60)
    time.sleep(1)
    size = beats.stat().st_size
    time.sleep(2)
    assert beats.stat().st_size == size  # nothing of either attempt runs after the cancel
    print(f"old attempt's last beat {new_at - old_last:.2f}s before the new attempt started")


def test_a_worker_dying_during_a_gang_s_reservation_requeues_the_job(corral, lab: RayLab, tmp_path: Path) -> None:
    spec = tmp_path / "gang.yaml"
    spec.write_text("name: gang\nnum_nodes: 2\nresources: {accelerators: H100:4}\nrun: exec sleep 300\n")
    corral("queue", check=True)  # the server runs and knows both workers
    wait_for(lambda: sum(s == "UP" for s in ray_nodes(corral).values()) == 3, timeout=60)
    victim = lab.workers[1]
    lab.kill(victim)  # Ray declares it dead only after 20 s: corral still places a replica there
    job = corral("launch", "-d", "-p", "gpu", str(spec), check=True).stdout.strip()
    requeued = wait_for(lambda: (lambda d: d if d["requeues"] >= 1 or d["state"] == "FAILED" else None)(
        status(corral, job)), timeout=90)
    told = [e["message"] or "" for e in events(corral, job)]
    assert requeued["state"] != "FAILED", told
    assert not any("could not reserve" in m for m in told), told
    # the worker is found gone while the gang is reserved, or already when its ports are picked
    assert any("left the Ray cluster" in m or "did not answer" in m for m in told), told
    lab.revive(victim)
    wait_for(lambda: status(corral, job)["state"] == "RUNNING", timeout=120)


# How long Ray's client (the server's Ray driver) lives on without the head: Ray ends its
# process then (60 s by default); shortened here so that the server is seen to outlive it sooner.
GCS_RECONNECT_S = 15


def test_the_head_s_death_takes_only_the_ray_partition_down(corral, lab: RayLab, tmp_path: Path) -> None:
    corral.env["RAY_gcs_rpc_server_reconnect_timeout_s"] = str(GCS_RECONNECT_S)  # the server's, before it starts
    corral("queue", check=True)
    wait_for(lambda: sum(s == "UP" for s in ray_nodes(corral).values()) == 3, timeout=60)
    server = json.loads((corral.home / "server.json").read_text())["pid"]
    head = next(n for n in lab.nodes if n.name == "head")
    lab.kill(head)
    died = time.monotonic()
    wait_for(lambda: all(s == "DOWN" for s in ray_nodes(corral).values()), timeout=30)
    down_after = time.monotonic() - died
    local = tmp_path / "local.yaml"
    local.write_text("name: here\nrun: echo local still runs\n")
    done = corral("launch", "-p", "local", str(local), timeout=120)
    assert done.returncode == 0 and "local still runs" in done.stdout, done.stdout + done.stderr
    while time.monotonic() - died < GCS_RECONNECT_S + 15:  # Ray's client ends its process without the head
        time.sleep(5)
        assert json.loads((corral.home / "server.json").read_text())["pid"] == server
    os.kill(server, 0)  # the same server, alive
    corral("server", "stop", check=True)
    began = time.monotonic()
    corral("queue", check=True, timeout=60)  # a new server starts while the head is down
    started_in = time.monotonic() - began
    assert started_in < 30, started_in
    assert all(s == "DOWN" for s in ray_nodes(corral).values())
    for worker in lab.workers:  # their raylets would end without the head they knew (after Ray's 60 s)
        lab.kill(worker)
    lab.revive(head)
    for worker in lab.workers:
        lab.revive(worker, timeout=120)
    wait_for(lambda: sum(s == "UP" for s in ray_nodes(corral).values()) == 3, timeout=120)
    spec = tmp_path / "back.yaml"
    spec.write_text("name: back\nresources: {accelerators: H100:1}\nrun: echo ray is back\n")
    done = corral("launch", "-p", "gpu", str(spec), timeout=180)
    assert done.returncode == 0 and "ray is back" in done.stdout, done.stdout + done.stderr
    print(f"ray partition DOWN {down_after:.1f}s after the head died; a new server started in {started_in:.1f}s")


def _clear_scope(lab: RayLab, scope: str) -> None:
    """Remove what a deleted home left on the cluster (its actors and placement groups)."""
    code = f"""
import ray
ray.init(address={lab.address!r}, log_to_driver=False, logging_level="ERROR")
for actor in ray.util.list_named_actors(all_namespaces=True):
    if actor["name"].startswith("corral-{scope}-"):
        ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)
for pg in ray.util.placement_group_table().values():
    if str(pg.get("name", "")).startswith("corral-{scope}-") and pg.get("state") != "REMOVED":
        ray.util.remove_placement_group(ray.util.get_placement_group(pg["name"]))
"""
    subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)


def test_a_home_made_anew_runs_its_job_1_beside_the_old_home_s_and_keeps_node_logs_private(
        lab: RayLab, tmp_path: Path) -> None:
    home = tmp_path / "home"
    spec = tmp_path / "one.yaml"
    spec.write_text("name: one\nresources: {accelerators: H100:1}\nrun: echo secret $CORRAL_LAUNCH_KEY; exec sleep 300\n")
    instances, old_scope, corral = [], None, None
    try:
        for life in (1, 2):
            home.mkdir()
            (home / "config.yaml").write_text(_config(lab))
            corral = _runner(home)
            job = corral("launch", "-d", "-p", "gpu", str(spec), check=True).stdout.strip()
            assert job == "1"
            data = wait_for(lambda: (lambda d: d if d["state"] in ("RUNNING", "FAILED") else None)(
                status(corral, job)), timeout=90)
            assert data["state"] == "RUNNING", [e["message"] for e in events(corral, job)]
            instances.append((home / "ray.instance").read_text().strip())
            logs = list(Path("/tmp").glob(f"corral-ray-*-{instances[-1]}/logs/1.one.0.a*.log"))
            assert len(logs) == 1, logs
            wait_for(lambda: b"secret" in logs[0].read_bytes(), timeout=30)
            assert logs[0].stat().st_mode & 0o777 == 0o600  # the replica's output is its user's alone
            assert logs[0].parent.stat().st_mode & 0o777 == 0o700
            assert logs[0].parent.parent.stat().st_mode & 0o777 == 0o700
            if life == 1:  # the server dies, and the home is deleted under its running job
                os.kill(json.loads((home / "server.json").read_text())["pid"], signal.SIGKILL)
                wait_for(lambda: corral("server", "status").returncode == 1, timeout=30)
                old_scope = logs[0].parent.parent.name.removeprefix("corral-ray-")
                shutil.rmtree(home)
            else:
                corral("cancel", job, check=True)
                wait_for(lambda: status(corral, job)["state"] == "CANCELLED", timeout=60)
        assert instances[0] != instances[1]
    finally:
        if corral is not None:
            corral("server", "stop")
        if old_scope is not None:
            _clear_scope(lab, old_scope)
