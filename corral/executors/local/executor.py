"""The local executor: replicas are processes on this machine (the embedded default).

Each attempt is a process group in its own session, so it outlives a server restart, in its
own cgroup where the machine allows (see ``proctree``). Exits are observed through pidfds
(which also work for adopted processes that are not our children) on one watcher thread;
no polling. Every replica gets its own loopback address (Linux routes all of 127.0.0.0/8 to
``lo``) in its home's block (``corral.node.loopback``), derived from its row id, so two
replicas may listen on one port and a restarted replica keeps its address."""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import logging
import threading
import time
from pathlib import Path

from corral.auth.accounts import LOGIN_UMASK, hand_over, open_discovery, peers_readable
from corral.executors.contract import (Binding, EventStream, Handle, Kind, Launch, LaunchError, Observed, ShellError,
                                       ShellRequest, Started, Wake)
from corral.node import container as containers
from corral.node import listeners
from corral.node.mounts import MountError, attach_as
from corral.node.loopback import LoopbackBlock
from corral.node.network import HOST_ADDR_VAR, Bridge
from corral.node.proctree import ATTEMPT_VAR, attempt_mark
from corral.node.runner import (ENV_FILE_VAR, LOAD_ENV, SAFE_PATH, START_TIME_TOLERANCE_S, NodeRunner, Spawning,
                                process_start_time, run_as_value)
from corral.node.terminal import ENTER, ENTER_OWN, Terminal, env_file
from corral.pool import NodeSpec
from corral.runtime.batchenv import hand_over_job_files
from corral.settings import Settings


