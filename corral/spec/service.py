"""Service semantics of a task, the part no batch scheduler has: the ports a replica
listens on, readiness and liveness probes, start ordering (``depends_on``), a restart
policy with backoff, and the signal it gets before SIGKILL; and SkyServe's ``service:``
section read as those (``from_skyserve``): a service replica of ``num_nodes: N`` is a gang of
N replicas (``gang_size``), and ``min_replicas: 0`` lets the service scale to zero."""

from __future__ import annotations

import signal
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from corral.spec.base import Duration, Strict as _Strict

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


class HttpCheck(_Strict):
    """An HTTP check passes on a 2xx or 3xx answer. A GET by default; a POST when given a
    ``body`` (sent as JSON, as SkyServe's ``post_data``) or ``method: POST`` — an inference
    server's chat endpoint answers only POST."""

    port: PortRef
    path: str = "/"
    method: Literal["GET", "POST"] = "GET"
    body: Any = None
    headers: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _body_means_post(cls, value: Any) -> Any:
        if isinstance(value, dict) and value.get("body") is not None:
            if str(value.get("method", "POST")).upper() == "GET":
                raise ValueError("a GET probe carries no body: leave method out (a body means POST) or drop body")
            value = {**value, "method": "POST"}
        return value

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
    upper = [name.upper() for name in ports]
    twice = sorted({n for n in upper if upper.count(n) > 1})
    if twice:  # both would be CORRAL_PORT_<NAME>
        raise ValueError(f"port names {', '.join(n for n in ports if n.upper() in twice)} differ only in case: "
                         f"both would be CORRAL_PORT_{twice[0]}")
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
    # sbatch --requeue / --no-requeue: False cancels the job when it is preempted instead of
    # requeueing it (None: the partition's or QOS's preempt mode decides)
    requeue: bool | None = None

    @field_validator("partition", "account", "qos")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty")
        return value


SCHEDULING_FIELDS = frozenset(Scheduling.model_fields)


class Endpoint(_Strict):
    """One address for the whole task: corral balances connections to it over the task's READY
    replicas (on ``port``, a port of the task), like SkyServe's service endpoint; over the
    heads (rank 0) of its gangs when its replicas come in gangs.

    A task that can scale to zero holds a request that finds no replica ready for up to
    ``hold`` seconds (default: the task's ``startup_timeout``, SkyServe's
    ``initial_delay_seconds``) while a replica starts, then answers 503 saying why."""

    port: PortRef = "service"
    policy: Literal["round_robin", "least_load"] = "round_robin"
    hold: Duration | None = None

    @field_validator("hold")
    @classmethod
    def _hold(cls, value: float | None) -> float | None:
        if value is not None and not 0 < value <= 3600:
            raise ValueError("hold is how long a request waits for a replica: more than 0s, at most 1h")
        return value


class Autoscale(_Strict):
    """SkyServe's load-based autoscaling: the endpoint counts the requests it forwards, and
    the task is scaled toward ``ceil(rate / target_qps_per_replica)`` replicas (within its
    elastic bounds) once that has been wanted for ``upscale_delay`` (to grow) or
    ``downscale_delay`` (to shrink) without interruption. The rate is requests per second
    over the last minute, as SkyServe measures it.

    With ``num_nodes: {min: 0, ...}`` the task goes to zero replicas once no request has come
    for ``downscale_delay``, freeing its GPUs; the next request to the endpoint is held and
    brings replicas back at once (no upscale delay from zero, as SkyServe), placed by the
    scheduler like any job. Counts are in replicas; a task in gangs moves by whole gangs."""

    target_qps_per_replica: float = Field(gt=0, le=1_000_000)
    upscale_delay: Duration = 300.0
    downscale_delay: Duration = 1200.0


_SERVE_KEYS = {"readiness_probe", "replicas", "replica_policy", "ports", "load_balancing_policy", "tls"}
_PROBE_KEYS = {"path", "initial_delay_seconds", "timeout_seconds", "post_data", "headers"}
_POLICY_KEYS = {"min_replicas", "max_replicas", "target_qps_per_replica", "upscale_delay_seconds",
                "downscale_delay_seconds", "base_ondemand_fallback_replicas", "dynamic_ondemand_fallback",
                "num_overprovision"}
