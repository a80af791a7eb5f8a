"""ORM tables (SQLAlchemy 2). Times are UNIX seconds as floats so the pure core and a fake
clock use the same numbers; the API turns them into ISO timestamps.

Desired and observed state are separate columns: ``cancel_requested_at`` and
``stop_requested_at``/``kill_at`` say what corral wants; ``state``, ``handle`` and ``exit_code``
say what was observed. A replica's ``handle`` is its current attempt's, opaque to the core
(the executor named by ``infra`` defines it); ``attempt`` counts attempts launched, so every
attempt has its own key and nothing of one attempt is ever taken for another's."""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Boolean, false, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

REASON_LENGTH = 64  # a pending reason as stored; the loop keeps longer ones (an engine's) whole in memory


class Base(DeclarativeBase):
    pass


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(63), index=True)
    # The domain of its replicas' names (``{task}-{rank}.{domain}``) when it is not ``name``:
    # a job submitted while another active job of its user held that name gets ``name-ID``
    # (``runtime.discovery.choose_domain``), so every active job's replica names stay its own.
    domain: Mapped[str | None] = mapped_column(String(96), nullable=True, index=True)
    user: Mapped[str] = mapped_column(String(64), index=True)
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str] = mapped_column(String(REASON_LENGTH), default="None")
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    is_group: Mapped[bool] = mapped_column(Boolean, default=False)
    submitted_at: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    cancel_requested_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    version: Mapped[int] = mapped_column(Integer, default=0)
    # scheduling (Slurm's names); resolved at submission: account and partition are never blank
    partition: Mapped[str] = mapped_column(String(64), default="", server_default="")
    account: Mapped[str] = mapped_column(String(64), default="", server_default="")
    qos: Mapped[str] = mapped_column(String(64), default="", server_default="")
    nice: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    priority: Mapped[float | None] = mapped_column(Float, nullable=True)  # set by an operator
    time_limit: Mapped[float | None] = mapped_column(Float, nullable=True)
    dependency: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    kill_on_invalid_dep: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    requeues: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # times preempted and requeued
    hold: Mapped[str] = mapped_column(String(8), default="", server_default="")  # "", "user" or "admin"
    # A requeue asked for (by a user, or a node's loss): kept until the job is pending again, so a
    # server restart while its replicas stop still requeues it instead of ending it.
    requeue_requested_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # A job array's element: the array is named by its first element's id (Slurm's
    # SLURM_ARRAY_JOB_ID); ``array_throttle`` caps how many of its elements run at once.
    array_job_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    array_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    array_throttle: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The Unix account the job's replicas run as (``auth.accounts``), fixed at submission; NULL
    # for jobs stored before accounts existed: they run as the server's own account.
    run_as: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # The run time (seconds) learned from its user's history that the job was given when it last
    # started (``control.runtimes``): what ``corral acct`` judges predictions by. NULL: no history.
    predicted_run_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    # GPU-seconds held in its earlier attempts (least attained service: ``scheduler.attained``),
    # added to at each requeue; the current attempt's share is counted from ``started_at``.
    attained_gpu_s: Mapped[float] = mapped_column(Float, nullable=False, default=0.0, server_default="0")

    tasks: Mapped[list[Task]] = relationship(back_populates="job", order_by="Task.position",
                                             cascade="all, delete-orphan")
    replicas: Mapped[list[Replica]] = relationship(back_populates="job", order_by=lambda: (Replica.task_position, Replica.rank),
                                                   cascade="all, delete-orphan")

    __table_args__ = (Index("ix_jobs_state_id", "state", "id"), Index("ix_jobs_user_name", "user", "name"))


class Task(Base):
    __tablename__ = "tasks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(63))
    primary: Mapped[bool] = mapped_column(Boolean)
    num_nodes: Mapped[int] = mapped_column(Integer)
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    gpu_type: Mapped[str | None] = mapped_column(String(64), nullable=True)
    cpus: Mapped[float] = mapped_column(Float)
    memory: Mapped[float] = mapped_column(Float, default=0.0)
    grace_period: Mapped[float] = mapped_column(Float)
    termination_delay: Mapped[float] = mapped_column(Float, default=0.0)
    # Set when the last primary succeeded; persisted so a server restart does not reset it.
    termination_deadline: Mapped[float | None] = mapped_column(Float, nullable=True)
    master_port: Mapped[int | None] = mapped_column(Integer, nullable=True)
    endpoint_port: Mapped[int | None] = mapped_column(Integer, nullable=True)  # its service endpoint, if any

    job: Mapped[Job] = relationship(back_populates="tasks")

    __table_args__ = (UniqueConstraint("job_id", "name"),)


