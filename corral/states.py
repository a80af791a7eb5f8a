"""Job and replica states and the transitions allowed between them, and the reasons a
pending job waits. Every layer speaks these enums (defined once, here, at the bottom); the
control loop refuses any transition not in these tables."""

from __future__ import annotations

from enum import Enum


class JobState(str, Enum):
    PENDING = "PENDING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    PREEMPTED = "PREEMPTED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_JOB_STATES


TERMINAL_JOB_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT})

JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.STARTING, JobState.CANCELLED, JobState.FAILED}),
    JobState.STARTING: frozenset({JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED,
                                  JobState.TIMEOUT, JobState.PREEMPTED}),
    # RUNNING -> PENDING: a pipeline's stage succeeded and the next one waits for resources.
    JobState.RUNNING: frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT,
                                 JobState.PREEMPTED, JobState.PENDING}),
    # Preempted: its replicas are being stopped; then requeued (same id) or cancelled.
    JobState.PREEMPTED: frozenset({JobState.PENDING, JobState.CANCELLED}),
}


class ReplicaState(str, Enum):
    PENDING = "PENDING"
    STARTING = "STARTING"  # placed; process being launched
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    KILLED = "KILLED"  # stopped by corral (cancel, group termination)

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_REPLICA_STATES


TERMINAL_REPLICA_STATES = frozenset({ReplicaState.SUCCEEDED, ReplicaState.FAILED, ReplicaState.KILLED})

REPLICA_TRANSITIONS: dict[ReplicaState, frozenset[ReplicaState]] = {
    ReplicaState.PENDING: frozenset({ReplicaState.STARTING, ReplicaState.KILLED}),
    # STARTING -> RESTARTING: an attempt lost before its start was confirmed (its node died).
    ReplicaState.STARTING: frozenset({ReplicaState.RUNNING, ReplicaState.FAILED, ReplicaState.KILLED,
                                      ReplicaState.SUCCEEDED, ReplicaState.RESTARTING}),
    ReplicaState.RUNNING: frozenset({ReplicaState.SUCCEEDED, ReplicaState.FAILED, ReplicaState.KILLED,
                                     ReplicaState.RESTARTING}),
    # A replica whose node went away is placed again (PENDING) when its restart is due.
    ReplicaState.RESTARTING: frozenset({ReplicaState.STARTING, ReplicaState.PENDING, ReplicaState.KILLED}),
    # A rank retired by a scale-down comes back when the task grows again; a requeued job
    # (preempted, or its node failed) starts every replica again, however it ended.
    ReplicaState.KILLED: frozenset({ReplicaState.PENDING}),
    ReplicaState.FAILED: frozenset({ReplicaState.PENDING}),
    ReplicaState.SUCCEEDED: frozenset({ReplicaState.PENDING}),
}


class TransitionError(RuntimeError):
    pass


def check_job_transition(old: JobState, new: JobState) -> None:
    if new not in JOB_TRANSITIONS.get(old, frozenset()):
        raise TransitionError(f"job cannot go from {old.value} to {new.value}")


def check_replica_transition(old: ReplicaState, new: ReplicaState) -> None:
    if new not in REPLICA_TRANSITIONS.get(old, frozenset()):
        raise TransitionError(f"replica cannot go from {old.value} to {new.value}")


def retired(stop_cause: str | None, state: ReplicaState | str) -> bool:
    """A replica retired by a scale-down: no longer a member of its task (until it grows)."""
    return stop_cause == "scale_down" and ReplicaState(state).terminal


class Reason(str, Enum):
    """Why a pending job waits, in Slurm's REASON vocabulary."""

    NONE = "None"
    PRIORITY = "Priority"  # a job ahead of it in the queue waits first
    RESOURCES = "Resources"  # free resources are not enough for the whole gang now
    GPU_TYPE = "ReqGPUTypeNotAvail"  # no node offers the GPU type asked for
    DEPENDENCY = "Dependency"  # waits for other jobs
    DEPENDENCY_NEVER = "DependencyNeverSatisfied"
    PARTITION_TIME = "PartitionTimeLimit"  # asks for more time than its partition allows
    TOPOLOGY = "Topology"  # no switch has room for a task that requires one
    QOS_USER_GPUS = "QOSMaxGPUsPerUser"
    QOS_ACCOUNT_GPUS = "QOSMaxGPUsPerAccount"
    QOS_GPUS = "QOSGrpGPUs"
    QOS_GPU_MINUTES = "QOSGrpGPUMinutes"
    ACCOUNT_GPUS = "AccountMaxGPUs"
    ACCOUNT_GPU_MINUTES = "AccountGPUMinutes"
    PREEMPTING = "Preempting"  # lower-tier work is being stopped to make room for it
    HELD_USER = "JobHeldUser"  # held by its owner (corral hold, launch --hold)
    HELD_ADMIN = "JobHeldAdmin"  # held by an operator: only an operator releases it
    ARRAY_LIMIT = "JobArrayTaskLimit"  # its array already runs as many elements as its %N throttle allows
    CONSTRAINT = "BadConstraints"  # no node of its partition has the features or names it asks for
    PARTITION_DOWN = "PartitionDown"  # the engine of its partition's infra does not answer (why: the partition's)
