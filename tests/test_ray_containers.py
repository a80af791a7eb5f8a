"""Replicas in containers (``resources.image_id: docker:IMAGE``) on the Ray lab (``ray_lab``:
each worker in its own network namespace where this machine allows it), driven through the
real ``corral`` command and server, with the offline test image (``container_lab``):

* a job group with its server in a container on one worker and its client, not in a
  container, on the other: the client reaches the server by its corral name and declared
  port, the server's exec readiness probe runs inside the container, and no container is
  left when the job ends;
* a pull the registry refuses (a private image without its login, from a real registry on
  the lab's bridge) fails the replica with the registry's words, once: not restarted;
* a replica whose image is being pulled (an engine slow to pull) is STARTING, and RUNNING
  once its container runs, also when a server killed meanwhile adopts it;
* file_mounts whose sources no worker sees (``lab.hidden``: each worker has its own empty
  tmpfs there) reach every replica, in a container and not, copied once per job per node
  through Ray's object store, and are gone when the job ends; a source over the configured
  limit fails its replica with a sentence naming the mount;
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
from container_lab import GRACED, IMAGE, MARKER, SITE, containers_of, ensure_image, start_registry

pytest.importorskip("ray", reason="ray is not installed (pip install 'corral[ray]')")

from ray_lab import RayLab, leave_as_found, site_config, start_lab  # noqa: E402

status, replicas, events = cli_status, replicas_by_label, cli_events


@pytest.fixture(scope="module")
def lab():
    ensure_image()  # before the lab: a missing podman skips without starting Ray
    # the fence, not Ray's health checks, ends a lost attempt; lab.hidden: what no worker sees
    lab = start_lab(workers=2, gpus=4, misses=20, cgroups=True, hide=os.geteuid() == 0)
    yield lab
    lab.stop()


@pytest.fixture(scope="module")
def registry(lab: RayLab):
    registry = start_registry("private/raypull:1", host=lab.head_ip)  # on the bridge: the workers reach it
    yield registry
    registry.stop()


LIMIT = 'file_mounts_max_gb: 0.001'  # 1 MB: what a worker that does not see a source is sent at most


@pytest.fixture
def corral(lab: RayLab, tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(site_config(lab, SITE).replace(f'address: "{lab.address}"',
                                                                     f'address: "{lab.address}", {LIMIT}'))
    run = cli_for(home, cwd=tmp_path, timeout=120)
    yield run
    leave_as_found(run, home)


def _mine(corral, job: str, name: str) -> list[str]:
    """The job's containers on this machine (any state): named corral-SCOPE-…-JOB.NAME.RANK.aN,
    SCOPE being its home's (other runs share the machine's engine)."""
    from corral.executors import scope_of
    from corral.settings import Settings

    prefix = f"corral-{scope_of(Settings(home=corral.home, db_url='sqlite://'))}-"
    return [n for n in containers_of() if n.startswith(prefix) and f"-{job}.{name}." in n]


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
    wait_for(lambda: _mine(corral, "1", "server") == [], timeout=30)  # the server's container went with its job


def _login(registry) -> str:  # noqa: ANN001
    return (f"secrets: {{SKYPILOT_DOCKER_USERNAME: {registry.user}, SKYPILOT_DOCKER_PASSWORD: {registry.password}, "
            f"SKYPILOT_DOCKER_SERVER: {registry.address}}}\n")


def _ended(corral, job: str, timeout: float = 120) -> dict:
    return wait_for(lambda: (s := status(corral, job))["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") and s,
                    timeout=timeout)


def test_a_pull_the_registry_refuses_fails_the_replica_with_its_words_once(corral, registry, tmp_path: Path) -> None:
    spec = tmp_path / "refused.yaml"
    spec.write_text(f"""