class Replica(Base):
    __tablename__ = "replicas"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    task: Mapped[str] = mapped_column(String(63))
    task_position: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), index=True)
    node: Mapped[str | None] = mapped_column(String(63), nullable=True)
    gpus: Mapped[list[int]] = mapped_column(JSON, default=list)
    cpus: Mapped[float] = mapped_column(Float, default=0.0)
    memory: Mapped[float] = mapped_column(Float, default=0.0)
    infra: Mapped[str | None] = mapped_column(String(32), nullable=True)  # the executor it runs on
    handle: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    ports: Mapped[dict[str, int] | None] = mapped_column(JSON, nullable=True)  # name -> port, bound per replica
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    stop_requested_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    stop_cause: Mapped[str | None] = mapped_column(String(128), nullable=True)
    kill_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    log_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    addr: Mapped[str | None] = mapped_column(String(45), nullable=True)
    ready: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # When a replica waiting to restart (RESTARTING) is due; persisted so backoff survives restarts.
    restart_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)  # of the previous attempt

    job: Mapped[Job] = relationship(back_populates="replicas")

    __table_args__ = (UniqueConstraint("job_id", "task", "rank"),)

    @property
    def label(self) -> str:
        return f"{self.task}-{self.rank}"

    @property
    def pid(self) -> int | None:
        """The attempt's process id where the executor has one (local), for people to read."""
        value = (self.handle or {}).get("pid")
        return int(value) if value else None


class Event(Base):
    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    ts: Mapped[float] = mapped_column(Float)
    subject: Mapped[str] = mapped_column(String(140))  # "job" or a replica label
    from_state: Mapped[str | None] = mapped_column(String(16), nullable=True)
    to_state: Mapped[str | None] = mapped_column(String(16), nullable=True)
    cause: Mapped[str] = mapped_column(String(64))
    message: Mapped[str | None] = mapped_column(Text, nullable=True)


class ServerClaim(Base):
    """One row: the epoch of the server that owns the database's control loop (raised by
    each server that takes the claim; see ``store.database.Claim``)."""

    __tablename__ = "server_claim"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    epoch: Mapped[int] = mapped_column(Integer)
    holder: Mapped[str] = mapped_column(String(256))
    taken_at: Mapped[float] = mapped_column(Float)


class Usage(Base):
    """What each association (account, user) under each QOS has consumed: ``charge`` is
    the fair-share usage (weighted resource-seconds, decayed with the half-life up to
    ``updated_at``); ``gpu_seconds`` never decays and feeds the GPU-minute budgets."""

    __tablename__ = "usage"

    account: Mapped[str] = mapped_column(String(64), primary_key=True)
    user: Mapped[str] = mapped_column(String(64), primary_key=True)
    qos: Mapped[str] = mapped_column(String(64), primary_key=True)
    charge: Mapped[float] = mapped_column(Float, default=0.0)
    gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    updated_at: Mapped[float] = mapped_column(Float)


class ApiToken(Base):
    """A bearer token for the API. Only its SHA-256 is kept (the token itself is shown once,
    when created); ``role`` is null when the holder's role follows config.yaml."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    user: Mapped[str] = mapped_column(String(64), index=True)
    role: Mapped[str | None] = mapped_column(String(16), nullable=True)
    note: Mapped[str | None] = mapped_column(String(200), nullable=True)
    created_by: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_used_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class AuditEntry(Base):
    """Who did what to which job or token, from where, and whether it was allowed."""

    __tablename__ = "audit"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ts: Mapped[float] = mapped_column(Float, index=True)
    user: Mapped[str] = mapped_column(String(64), index=True)
    role: Mapped[str] = mapped_column(String(16))
    source: Mapped[str] = mapped_column(String(64))  # the client's address, or "local"
    action: Mapped[str] = mapped_column(String(32), index=True)
    target: Mapped[str | None] = mapped_column(String(140), nullable=True)  # "job 12", "token 3"
    outcome: Mapped[str] = mapped_column(String(16))  # "ok", "refused" or "failed"
    detail: Mapped[str | None] = mapped_column(Text, nullable=True)
