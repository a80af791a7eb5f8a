"""The contract between the control loop and the engines replicas run on.

An executor starts, signals, watches and adopts *attempts* of replicas on the nodes it
reports, and keeps no job state the store does not also hold. The core never sees a pid,
a loopback address or a file of the executor's: it stores the opaque, JSON-storable
``handle`` the executor returns and hands it back. What happens to an attempt comes back
as a stream of ``Observed`` events (started, exited with a code, lost with a reason, or
absent: never started), drained by the control loop on its own thread.

``Executor`` is what every infra implements. Beyond it an infra may offer *capabilities*,
each a small protocol the loop checks with ``isinstance`` (as Kueue's job framework does
with its optional interfaces), never by the infra's name:

* ``Reserving``   — hold a gang's resources in the engine's own accounting before any
                    replica starts (Ray's placement groups);
* ``Gangs``       — start several replicas of one launch at once, faster than one by one;
* ``ExecProbes``  — run a probe command where the attempt runs;
* ``DeclaredNodes`` — nodes given by the site's configuration: one it no longer declares has
                    left for good, and attempts recorded there are ended and lost;
* ``Listening``   — say whether the attempt itself answers on its address and port, where
                    replicas share a network stack with others (a probe counts only then);
* ``Shells``      — start a process in a running attempt's world (``corral exec``/``shell``);
* ``StepAgents``  — nodes that are all this machine: a batch job's steps on its other nodes
                    run inside those nodes' holder replicas (``corral.node.stepagent``);
* ``Preparing``   — get ready for an attempt as soon as it is placed, before its start;
* ``Provisioner`` — obtain nodes for a job before corral can place it (a Slurm allocation
                    today; a cloud or Kubernetes node pool later), checked at submission
                    (``misfit``) and followed while the job runs.

Two promises every executor keeps (the first law: never lost, never run twice, never alive
twice):

* An attempt counts only once its process really started: ``adopt`` reports an attempt
  that left no trace as ``ABSENT``, never as an exit, so the loop launches it anew.
* An attempt is alive at most once: before an executor reports an attempt ended (exited or
  lost), it has ended the attempt's whole process tree; ``signal(SIGKILL)`` kills the tree.

Where a replica's log is kept on the server is one rule (``Settings.log_file``): an
executor whose nodes are elsewhere mirrors the log there while the attempt runs."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, runtime_checkable

from corral.auth.accounts import UnixAccount
from corral.node.container import Container  # noqa: F401 - part of the contract, kept light (see there)
from corral.pool import NodeSpec

Handle = dict[str, Any]  # opaque to the core; JSON-storable; defined by each executor


class LaunchError(RuntimeError):
    """The attempt could not be started (bad working directory, engine refused, node gone);
    its message is shown in ``corral events``. Nothing of the attempt is left running."""


@dataclass(frozen=True)
class Launch:
    """Everything needed to run one attempt of one replica, on the node corral chose."""

    key: str  # unique per attempt, never reused: "{job}.{task}.{rank}.a{attempt}"
    job_id: int
    label: str  # "{task}-{rank}"
    node: str
    gpus: tuple[int, ...]
    cpus: float
    memory: float  # GB
    setup: str | None
    run: str | None
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    # a git workdir (url, ref): cloned once per job on the node, the attempt starts in the clone
    repo: tuple[str, str | None] | None = None
    hosts: bool = True  # resolve the job's names through /etc/hosts where the executor can
    # directories the attempt expects to exist where it runs (its checkpoint directory)
    dirs: tuple[str, ...] = ()
    # the Unix account it runs as (uid, groups, home: ``auth.accounts``); None: the server's own.
    # An executor starts it as exactly that account, or refuses with a LaunchError.
    run_as: UnixAccount | None = None
    # the container its setup and run execute in (``corral.node.container``); None: on the node
    container: Container | None = None
    file_mounts: tuple[tuple[str, str], ...] = ()  # (remote path as written, absolute source): node.mounts


@dataclass(frozen=True)
class Started:
    """What ``start`` returns: the attempt's handle, and what the core may know of it
    without reading the handle."""

    handle: Handle
    confirmed: bool = True  # False: the engine confirms the start later with a STARTED event
    gpus: tuple[int, ...] | None = None  # the GPUs the engine bound, when it chose them itself
    detail: str = ""  # shown in the replica's event: "pid 4242", "step 17.3" …


@dataclass(frozen=True)
class Binding:
    """Where a replica is reached: an address and its named ports. Chosen by the executor
    when the replica is placed on a node and kept across restarts on that node."""

    addr: str
    ports: dict[str, int]
    # why a port differs from the one declared, when the executor could not honour it: the
    # replica's event says so, and its peers entry and ``CORRAL_PORT_*`` carry the port bound
    moved: str = ""


class Kind(str, Enum):
    # the attempt runs (reported by adopt for one still alive, or a late confirmation); an
    # attempt in a container runs once its container does: while its image is pulled it is
    # not started yet, and its executor confirms it (``Started.confirmed`` False) only then
    STARTED = "started"
    EXITED = "exited"  # its process ended with ``code``
    LOST = "lost"  # it ended and its exit code cannot be known (node died, no record)
    ABSENT = "absent"  # adopt found no trace: it never started


@dataclass(frozen=True)
class Observed:
    key: str
    kind: Kind
    code: int | None = None
    reason: str = ""
    handle: Handle | None = None
    node: str | None = None
    gpus: tuple[int, ...] | None = None  # STARTED: the GPUs the engine bound, when it chose them
    detail: str = ""  # STARTED: as ``Started.detail``
    # EXITED: it failed for a reason every new attempt would meet again (a registry refused its
    # image: ``corral.node.container.refused``), so its restart policy is not asked
    permanent: bool = False
    # LOST: nobody could make sure it ended (its engine is out of reach for good), so nothing may
    # replace it until a person who can look says it has: its job is requeued held
    unverified: bool = False


Wake = Callable[[], None]


class EventStream:
    """What an executor observed, queued from its own threads for the loop to drain; every
    event wakes the loop."""

    def __init__(self, wake: Wake):
        self._events: deque[Observed] = deque()
        self._wake_loop = wake

    def _emit(self, event: Observed) -> None:
        self._events.append(event)
        self._wake_loop()

    def drain(self) -> list[Observed]:
        out = []
        while self._events:
            out.append(self._events.popleft())
        return out


@runtime_checkable
class Executor(Protocol):
    """What every infra implements."""

    name: str

    def nodes(self) -> list[NodeSpec]:
        """The nodes this executor can run on now (alive). May change while running; the
        control loop asks again when ``inventory_version`` moves."""
        ...

    @property
    def inventory_version(self) -> int: ...

    def bind(self, job_id: int, replica_id: int, node: str, ports: dict[str, int],
             previous: Binding | None) -> Binding:
        """Choose the replica's address and ports on ``node`` (``ports``: the task's named
        ports as declared). ``previous`` is kept when it is still valid on this node."""
        ...

    def rendezvous_port(self, node: str) -> int:
        """A TCP port free on ``node`` for a task's rank 0 (``MASTER_PORT``)."""
        ...

    def start(self, launch: Launch) -> Started:
        """Start the attempt; raise ``LaunchError`` when it cannot be started. It creates
        ``launch.dirs`` where the attempt runs and keeps the replica's log current at
        ``Settings.log_file`` on the server."""
        ...

    def adopt(self, attempts: list[tuple[str, Handle | None]]) -> None:
        """After a server restart (or a cycle whose writes were lost): re-attach to each (key,
        handle or None if the handle was never stored) and report each through the event
        stream: STARTED if alive, EXITED / LOST if it ended, ABSENT if it never started.
        Reported before this returns. An attempt already watched is reported again, once,
        and not watched twice."""
        ...

    def signal(self, handle: Handle, signum: int) -> bool:
        """Send ``signum`` to the attempt (SIGKILL: its whole process tree); False if gone."""
        ...

    def drain(self) -> list[Observed]:
        """The events observed since the last call."""
        ...

    def forget(self, handle: Handle) -> None:
        """The attempt's end is durable in the store: drop what the executor kept for it."""
        ...

    def publish(self, job_id: int, nodes: set[str], hosts: str, peers: str) -> None:
        """Make the job's hosts and peers files current on ``nodes``."""
        ...

    def attempt_env(self, job_id: int) -> dict[str, str]:
        """Variables the executor adds to every attempt of the job (where its files are)."""
        ...

    def release(self, job_id: int) -> None:
        """The job ended or was requeued: give back whatever is held for it (reservations,
        a provisioned allocation unless asked to keep it)."""
        ...

    def cleanup_job(self, job_id: int) -> None:
        """The job ended: remove its discovery files and runtime state."""
        ...

    def close(self) -> None: ...