name: refused
resources: {{image_id: docker:{registry.image('private/raypull:1')}, accelerators: H100:1}}
restart: {{policy: on_failure, max_restarts: 3, backoff: {{initial: 0s}}}}
run: echo never
""")
    job = corral("launch", "-d", "-p", "gpu", str(spec), check=True).stdout.strip()
    done = _ended(corral, job)
    assert done["state"] == "FAILED", done
    assert "image pull failed" in done["message"] and "unauthorized" in done["message"].lower(), done
    assert replicas(done)["refused-0"]["restarts"] == 0, done  # a refusal is not pulled again and again
    assert any("unauthorized" in m.lower() for m in _told(corral, job)), _told(corral, job)
    log = corral("logs", job).stdout
    assert log.count("corral: pulling") == 1 and "never" not in log.replace("echo never", ""), log


def _slow_engine(corral, tmp_path: Path, seconds: int) -> None:  # noqa: ANN001
    """The site's engine becomes one slow to pull (``seconds`` per pull) for the next starts."""
    import shutil

    slow = tmp_path / "slow-podman"
    slow.write_text(f'#!/bin/sh\nif [ "$1" = pull ]; then sleep {seconds}; fi\nexec {shutil.which("podman")} "$@"\n')
    slow.chmod(0o755)
    config = corral.home / "config.yaml"
    config.write_text(config.read_text().replace("containers:\n", f"containers:\n  engine: {slow}\n"))


def test_a_replica_on_ray_is_starting_while_its_image_is_pulled(corral, registry, tmp_path: Path) -> None:
    _slow_engine(corral, tmp_path, 5)
    spec = tmp_path / "pulled.yaml"
    spec.write_text(f"name: pulled\nresources: {{image_id: docker:{registry.image('private/raypull:1')}, "
                    f"accelerators: H100:1}}\nrun: test -e {MARKER} && sleep 2\n" + _login(registry))
    job = corral("launch", "-d", "-p", "gpu", str(spec), check=True).stdout.strip()
    wait_for(lambda: "corral: pulling" in corral("logs", job).stdout, timeout=60)
    seen = set()
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:  # the pull (5 s) is under way
        seen.add(replicas(status(corral, job))["pulled-0"]["state"])
    assert seen == {"STARTING"}, seen
    wait_for(lambda: replicas(status(corral, job))["pulled-0"]["state"] == "RUNNING", timeout=30)
    done = _ended(corral, job)
    assert done["state"] == "SUCCEEDED", _told(corral, job)
    assert any("in its container" in m for m in _told(corral, job)), _told(corral, job)


def test_a_replica_pulling_when_the_server_is_killed_is_adopted_starting_then_runs(corral, registry,
                                                                                   tmp_path: Path) -> None:
    """A server killed during a pull on Ray: its successor adopts the attempt (its actor) as
    STARTING, confirms it once its container runs, and starts no second one."""
    import json

    _slow_engine(corral, tmp_path, 10)
    spec = tmp_path / "adopted.yaml"
    spec.write_text(f"name: adopted\nresources: {{image_id: docker:{registry.image('private/raypull:1')}, "
                    f"accelerators: H100:1}}\nrun: test -e {MARKER} && sleep 3\n" + _login(registry))
    job = corral("launch", "-d", "-p", "gpu", str(spec), check=True).stdout.strip()
    wait_for(lambda: "corral: pulling" in corral("logs", job).stdout, timeout=60)
    os.kill(json.loads(corral("server", "status", "--json", check=True).stdout)["pid"], signal.SIGKILL)
    seen = {replicas(status(corral, job))["adopted-0"]["state"]}  # a new server answers and adopts it
    deadline = time.monotonic() + 2.5
    while time.monotonic() < deadline:  # its pull (10 s) still under way
        seen.add(replicas(status(corral, job))["adopted-0"]["state"])
    assert seen == {"STARTING"}, seen
    wait_for(lambda: replicas(status(corral, job))["adopted-0"]["state"] == "RUNNING", timeout=60)
    done = _ended(corral, job)
    assert done["state"] == "SUCCEEDED" and replicas(done)["adopted-0"]["restarts"] == 0, _told(corral, job)
    assert corral("logs", job).stdout.count("corral: pulling") == 1  # the same attempt: never started twice
    assert any("in its container" in m for m in _told(corral, job)), _told(corral, job)