_BALANCING = {"round_robin": "round_robin", "least_load": "least_load"}
# SkyServe fields about a cloud's load balancers and offers: nothing to honour on one endpoint
# here, and nothing the replicas do changes, so a file that sets them runs with a warning
SERVICE_RESTARTS = 1_000_000  # a SkyServe replica's: replaced for as long as the service is up
_CLOUD_SERVE_KEYS = {"external_load_balancers", "spot_placer", "https"}


def from_skyserve(data: dict[str, Any], warn: Any) -> dict[str, Any]:
    """A task with SkyServe's ``service:`` section as corral fields: the replicas' port (from
    ``service.ports``, else the task's first port), an HTTP readiness probe on it, a fixed or
    elastic replica count, and an ``endpoint`` balancing over READY replicas. What has no
    meaning here is named in ``warn(message)``; what cannot be honoured is an error."""
    serve = data["service"]
    if not isinstance(serve, dict):
        raise ValueError("service is a mapping like {readiness_probe: /health, replicas: 2}")
    for key in sorted(_CLOUD_SERVE_KEYS & set(serve)):
        warn(f"service.{key} is ignored: it configures a cloud's load balancing, and corral's endpoint is one "
             "address on the server")
    serve = {k: v for k, v in serve.items() if k not in _CLOUD_SERVE_KEYS}
    unknown = set(serve) - _SERVE_KEYS
    if unknown:
        raise ValueError(f"service has unknown field(s) {', '.join(sorted(map(str, unknown)))}; "
                         f"known: {', '.join(sorted(_SERVE_KEYS))}")
    out = {k: v for k, v in data.items() if k != "service"}
    ports = _ports(out.get("ports")) if out.get("ports") is not None else {}
    if not isinstance(ports, dict):
        raise ValueError("ports must be a number, a list of numbers or a mapping of names to numbers")
    if serve.get("ports") is not None:
        port = serve["ports"]
        if isinstance(port, str) and port.isdigit():
            port = int(port)
        if isinstance(port, bool) or not isinstance(port, int):
            raise ValueError("service.ports is the one port the replicas serve on, e.g. 8080")
        name = next((n for n, p in ports.items() if p == port), "service")
        ports = {**ports, name: port}
    elif ports:
        name = next(iter(ports))
    else:
        raise ValueError("a service needs the port its replicas serve on: service.ports or resources.ports")
    out["ports"] = ports

    probe = serve.get("readiness_probe", "/")
    if isinstance(probe, str):
        probe = {"path": probe}
    if not isinstance(probe, dict):
        raise ValueError("service.readiness_probe is a path like /health or {path: /health, ...}")
    unknown = set(probe) - _PROBE_KEYS
    if unknown:
        raise ValueError(f"service.readiness_probe has unknown field(s) {', '.join(sorted(map(str, unknown)))}")
    if out.get("readiness_probe") is not None:
        raise ValueError("give the readiness probe in service.readiness_probe or at the task, not both")
    check: dict[str, Any] = {"path": probe.get("path", "/"), "port": name}
    if probe.get("post_data") is not None:  # SkyServe sends the probe as a POST with this JSON body
        check["body"] = probe["post_data"]
    if probe.get("headers"):
        if not isinstance(probe["headers"], dict):
            raise ValueError("service.readiness_probe.headers is a mapping of header names to values")
        check["headers"] = {str(k): str(v) for k, v in probe["headers"].items()}
    out["readiness_probe"] = {"http": check,
                              **({"timeout": probe["timeout_seconds"]} if "timeout_seconds" in probe else {})}
    if "initial_delay_seconds" in probe:  # SkyServe's grace before a replica that never gets ready fails
        out.setdefault("startup_timeout", probe["initial_delay_seconds"])

    # num_nodes under service: each service replica is a gang of that many replicas (a model too
    # big for one node, served by vLLM/SGLang across nodes), with its own rank 0 that serves
    gang = out.pop("num_nodes", None)
    gang = 1 if gang is None else gang
    if isinstance(gang, bool) or not isinstance(gang, int) or gang < 1:
        raise ValueError("num_nodes of a service is the nodes of each service replica (a whole number >= 1); "
                         "set the number of replicas in service.replicas or service.replica_policy")
    if gang > 1:
        out["gang_size"] = gang
    if "replicas" in serve and "replica_policy" in serve:
        raise ValueError("service takes replicas or replica_policy, not both")
    if "replica_policy" in serve:
        policy = serve["replica_policy"]
        if not isinstance(policy, dict) or "min_replicas" not in policy:
            raise ValueError("service.replica_policy needs min_replicas (and max_replicas to scale)")
        unknown = set(policy) - _POLICY_KEYS
        if unknown:
            raise ValueError(f"service.replica_policy has unknown field(s) {', '.join(sorted(map(str, unknown)))}")
        low = policy["min_replicas"]
        high = policy.get("max_replicas", low)
        for key, value in (("min_replicas", low), ("max_replicas", high)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"service.replica_policy.{key} is a whole number of replicas, not {value!r}")
        if high < 1:
            raise ValueError("service.replica_policy.max_replicas must be at least 1")
        if low == 0 and "target_qps_per_replica" not in policy:
            raise ValueError("service.replica_policy.min_replicas: 0 (scale to zero) needs target_qps_per_replica: "
                             "the requests to the endpoint are what bring a replica back")
        # min_replicas 0 starts with one replica (the endpoint opens, the replica is checked once);
        # with no requests for downscale_delay_seconds the service goes to zero
        out["num_nodes"] = {"min": low * gang, "max": high * gang, "initial": max(low, 1) * gang}
        if "target_qps_per_replica" in policy:
            out["autoscale"] = {"target_qps_per_replica": policy["target_qps_per_replica"],
                                **({"upscale_delay": policy["upscale_delay_seconds"]}
                                   if "upscale_delay_seconds" in policy else {}),
                                **({"downscale_delay": policy["downscale_delay_seconds"]}
                                   if "downscale_delay_seconds" in policy else {})}
        else:
            delays = sorted({"upscale_delay_seconds", "downscale_delay_seconds"} & set(policy))
            if delays:
                warn(f"service.replica_policy: {', '.join(delays)} ignored without target_qps_per_replica; "
                     f"replicas stay between {low} and {high} as set with `corral scale`")
        ignored = sorted(set(policy) - {"min_replicas", "max_replicas", "target_qps_per_replica",
                                        "upscale_delay_seconds", "downscale_delay_seconds"})
        if ignored:
            warn(f"service.replica_policy: {', '.join(ignored)} ignored: on-demand fallbacks and overprovisioning "
                 "are cloud-offer choices")
    else:
        replicas = serve.get("replicas", 1)
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
            raise ValueError(f"service.replicas is a whole number of replicas >= 1, not {replicas!r}")
        out["num_nodes"] = replicas * gang
    balancing = serve.get("load_balancing_policy", "round_robin")
    if balancing not in _BALANCING:
        raise ValueError(f"service.load_balancing_policy {balancing!r} is not one corral offers: "
                         f"{', '.join(_BALANCING)}")
    if "tls" in serve:
        warn("service.tls is ignored: the endpoint serves plain TCP; put a TLS proxy in front of it")
    given = out.get("endpoint")
    if given is not None and (not isinstance(given, dict) or set(given) - {"hold"}):
        raise ValueError("endpoint beside service: takes only hold (the service section sets the endpoint's port "
                         "and load_balancing_policy)")
    out["endpoint"] = {"port": name, "policy": _BALANCING[balancing], **(given or {})}
    resources = out.get("resources") if isinstance(out.get("resources"), dict) else {}
    if "restart" not in out and not ({"job_recovery", "spot_recovery"} & set(resources)):
        # SkyServe replaces a service replica that ends, whatever its exit: a service is meant to
        # run until it is taken down (a crash loop backs off to one restart a minute)
        out["restart"] = {"policy": "always", "max_restarts": SERVICE_RESTARTS}
    return out
