"""A batch job's step tasks on its other nodes, run inside those nodes' holder replicas.

Off Slurm, a multi-node batch job holds each node beyond the first with a holder replica
(``corral.spec.sbatch``). Where an executor's nodes are all this machine (the local
executor, ``StepAgents``), the holder runs this *agent* instead of sleeping: it listens on a
Unix socket in the job's runtime directory, named for its node, and starts the tasks corral's
``srun`` sends it as its own children. A task of node 2 then runs where Slurm would run it:
in node 2's replica, with that replica's host name, address, network and mount namespaces,
cgroup and account, not in the batch script's.

The exchange, over one connection per task: ``srun`` passes the task's stdin, stdout and
stderr as file descriptors (``SCM_RIGHTS``, so output goes straight where ``srun`` would put
it), then one JSON line ``{"argv", "env", "cwd"}``; the agent answers ``{"pid": N}`` (or
``{"error": …}``), takes ``{"signal": N}`` lines for the task's process group, and ends with
``{"exit": CODE}`` (negative: the signal that ended it, as ``Popen.returncode``). A
connection that closes first (``srun`` killed) ends the task with SIGKILL, as Slurm ends a
step whose ``srun`` dies. Only a peer of the agent's own Unix account is served
(``SO_PEERCRED``).

A stop of the holder (the job ends or is cancelled) does not cut its tasks short: their
signals come from ``srun`` (relayed by the batch shell), and the agent exits 0 once none is
left; what outlives the grace period goes with the holder's process tree, as every attempt's.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

DIR_VAR = "CORRAL_STEP_AGENTS"  # the job's agents' directory: one socket per holder's node
AGENT_VAR = "CORRAL_STEP_AGENT"  # the command a holder runs to be its node's agent
# a task started by an agent is its holder's: these say which replica it runs in
IDENTITY = ("CORRAL_TASK", "CORRAL_REPLICA", "CORRAL_HOSTNAME", "CORRAL_ADDR", "CORRAL_LAUNCH_KEY")
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
WAIT_S = 10.0  # how long srun waits for a holder that has not opened its socket yet
_MAX_HEADER = 4 << 20


def socket_name(node: str) -> str:
    if not node or "/" in node or node.startswith("."):
        raise ValueError(f"not a node name: {node!r}")
    return f"{node}.sock"


def ended_name(node: str) -> str:
    """Left by a node's agent when it exits: its holder ended (the job ends, or the node was
    lost), so a step there fails rather than running in another replica."""
    return socket_name(node)[:-len(".sock")] + ".ended"


class HolderGone(OSError):
    """The node's holder has ended (or its agent died): its tasks cannot start."""


def _short(directory: int, name: str) -> str:
    """A path to ``name`` in an open directory that fits a socket address (108 bytes) however
    deep the job's runtime directory is."""
    return f"/proc/self/fd/{directory}/{name}"


# -- the agent (a holder replica's process) ---------------------------------------------------