def test_file_mounts_reach_ray_nodes_that_do_not_see_them(corral, lab: RayLab, tmp_path: Path) -> None:
    if lab.hidden is None:
        pytest.skip("hiding a directory from the workers needs root")
    src = lab.hidden / f"src-{tmp_path.name}"  # this machine's alone: no worker sees it
    (src / "data").mkdir(parents=True)
    (src / "data" / "a.txt").write_text("shard\n")
    (src / "cfg.txt").write_text("lr: 0.1\n")
    remote = f"{lab.hidden}/mnt-{tmp_path.name}"  # a path of each worker's own (its tmpfs there)
    mounts = f"file_mounts: {{{remote}/data: {src}/data, {remote}/cfg.txt: {src}/cfg.txt}}"
    spec = tmp_path / "files.yaml"
    spec.write_text(f"""
name: files
execution: parallel
---
name: boxed
num_nodes: 2
resources: {{image_id: docker:{IMAGE}, accelerators: H100:2}}
{mounts}
run: test -e {MARKER} && echo "boxed $(cat {remote}/data/a.txt) $(cat {remote}/cfg.txt)"
---
name: bare
num_nodes: 2
resources: {{accelerators: H100:2}}
{mounts}
run: |
  test ! -e {src} || exit 4
  test ! -L {remote}/data || exit 5
  echo "bare $(cat {remote}/data/a.txt) $(cat {remote}/cfg.txt) $(grep -c 'NoNewPrivs:.1' /proc/self/status)"
""")
    done = corral("launch", "-p", "gpu", str(spec), timeout=180)
    log = corral("logs", "files").stdout
    assert done.returncode == 0, log[-3000:] + done.stderr[-2000:]
    # bare: bound in each replica's own mount namespace (no link on the node), with no_new_privs
    assert log.count("boxed shard lr: 0.1") == 2 and log.count("bare shard lr: 0.1 1") == 2, log
    nodes = {r["node"] for r in replicas(status(corral, "files")).values()}
    assert len(nodes) == 2  # 8 GPUs: both workers
    for source in (f"{src}/data", f"{src}/cfg.txt"):  # once per job per node, whatever its replicas there
        assert log.count(f"corral: copied {source} to this node") == len(nodes), log
    for worker in lab.workers:  # gone with the job: the links, what corral made for them, the copies
        wait_for(lambda: not lab.sees(worker, f"{remote}/data") and not lab.sees(worker, remote), timeout=30)
        assert not list(lab.node_dir(worker).glob("corral-ray-*/mounts/1")), list(lab.node_dir(worker).rglob("*"))


def test_a_source_over_the_limit_fails_its_replica_naming_the_mount(corral, lab: RayLab, tmp_path: Path) -> None:
    if lab.hidden is None:
        pytest.skip("hiding a directory from the workers needs root")
    big = lab.hidden / f"big-{tmp_path.name}"
    big.mkdir()
    (big / "weights.bin").write_bytes(os.urandom(2 * 2**20))  # 2 MB, over the 1 MB limit
    spec = tmp_path / "big.yaml"
    spec.write_text(f"name: big\nresources: {{accelerators: H100:1}}\nfile_mounts: {{/opt/big-{tmp_path.name}: {big}}}\n"
                    "restart: {policy: on_failure, backoff: {initial: 0s}}\nrun: echo never\n")
    job = corral("launch", "-d", "-p", "gpu", str(spec), check=True).stdout.strip()
    done = _ended(corral, job)
    assert done["state"] == "FAILED", done
    said = done["message"]
    assert f"file_mounts./opt/big-{tmp_path.name}" in said and "1.0 MB" in said and "file_mounts_max_gb" in said, said
    assert replicas(done)["big-0"]["restarts"] == 0, done


def test_a_program_in_a_container_on_ray_gets_the_stop_signal_and_its_grace(corral, lab: RayLab,
                                                                            tmp_path: Path) -> None:
    spec = tmp_path / "graced.yaml"
    spec.write_text(GRACED)
    job = corral("launch", "-d", "-p", "gpu", str(spec), check=True).stdout.strip()
    wait_for(lambda: "up" in corral("logs", job).stdout.split(), timeout=120)
    assert corral("cancel", job).returncode == 0
    _ended(corral, job)
    log = [line.split(" | ", 1)[-1] for line in corral("logs", job).stdout.splitlines()]
    assert "got TERM" in log and "saved" in log and "after" not in log, log


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
    first = _mine(corral, job, "fenced")
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
    now = _mine(corral, job, "fenced")
    assert first[0] not in now and len(now) == 1, (first, now)  # the old container is gone, one runs
    corral("cancel", job, check=True)
    wait_for(lambda: status(corral, job)["state"] == "CANCELLED", timeout=60)
    wait_for(lambda: _mine(corral, job, "fenced") == [], timeout=30)
    size = len(_beats(beats))
    time.sleep(1.5)
    assert len(_beats(beats)) == size  # nothing of either attempt runs after the cancel