# -- optional capabilities ------------------------------------------------------------------


@runtime_checkable
class Reserving(Protocol):
    """Holds a gang's resources in the engine's own accounting before any replica starts."""

    def reserve(self, job_id: int, generation: int, slots: list[tuple[str, str, tuple[int, ...], float, float]]) -> None:
        """All or nothing: ``slots`` are (label, node, gpus, cpus, memory); raises LaunchError."""
        ...


@runtime_checkable
class Gangs(Protocol):
    """Starts several replicas of one launch at once, faster than one ``start`` after another
    (the local executor makes each fork while it prepares the next replica)."""

    def start_gang(self, launches: list[Launch]) -> list[Started | Exception]:
        """For each launch in order, what ``start`` would return, or the exception it would
        raise; every attempt that started is in the list, whatever failed beside it."""
        ...


@runtime_checkable
class Accounting(Protocol):
    """An engine that keeps its own record of a job's end (Slurm's accounting, ``sacct``):
    told how the job ended just before its ``release``, so that record agrees with corral's."""

    def record_end(self, job_id: int, state: str) -> None:
        """``state``: the job's final state (SUCCEEDED, FAILED, CANCELLED, TIMEOUT …); ""
        when it is released to run again (a requeue, a pipeline's next stage)."""
        ...


