"""The contract between the control loop and the engines replicas run on (v2).

An executor starts, signals, watches and adopts *attempts* of replicas on the nodes it
reports, and keeps no job state the store does not also hold. The core never sees a pid,
a loopback address or a file of the executor's: it stores the opaque, JSON-storable
``handle`` the executor returns and hands it back. What happens to an attempt comes back
as a stream of ``Observed`` events (started, exited with a code, lost with a reason, or
absent: never started), drained by the control loop on its own thread.

Two promises every executor keeps (the first law: never lost, never run twice, never alive
twice):

* An attempt counts only once its process really started: ``adopt`` reports an attempt
  that left no trace as ``ABSENT``, never as an exit, so the loop launches it anew.
* An attempt is alive at most once: before an executor reports an attempt ended (exited or
  lost), it has ended the attempt's whole process tree; ``signal(SIGKILL)`` kills the tree."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

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


@dataclass(frozen=True)
class Binding:
    """Where a replica is reached: an address and its named ports. Chosen by the executor
    when the replica is placed on a node and kept across restarts on that node."""

    addr: str
    ports: dict[str, int]


class Kind(str, Enum):
    STARTED = "started"  # the attempt runs (reported by adopt for one still alive)
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
    gpus: tuple[int, ...] | None = None  # the GPUs the engine bound, when it chose them


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


class Executor(Protocol):
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

    def reserve(self, job_id: int, generation: int, slots: list[tuple[str, str, tuple[int, ...], float, float]]) -> None:
        """Hold a gang's resources in the engine's own accounting, all or nothing, before any
        replica starts: ``slots`` are (label, node, gpus, cpus, memory). Raises LaunchError."""
        ...

    def release(self, job_id: int) -> None:
        """Give back everything ``reserve`` held for the job (it ended or was requeued)."""
        ...

    def start(self, launch: Launch) -> Handle:
        """Start the attempt; raise ``LaunchError`` when it cannot be started."""
        ...

    def adopt(self, attempts: list[tuple[str, Handle | None]]) -> None:
        """After a server restart: re-attach to each (key, handle or None if the handle was
        never stored) and report each through the event stream: STARTED if alive, EXITED /
        LOST if it ended, ABSENT if it never started. Reported before this returns."""
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

    def exec_probe(self, handle: Handle, command: str, env: dict[str, str], cwd: str | None,
                   timeout: float) -> tuple[bool, str]:
        """Run an exec probe where the attempt runs."""
        ...

    def log_path(self, job_id: int, label: str) -> str:
        """Where ``corral logs`` reads the replica's log on the server (the executor keeps
        it current, streaming it from the node when the node is elsewhere)."""
        ...

    def cleanup_job(self, job_id: int) -> None:
        """The job ended: remove its discovery files and runtime state."""
        ...

    def close(self) -> None: ...
