"""A real multi-node Ray cluster on this one machine, for tests and benchmarks.

The head runs in the root network namespace; each worker runs in a network namespace of
its own with its own IP on a veth pair into a bridge the lab creates (172.31.N.0/24, an
address range made here and used only between the lab's own namespaces), so traffic and
name resolution between replicas really cross hosts. Where namespaces cannot be made (not
root, no ``ip``, or ``CORRAL_RAY_LAB_LOOPBACK`` set), every node runs on loopback and
``lab.isolated`` is False.

Each node is ``ray start --block`` in its own process group, so a node is stopped by
killing that group (``ray stop`` would stop every Ray process on the machine). Killing a
worker also kills every process left in its namespace: what a machine's death does."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))
# Fast node-death detection (Ray's default takes ~15 s): one health check a second, three misses.
SYSTEM_CONFIG = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3,
                 "health_check_initial_delay_ms": 1000}


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check)


def can_isolate() -> bool:
    if os.environ.get("CORRAL_RAY_LAB_LOOPBACK") or os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    probe = f"crlprobe{os.getpid()}"
    ok = _run("ip", "netns", "add", probe, check=False).returncode == 0
    if ok:
        _run("ip", "netns", "del", probe, check=False)
    return ok


@dataclass
class Node:
    name: str
    ip: str
    proc: subprocess.Popen
    netns: str | None = None
    gpus: int = 0
    manager_port: int = 0

    def alive(self) -> bool:
        return self.proc.poll() is None

    def is_named(self, corral_name: str) -> bool:
        """Whether corral's name for a Ray node (``ray-IP`` or ``ray-IP-PORT``) is this node."""
        if corral_name.endswith(f"-{self.manager_port}"):  # nodes sharing an IP are told apart by port
            return True
        return self.netns is not None and corral_name.endswith("-" + self.ip.replace(".", "-"))