@runtime_checkable
class Reachability(Protocol):
    """An engine that can be unreachable while the server runs (a Ray cluster, a Slurm
    controller). Such an executor is built without contacting its engine and never raises
    for an unreachable one: it keeps trying in the background, ``nodes()`` is empty while
    it is down, and the loop shows its partitions DOWN with the reason (``corral nodes``,
    ``corral queue``, the dashboard, ``/metrics``) while every other infra runs on."""

    def unreachable(self) -> str | None:
        """None while the engine answers; otherwise the reason, as a sentence naming the
        engine and what failed (e.g. "Ray at 10.0.0.1:6379 does not answer: …")."""
        ...


@runtime_checkable
class Preparing(Protocol):
    def prepare(self, key: str) -> None:
        """An attempt with this key was placed on one of its nodes and launches after the
        loop's next commit: get ready for it (never blocking; local: its cgroup)."""
        ...


@runtime_checkable
class Anticipating(Protocol):
    def anticipate(self) -> None:
        """A submission has passed admission: a start on this infra may follow within
        milliseconds. Get ready for whatever would stall it (never blocking; local: the
        kernel's cgroup lock put in its fast mode, ``ProcessTrees.warm``)."""
        ...


@runtime_checkable
class ExecProbes(Protocol):
    def exec_probe(self, handle: Handle, command: str, env: dict[str, str], cwd: str | None,
                   timeout: float) -> tuple[bool, str]:
        """Run an exec probe where the attempt runs: (passed, what it said)."""
        ...


@runtime_checkable
class StepAgents(Protocol):
    def step_agents_dir(self, job_id: int) -> str:
        """Where a batch job's holder replicas open their step agents' sockets, one per node:
        a directory every replica of the job sees as the same (its runtime files')."""
        ...


@runtime_checkable
class DeclaredNodes(Protocol):
    def declares(self, node: str) -> bool:
        """Whether ``node`` is one the site's configuration gives this executor; a node it does
        not declare has left the site (not merely stopped answering)."""
        ...


@runtime_checkable
class Listening(Protocol):
    def answered_by_other(self, handle: Handle, addr: str, port: int) -> str | None:
        """None when a process of the attempt holds the socket that answers ``addr:port`` on
        its node (or no other could: it has a network of its own); else why not, a sentence."""
        ...


class ShellError(RuntimeError):
    """No process could be started in the attempt's world (it ended, its node is gone, the
    engine refused); the message is a sentence the caller is shown."""


@dataclass(frozen=True)
class ShellRequest:
    """A process to start in a running attempt's world: its namespaces or container, its
    working directory, its environment and its Unix account (``corral exec``, ``corral shell``)."""

    key: str  # the attempt's
    job_id: int
    argv: tuple[str, ...]  # () for the account's interactive shell
    env: dict[str, str]  # the replica's environment (``Launch.env``), TERM included for a terminal
    cwd: str | None  # the replica's working directory, where the executor cannot read the attempt's own
    run_as: UnixAccount | None = None  # as ``Launch.run_as``: never the server's account for another's job
    tty: bool = False  # a pseudo-terminal of ``rows`` x ``cols``, else plain pipes (stdout and stderr apart)
    rows: int = 24
    cols: int = 80


