"""The Ray actor that carries one attempt on the node corral placed it on: it runs the
attempt with the same ``NodeRunner`` the local executor uses (wrapper, cgroup, exit file,
hosts file, exec probes), so a replica on Ray sees the same environment contract as one on
this machine. Detached and named after the attempt key, it outlives the corral server, which
finds it again by name after a restart. Only plain data crosses Ray: no corral object is
pickled into the actor but its launch dictionary."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

from corral.node.runner import NodeRunner, process_start_time


def node_dirs(scope: str) -> tuple[Path, Path, Path]:
    """Runs, logs and discovery directories on a Ray node (no shared filesystem assumed)."""
    base = Path(os.environ.get("CORRAL_RAY_DIR", "/tmp")) / f"corral-ray-{scope}"
    shm = Path("/dev/shm") if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else base
    return base / "runs", base / "logs", shm / f"corral-ray-{scope}"


class ReplicaActor:
    def __init__(self, scope: str):
        runs, self.logs, runtime = node_dirs(scope)
        self.runner = NodeRunner(runs, runtime, scope)
        self.proc: subprocess.Popen | None = None
        self.key: str | None = None
        self.code: int | None = None
        self.done = threading.Event()
        self.log_file: Path | None = None
        self.lock = threading.Lock()  # a status asked while the start runs waits for it
        self.gpus: list[int] = []

    def start(self, launch: dict, hosts: str, peers: str) -> dict:
        with self.lock:
            return self._start(launch, hosts, peers)

    def _start(self, launch: dict, hosts: str, peers: str) -> dict:
        import ray

        from corral.runtime.discovery import RESOLVER_DIR

        self.key = launch["key"]
        job_id = int(launch["job_id"])
        self.runner.publish(job_id, hosts, peers)
        gpus = [str(g) for g in ray.get_gpu_ids()]
        env = dict(launch["env"])  # what the replica starts with (runtime.environment), nothing of the worker's
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)  # the GPUs Ray assigned this bundle
        env["SLURM_JOB_GPUS"] = env["CUDA_VISIBLE_DEVICES"]
        env["CORRAL_NAMES"] = self.runner.hosts_mode
        path = env.get("PYTHONPATH")
        env["PYTHONPATH"] = str(RESOLVER_DIR) + (os.pathsep + path if path else "")
        for directory in launch.get("dirs") or ():  # node-local unless the site mounts shared storage there
            Path(directory).mkdir(parents=True, exist_ok=True)
        self.log_file = self.logs / f"{self.key}.log"
        repo = launch.get("repo")
        self.proc = self.runner.spawn(self.key, job_id, launch["setup"], launch["run"], env, launch["cwd"],
                                      self.log_file, bool(launch.get("hosts", True)), repo=tuple(repo) if repo else None)
        threading.Thread(target=self._reap, daemon=True).start()
        self.gpus = [int(float(g)) for g in gpus]
        return {"node_pid": self.proc.pid, "started_at": process_start_time(self.proc.pid) or 0.0,
                "gpus": self.gpus, "names": self.runner.hosts_mode}

    def _reap(self) -> None:
        assert self.proc is not None and self.key is not None
        rc = self.proc.wait()
        self.runner.end_tree(self.key, self.proc.pid)
        code = self.runner.exit_code(self.key)
        self.code = code if code is not None else (128 - rc if rc < 0 else rc)
        self.done.set()

    def status(self) -> dict:
        with self.lock:
            return self._status()

    def _status(self) -> dict:
        if self.proc is None:
            return {"state": "absent"}
        if not self.done.is_set():
            return {"state": "running", "node_pid": self.proc.pid, "gpus": self.gpus}
        return {"state": "exited", "code": self.code}

    def wait(self) -> int | None:
        self.done.wait()
        return self.code

    def signal(self, signum: int) -> bool:
        if self.proc is None or self.done.is_set():
            return False
        if signum == 9:
            self.runner.end_tree(self.key or "", self.proc.pid)
            return True
        try:
            os.killpg(self.proc.pid, signum)
            return True
        except ProcessLookupError:
            return False

    def read_log(self, offset: int, limit: int = 1 << 20) -> bytes:
        return self.runner.read_log(self.log_file, offset, limit) if self.log_file else b""

    def publish(self, job_id: int, hosts: str, peers: str) -> None:
        self.runner.publish(job_id, hosts, peers)

    def exec_probe(self, command: str, env: dict, cwd: str | None, timeout: float) -> tuple[bool, str]:
        if self.proc is not None and self.runner.hosts_mode == "mount-namespace" and not self.done.is_set():
            quoted = "'" + command.replace("'", "'\"'\"'") + "'"
            command = f"exec nsenter -t {self.proc.pid} -m -- bash -c {quoted}"
        return self.runner.exec_probe(command, env, cwd, timeout)

    def forget(self) -> None:
        if self.key:
            self.runner.forget(self.key)
            if self.log_file is not None:
                self.log_file.unlink(missing_ok=True)


def free_ports(wanted: list[int], count: int, taken: list[int]) -> list[int]:
    """On the node it runs on: the wanted ports where free, else free ones, none in ``taken``."""
    out: list[int] = []
    for port in wanted:
        chosen = port if port not in taken and port not in out and _free(port) else _any_free(set(taken) | set(out))
        out.append(chosen)
    while len(out) < len(wanted) + count:
        out.append(_any_free(set(taken) | set(out)))
    return out


def _free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        # as servers bind (SO_REUSEADDR): a port left in TIME_WAIT by an ended server is free
        # to them, and only a listener makes it taken
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


def _any_free(avoid: set[int]) -> int:
    import socket

    while True:
        with socket.socket() as sock:
            sock.bind(("0.0.0.0", 0))
            port = sock.getsockname()[1]
        if port not in avoid:
            return port


def kill_tree(scope: str, key: str) -> list[int]:
    """On the node it runs on: end whatever is left of an attempt whose actor died."""
    runs, _, runtime = node_dirs(scope)
    runner = NodeRunner(runs, runtime, scope)
    return runner.end_tree(key, None, thorough=True)  # by cgroup and environment: a pid may be reused


def cleanup_job(scope: str, job_id: int) -> None:
    runs, _, runtime = node_dirs(scope)
    NodeRunner(runs, runtime, scope).cleanup_job(job_id)
