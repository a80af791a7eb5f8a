"""corral on a real multi-node Ray cluster (``ray_lab``): a head and two workers with four
declared H100s each, every worker in its own network namespace with its own IP when this
machine allows it (as root), so traffic and names really cross hosts. Driven through the
real ``corral`` command and its server, as a user would.

The node-death test kills a worker, so it runs last."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from conftest import cli_events, cli_for, cli_status, replicas_by_label, wait_for

pytest.importorskip("ray", reason="ray is not installed (pip install 'corral[ray]')")

from ray_lab import RayLab, leave_as_found, site_config, start_lab  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def lab():
    lab = start_lab(workers=2, gpus=4)
    if not lab.isolated:
        print("ray lab: no network namespaces here (not root, or no `ip`): all nodes on loopback")
    yield lab
    lab.stop()


def _config(lab: RayLab, extra: str = "") -> str:
    return site_config(lab, extra)


@pytest.fixture
def corral(lab: RayLab, tmp_path: Path, request):
    home = tmp_path / "home"
    home.mkdir()
    marker = request.node.get_closest_marker("site")
    (home / "config.yaml").write_text(_config(lab, marker.args[0] if marker else ""))
    run = cli_for(home, timeout=120)
    yield run
    leave_as_found(run, home)


status, replicas, events = cli_status, replicas_by_label, cli_events


def test_nodes_come_from_ray(corral, lab: RayLab) -> None:
    nodes = {n["name"]: n for n in json.loads(corral("nodes", "--json", check=True).stdout)}
    ray_nodes = [n for n in nodes.values() if n["infra"] == "ray"]
    workers = sorted((n for n in ray_nodes if n["gpus"]), key=lambda n: n["name"])
    assert len(ray_nodes) == 3 and len(workers) == 2 and "here" in nodes
    assert all(n["gpus"] == 4 and n["gpu_type"] == "H100" and n["state"] == "UP" for n in workers)
    assert sorted(n["labels"]["switch"] for n in workers) == ["leaf0", "leaf1"]
    if lab.isolated:
        assert {w.ip for w in lab.workers} == {n["name"].removeprefix("ray-").replace("-", ".") for n in workers}


def test_a_job_group_across_nodes_reaches_its_peers_by_name(corral, lab: RayLab, tmp_path: Path) -> None:
    spec = tmp_path / "group.yaml"
    spec.write_text("""
name: spread
execution: parallel
primary_tasks: [trainer]
---
name: rollout
num_nodes: 2
resources: {accelerators: H100:2}
ports: {http: 8000}
readiness_probe: {http: {path: /, port: http}, period: 0.3s}
run: exec python -m http.server $CORRAL_PORT_HTTP --bind $CORRAL_ADDR
---
name: trainer
resources: {accelerators: H100:2}
depends_on: [{task: rollout, condition: ready}]
run: |
  echo "trainer on $CORRAL_NODE ($CORRAL_ADDR) gpus $CUDA_VISIBLE_DEVICES names $CORRAL_NAMES"
  for r in 0 1; do
    port=$(python -c "import json,os; p=json.load(open(os.environ['CORRAL_PEERS_FILE'])); print(p['tasks']['rollout']['replicas'][$r]['ports']['http'])")
    getent hosts rollout-$r.spread
    curl -sf -o /dev/null -w "curl rollout-$r %{http_code}\\n" http://rollout-$r.spread:$port/ || exit 7
    python -c "import urllib.request; print('python rollout-$r', urllib.request.urlopen('http://rollout-$r.spread:$port/', timeout=5).status)" || exit 8
  done
