"""Replicas in containers (``resources.image_id: docker:IMAGE``) on the Ray lab (``ray_lab``:
each worker in its own network namespace where this machine allows it), driven through the
real ``corral`` command and server, with the offline test image (``container_lab``):

* a job group with its server in a container on one worker and its client, not in a
  container, on the other: the client reaches the server by its corral name and declared
  port, the server's exec readiness probe runs inside the container, and no container is
  left when the job ends;
* a raylet killed under a running container replica: its fence ends the attempt and its
  container before the next attempt runs (never alive twice), and cancel leaves no container.

The raylet test kills a worker's raylet, so it runs last; one lab serves the module."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from conftest import cli_events, cli_for, cli_status, replicas_by_label, wait_for
from container_lab import IMAGE, MARKER, SITE, containers_of, ensure_image

pytest.importorskip("ray", reason="ray is not installed (pip install 'corral[ray]')")

from ray_lab import RayLab, leave_as_found, site_config, start_lab  # noqa: E402

status, replicas, events = cli_status, replicas_by_label, cli_events


@pytest.fixture(scope="module")
def lab():
    ensure_image()  # before the lab: a missing podman skips without starting Ray
    lab = start_lab(workers=2, gpus=4, misses=20, cgroups=True)  # the fence, not Ray's health checks, ends a lost attempt
    yield lab
    lab.stop()


@pytest.fixture
def corral(lab: RayLab, tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(site_config(lab, SITE))
    run = cli_for(home, cwd=tmp_path, timeout=120)
    yield run
    leave_as_found(run, home)


def _mine(job: str, name: str) -> list[str]:
    """The job's containers on this machine (any state): named corral-SCOPE-JOB.NAME.RANK.aN."""
    return [n for n in containers_of() if f"-{job}.{name}." in n]


def _told(corral, job: str) -> list[str]:
    return [f"{e['subject']}: {e['message'] or e['cause']}" for e in events(corral, job)]


def test_a_group_s_container_on_a_worker_serves_a_client_outside_one_by_name(corral, lab: RayLab,
                                                                           tmp_path: Path) -> None:
    port = 18080 + os.getpid() % 1000
    spec = tmp_path / "web.yaml"
    spec.write_text(f"""
name: web
execution: parallel
primary_tasks: [client]
---
name: server
resources: {{image_id: docker:{IMAGE}, accelerators: H100:1}}
ports: {{http: {port}}}
run: |
  echo "inside $(hostname) $CORRAL_TASK-$CORRAL_REPLICA gpus $CUDA_VISIBLE_DEVICES $(cat {MARKER})"
  exec httpd -f -p "$CORRAL_PORT_HTTP" -h /www
readiness_probe: {{exec: "test -e {MARKER}", period: 0.2s}}
---
name: client
resources: {{accelerators: H100:4}}
depends_on: [{{task: server, condition: ready}}]
run: |
  test ! -e {MARKER} || exit 3
  getent hosts server-0.web
  curl -sf "http://server-0.web:{port}/index.html" | sed 's/^/got: /'
""")
    done = corral("launch", "-p", "gpu", str(spec), timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "got: served from a container" in done.stdout, done.stdout[-3000:]
    assert "inside server-0.web server-0 gpus 0 inside" in done.stdout, done.stdout[-3000:]
    reps = replicas(status(corral, "web"))
    assert reps["server-0"]["node"] != reps["client-0"]["node"]  # 1 + 4 GPUs: one worker each
    if lab.isolated:
        assert {reps["server-0"]["addr"], reps["client-0"]["addr"]} == {w.ip for w in lab.workers}
    # its exec probe passed (it can only inside: the node has no MARKER) before the client ran
    assert any(e["subject"] == "server-0" and e["cause"] == "ready" for e in events(corral, "web")), \
        _told(corral, "web")
    wait_for(lambda: _mine("1", "server") == [], timeout=30)  # the server's container went with its job


def _beats(path: Path) -> list[str]:
    """The attempt keys of the beats in the order they were written (one file, appended)."""
    return [line.split()[1] for line in path.read_text().splitlines() if len(line.split()) == 2] \
        if path.exists() else []


def test_a_killed_raylet_ends_its_container_before_the_next_attempt_and_cancel_leaves_none(
        corral, lab: RayLab, tmp_path: Path) -> None:
    spec = tmp_path / "fenced.yaml"
    spec.write_text(f"""
name: fenced
resources: {{image_id: docker:{IMAGE}, accelerators: H100:1}}
restart: {{policy: on_failure, backoff: {{initial: 0s}}}}
run: |
  test -e {MARKER} || exit 3
  while true; do echo "beat $CORRAL_LAUNCH_KEY" >> beats; sleep 0.05; done
""")
    job = corral("launch", "-d", "-p", "gpu", str(spec), check=True).stdout.strip()
    beats = tmp_path / "beats"  # in the workdir, bound into the container at its own path
    wait_for(lambda: status(corral, job)["state"] == "RUNNING" and _beats(beats), timeout=90)
    first = _mine(job, "fenced")
    assert len(first) == 1, first
    before = replicas(status(corral, job))["fenced-0"]
    victim = next(w for w in lab.workers if w.is_named(before["node"]))
    os.kill(lab.raylet(victim), signal.SIGKILL)  # the raylet alone: the container's processes live on
    keys = wait_for(lambda: (lambda k: k if len(k) == 2 else None)(list(dict.fromkeys(_beats(beats)))), timeout=120)
    old, new = keys
    wait_for(lambda: _beats(beats).count(new) >= 10, timeout=30)
    order = _beats(beats)
    assert old not in order[order.index(new):], "the old attempt's container beat after the new one started"
    after = replicas(status(corral, job))["fenced-0"]
    assert after["node"] != before["node"] and after["restarts"] == 1
    lost = [m for m in _told(corral, job) if m.startswith("fenced-0") and "fence" in m]
    assert lost, _told(corral, job)
    now = _mine(job, "fenced")
    assert first[0] not in now and len(now) == 1, (first, now)  # the old container is gone, one runs
    corral("cancel", job, check=True)
    wait_for(lambda: status(corral, job)["state"] == "CANCELLED", timeout=60)
    wait_for(lambda: _mine(job, "fenced") == [], timeout=30)
    size = len(_beats(beats))
    time.sleep(1.5)
    assert len(_beats(beats)) == size  # nothing of either attempt runs after the cancel
