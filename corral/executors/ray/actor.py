"""The Ray actor that carries one attempt on the node corral placed it on: it runs the
attempt with the same ``NodeRunner`` the local executor uses (wrapper, cgroup, exit file,
hosts file, exec probes), so a replica on Ray sees the same environment contract as one on
this machine. Detached and named after the attempt key, it outlives the corral server, which
finds it again by name after a restart. Only plain data crosses Ray: no corral object is
pickled into the actor but its launch dictionary.

A job's ``file_mounts`` whose sources the node does not see (another machine, a worker in a
namespace of its own) are sent by the driver through Ray's object store when the actor asks
for them (``start`` answers ``need`` before anything starts), and unpacked once per job on
the node (``corral.node.mounts``). A container attempt tells the driver when its container
runs (``until_running``): until then its image is being pulled and the replica is starting.

Beside each attempt the actor starts its *fence* (``fence``): should the actor's worker or
the node's raylet die, the fence ends the attempt's process tree, so a replica whose node
left the cluster does not run on beside its next attempt.

Everything corral keeps on a node lives in directories private to the worker's user (0700;
logs 0600) named after the server's *node scope*: its CORRAL_HOME and that home's instance,
so a home made anew never meets the runs of an earlier one with the same attempt keys."""

from __future__ import annotations

import os
import select
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path

from corral.executors.ray.fence import FENCED_FILE
from corral.executors.ray.relay import NodeShells
from corral.node import container as containers
from corral.node.mounts import MountError, attach, here, home_of_this_account, lacking
from corral.node.runner import NodeRunner, process_start_time

FENCE_EXIT_S = 5.0  # how long an ended attempt's actor waits for its fence to go


def node_dirs(scope: str) -> tuple[Path, Path, Path]:
    """Runs, logs and discovery directories on a Ray node (no shared filesystem assumed)."""
    base = Path(os.environ.get("CORRAL_RAY_DIR", "/tmp")) / f"corral-ray-{scope}"
    shm = Path("/dev/shm") if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else base
    return base / "runs", base / "logs", shm / f"corral-ray-{scope}"