log = logging.getLogger("corral.local")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class LocalExecutor(EventStream):
    name = "local"

    def __init__(self, nodes: list[NodeSpec], settings: Settings, scope: str,
                 wake: Wake = lambda: None, network: str = "host"):
        super().__init__(wake)
        self._nodes = list(nodes)
        self.settings = settings
        self.bridge: Bridge | None = None
        if network == "namespace":  # refused here (NetworkError), before any replica starts, if it cannot be
            self.bridge = Bridge(scope, settings.home / "network")  # outlives the runtime dir: a kept bridge's state
            self.bridge.open()
        # the home's own 127.B.0.0/16, so another server's replicas on this machine never share an address
        self.loopback: LoopbackBlock | None = LoopbackBlock.claim(settings.home) if self.bridge is None else None
        # a gang's starts are forked side by side (``start_gang``), up to four at once: a fork
        # mostly waits for its child's exec, which it does without the GIL
        self.runner = NodeRunner(settings.runs_dir, settings.runtime_dir, scope, self.bridge, spawn_threads=4)
        try:  # replicas create files as the user would, not with the server's private umask
            self._umask = int(os.environ.get("CORRAL_USER_UMASK", "0o022"), 8)
        except ValueError:
            self._umask = 0o022
        self._children: dict[str, subprocess.Popen] = {}  # key -> our child wrapper
        self._watched: dict[int, tuple[str, int]] = {}  # pidfd -> (key, pid)
        self._ending: set[str] = set()  # wrappers ended, processes of the attempt not yet all gone
        self._killed: set[str] = set()  # attempts this executor SIGKILLed (the end of a grace period)
        self._rc: dict[str, int | None] = {}  # our child wrapper's return code, kept while it is being ended
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._poll = select.poll()
        self._poll.register(self._wake_r, select.POLLIN)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="corral-local-watcher", daemon=True)
        self._thread.start()

    # -- inventory and binding ------------------------------------------------------------
    def nodes(self) -> list[NodeSpec]:
        return list(self._nodes)

    @property
    def inventory_version(self) -> int:
        return 0  # declared in config.yaml: fixed while the server runs

    def declares(self, node: str) -> bool:
        """``DeclaredNodes``: a node config.yaml no longer lists has left this site."""
        return any(n.name == node for n in self._nodes)

    def bind(self, job_id: int, replica_id: int, node: str, ports: dict[str, int],
             previous: Binding | None) -> Binding:
        if self.bridge is not None:
            return Binding(self.bridge.address(replica_id), dict(ports))
        if previous is not None and previous.addr:  # a restart keeps its address, whichever block it came from
            return Binding(previous.addr, dict(ports))
        assert self.loopback is not None
        return Binding(self.loopback.address(replica_id), dict(ports))

    def prepare(self, key: str) -> None:
        """Optional: an attempt with this key was placed here and launches after the loop's
        next commit (see ``ProcessTrees.expect``)."""
        self.runner.trees.expect(key)

    def anticipate(self) -> None:
        """``Anticipating``: a job was just submitted; its start here would otherwise wait
        for the kernel's grace period on its first cgroup move."""
        self.runner.trees.warm()

    def rendezvous_port(self, node: str) -> int:
        return free_port()

    def release(self, job_id: int) -> None:
        return None  # corral's own allocation is the only accounting on this machine

    # -- attempts -------------------------------------------------------------------------
    def start(self, launch: Launch) -> Started:
        spawning = self._begin(launch)
        return self._finish(launch, spawning)

    def start_gang(self, launches: list[Launch]) -> list[Started | Exception]:
        """``Gangs``: the starts of several replicas at once, each one's ``Started`` or the
        exception its ``start`` would have raised, in order. Each wrapper's fork is queued for
        the namespace threads as soon as its replica is prepared, so the next replica is
        prepared while it is made (and forks overlap), and what is done with a started process
        (its handle, its watch) waits until every fork is queued: the gang's last replica
        starts sooner. Every fork queued is taken back and watched (or ended) before this
        returns, even when the caller's thread is being torn down mid-gang."""
        begun: list[tuple[Launch, Spawning | Exception]] = []
        try:
            for i, launch in enumerate(launches):
                try:  # one grace period for the gang's moves into their cgroups (``ProcessTrees.warm``)
                    begun.append((launch, self._begin(launch, warm=i == 0)))
                except Exception as exc:  # (the launcher fails this replica alone, as with ``start``)
                    begun.append((launch, exc))
        except BaseException:  # the server is going down: what was forked is still watched, never lost
            self._take_back(begun)
            raise
        outcomes: list[Started | Exception] = []
        try:
            for launch, spawning in begun:
                outcomes.append(spawning if isinstance(spawning, Exception) else self._catching(launch, spawning))
        except BaseException:  # likewise for those after the one cut short
            self._take_back(begun[len(outcomes) + 1:])
            raise
        return outcomes

    def _take_back(self, begun: list[tuple[Launch, Spawning | Exception]]) -> None:
        for launch, spawning in begun:
            if not isinstance(spawning, Exception):
                self._catching(launch, spawning)

    def _catching(self, launch: Launch, spawning: Spawning) -> Started | Exception:
        try:
            return self._finish(launch, spawning)
        except Exception as exc:
            return exc

    def _begin(self, launch: Launch, warm: bool = True) -> Spawning:
        """The start up to the wrapper's fork, which may still be under way on return."""
        account = launch.run_as  # another Unix account's job: its files handed to it, its processes as it
        log_file = self.settings.log_file(launch.job_id, launch.label)
        try:
            for directory in launch.dirs:
                hand_over(Path(directory), account, self.settings.home)
            if account is not None:
                hand_over(log_file, account, self.settings.home, directory=False)
                open_discovery(self.runner.runtime_dir, self.runner.job_dir(launch.job_id))
                hand_over_job_files(self.runner.job_dir(launch.job_id), launch.env, account, self.runner.runtime_dir)
            # exactly the replica's environment (runtime.environment), the account's login basics under it
            env = {**(account.env() if account else {}), **launch.env}
            if launch.container is not None:  # ``signal`` reaches every process in it
                env[containers.SIGNALS_VAR] = "1"
            bound: tuple[tuple[str, str], ...] = ()
            if launch.file_mounts and launch.container is None:  # as the account, in its job's record (a container binds them)
                record = self.runner.mounts_dir(launch.job_id)
                hand_over(record, account, self.settings.home)
                if self.runner.binds:  # in the replica's own mount namespace
                    bound = launch.file_mounts
                else:  # links on the machine
                    attach_as(account, record, launch.file_mounts, env.get("HOME") or "")
            return self.runner.begin_spawn(launch.key, launch.job_id, launch.setup, launch.run, env, launch.cwd,
                                           log_file, launch.hosts, LOGIN_UMASK if account else self._umask,
                                           launch.repo, account, launch.container,
                                           address=launch.env.get("CORRAL_ADDR"), warm=warm, file_mounts=bound,
                                           home=env.get("HOME") or "")
        except (OSError, ValueError, MountError) as exc:  # ValueError: an argument or env value Popen refuses
            self.runner.end_tree(launch.key, None)
            raise LaunchError(str(exc)) from exc

    def _finish(self, launch: Launch, spawning: Spawning) -> Started:
        """The start from the wrapper's fork on: its handle, and its exit watched."""
        try:
            proc = spawning.result()
        except (OSError, ValueError) as exc:
            self.runner.end_tree(launch.key, None)
            raise LaunchError(str(exc)) from exc
        with self._lock:  # at once: from here on its exit is ours to report
            self._children[launch.key] = proc
        started = process_start_time(proc.pid) or 0.0  # 0.0: it already ended
        handle = {"pid": proc.pid, "started_at": started, "key": launch.key}
        if launch.run_as is not None:
            handle["run_as"] = run_as_value(launch.run_as)  # its probes run as it too
        in_container = containers.named(self.runner.run_dir(launch.key))
        if in_container is not None:
            handle["container"] = list(in_container)  # engine and name: its exec probes run inside
        self._watch(launch.key, proc.pid)
        if containers.pulling(self.runner.run_dir(launch.key)):  # STARTING while its image is pulled; running once its container starts
            threading.Thread(target=self._await_container, args=(launch.key, proc.pid, handle), daemon=True,
                             name=f"corral-container-{launch.key}").start()
            return Started(handle, confirmed=False, detail=f"pid {proc.pid}")
        return Started(handle, detail=f"pid {proc.pid}")

    def _await_container(self, key: str, pid: int, handle: Handle) -> None:
        """Confirm a container's start once its wrapper has the image (a pull may take
        minutes); its exit, if it comes first, is reported by the watcher."""
        run_dir = self.runner.run_dir(key)
        boxed = handle.get("container")
        where = f"in container {boxed[1]}" if boxed else "its batch script's image is here"
        while not self._closed and self._alive(pid, key, handle.get("started_at")):
            if not containers.pulling(run_dir):
                self._emit(Observed(key, Kind.STARTED, handle=handle, detail=f"pid {pid}, {where}"))
                return
            time.sleep(0.05)

    def adopt(self, attempts: list[tuple[str, Handle | None]]) -> None:
        for key, handle in attempts:
            pid = int(handle["pid"]) if handle and handle.get("pid") else self.runner.started_pid(key)
            if pid is None:
                # Never recorded that it started: whatever the tree holds (a wrapper caught
                # between spawn and its first line) is ended, and the attempt never ran.
                self.runner.end_tree(key, None, thorough=True)
                self._emit(Observed(key, Kind.ABSENT, reason="no process was started for this attempt"))
                continue
            if self._alive(pid, key, handle.get("started_at") if handle else None):
                # what the handle said of it stays: its account (its probes run as it), its container
                new = {**(handle or {}), "pid": pid, "started_at": process_start_time(pid), "key": key}
                boxed = containers.named(self.runner.run_dir(key))
                if boxed is not None:
                    new["container"] = list(boxed)
                with self._lock:  # adopted again (a cycle's writes were lost): one watch is enough
                    watched = any(k == key for k, _ in self._watched.values())
                if containers.pulling(self.runner.run_dir(key)):
                    # still pulling its image: STARTING until its container runs
                    if not watched:
                        threading.Thread(target=self._await_container, args=(key, pid, new), daemon=True,
                                         name=f"corral-container-{key}").start()
                else:
                    self._emit(Observed(key, Kind.STARTED, handle=new, detail=f"pid {pid}"))
                if not watched:
                    self._watch(key, pid)
                continue
            with self._lock:
                ending = key in self._ending
            if not ending:  # an attempt still being ended reports its exit once that is done
                self._report(key, pid)

    def signal(self, handle: Handle, signum: int) -> bool:
        key, pid = handle["key"], int(handle.get("pid") or 0)
        if pid <= 0 or not self._alive(pid, key, handle.get("started_at")):
            return False
        if signum == signal.SIGKILL:
            with self._lock:  # its end is ours: an adopted wrapper (not our child) leaves no exit code
                self._killed.add(key)
            self.runner.end_tree(key, pid)
            return True
        if handle.get("container"):  # and to the programs in its container (off the loop's thread)
            engine, name = handle["container"]
            run_as = handle.get("run_as")
            containers.signal_all(engine, name, signum, run_as if run_as and os.geteuid() == 0 else None)
        try:
            os.killpg(pid, signum)
            return True
        except ProcessLookupError:
            return False

    def forget(self, handle: Handle) -> None:
        self.runner.forget(handle["key"])

    # -- discovery, probes, logs ------------------------------------------------------------
    def publish(self, job_id: int, nodes: set[str], hosts: str, peers: str) -> None:
        self.runner.publish(job_id, hosts, peers)
        peers_readable(self.runner.job_dir(job_id))  # read by replicas that may run as other accounts


    def step_agents_dir(self, job_id: int) -> str:
        """``StepAgents``: every node is this machine, so the job's runtime directory is one."""
        return str(self.runner.job_dir(job_id) / "steps")

    def attempt_env(self, job_id: int) -> dict[str, str]:
        env = self.runner.attempt_env(job_id, None)
        if self.bridge is not None and self.bridge.gateway is not None:  # the machine, seen from a replica's namespace
            env[HOST_ADDR_VAR] = str(self.bridge.gateway.ip)
        return env

    def exec_probe(self, handle: Handle, command: str, env: dict[str, str], cwd: str | None,
                   timeout: float) -> tuple[bool, str]:
        pid = int(handle.get("pid") or 0)
        run_as = handle.get("run_as")
        if handle.get("container"):  # inside the replica's container, as its account
            engine, name = handle["container"]
            argv = containers.exec_argv(engine, name, command, run_as if run_as and os.geteuid() == 0 else None)
            return self.runner.exec_probe(" ".join(_quote(a) for a in argv), {"PATH": SAFE_PATH}, None, timeout)
        user_env = None
        if run_as:  # as the replica's account, never the server's; its variables only past the switch
            uid, gid, groups = str(run_as).split(":")
            command = (f"exec setpriv --reuid={uid} --regid={gid} --groups={groups} -- env -i PATH=/usr/bin:/bin "
                       f"bash --noprofile --norc -c {_quote(_PROBE_AS_USER)} corral-probe {_quote(command)} "
                       f'4<"${ENV_FILE_VAR}"')
            user_env, env = env, {}
        if self.runner.hosts_mode == "mount-namespace" and pid > 0 and shutil.which("nsenter"):
            # in the attempt's mount namespace, so the probe resolves names as the replica does
            net = " -n" if self.bridge is not None else ""  # its localhost, its 0.0.0.0
            nnp = "setpriv --no-new-privs -- " if self.runner.no_new_privs(handle["key"]) else ""
            return self.runner.exec_probe(f"exec nsenter -t {pid} -m{net} -- {nnp}bash -c {_quote(command)}", env, cwd,
                                          timeout, user_env)
        return self.runner.exec_probe(command, env, cwd, timeout, user_env)

    def answered_by_other(self, handle: Handle, addr: str, port: int) -> str | None:
        """``Listening``: replicas in host networking share the machine's ports, and a sibling
        (or anyone) bound to 0.0.0.0 answers on a replica's address too."""
        if self.bridge is not None or handle.get("container"):
            # its own network namespace; or a container's processes, which the engine runs
            # outside the attempt's tree (its own address still, from its host networking)
            return None
        return listeners.who_answers(addr, port, self.runner.trees.members(handle["key"]))

    def open_shell(self, handle: Handle, request: ShellRequest) -> Terminal:
        """A process in the attempt's world (``Shells``): inside its container by its engine, or
        in its mount and UTS namespaces (its hosts file, its hostname) and its working
        directory, with its environment, as its account. It joins the attempt's process tree,
        so it ends with the attempt (as ``kubectl exec`` ends with its container)."""
        key, pid = handle["key"], int(handle.get("pid") or 0)
        if pid <= 0 or not self._alive(pid, key, handle.get("started_at")):
            raise ShellError(f"the replica's process (pid {pid or '?'}) is no longer running")
        account, mark = request.run_as, attempt_mark(self.runner.trees.scope, key)
        root = os.geteuid() == 0
        term = request.env.get("TERM")
        boxed = containers.shell_argv(self.runner.run_dir(key), list(request.argv), request.tty, term) \
            if handle.get("container") else None
        if handle.get("container") and boxed is None:
            raise ShellError("the replica's container is not one corral can enter (its engine or name changed)")
        try:
            if boxed is not None:
                argv = (containers.as_account(account.uid, boxed) if account is not None and root else None) or boxed
                return Terminal(self._joining(key, argv), {"PATH": SAFE_PATH, "LANG": "C.UTF-8", ATTEMPT_VAR: mark},
                                request.tty, request.rows, request.cols)
            env = {**(account.env() if account else {}), **request.env, ATTEMPT_VAR: mark}
            try:  # where the replica's wrapper is now (a git workdir's clone), else where it was to start
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                cwd = request.cwd or env.get("HOME") or "/"
            enter = ["nsenter", "-t", str(pid), "-m", "-u", *(["-n"] if self.bridge is not None else []), "--"] \
                if self.runner.hosts_mode == "mount-namespace" and root and shutil.which("nsenter") else []
            if enter and self.runner.no_new_privs(key):  # as the replica itself runs (it binds file_mounts)
                enter += ["setpriv", "--no-new-privs", "--"]
            if account is not None and root:  # its variables only past the switch to its account
                uid, gid, groups = run_as_value(account).split(":")
                argv = [*enter, "setpriv", f"--reuid={uid}", f"--regid={gid}", f"--groups={groups}", "--",
                        "env", "-i", "PATH=/usr/bin:/bin", "bash", "--noprofile", "--norc", "-c", ENTER,
                        "corral-shell", cwd, *request.argv]
                return Terminal(self._joining(key, argv), {"PATH": SAFE_PATH, "LANG": "C.UTF-8", ATTEMPT_VAR: mark},
                                request.tty, request.rows, request.cols, env_fd=env_file(env, str(self.runner.runs_dir)))
            argv = [*enter, "bash", "--noprofile", "--norc", "-c", ENTER_OWN, "corral-shell", cwd, *request.argv]
            return Terminal(self._joining(key, argv), env, request.tty, request.rows, request.cols)
        except (OSError, ValueError) as exc:
            raise ShellError(f"could not start it beside the replica: {exc}") from exc

    def _joining(self, key: str, argv: list[str]) -> list[str]:
        """``argv`` started from inside the attempt's cgroup (where it has one), so that the
        attempt's end, which ends its whole tree, ends it too."""
        procs = self.runner.trees.base / key / "cgroup.procs" if self.runner.trees.base is not None else None
        if procs is None or not procs.exists():
            return argv
        return ["sh", "-c", 'echo "$$" > "$1" 2>/dev/null; shift; exec "$@"', "corral-join", str(procs), *argv]

    def cleanup_job(self, job_id: int) -> None:
        self.runner.cleanup_job(job_id)

    def close(self) -> None:
        with self._lock:
            if self._closed:  # once: a second close would close numbers other files now hold
                return
            self._closed = True
        self.runner.close()
        if self.bridge is not None:
            self.bridge.close()
        if self.loopback is not None:
            self.loopback.close()
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        self._thread.join(timeout=2)
        if not self._thread.is_alive():  # its descriptors are no one's now
            with self._lock:
                for fd in (*self._watched, self._wake_r, self._wake_w):
                    try:
                        os.close(fd)
                    except OSError:
                        pass
                self._watched = {}

    # -- watching -----------------------------------------------------------------------------
    def _alive(self, pid: int, key: str, recorded: float | None) -> bool:
        with self._lock:
            proc = self._children.get(key)
        if proc is not None and proc.pid == pid:
            return proc.poll() is None
        started = process_start_time(pid)
        if started is None:
            return False
        # Without a recorded start time (the handle was never stored), the wrapper's pid from
        # its own "started" file is trusted only while that process still carries the key.
        if recorded:
            return abs(started - float(recorded)) < START_TIME_TOLERANCE_S
        return pid in self.runner.trees.members(key)

    def _watch(self, key: str, pid: int) -> None:
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._report(key, pid)
            return
        with self._lock:  # (under the lock: after close the pipe's number may be another file's)
            if self._closed:
                os.close(pidfd)
                return
            self._watched[pidfd] = (key, pid)
            self._poll.register(pidfd, select.POLLIN)
            os.write(self._wake_w, b"x")

    def _run(self) -> None:
        while not self._closed:
            for fd, _ in self._poll.poll(1000):
                if fd == self._wake_r:
                    os.read(self._wake_r, 4096)
                    continue
                with self._lock:
                    key, pid = self._watched.pop(fd, (None, None))
                    self._poll.unregister(fd)
                os.close(fd)
                if key is not None:
                    self._report(key, pid)

    def _report(self, key: str, pid: int, tries: int = 0) -> None:
        """The wrapper ended: end what is left of its tree, then report the exit. While any
        process of the attempt survives, nothing is reported (the attempt is still alive):
        the tree is ended again, more thoroughly and less often, until it is gone."""
        with self._lock:
            proc = self._children.pop(key, None)
            self._rc.setdefault(key, proc.wait() if proc is not None else None)  # reaped only now: the pgid stayed ours
        survivors = self.runner.end_tree(key, pid, thorough=tries > 0)
        if survivors:
            with self._lock:
                self._ending.add(key)
            if tries % 60 == 1:
                log.warning("attempt %s: processes %s survive SIGKILL; its end is reported once they are gone",
                            key, survivors)
            if not self._closed:
                retry = threading.Timer(min(5.0, 0.1 * 2 ** tries), self._report, (key, pid, tries + 1))
                retry.daemon = True
                retry.start()
            return
        with self._lock:
            self._ending.discard(key)
            rc = self._rc.pop(key, None)
            killed = key in self._killed
            self._killed.discard(key)
        code = self.runner.exit_code(key)
        if code is None and rc is not None:
            code = 128 - rc if rc < 0 else rc
        if code is None and killed:  # (a wrapper adopted after a restart: its SIGKILL was corral's)
            code = 128 + signal.SIGKILL
        if code is None:
            self._emit(Observed(key, Kind.LOST, reason="the process ended while corral was down and left no exit code"))
        else:
            said, permanent = containers.ended(self.runner.run_dir(key))
            self._emit(Observed(key, Kind.EXITED, code=code, reason=said, permanent=permanent))


# an exec probe's shell of the replica's account: the job's variables, then the probe
_PROBE_AS_USER = LOAD_ENV + 'eval "$1"'


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"