""")
    done = corral("launch", "-p", "gpu", str(spec), timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    data = status(corral, "spread")
    reps = replicas(data)
    # both rollouts declare port 8000: never on one address, so on two nodes
    assert reps["rollout-0"]["node"] != reps["rollout-1"]["node"]
    assert reps["rollout-0"]["addr"] != reps["rollout-1"]["addr"]
    for r in (0, 1):
        assert f"curl rollout-{r} 200" in done.stdout and f"python rollout-{r} 200" in done.stdout
    if lab.isolated:
        workers = {w.ip for w in lab.workers}
        assert {reps[k]["addr"] for k in reps} <= workers  # node IPs, crossing namespaces
        assert "names mount-namespace" in done.stdout  # curl and getent resolve through /etc/hosts
    assert sorted(len(reps[k]["gpus"]) for k in reps) == [2, 2, 2]


def test_torch_all_reduce_across_two_nodes(corral, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    spec = tmp_path / "ddp.yaml"
    spec.write_text("""
name: ddp
num_nodes: 2
resources: {accelerators: H100:4}
run: |
  python - <<'EOF'
  import os, torch, torch.distributed as dist
  dist.init_process_group("gloo", init_method="env://", timeout=__import__("datetime").timedelta(seconds=60))
  t = torch.tensor([float(dist.get_rank() + 1)])
  dist.all_reduce(t)
  print(f"rank {dist.get_rank()}/{dist.get_world_size()} on {os.environ['CORRAL_NODE']} via {os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} sum {t.item()}")
  dist.destroy_process_group()
  EOF
""")
    done = corral("launch", "-p", "gpu", str(spec), timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert done.stdout.count("sum 3.0") == 2
    reps = replicas(status(corral, "ddp"))
    assert reps["ddp-0"]["node"] != reps["ddp-1"]["node"]


def test_the_grpo_example_across_nodes(corral, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    text = (ROOT / "examples/grpo/grpo.yaml").read_text()
    text = text.replace("workdir: examples/grpo", f"workdir: {ROOT / 'examples/grpo'}")
    # two rollouts declare port 8000: they need two addresses, so with two workers the trainer
    # shares one of them (it took a whole worker before ports were a node resource)
    text = text.replace("name: trainer\n", "name: trainer\nresources: {accelerators: H100:2}\n")
    text = text.replace("name: rollout\n", "name: rollout\nresources: {accelerators: H100:2}\n")
    spec = tmp_path / "grpo.yaml"
    spec.write_text(text)
    done = corral("launch", "-p", "gpu", str(spec), timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "mean reward: first 10 iterations" in done.stdout
    reps = replicas(status(corral, "grpo"))
    assert reps["rollout-0"]["node"] != reps["rollout-1"]["node"]  # one port, two addresses


@pytest.mark.site("qos:\n  - {name: normal, max_gpus_per_user: 4}\n")
def test_limits_hold_when_a_job_grows_on_ray(corral, tmp_path: Path) -> None:
    spec = tmp_path / "elastic.yaml"
    spec.write_text("""
name: elastic
execution: parallel
primary_tasks: [trainer]
---
name: rollout
num_nodes: {min: 1, max: 4, initial: 2}
resources: {accelerators: H100:1}
run: sleep 300
---
name: trainer
resources: {accelerators: H100:2}
run: sleep 300
""")
    job = corral("launch", "-d", "-p", "gpu", str(spec), check=True).stdout.strip()
    wait_for(lambda: status(corral, job)["state"] == "RUNNING", timeout=60)
    corral("scale", job, "rollout", "4", check=True)
    time.sleep(3)
    reps = replicas(status(corral, job))
    held = sum(len(r["gpus"]) for r in reps.values() if r["state"] in ("STARTING", "RUNNING"))
    assert held == 4 and sorted(r["state"] for r in reps.values()).count("PENDING") == 2


def test_a_server_restart_adopts_replicas_and_starts_none_twice(corral, tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    spec = tmp_path / "long.yaml"
    spec.write_text(f"""