@runtime_checkable
class Shell(Protocol):
    """A process started by ``Shells.open_shell``, driven from the server. Its methods may be
    called from different threads: one reading, others writing, resizing or signalling."""

    def read(self) -> tuple[int, bytes]:
        """Blocks for output: (1, data) from its stdout or terminal, (2, data) from its stderr;
        (0, b"") once all its output is read."""
        ...

    def write(self, data: bytes) -> None: ...

    def close_input(self) -> None:
        """End of its standard input (a terminal gets ^D instead: it is the user's to type)."""
        ...

    def resize(self, rows: int, cols: int) -> None: ...

    def signal(self, signum: int) -> None:
        """Send ``signum`` to its process group (a terminal's Ctrl-C arrives as a byte instead)."""
        ...

    def wait(self) -> int:
        """Its exit code once it ended (128+N for a signal N), waiting for it."""
        ...

    def close(self) -> None:
        """End it, and whatever it started, if it still runs."""
        ...


@runtime_checkable
class Shells(Protocol):
    def open_shell(self, handle: Handle, request: ShellRequest) -> Shell:
        """Start ``request`` in the attempt's world on its node; raises ``ShellError``."""
        ...


@dataclass(frozen=True)
class ReplicaShape:
    """One replica a provisioned allocation must hold."""

    gpus: int
    cpus: float
    memory: float  # GB
    distinct: bool = False  # needs a node of its own (no other replica of its task beside it)
    gpu_type: str | None = None  # the GPU type it asks for (None: any)
    ports: tuple[int, ...] = ()  # the ports it declares (it listens on them on its node's address)


@dataclass(frozen=True)
class ProvisionRequest:
    """What a job asks of an engine that provisions nodes for it."""

    job_id: int
    replicas: tuple[ReplicaShape, ...]
    gpu_type: str | None
    time_limit: float | None
    grace: float  # the longest stop grace period of its tasks
    target: str | None  # the engine's own partition or pool (None: its default)
    account: str  # the job's; an engine passes them on only if its section says the names are its own
    qos: str
    exclusive: bool = False
    constraint: str | None = None
    # the Unix account the job runs as (its allocation is that account's); None: the server's own
    run_as: UnixAccount | None = None


class Provision(str, Enum):
    READY = "ready"  # its nodes are in the inventory, dedicated to the job
    WAITING = "waiting"  # asked for; the engine says why it waits
    REFUSED = "refused"  # the engine will never give it: the job fails with the reason
    UNREACHABLE = "unreachable"  # the engine does not answer: the job waits, saying so


@dataclass(frozen=True)
class Provisioned:
    state: Provision
    reason: str = ""
    submitted: str | None = None  # the engine's id for a request made just now (said in the job's events)


class Allocation(str, Enum):
    """What became of a running job's provisioned nodes."""

    LIVE = "live"
    REQUEUED = "requeued"  # the engine took them back and will give them again (requeue the job)
    TIMEOUT = "timeout"  # the engine's time limit ended them: the job ends TIMEOUT
    CANCELLED = "cancelled"  # cancelled outside corral: the job ends CANCELLED
    ENDED = "ended"  # ended otherwise (node failure, out of memory): the job ends FAILED


@runtime_checkable
class Provisioner(Protocol):
    """An infra that must first obtain nodes for a job (a Slurm allocation per job). Its
    partitions' jobs are placed only on the nodes provisioned for them, which carry
    ``NodeSpec.dedicated_to``."""

    def provision(self, request: ProvisionRequest) -> Provisioned:
        """Make sure the job's nodes are asked for (never twice) and say where it stands."""
        ...

    def allocation(self, job_id: int) -> tuple[Allocation, str]:
        """What became of a running job's nodes, and the engine's words for it."""
        ...

    def holds(self, job_id: int) -> bool:
        """Whether something is asked for or held on the job's behalf (array throttles count it)."""
        ...

    def keep_on_release(self, job_id: int) -> None:
        """The engine requeued the job's nodes: the next ``release`` keeps waiting for them."""
        ...

    def prune(self, keep: set[int]) -> None:
        """Give back what is held for jobs not in ``keep``."""
        ...

    def misfit(self, target: str | None, replicas: list[ReplicaShape], timeout: float) -> str | None:
        """At submission: why no allocation of ``target`` could ever hold these replicas, or
        None (also when the engine does not answer within ``timeout``: it decides later)."""
        ...