class Agent:
    def __init__(self, directory: Path, node: str):
        self.directory, self.node = directory, node
        self.tasks: dict[int, subprocess.Popen] = {}
        self.lock = threading.Lock()
        self.stopping = False
        self.uid = os.getuid()
        self.own = {k: os.environ[k] for k in IDENTITY if k in os.environ}

    def serve(self) -> int:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        name = socket_name(self.node)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        temp = f".{name}.{os.getpid()}"
        try:
            os.unlink(_short(fd, temp))
        except FileNotFoundError:
            pass
        server.bind(_short(fd, temp))  # bound aside, then renamed: a client never meets a half-made socket
        os.chmod(_short(fd, temp), 0o600)
        server.listen(64)
        os.rename(_short(fd, temp), _short(fd, name))
        try:  # (a holder started again over its last attempt's)
            os.unlink(_short(fd, ended_name(self.node)))
        except FileNotFoundError:
            pass
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._stop)
        server.settimeout(0.2)
        try:
            while not (self.stopping and not self._live()):
                try:
                    conn, _ = server.accept()
                except socket.timeout:
                    continue
                except InterruptedError:
                    continue
                threading.Thread(target=self._serve_one, args=(conn,), daemon=True).start()
        finally:
            try:  # said before the socket goes, so srun never finds neither
                os.close(os.open(_short(fd, ended_name(self.node)), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
            except OSError:
                pass
            try:
                os.unlink(_short(fd, name))
            except FileNotFoundError:
                pass
            server.close()
            os.close(fd)
        return 0

    def _stop(self, signum: int, _frame) -> None:  # noqa: ANN001
        self.stopping = True  # the tasks' own signals come from srun; exit once they are gone

    def _live(self) -> bool:
        with self.lock:
            return any(p.poll() is None for p in self.tasks.values())

    def _serve_one(self, conn: socket.socket) -> None:
        fds: list[int] = []
        try:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _, uid, _ = struct.unpack("3i", creds)
            if uid != self.uid:
                raise ValueError("only the job's own account may start its tasks")
            _, fds, _, _ = socket.recv_fds(conn, 1, 3)
            reader = conn.makefile("rb")
            line = reader.readline(_MAX_HEADER)
            if len(fds) != 3 or not line.endswith(b"\n"):
                raise ValueError("not a step request")
            request = json.loads(line)
            env = {**request["env"], **self.own}
            if self.stopping:
                raise OSError("its node's holder is stopping")
            proc = subprocess.Popen(request["argv"], env=env, cwd=request.get("cwd") or None, stdin=fds[0],
                                    stdout=fds[1], stderr=fds[2], process_group=0, preexec_fn=_default_signals)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self._send(conn, {"error": f"{exc.strerror or exc}" if isinstance(exc, OSError) else str(exc)})
            conn.close()
            return
        finally:
            for fd in fds:
                os.close(fd)
        with self.lock:
            self.tasks[proc.pid] = proc
        self._send(conn, {"pid": proc.pid})
        threading.Thread(target=self._signals, args=(reader, proc), daemon=True).start()
        code = proc.wait()
        self._send(conn, {"exit": code})
        conn.close()
        with self.lock:
            self.tasks.pop(proc.pid, None)

    def _signals(self, reader, proc: subprocess.Popen) -> None:  # noqa: ANN001
        try:
            for line in reader:
                try:
                    signum = int(json.loads(line)["signal"])
                except (ValueError, KeyError, TypeError):
                    continue
                _killpg(proc, signum)
        except OSError:  # reset rather than closed: srun is gone all the same
            pass
        _killpg(proc, signal.SIGKILL)  # srun is gone (or done): as Slurm, its step ends with it

    @staticmethod
    def _send(conn: socket.socket, message: dict) -> None:
        try:
            conn.sendall(json.dumps(message).encode() + b"\n")
        except OSError:
            pass


def _killpg(proc: subprocess.Popen, signum: int) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def _default_signals() -> None:
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_DFL)


# -- srun's side ------------------------------------------------------------------------------


class RemoteTask:
    """A step task running in another node's holder, seen as srun sees its own children:
    ``poll()`` (``Popen``'s return codes), ``signal_group``, and ``stdout`` when srun reads
    the task's output itself (``-l``)."""

    def __init__(self, conn: socket.socket, pid: int, stdout=None):  # noqa: ANN001
        self.conn, self.pid, self.stdout = conn, pid, stdout
        self.returncode: int | None = None
        self.lost = False  # its agent went away without a word: no exit code of the task's own
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        code = None
        try:
            for line in self.conn.makefile("rb"):
                message = json.loads(line)
                if "exit" in message:
                    code = int(message["exit"])
                    break
        except (OSError, ValueError):
            pass
        self.lost = code is None
        self.returncode = 255 if code is None else code  # 255: its holder ended under the task

    def poll(self) -> int | None:
        return self.returncode

    def signal_group(self, signum: int) -> None:
        if self.returncode is None:
            try:
                self.conn.sendall(json.dumps({"signal": int(signum)}).encode() + b"\n")
            except OSError:
                pass


def start_on(node: str, env: dict[str, str], argv: list[str], task_env: dict[str, str], cwd: str, stdin: int,
             stdout: int, stderr: int, reader=None, wait_s: float = WAIT_S) -> RemoteTask | None:  # noqa: ANN001
    """Start a task through ``node``'s agent for this job, waiting a while for it (its holder
    may be starting, or restarting over the socket its last attempt left); None where there
    is none to ask (not an executor with agents, the batch script's own node, or a holder
    that never opened one: one that only holds, an older job's), and srun then runs the task
    itself. ``HolderGone`` where the node's holder had an agent and has ended: its task
    never runs elsewhere (in another replica, with another node's GPUs)."""
    directory = env.get(DIR_VAR)
    if not directory or node == env.get("SLURMD_NODENAME"):
        return None
    path = os.path.join(directory, socket_name(node))
    deadline = time.monotonic() + wait_s
    refused = False
    while True:
        try:
            return start(path, argv, task_env, cwd, stdin, stdout, stderr, reader)
        except FileNotFoundError:
            if os.path.lexists(os.path.join(directory, ended_name(node))):
                raise HolderGone(f"its holder on {node} has ended (the job is ending, or the node was lost)") from None
        except ConnectionRefusedError:  # a socket nobody listens on: its agent was killed
            refused = True
        if time.monotonic() >= deadline:
            if refused:
                raise HolderGone(f"the step agent of its holder on {node} does not answer (it was killed)")
            return None
        time.sleep(0.02)


def start_task(node: str, env: dict[str, str], argv: list[str], task_env: dict[str, str], cwd: str,
               out, err, label: bool) -> RemoteTask | None:  # noqa: ANN001
    """srun's task of another node, started in that node's holder, its output where srun
    would put its own child's (``out``/``err`` files, its own stdout/stderr, or a pipe it reads
    for ``-l``); None where srun runs it itself."""
    if not env.get(DIR_VAR):
        return None
    read = write = None
    if label:
        read, write = os.pipe()
    reader = None
    try:
        stdout = write if label else (out.fileno() if out is not None else 1)
        stderr = write if label and err is out else (err.fileno() if err is not None else 2)
        if read is not None:
            reader, read = os.fdopen(read, "rb"), None
        task = start_on(node, env, argv, task_env, cwd, 0, stdout, stderr, reader)
    except BaseException:
        if reader is not None:
            reader.close()
        raise
    finally:
        for fd in (read, write):
            if fd is not None:
                os.close(fd)
    if task is None and reader is not None:
        reader.close()
    return task


def start(path: str, argv: list[str], env: dict[str, str], cwd: str, stdin: int, stdout: int, stderr: int,
          reader=None) -> RemoteTask:  # noqa: ANN001
    """Start one task through the agent at ``path``; raises OSError with the agent's words."""
    directory, name = os.path.split(path)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(_short(fd, name))
        socket.send_fds(conn, [b"F"], [stdin, stdout, stderr])
        conn.sendall(json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode() + b"\n")
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = conn.recv(1)
            if not chunk:
                raise OSError(f"the agent at {path} closed the connection")
            answer += chunk
        message = json.loads(answer)
    except BaseException:
        conn.close()
        raise
    finally:
        os.close(fd)
    if "error" in message:
        conn.close()
        raise OSError(message["error"])
    return RemoteTask(conn, int(message["pid"]), reader)


def main(argv: list[str]) -> int:
    directory, node = os.environ.get(DIR_VAR), os.environ.get("CORRAL_NODE")
    if not directory or not node:
        print(f"corral-stepd: {DIR_VAR} and CORRAL_NODE must be set", file=sys.stderr)
        return 2
    return Agent(Path(directory), node).serve()