def private_dir(path: Path) -> Path:
    """``path`` (and missing parents) as a directory of this user's alone (0700); refused
    when it is a symlink or another user's, so nothing is written through a trap."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise PermissionError(f"{path} on this node is not a directory of this user's; corral will not use it")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def node_runner(scope: str) -> NodeRunner:
    """The runner of a node scope, its directories made private."""
    runs, logs, runtime = node_dirs(scope)
    for directory in (runs.parent, runs, logs, runtime):
        private_dir(directory)
    return NodeRunner(runs, runtime, scope)


class ReplicaActor:
    def __init__(self, scope: str):
        self.scope = scope
        self.runner = node_runner(scope)
        self.logs = node_dirs(scope)[1]
        self.fence: subprocess.Popen | None = None
        self.fence_fd: int | None = None
        self.fence_gone: int | None = None
        self.proc: subprocess.Popen | None = None
        self.key: str | None = None
        self.code: int | None = None
        self.done = threading.Event()
        self.log_file: Path | None = None
        self.lock = threading.Lock()  # a status asked while the start runs waits for it
        self.gpus: list[int] = []
        self.fenced: str | None = None
        self.reason, self.permanent = "", False  # what its failed pull (or mounts) said, and if it lasts
        self.shells = NodeShells(self.runner)  # processes of ``corral exec``/``shell`` beside it

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
        mounts = [tuple(m) for m in launch.get("file_mounts") or ()]
        record = self.runner.mounts_dir(job_id)
        sent = launch.get("archives")
        if mounts and sent is None and lacking(record, mounts):  # nothing started: the driver sends them first
            return {"need": lacking(record, mounts)}
        self.log_file = self.logs / f"{self.key}.log"
        stale = self.runner.run_dir(self.key)
        if stale.exists():  # left by a server that crashed before its start was recorded: never ran here
            self.runner.end_tree(self.key, self.runner.started_pid(self.key), thorough=True)
            shutil.rmtree(stale, ignore_errors=True)
        fd = os.open(self.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        os.fchmod(fd, 0o600)  # the replica's output is its user's alone
        os.close(fd)
        boxed = launch.get("container")
        binding = bool(mounts) and boxed is None and self.runner.binds  # in the replica's own mount namespace
        try:  # made here as the job's account: linked on the node, or bound into its container or namespace
            mounts = self._mounts(record, mounts, sent or {}, boxed is not None or binding, env.get("HOME"))
        except MountError as exc:  # as a failed start elsewhere: the attempt ends, its reason said
            self._say(f"corral: {exc}")
            self.code, self.reason, self.permanent = 1, str(exc), True
            self.done.set()
            return {"failed": str(exc)}
        self._start_fence()
        repo = launch.get("repo")
        if boxed:  # ``signal`` reaches every process in it
            env = {**env, containers.SIGNALS_VAR: "1"}
        container = containers.Container(**{**boxed, "options": tuple(boxed["options"]),
                                 "login": tuple(boxed["login"]) if boxed.get("login") else None,
                                 "mounts": tuple(mounts), "kept": tuple(boxed.get("kept") or ())}) if boxed else None
        self.proc = self.runner.spawn(self.key, job_id, launch["setup"], launch["run"], env, launch["cwd"],
                                      self.log_file, bool(launch.get("hosts", True)), repo=tuple(repo) if repo else None,
                                      container=container, file_mounts=tuple(mounts) if binding else (),
                                      home=env.get("HOME") or home_of_this_account())
        threading.Thread(target=self._reap, daemon=True).start()
        self.gpus = [int(float(g)) for g in gpus]
        return {"node_pid": self.proc.pid, "started_at": process_start_time(self.proc.pid) or 0.0,
                "gpus": self.gpus, "names": self.runner.hosts_mode, "pulling": self._pulling()}

    def _mounts(self, record: Path, mounts: list[tuple[str, str]], sent: dict, boxed: bool,
                home: str | None) -> list[tuple[str, str]]:
        """The job's file_mounts on this node, the sources it does not see unpacked from what
        the driver sent (once per job here: the job's lock); ``boxed`` (a container, or a
        replica that binds them in its own mount namespace): the paths to bind, nothing linked."""
        import ray

        def archive(source: str) -> bytes:
            shipped = sent.get(source)
            if isinstance(shipped, str):  # refused on the submitting side (too large, unreadable)
                raise MountError(shipped)
            if not shipped:
                raise MountError(f"{source} was not sent to this node")
            data = ray.get(shipped[0], timeout=600)
            self._say(f"corral: copied {source} to this node ({len(data)} bytes, compressed)")
            return data

        if not mounts:
            return []
        if boxed:
            return here(record, mounts, archive=archive)
        attach(record, mounts, home or home_of_this_account(), archive=archive)
        return mounts

    def _say(self, line: str) -> None:
        if self.log_file is not None:
            with open(self.log_file, "a") as out:
                out.write(line + "\n")

    def _pulling(self) -> bool:
        """Its container does not run yet (its image is being pulled)."""
        return containers.pulling(self.runner.run_dir(self.key or ""))

    def until_running(self) -> bool:
        """Once its container runs: True; False if the attempt ended first."""
        while not self.done.wait(0.05):
            if not self._pulling():
                return True
        return False

    def _start_fence(self) -> None:
        """Before the attempt starts: its fence, watching this worker (a pipe only it holds
        the read end of) and the raylet (this worker's parent). It holds the write end of a
        second pipe until it exits: the actor's way to wait for a process it is not the
        parent of (the fence leaves the worker's children, see ``fence``)."""
        read, write = os.pipe()
        gone_read, gone_write = os.pipe()
        said = os.open(self.logs / f"{self.key}.fence", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        # CORRAL_RAY_DIR too: the fence finds the attempt's run directory where the actor made it
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "HOME", "LANG", "CORRAL_RAY_DIR")}
        try:
            self.fence = subprocess.Popen([sys.executable, "-m", "corral.executors.ray.fence", str(read),
                                           str(os.getppid()), self.scope, self.key or ""],
                                          pass_fds=(read, gone_write), stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=said, start_new_session=True, env=env,
                                          close_fds=True)
        except BaseException:
            os.close(write)
            os.close(gone_read)
            raise
        finally:
            os.close(read)
            os.close(said)
            os.close(gone_write)
        self.fence_fd = write
        self.fence_gone = gone_read
        threading.Thread(target=self.fence.wait, name="corral-fence-reaper", daemon=True).start()

    def _reap(self) -> None:
        assert self.proc is not None and self.key is not None
        rc = self.proc.wait()
        self.runner.end_tree(self.key, self.proc.pid)
        code = self.runner.exit_code(self.key)
        self.code = code if code is not None else (128 - rc if rc < 0 else rc)
        self.reason, self.permanent = containers.ended(self.runner.run_dir(self.key))
        try:
            self.fenced = (self.runner.run_dir(self.key) / FENCED_FILE).read_text() or "fenced"
        except OSError:
            pass
        if self.fence_fd is not None:  # nothing of the attempt is left: its fence may go
            try:
                os.write(self.fence_fd, b"ended")
            except OSError:
                pass
        if self.fence_gone is not None:  # end-of-file once the fence has exited
            try:  # (poll, not select: a Ray worker's descriptors may pass 1024)
                waiting = select.poll()
                waiting.register(self.fence_gone, select.POLLIN)
                waiting.poll(FENCE_EXIT_S * 1000)
            finally:
                os.close(self.fence_gone)
                self.fence_gone = None
        self.done.set()

    def status(self) -> dict:
        with self.lock:
            return self._status()

    def _status(self) -> dict:
        if self.proc is None:
            return {"state": "exited", **self._end()} if self.done.is_set() else {"state": "absent"}
        if not self.done.is_set():
            return {"state": "running", "node_pid": self.proc.pid, "gpus": self.gpus, "pulling": self._pulling()}
        return {"state": "exited", **self._end()}

    def _end(self) -> dict:
        return {"code": self.code, "fenced": self.fenced, "reason": self.reason, "permanent": self.permanent}

    def wait(self) -> dict:
        """How the attempt ended: its exit code, what its pull said, or why its fence ended it
        (``fenced``: a loss, its node is failing)."""
        self.done.wait()
        return self._end()

    def signal(self, signum: int) -> bool:
        if self.proc is None or self.done.is_set():
            return False
        if signum == 9:
            self.runner.end_tree(self.key or "", self.proc.pid)
            return True
        boxed = containers.named(self.runner.run_dir(self.key)) if self.key else None
        if boxed is not None:  # and to the programs in its container (``containers.signal_all``)
            containers.signal_all(boxed[0], boxed[1], signum, None)
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
        boxed = containers.named(self.runner.run_dir(self.key)) if self.key else None
        if boxed is not None:  # inside the replica's container
            argv = containers.exec_argv(boxed[0], boxed[1], command, None)
            return self.runner.exec_probe(" ".join("'" + a.replace("'", "'\"'\"'") + "'" for a in argv),
                                          {"PATH": env.get("PATH", "/usr/bin:/bin")}, None, timeout)
        if self.proc is not None and self.runner.hosts_mode == "mount-namespace" and not self.done.is_set():
            quoted = "'" + command.replace("'", "'\"'\"'") + "'"
            command = f"exec nsenter -t {self.proc.pid} -m -- bash -c {quoted}"
        return self.runner.exec_probe(command, env, cwd, timeout)

    def shell_open(self, request: dict) -> str:
        """A process in the replica's world on this node (``relay``); its id."""
        if self.proc is None or self.key is None or self.done.is_set():
            raise RuntimeError("the replica is not running on this node")
        return self.shells.open(self.key, self.proc.pid, request)

    def shell_call(self, ident: str, op: str, args: tuple):
        return self.shells.call(ident, op, tuple(args))

    def forget(self) -> None:
        self.shells.close_all()
        if self.key:
            self.runner.forget(self.key)
            if self.log_file is not None:
                self.log_file.unlink(missing_ok=True)
                self.log_file.with_suffix(".fence").unlink(missing_ok=True)


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
    return node_runner(scope).end_tree(key, None, thorough=True)  # by cgroup and environment: a pid may be reused


def cleanup_job(scope: str, job_id: int) -> None:
    node_runner(scope).cleanup_job(job_id)
