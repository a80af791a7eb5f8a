"""Service semantics of a task, the part no batch scheduler has: the ports a replica
listens on, readiness and liveness probes, start ordering (``depends_on``), a restart
policy with backoff, and the signal it gets before SIGKILL."""

from __future__ import annotations

import signal
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from corral.spec.quantity import parse_duration

Duration = Annotated[float, BeforeValidator(parse_duration)]
PortRef = int | str  # a number, or the name of one of the task's ports

STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT")


def _signal_name(value: Any) -> str:
    name = str(value).upper()
    name = name if name.startswith("SIG") else f"SIG{name}"
    if name not in STOP_SIGNALS:
        raise ValueError(f"{value!r} is not a stop signal corral sends; use one of {', '.join(STOP_SIGNALS)}")
    return name


SignalName = Annotated[str, BeforeValidator(_signal_name)]


def signal_number(name: str) -> int:
    return int(getattr(signal, name))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HttpCheck(_Strict):
    port: PortRef
    path: str = "/"

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("an HTTP probe path starts with '/'")
        return value


class Probe(_Strict):
    """Exactly one of ``http``, ``tcp`` or ``exec``; timings as in Kubernetes, faster defaults."""

    http: HttpCheck | None = None
    tcp: PortRef | None = None
    exec: str | None = None
    initial_delay: Duration = 0.0
    period: Duration = 1.0
    timeout: Duration = 1.0
    failure_threshold: int = Field(default=3, ge=1, le=1000)
    success_threshold: int = Field(default=1, ge=1, le=1000)

    @field_validator("exec", mode="before")
    @classmethod
    def _exec(cls, value: Any) -> Any:
        if isinstance(value, list):
            import shlex

            return " ".join(shlex.quote(str(v)) for v in value)
        return value

    @model_validator(mode="after")
    def _one_check(self) -> Probe:
        chosen = [k for k in ("http", "tcp", "exec") if getattr(self, k) is not None]
        if len(chosen) != 1:
            raise ValueError("a probe needs exactly one of http, tcp or exec")
        if self.period <= 0 or self.timeout <= 0:
            raise ValueError("period and timeout must be > 0")
        return self


class Backoff(_Strict):
    initial: Duration = 1.0
    max: Duration = 60.0
    factor: float = Field(default=2.0, ge=1.0, le=100.0)

    def delay(self, restarts: int) -> float:
        """Wait before restart number ``restarts + 1``."""
        return min(self.max, self.initial * self.factor ** restarts)


class RestartPolicy(_Strict):
    policy: Literal["never", "on_failure", "always"] = "never"
    max_restarts: int = Field(default=3, ge=0, le=1_000_000)
    backoff: Backoff = Backoff()
    exit_codes: list[int] | None = None  # on_failure: only these exit codes restart

    def should_restart(self, exit_code: int | None, restarts: int) -> bool:
        if self.policy == "never" or restarts >= self.max_restarts:
            return False
        if self.policy == "always":
            return True
        if exit_code == 0:
            return False
        return self.exit_codes is None or exit_code in self.exit_codes


class Dependency(_Strict):
    task: str
    condition: Literal["ready", "started", "succeeded"] = "ready"


class WarnBeforeTimeout(_Strict):
    signal: SignalName = "SIGUSR1"
    seconds: Duration = 60.0


def _ports(value: Any) -> Any:
    """``{http: 8000}``, or SkyPilot's list ``[8000, 8001]`` (named ``port0``, ``port1``)."""
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        value = [value]
    if isinstance(value, list):
        return {f"port{i}": p for i, p in enumerate(value)}
    return value


Ports = Annotated[dict[str, int], BeforeValidator(_ports)]


def check_ports(ports: dict[str, int]) -> dict[str, int]:
    for name, port in ports.items():
        if not name.replace("_", "a").isalnum():
            raise ValueError(f"port name {name!r} must be letters, digits and '_'")
        if not 1 <= port <= 65535:
            raise ValueError(f"port {name}={port} is outside 1..65535")
    return ports


def resolve_port(ref: PortRef, ports: dict[str, int]) -> int:
    if isinstance(ref, int):
        return ref
    if ref.isdigit():
        return int(ref)
    if ref not in ports:
        raise ValueError(f"no port is named {ref!r}; the task declares {', '.join(ports) or 'none'}")
    return ports[ref]


class TopologyRequest(_Strict):
    """``topology: {required: leaf}`` or ``{preferred: spine, max_wait: 10m}``: where a
    multi-node task's replicas go in the switch tree (a level is a topology label)."""

    required: str | None = None
    preferred: str | None = None
    max_wait: Duration | None = None

    @model_validator(mode="after")
    def _one(self) -> TopologyRequest:
        if (self.required is None) == (self.preferred is None):
            raise ValueError("topology takes exactly one of required or preferred (a switch level like leaf)")
        if self.max_wait is not None and self.required is None:
            raise ValueError("max_wait relaxes a required level; a preferred one never waits")
        return self

    @property
    def level(self) -> str:
        return self.required or self.preferred or ""


def _dependency(value: Any) -> Any:
    from corral.scheduler.dependency import parse
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    if isinstance(value, int):
        value = f"afterok:{value}"
    if not isinstance(value, str):
        raise ValueError("a dependency is a string like 'afterok:12:13,singleton' or a list of them")
    return tuple((d.kind, d.job_ids) for d in parse(value))


class Scheduling(_Strict):
    """Job-level scheduling fields, Slurm's names: at the top of a single-task file or in a
    job group's header (and as ``corral launch`` options)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    nice: int = Field(default=0, ge=-10000, le=10000)
    priority: float | None = Field(default=None, ge=0)
    dependency: Annotated[tuple[tuple[str, tuple[int, ...]], ...], BeforeValidator(_dependency)] = ()
    kill_on_invalid_dep: bool = False
    hold: bool = False  # submitted held (sbatch --hold): waits, JobHeldUser, until released

    @field_validator("partition", "account", "qos")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty")
        return value


SCHEDULING_FIELDS = frozenset(Scheduling.model_fields)