name: long
num_nodes: 2
resources: {{accelerators: H100:1}}
run: echo $CORRAL_LAUNCH_KEY >> {starts}; exec sleep 300
""")
    job = corral("launch", "-d", "-p", "gpu", str(spec), check=True).stdout.strip()
    wait_for(lambda: status(corral, job)["state"] == "RUNNING" and starts.exists()
             and len(starts.read_text().split()) == 2, timeout=60)
    info = json.loads((corral.home / "server.json").read_text())
    os.kill(info["pid"], signal.SIGKILL)  # a crash
    wait_for(lambda: corral("server", "status").returncode == 1)
    data = status(corral, job)  # starts the server again
    wait_for(lambda: sum(e["cause"] == "adopted" for e in events(corral, job)) == 2, timeout=60)
    assert status(corral, job)["state"] == "RUNNING"
    time.sleep(2)
    assert len(starts.read_text().split()) == 2  # nothing started twice
    assert data["id"] == int(job)
    corral("cancel", job, check=True)
    final = wait_for(lambda: (lambda d: d if d["state"] == "CANCELLED" else None)(status(corral, job)), timeout=60)
    assert all(r["state"] == "KILLED" for r in replicas(final).values())


def test_a_dead_worker_s_replicas_restart_elsewhere_or_their_job_is_requeued(corral, lab: RayLab,
                                                                             tmp_path: Path) -> None:
    svc = tmp_path / "svc.yaml"
    svc.write_text("""
name: svc
execution: parallel
primary_tasks: [trainer]
---
name: rollout
resources: {accelerators: H100:2}
restart: {policy: on_failure, backoff: {initial: 0s}}
run: echo "rollout on $CORRAL_NODE at $CORRAL_ADDR attempt $CORRAL_RESTART_COUNT"; exec sleep 300
---
name: trainer
run: sleep 300
""")
    solo = tmp_path / "solo.yaml"
    solo.write_text("name: solo\nresources: {accelerators: H100:2}\nrun: exec sleep 300\n")
    job = corral("launch", "-d", "-p", "gpu", str(svc), check=True).stdout.strip()
    wait_for(lambda: status(corral, job)["state"] == "RUNNING", timeout=60)
    other = corral("launch", "-d", "-p", "gpu", str(solo), check=True).stdout.strip()
    wait_for(lambda: status(corral, other)["state"] == "RUNNING", timeout=60)
    before = replicas(status(corral, job))["rollout-0"]
    assert replicas(status(corral, other))["solo-0"]["node"] == before["node"]  # best fit: the same node
    assert replicas(status(corral, job))["trainer-0"]["node"] != before["node"]  # CPU-only: the GPU-less head
    victim = next(w for w in lab.workers if w.alive() and w.is_named(before["node"]))
    killed_at = time.monotonic()
    lab.kill(victim)
    lost = wait_for(lambda: next((e for e in events(corral, job) if e["subject"] == "rollout-0"
                                  and e["cause"] == "restart_scheduled"), None), timeout=30)
    detected = time.monotonic() - killed_at
    assert detected < 10.0, detected
    assert "lost" in lost["message"] and before["node"] in lost["message"]
    # the replica with a restart policy comes back elsewhere under its name
    after = wait_for(lambda: (lambda r: r if r["state"] == "RUNNING" and r["node"] != before["node"] else None)(
        replicas(status(corral, job))["rollout-0"]), timeout=60)
    assert after["hostname"] == before["hostname"] and after["restarts"] == 1
    if lab.isolated:
        assert after["addr"] != before["addr"]  # a new address: peers see the change
    # the job without one is requeued, as Slurm requeues a job whose node failed
    requeued = wait_for(lambda: (lambda d: d if d["state"] == "RUNNING" and d["requeues"] == 1 else None)(
        status(corral, other)), timeout=60)
    assert replicas(requeued)["solo-0"]["node"] != before["node"]
    assert any(e["cause"] == "node_lost" for e in events(corral, other))
    nodes = {n["name"]: n for n in json.loads(corral("nodes", "--json", check=True).stdout)}
    assert nodes[before["node"]]["state"] == "DOWN"
    print(f"lost detected {detected:.1f}s after the node died")