@dataclass
class RayLab:
    head_ip: str
    port: int
    isolated: bool
    tag: str
    temp: Path
    bridge: str | None = None
    nodes: list[Node] = field(default_factory=list)
    # how each worker was started (its command line without the netns prefix, and its log), so
    # a killed one can come back as the same machine
    commands: dict[str, tuple[list[str], Path]] = field(default_factory=dict)
    cgroups: bool = False  # workers see the machine's /sys (its cgroup mounts), see ``start_lab``
    hidden: Path | None = None  # a directory of this machine that no worker sees (``start_lab``)

    @property
    def address(self) -> str:
        return f"{self.head_ip}:{self.port}"

    @property
    def workers(self) -> list[Node]:
        return [n for n in self.nodes if n.name != "head"]

    def kill(self, node: Node) -> None:
        """The node dies: its Ray processes and everything else in its namespace."""
        try:
            os.killpg(node.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 10
        while node.netns and time.monotonic() < deadline:  # until nothing of the machine is left
            pids = _run("ip", "netns", "pids", node.netns, check=False).stdout.split()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            time.sleep(0.05)
        try:
            node.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def node_dir(self, node: Node) -> Path:
        """Where corral keeps its files on a worker of a ``hide`` lab (its CORRAL_RAY_DIR)."""
        return self.temp / f"w{self.workers.index(node)}"

    def sees(self, node: Node, path: str) -> bool:
        """Whether ``path`` exists as the worker sees it (in its own mount namespace)."""
        return _run("nsenter", f"--mount=/proc/{node.proc.pid}/ns/mnt", "--", "test", "-e", path,
                    check=False).returncode == 0

    def raylet(self, node: Node) -> int:
        """The pid of the node's raylet (a child of its ``ray start``)."""
        for line in _run("ps", "-eo", "pid=,ppid=,comm=", check=False).stdout.splitlines():
            pid, ppid, comm = (line.split(None, 2) + ["", "", ""])[:3]
            if comm.strip() == "raylet" and _descends(int(pid), node.proc.pid):
                return int(pid)
        raise RuntimeError(f"no raylet found for {node.name}")

    def revive(self, node: Node, timeout: float = 60.0) -> None:
        """A killed node comes back: the same name, IP, namespace and resources (a machine
        that rebooted); a worker rejoins the cluster, the head starts it anew at its address.
        What is left of its earlier life (a ``ray start`` whose raylet was killed) goes first."""
        self.kill(node)
        argv, log = self.commands[node.name]
        node.proc = _start(argv, node.netns, log, self.cgroups)
        if node.name != "head":  # the head comes up with the first worker's query
            self.wait_nodes(sum(n.alive() for n in self.nodes), timeout)

    def stop(self) -> None:
        for node in reversed(self.nodes):
            self.kill(node)
        if self.isolated:
            for node in self.nodes:
                if node.netns:
                    _run("ip", "netns", "del", node.netns, check=False)
            if self.bridge:
                _run("ip", "link", "del", self.bridge, check=False)
        shutil.rmtree(self.temp, ignore_errors=True)
        if self.hidden is not None:
            shutil.rmtree(self.hidden, ignore_errors=True)

    def wait_nodes(self, count: int, timeout: float = 60.0) -> list[dict]:
        """Ray's view of its alive nodes, once ``count`` are up (asked in a subprocess, so
        the caller's process is not a Ray driver)."""
        # one driver asks until the count is reached (importing ray and connecting took 2-3 s
        # a time on a loaded machine, for each look while a node was still registering); a
        # look that fails to connect (the head's GCS not up yet) is tried again after a second
        code = ("import json, sys, time, ray\n"
                "ray.init(address=sys.argv[1], log_to_driver=False, logging_level='ERROR')\n"
                "count, until = int(sys.argv[2]), time.monotonic() + float(sys.argv[3])\n"
                "while True:\n"
                "    nodes = [n for n in ray.nodes() if n['Alive']]\n"
                "    if len(nodes) >= count or time.monotonic() > until:\n"
                "        break\n"
                "    time.sleep(0.2)\n"
                "print(json.dumps(nodes))\n")
        deadline = time.monotonic() + timeout
        nodes: list[dict] = []
        while time.monotonic() < deadline:
            left = max(deadline - time.monotonic(), 0.0)
            done = subprocess.run([sys.executable, "-c", code, self.address, str(count), f"{left:.1f}"],
                                  capture_output=True, text=True, timeout=left + 60)
            # Ray may print its own warnings to stdout (lagging heartbeats on a busy machine)
            said = [line for line in done.stdout.splitlines() if line.startswith("[")]
            if done.returncode == 0 and said:
                nodes = json.loads(said[-1])
                if len(nodes) >= count:
                    return nodes
            time.sleep(1)
        raise RuntimeError(f"only {len(nodes)} of {count} Ray nodes came up")


def _descends(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return False
    return False


def _free_subnet() -> int:
    used = _run("ip", "-4", "addr", check=False).stdout
    for _ in range(100):
        n = random.randint(100, 250)
        if f"172.31.{n}." not in used:
            return n
    raise RuntimeError("no free 172.31.N.0/24 for the lab")


def _nameservers() -> list[str]:
    """This machine's DNS servers (IPv4), which a worker's namespace cannot reach: its packets
    would be dropped (no forwarding from the lab's bridge), so every lookup DNS is asked, as
    ``getent hosts`` asks for a name's IPv6 address before reading the IPv4 one in /etc/hosts,
    would wait out the resolver's timeouts (20 s). Routed as unreachable there, a lookup fails
    at once, as a cluster's DNS server answers at once for a name it does not know."""
    try:
        lines = Path("/etc/resolv.conf").read_text().splitlines()
    except OSError:
        return []
    return [parts[1] for parts in (line.split() for line in lines)
            if len(parts) >= 2 and parts[0] == "nameserver" and parts[1].count(".") == 3]


def _cleanup_leftovers() -> None:
    """Namespaces and bridges of earlier runs that died without tearing down."""
    for line in _run("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        mine = re.fullmatch(r"crl(\d+)(?:l\d+)?w\d+", name)
        if mine:
            pid = int(mine[1])
            if not Path(f"/proc/{pid}").exists():
                for pid_ in _run("ip", "netns", "pids", name, check=False).stdout.split():
                    try:
                        os.kill(int(pid_), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
                _run("ip", "netns", "del", name, check=False)
    for line in _run("ip", "-o", "link", "show", "type", "bridge", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        mine = re.fullmatch(r"crlbr(\d+)(?:l\d+)?", name)
        if mine and not Path(f"/proc/{mine[1]}").exists():
            _run("ip", "link", "del", name, check=False)


def _start(argv: list[str], netns: str | None, log: Path, cgroups: bool = False) -> subprocess.Popen:
    if netns and cgroups:  # the network namespace alone: the machine's mounts, /sys and its cgroups stay
        argv = ["nsenter", f"--net=/run/netns/{netns}", "--"] + argv
    elif netns:
        argv = ["ip", "netns", "exec", netns] + argv
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)


_LABS = 0  # labs started by this process


def start_lab(workers: int = 2, gpus: int = 4, gpu_type: str = "H100", cpus: int = 2, misses: int = 3,
              cgroups: bool = False, hide: bool = False) -> RayLab:
    """A head (no GPUs) and ``workers`` nodes with ``gpus`` declared GPUs of ``gpu_type``,
    labelled ``switch=leaf{i}``; a node is declared dead after ``misses`` missed health
    checks, one a second. With ``cgroups`` a worker enters only its network namespace
    (``nsenter --net``), keeping the machine's /sys: ``ip netns exec`` mounts a sysfs of the
    namespace without the cgroup mounts, where a container engine (runc) cannot start a
    container (``no cgroup mount found in mountinfo``), as no real machine would lack them.
    With ``hide`` (root only) each worker runs in a mount namespace of its own where
    ``lab.hidden``, a directory of this machine, is an empty tmpfs: files there are the
    submitting machine's alone, as on a cluster without a shared filesystem; and corral's
    node directories are its own (``lab.node_dir``)."""
    isolated = can_isolate()
    # the process's id, and which of its labs: a session's conformance lab is still up when a
    # Ray test module of the same worker starts its own (their bridges and namespaces collided)
    global _LABS
    _LABS += 1
    tag = f"{os.getpid()}l{_LABS}"
    temp = Path(tempfile.mkdtemp(prefix=f"crl{tag}-", dir="/tmp"))
    common = ["--disable-usage-stats", "--object-store-memory", str(80 * 2**20), "--block"]
    if isolated:
        _cleanup_leftovers()
        net = _free_subnet()
        bridge = f"crlbr{tag}"[:15]
        head_ip = f"172.31.{net}.1"
        _run("ip", "link", "add", bridge, "type", "bridge")
        _run("ip", "addr", "add", f"{head_ip}/24", "dev", bridge)
        _run("ip", "link", "set", bridge, "up")
    else:
        bridge, head_ip, net = None, "127.0.0.1", 0
    port = random.randint(20000, 29000)
    # Ray's client server (ray://) needs ray[client]; without it Ray refuses the option. The
    # lab speaks to the GCS directly, so the port is only pinned to keep clear of 10001.
    client_port = ["--ray-client-server-port", str(port + 1)] if importlib.util.find_spec("grpc") else []
    lab = RayLab(head_ip, port, isolated, tag, temp, bridge, cgroups=cgroups)
    # what a worker starts under to lose sight of lab.hidden (private: its mounts stay its own)
    unseen: list[str] = []
    if hide:
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            raise RuntimeError("hiding a directory from the lab's workers needs root and unshare")
        lab.hidden = Path(tempfile.mkdtemp(prefix=f"crl{tag}-hidden-", dir="/tmp"))
        unseen = ["unshare", "--mount", "--propagation", "slave", "sh", "-c",
                  'mount -t tmpfs -o size=1m,mode=0700 corral-lab-hidden "$0" && exec "$@"', str(lab.hidden)]
    try:
        argv = [RAY, "start", "--head", "--node-ip-address", head_ip, "--port", str(port), "--num-cpus", "1",
                "--num-gpus", "0", "--temp-dir", str(temp), "--system-config",
                json.dumps({**SYSTEM_CONFIG, "health_check_failure_threshold": misses}),
                *client_port, "--include-dashboard=false", *common]
        lab.commands["head"] = (argv, temp / "head.log")
        head = _start(argv, None, temp / "head.log")
        lab.nodes.append(Node("head", head_ip, head))
        for i in range(workers):
            netns, ip = None, "127.0.0.1"
            if isolated:
                netns, ip = f"crl{tag}w{i}", f"172.31.{net}.{10 + i}"
                host_end, ns_end = f"crl{tag}h{i}"[:15], f"crl{tag}n{i}"[:15]
                _run("ip", "netns", "add", netns)
                _run("ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end)
                _run("ip", "link", "set", ns_end, "netns", netns)
                _run("ip", "link", "set", host_end, "master", bridge)
                _run("ip", "link", "set", host_end, "up")
                _run("ip", "netns", "exec", netns, "ip", "addr", "add", f"{ip}/24", "dev", ns_end)
                _run("ip", "netns", "exec", netns, "ip", "link", "set", ns_end, "up")
                _run("ip", "netns", "exec", netns, "ip", "link", "set", "lo", "up")
                _run("ip", "netns", "exec", netns, "ip", "route", "add", "default", "via", head_ip)
                for server in _nameservers():  # unreachable at once, not a black hole (see _nameservers)
                    _run("ip", "netns", "exec", netns, "ip", "route", "add", "unreachable", server, check=False)
            lab.wait_nodes(i + 1)  # one at a time: raylets starting together on one machine can time out
            manager_port = port + 10 + i
            # its own directories for corral's files (CORRAL_RAY_DIR), as a machine of its own has
            own = ["env", f"CORRAL_RAY_DIR={temp / f'w{i}'}"] if hide else []
            argv = unseen + own + [RAY, "start", "--address", lab.address, "--node-ip-address", ip, "--num-cpus", str(cpus),
                    "--node-manager-port", str(manager_port),
                    "--num-gpus", str(gpus), "--resources", json.dumps({f"accelerator_type:{gpu_type}": gpus}),
                    "--labels", f"switch=leaf{i}", *common]
            lab.commands[f"worker{i}"] = (argv, temp / f"worker{i}.log")
            proc = _start(argv, netns, temp / f"worker{i}.log", cgroups)
            lab.nodes.append(Node(f"worker{i}", ip, proc, netns, gpus, manager_port))
        lab.wait_nodes(workers + 1)
    except BaseException as exc:
        logs = "\n".join(f"--- {log.name}\n" + log.read_text()[-1500:] for log in sorted(temp.glob("*.log")))
        lab.stop()
        raise RuntimeError(f"the Ray lab did not come up: {exc}\n{logs}") from exc
    return lab


def site_config(lab: RayLab, extra: str = "") -> str:
    """config.yaml of a corral home beside the lab: a small local node and partition, and a
    ``gpu`` partition on the lab's Ray cluster."""
    return f"""
nodes:
  - {{name: here, cpus: 2, memory: 4}}
infra:
  ray: {{address: "{lab.address}"}}
partitions:
  - {{name: local, infra: local}}
  - {{name: gpu, infra: ray}}
{extra}"""


def leave_as_found(run, home: Path) -> None:  # noqa: ANN001 - conftest.cli_for's runner
    """A test's end on the shared lab: its jobs cancelled and gone, its server stopped, and
    whatever of its replicas is left killed."""
    from conftest import kill_leftovers, wait_for

    for job in json.loads(run("queue", "--json").stdout or "[]"):
        run("cancel", str(job["id"]))
    wait_for(lambda: json.loads(run("queue", "--json").stdout or "[]") == [], timeout=60)
    run("server", "stop")
    kill_leftovers(home)
