#!/usr/bin/env python3
"""What running a replica in a container costs in corral, beside Podman by hand in the same run.

  python bench/containers.py [--runs 15] [--replicas 16] [--private]

Workloads (corral's embedded local server, one node; the node's Podman with the options this
machine needs, ``tests/container_lab.py``'s ``SITE``; images built offline):
  * latency: submit → the replica's first command runs inside its container (it touches a file
    in its working directory; the bench sees the file appear, polling every millisecond), p50
    over ``--runs`` one-task jobs run one after another, beside ``podman run`` of the same image
    with the same options by hand (start → the same file), measured the same way in the same run;
  * cold start: an image no node has (a rootfs of its own, so no layer is shared with another
    image; removed from the store first) in a registry on loopback; a job group of
    ``--replicas`` replicas (two tasks) in it: submit → every replica runs inside, and how often
    the image was pulled (the ``corral: pulling`` lines of the job's log: once per node is the
    promise), beside ``podman pull`` and then ``--replicas`` concurrent ``podman run`` by hand;
  * with ``--private``: the same group from a registry that wants a login (the login in the
    job's secrets), pulls counted the same way.

The target: corral adds at most 100 ms to a container's start."""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from corral import embedded as daemon  # noqa: E402
from corral.client import Client  # noqa: E402
from corral.credentials import read_local_token  # noqa: E402
from corral.settings import Settings  # noqa: E402

import container_lab  # noqa: E402

POOL = "nodes:\n  - {name: node, cpus: 64, memory: 512}\n"
# what the lab's SITE gives podman, for the hand-run baseline (corral adds its own: name, labels,
# host network, hosts file, env file, binds, --init)
BY_HAND = ["--runtime", "runc", "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096", "--network", "host"]


def wait_files(paths: list[Path], timeout: float = 120.0) -> float:
    """The time the last of ``paths`` exists, polled every millisecond."""
    deadline = time.time() + timeout
    left = list(paths)
    while time.time() < deadline:
        left = [p for p in left if not p.exists()]
        if not left:
            return time.time()
        time.sleep(0.001)
    raise TimeoutError(f"{len(left)} of {len(paths)} never appeared (first: {left[0]})")


def wait_done(client: Client, job_id: int, timeout: float = 120.0) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = client.job(job_id)
        if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT"):
            return job
        time.sleep(0.05)
    raise TimeoutError(f"job {job_id} did not end")


def podman() -> str:
    return container_lab.need_podman()


def corral_latency(client: Client, work: Path, image: str, runs: int) -> list[float]:
    out = []
    for i in range(runs):
        flag = work / f"corral-{i}"
        t0 = time.time()
        job = client.submit(f"name: lat{i}\nresources: {{image_id: docker:{image}}}\nrun: touch {flag}\n",
                            cwd=str(work))["job"]
        out.append(wait_files([flag]) - t0)
        done = wait_done(client, job["id"])
        if done["state"] != "SUCCEEDED":
            raise RuntimeError(f"job {job['id']} {done['state']}: {b''.join(client.logs(job['id']))[-500:]!r}")
    return out


def hand_latency(work: Path, image: str, runs: int) -> list[float]:
    out = []
    for i in range(runs):
        flag = work / f"hand-{i}"
        t0 = time.time()
        proc = subprocess.Popen([podman(), "run", "--rm", *BY_HAND, "-v", f"{work}:{work}", "-w", str(work), image,
                                 "/bin/sh", "-c", f"touch {flag}"], stdout=subprocess.DEVNULL)
        out.append(wait_files([flag]) - t0)
        if proc.wait(timeout=60) != 0:
            raise RuntimeError("podman run by hand failed")
    return out


