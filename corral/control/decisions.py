"""The one vocabulary of decisions the control loop's pure rules return and its carrier
carries out: what happens to a replica (restart, relaunch, replace, end, stop, signal, kill,
readiness) and to its job (a task's termination deadline, the job's end, when to look
again). Decisions are data: the rules that make them (``supervisor`` for replicas,
``lifecycle`` for the job group) never touch a process, a file or the store.

``MOVES`` is the table of which replica states each kind of decision may move a replica from,
and to which; ``check`` holds each decision to it and to ``states.REPLICA_TRANSITIONS``, so a
decision taken on a stale view fails loudly instead of corrupting state."""

from __future__ import annotations

from dataclasses import dataclass

from corral.states import JobState, ReplicaState, TransitionError, check_replica_transition

# -- what happens to a replica ----------------------------------------------------------------


@dataclass(frozen=True)
class Restart:
    """RESTARTING until ``at`` (the backoff); its resources stay held meanwhile."""
    replica_id: int
    at: float
    exit_code: int | None
    message: str


@dataclass(frozen=True)
class Relaunch:
    """A due restart on the same node: a new attempt key, committed before it launches."""
    replica_id: int
    message: str


@dataclass(frozen=True)
class Replace:
    """A due restart whose node is gone: back to PENDING, placed again by the scheduler."""
    replica_id: int
    message: str


@dataclass(frozen=True)
class End:
    replica_id: int
    state: ReplicaState
    cause: str
    message: str
    exit_code: int | None = None


@dataclass(frozen=True)
class RequeueJob:
    """Lost with its node and may not restart: the replica FAILED, the job PREEMPTED, its
    other replicas stopped, and the job requeued once they have (Slurm on node failure)."""
    replica_id: int
    message: str
    job_message: str
    hold: str = ""  # "admin": pending again only once an operator releases it


@dataclass(frozen=True)
class Stop:
    """Stop for good: the stop signal, SIGKILL after the grace period (or KILLED at once if
    no process runs for it)."""
    replica_id: int
    cause: str


@dataclass(frozen=True)
class Signal:
    """Send ``signal``; with ``grace`` set, SIGKILL follows after it (the attempt's exit then
    goes to the restart policy); without, it is a warning only."""
    replica_id: int
    signal: str
    cause: str
    message: str
    grace: float | None


@dataclass(frozen=True)
class Kill:
    """The grace period ran out: SIGKILL."""
    replica_id: int


@dataclass(frozen=True)
class SetReady:
    replica_id: int
    ready: bool
    detail: str


# -- what happens to the job ------------------------------------------------------------------


@dataclass(frozen=True)
class SetDeadline:
    """The primaries are done: the auxiliary ``task`` is stopped at ``deadline`` (kept in the
    store, so a restarted server keeps it)."""
    task: str
    deadline: float


@dataclass(frozen=True)
class EndJob:
    state: JobState
    exit_code: int | None
    cause: str
    message: str | None = None


@dataclass(frozen=True)
class WakeAt:
    """Look at the job again at ``at``, whatever happens before."""
    at: float


ReplicaDecision = Restart | Relaunch | Replace | End | RequeueJob | Stop | Signal | Kill | SetReady
JobDecision = SetDeadline | EndJob | WakeAt
Decision = ReplicaDecision | JobDecision

LIVE = frozenset({ReplicaState.STARTING, ReplicaState.RUNNING})
# Which states each kind of decision may move a replica from, and to which.
MOVES: dict[type, tuple[frozenset[ReplicaState], ReplicaState | None]] = {
    Restart: (LIVE, ReplicaState.RESTARTING),
    Relaunch: (frozenset({ReplicaState.RESTARTING}), ReplicaState.STARTING),
    Replace: (frozenset({ReplicaState.RESTARTING}), ReplicaState.PENDING),
    RequeueJob: (LIVE, ReplicaState.FAILED),
    End: (LIVE, None),  # to the decision's own (terminal) state
}


def target(decision: Decision) -> ReplicaState | None:
    if isinstance(decision, End):
        return decision.state
    move = MOVES.get(type(decision))
    return move[1] if move else None


def check(decision: Decision, state: ReplicaState) -> None:
    """Raise ``TransitionError`` if the decision may not move a replica in ``state``."""
    move = MOVES.get(type(decision))
    if move is None:
        return
    sources, _ = move
    if state not in sources:
        raise TransitionError(f"{type(decision).__name__} cannot apply to a {state.value} replica")
    new = target(decision)
    if isinstance(decision, End) and (new is None or not new.terminal):
        raise TransitionError(f"End must name a terminal state, not {new}")
    check_replica_transition(state, new)  # type: ignore[arg-type]
