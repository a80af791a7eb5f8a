"""What a process started in a running replica's world (``corral exec``, ``corral shell``)
is given, read from the loop's memory on the loop's own thread (``ControlLoop.ask``): the
executor its attempt runs on, the attempt's handle, and the ``Launch`` the attempt was
started with (its environment, working directory, Unix account), computed as at its start.
The API starts the process itself; nothing here changes the loop's state."""

from __future__ import annotations

from dataclasses import dataclass

from corral.control.loop import ControlLoop
from corral.executors.contract import Executor, Handle, Launch, LaunchError
from corral.states import ReplicaState


@dataclass(frozen=True)
class ShellTarget:
    """A running attempt a process may be started beside, or why there is none (``refused``:
    a sentence, with the HTTP status that says it)."""

    label: str = ""
    executor: Executor | None = None
    handle: Handle | None = None
    launch: Launch | None = None
    refused: str = ""
    status: int = 0


def shell_target(loop: ControlLoop, job_id: int, label: str) -> ShellTarget:
    """The running attempt of replica ``label`` ("task-rank") of job ``job_id``."""
    job = loop.book.active.get(job_id)
    if job is None:
        return ShellTarget(refused=f"job {job_id} is not running", status=409)
    replica = next((r for r in job.members if r.label == label), None)
    if replica is None:
        names = ", ".join(r.label for r in job.members)
        return ShellTarget(refused=f"job {job_id} has no replica {label!r}; it has {names}", status=404)
    if replica.state != ReplicaState.RUNNING or replica.handle is None or replica.id in loop.book.unconfirmed:
        return ShellTarget(refused=f"replica {label} of job {job_id} is {replica.state.value}, not running", status=409)
    try:
        launch = loop.launcher.launch_for(job, replica)
    except LaunchError as exc:
        return ShellTarget(refused=f"replica {label} of job {job_id}: {exc}", status=409)
    return ShellTarget(label, loop.inventory.of(replica), dict(replica.handle), launch)