def cold_image(registry: str, tag: str) -> str:
    """A test image of its own (the lab's recipe and a file naming ``tag``: no layer shared),
    pushed to ``registry`` and removed from this node's store."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        for d in ("bin", "etc", "tmp", "www"):
            (root / d).mkdir(parents=True)
        shutil.copy("/bin/busybox", root / "bin" / "busybox")
        for applet in container_lab.APPLETS:
            (root / "bin" / applet).symlink_to("busybox")
        (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
        (root / "etc" / "group").write_text("root:x:0:\n")
        (root / "cold").write_text(tag + "\n")
        tar = Path(tmp) / "rootfs.tar"
        with tarfile.open(tar, "w") as out:
            out.add(root, arcname=".")
        image = f"{registry}/bench/cold:{tag}"
        subprocess.run([podman(), "import", "-q", "--change", "ENV=PATH=/bin", str(tar), image], check=True,
                       capture_output=True)
    subprocess.run([podman(), "push", "-q", "--tls-verify=false", image], check=True, capture_output=True)
    remove_image(image)
    return image


def remove_image(image: str) -> None:
    subprocess.run([podman(), "rmi", "-f", image], capture_output=True)
    if subprocess.run([podman(), "image", "exists", image]).returncode == 0:
        raise RuntimeError(f"{image} is still in the store")


def open_registry() -> tuple[str, subprocess.Popen, Path, Path]:
    """A distribution registry on loopback without a login (a public image's registry)."""
    server = shutil.which("docker-registry")
    if server is None:
        raise SystemExit("the cold start needs docker-registry (apt-get install docker-registry)")
    root = Path(tempfile.mkdtemp(prefix="corral-bench-registry-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (root / "config.yml").write_text(f"version: 0.1\nlog: {{level: error}}\n"
                                     f"storage: {{filesystem: {{rootdirectory: {root / 'data'}}}}}\n"
                                     f"http: {{addr: 127.0.0.1:{port}}}\n")
    proc = subprocess.Popen([server, "serve", str(root / "config.yml")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    conf = Path("/etc/containers/registries.conf.d") / f"corral-bench-{port}.conf"
    conf.write_text(f'[[registry]]\nlocation = "127.0.0.1:{port}"\ninsecure = true\n')
    deadline = time.time() + 20
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if time.time() > deadline:
                raise RuntimeError("the registry did not start")
            time.sleep(0.1)
    return f"127.0.0.1:{port}", proc, conf, root


def group_text(image: str, replicas: int, work: Path, extra: str = "") -> str:
    half = replicas // 2
    tasks = [("a", half), ("b", replicas - half)]
    docs = ["name: cold\nexecution: parallel\n"] + [
        f"name: {name}\nnum_nodes: {n}\nresources: {{image_id: docker:{image}}}\n{extra}"
        f"run: touch {work}/up-$CORRAL_TASK-$CORRAL_REPLICA\n" for name, n in tasks]
    return "---\n".join(docs)


def corral_cold(client: Client, work: Path, image: str, replicas: int, extra: str = "") -> tuple[float, int, str]:
    half = replicas // 2
    flags = [work / f"up-a-{i}" for i in range(half)] + [work / f"up-b-{i}" for i in range(replicas - half)]
    t0 = time.time()
    job = client.submit(group_text(image, replicas, work, extra), cwd=str(work))["job"]
    took = wait_files(flags, timeout=300) - t0
    done = wait_done(client, job["id"], timeout=300)
    logs = b"".join(client.logs(job["id"])).decode(errors="replace")
    if done["state"] != "SUCCEEDED":
        raise RuntimeError(f"cold group {done['state']}: {logs[-1000:]}")
    return took, sum("corral: pulling" in line for line in logs.splitlines()), done["state"]


def hand_cold(work: Path, image: str, replicas: int) -> float:
    flags = [work / f"hand-up-{i}" for i in range(replicas)]
    t0 = time.time()
    subprocess.run([podman(), "pull", "-q", image], check=True, capture_output=True)
    procs = [subprocess.Popen([podman(), "run", "--rm", *BY_HAND, "-v", f"{work}:{work}", image, "/bin/sh", "-c",
                               f"touch {flag}"], stdout=subprocess.DEVNULL) for flag in flags]
    took = wait_files(flags, timeout=300) - t0
    for proc in procs:
        proc.wait(timeout=120)
    return took


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--replicas", type=int, default=16)
    parser.add_argument("--private", action="store_true", help="also a group from a registry that wants a login")
    args = parser.parse_args()
    image = container_lab.ensure_image()
    home = Path(tempfile.mkdtemp(prefix="corral-bench-containers-"))
    (home / "config.yaml").write_text(POOL + container_lab.SITE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["CORRAL_HOME"] = str(home)
    settings = Settings.from_env(env)
    info = daemon.start(settings)
    client = Client(info["url"], read_local_token(home))
    work = home / "work"
    work.mkdir()
    address, registry, conf, registry_root = open_registry()
    private = None
    try:
        print(f"# bench/containers.py  {time.strftime('%Y-%m-%d %H:%M:%S')}  podman "
              f"{subprocess.run([podman(), '--version'], capture_output=True, text=True).stdout.split()[-1]}, "
              f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
        corral_latency(client, work, image, 2)  # warm-up: the server's first job, podman's caches
        hand_latency(work, image, 2)
        hands, corrals = [], []
        for i in range(args.runs):  # interleaved, so a load change hits both alike
            sub = work / f"r{i}"
            sub.mkdir()
            hands += hand_latency(sub, image, 1)
            corrals += corral_latency(client, sub, image, 1)
        h50, c50 = statistics.median(hands), statistics.median(corrals)
        print(f"\nsubmit -> replica running inside its container ({args.runs} runs each, interleaved)")
        print(f"  {'':28} {'p50':>8} {'p90':>8} {'min':>8}")
        print(f"  {'podman run by hand':28} {h50 * 1e3:7.0f}ms {p(hands, 90) * 1e3:7.0f}ms {min(hands) * 1e3:7.0f}ms")
        print(f"  {'corral (SDK submit)':28} {c50 * 1e3:7.0f}ms {p(corrals, 90) * 1e3:7.0f}ms {min(corrals) * 1e3:7.0f}ms")
        print(f"  corral adds {(c50 - h50) * 1e3:+.0f} ms at p50 ({c50 / h50:.2f}x podman by hand); target <= +100 ms: "
              f"{'met' if c50 - h50 <= 0.1 else 'NOT met'}")

        tag = f"t{os.getpid()}-{int(time.time())}"
        cold = cold_image(address, tag + "c")
        hand = cold_image(address, tag + "h")
        cold_dir, hand_dir = work / "cold", work / "hand-cold"
        cold_dir.mkdir()
        hand_dir.mkdir()
        took, pulls, _ = corral_cold(client, cold_dir, cold, args.replicas)
        by_hand = hand_cold(hand_dir, hand, args.replicas)
        print(f"\n{args.replicas}-replica group from a cold image cache (image removed first; registry on loopback)")
        print(f"  podman pull, then {args.replicas} podman run at once, by hand: {by_hand:6.2f}s")
        print(f"  corral (submit -> all {args.replicas} replicas running inside): {took:6.2f}s "
              f"({took / by_hand:.2f}x, {took - by_hand:+.2f}s)")
        print(f"  pulls of the image on this node (\"corral: pulling\" lines in the job's log): {pulls} "
              f"(expected 1: {'met' if pulls == 1 else 'NOT met'})")
        remove_image(cold)
        remove_image(hand)
        if args.private:
            private = container_lab.start_registry(f"private/busybox:{tag}")
            image_p = private.image(f"private/busybox:{tag}")
            secrets = (f"secrets: {{SKYPILOT_DOCKER_USERNAME: {private.user}, SKYPILOT_DOCKER_PASSWORD: "
                       f"{private.password}, SKYPILOT_DOCKER_SERVER: {private.address}}}\n")
            priv_dir = work / "private"
            priv_dir.mkdir()
            took_p, pulls_p, _ = corral_cold(client, priv_dir, image_p, args.replicas, secrets)
            print(f"\n{args.replicas}-replica group from a registry that wants a login (login in the job's secrets)")
            print(f"  corral: {took_p:6.2f}s; pulls on this node: {pulls_p} (once per job per task, the login's "
                  f"scope: expected 2, for the group's 2 tasks)")
            remove_image(image_p)
    finally:
        daemon.stop(settings)
        registry.kill()
        registry.wait(timeout=10)
        conf.unlink(missing_ok=True)
        shutil.rmtree(registry_root, ignore_errors=True)
        if private is not None:
            private.stop()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
