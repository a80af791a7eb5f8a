"""What ``corral scale`` asks of a running task, checked before the control loop carries it
out: a replica count within the task's elastic bounds, new bounds (``--min/--max``), or both;
a task of a fixed count takes a new count as a Deployment does (``kubectl scale``).

An autoscaled service's count belongs to its autoscaler, so a manual count alone would be
undone a downscale delay later. Here it is not: a count given to an autoscaled task without
bounds pins both bounds to it (min = max = count, the autoscaler holds it there), and
``--min/--max`` give the autoscaler room again, as a Kubernetes user edits an HPA's
``minReplicas``/``maxReplicas`` rather than the Deployment it scales. New bounds are checked
as a submitted file's are: min <= max, whole gangs for a multi-node service replica (said in
service replicas too), zero only for an autoscaled task, and no more replicas than the
task's partition could ever hold at once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError

from corral.api.errors import invalid_parameter
from corral.api.schemas import ScaleRequest
from corral.scheduler import PendingJob, TaskRequest
from corral.spec.models import STORED, TaskSpec
from corral.store.tables import Task


@dataclass(frozen=True)
class Scale:
    replicas: int
    bounds: tuple[int, int] | None = None  # new (min, max), or None: as they are
    why: str = ""  # what the new bounds mean, for the event and the answer
    fixed: bool = False  # a task of a fixed count given a new one (kept across restarts and requeues)


def decide(body: ScaleRequest, spec: dict, task: Task, never_holds: Callable[[PendingJob], str | None]) -> Scale:
    """The count and bounds ``body`` asks of ``task`` (whose stored spec is ``spec``), or an
    invalid-parameter error naming the field. ``never_holds``: why the task's partition could
    never hold a request (None: it could)."""
    name = task.name
    gang = int(spec.get("gang_size") or 1)
    auto = spec.get("autoscale") is not None
    low = spec["num_nodes"] if spec.get("min_nodes") is None else spec["min_nodes"]
    high = spec.get("max_nodes") or spec["num_nodes"]

    def units(n: int) -> str:
        return f"{n} replica{'' if n == 1 else 's'}" + (
            f" ({n // gang} service replica(s) of {gang} nodes each)" if gang > 1 else "")

    def whole(field: str, n: int) -> None:
        if n % gang:
            raise invalid_parameter("body", field, (
                f"task {name!r} runs in gangs of {gang} replicas (each gang one multi-node service replica): "
                f"give a multiple of {gang}, e.g. {n - n % gang or gang}"))

    if body.min_nodes is None and body.max_nodes is None:
        if body.replicas is None:
            raise invalid_parameter("body", "replicas", "give replicas, min_nodes and/or max_nodes")
        count = body.replicas
        if not auto and low == high and spec.get("endpoint") is not None:
            # a service of a fixed count changes as `kubectl scale` changes a Deployment's: the
            # new count is the task's from now on (a restart or requeue brings it back at that size)
            if count < gang:
                raise invalid_parameter("body", "replicas", (
                    f"task {name!r} needs at least {units(gang)}; cancel the job to stop it"))
            whole("replicas", count)
            _fits(name, count, units, "replicas", task, spec, never_holds)
            return Scale(count, fixed=True)
        if not auto:
            if not low <= count <= high:
                detail = (f"task {name!r} is not elastic: its file fixes it at {units(low)} (num_nodes: "
                          "{min: N, max: M} makes it elastic; a service's count can always be set)"
                          if low == high else
                          f"task {name!r} scales between {low} and {high} replicas (num_nodes: "
                          f"{{min: {low}, max: {high}}})")
                if gang > 1 and low != high:  # in the service's own units too: its file counts gangs
                    detail += f", that is {low // gang} to {high // gang} service replicas of {gang} nodes each"
                raise invalid_parameter("body", "replicas", detail + "; corral scale --min/--max changes the bounds")
            whole("replicas", count)  # within bounds already accepted: what cannot be placed waits, saying why
            if spec.get("grow") and count < high:
                # it would grow straight back into the GPUs it gives up: the count caps it, as a
                # count pins an autoscaled task (a HorizontalPodAutoscaler overrides a bare scale)
                why = (f"a count on a task that grows on its own caps it: it grows no further than {units(count)} "
                       "until corral scale --max gives it room again")
                return Scale(count, (low, count), why)
            return Scale(count)
        # an autoscaled task: a bare count would be undone by the autoscaler, so it pins the bounds
        if count == 0:
            raise invalid_parameter("body", "replicas", (
                f"task {name!r} is autoscaled: a count alone pins its bounds to it (min = max = count), and 0 "
                "would keep it at zero for good; give --min 0 --max N to let it scale to zero, or cancel the job"))
        whole("replicas", count)
        _fits(name, count, units, "replicas", task, spec, never_holds)
        why = (f"a count on an autoscaled task pins it: the autoscaler holds it at {units(count)} until "
               "corral scale --min/--max gives it room again")
        return Scale(count, (count, count), why)

    new_low = low if body.min_nodes is None else body.min_nodes
    new_high = high if body.max_nodes is None else body.max_nodes
    if new_low > new_high:
        field = "min_nodes" if body.min_nodes is not None else "max_nodes"
        raise invalid_parameter("body", field, f"task {name!r}: min {units(new_low)} is above max {units(new_high)}"
                                               " (give both --min and --max to move the range)")
    for field, value in (("min_nodes", body.min_nodes), ("max_nodes", body.max_nodes)):
        if value is not None:
            whole(field, value)
    if new_low == 0 and not auto:
        raise invalid_parameter("body", "min_nodes", (
            f"task {name!r} is not autoscaled: min 0 (scale to zero) needs its endpoint's requests to bring a "
            "replica back (service.replica_policy.target_qps_per_replica)"))
    count = min(new_high, max(new_low, task.num_nodes)) if body.replicas is None else body.replicas
    if not new_low <= count <= new_high:
        raise invalid_parameter("body", "replicas", f"{units(count)} is outside the bounds asked for, "
                                                    f"{new_low}..{new_high}")
    whole("replicas", count)
    changed = {**spec, "min_nodes": new_low, "max_nodes": new_high,
               "num_nodes": min(new_high, max(new_low, int(spec.get("num_nodes") or 1)))}
    try:
        TaskSpec.model_validate(changed, context={STORED: True})  # (a grow task may be capped at its min)
    except ValidationError as exc:
        raise invalid_parameter("body", "min_nodes" if body.min_nodes is not None else "max_nodes",
                                f"task {name!r}: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None
    field, most = ("max_nodes", body.max_nodes) if body.max_nodes is not None else ("min_nodes", new_low)
    _fits(name, most, units, field, task, spec, never_holds)
    why = "the autoscaler works within them" if auto else "its count moves within them with corral scale"
    if count != task.num_nodes and body.replicas is None:
        why += f"; {task.num_nodes} -> {count} replicas to be within them"
    return Scale(count, (new_low, new_high), why)


def _fits(name: str, count: int, units: Callable[[int], str], field: str, task: Task, spec: dict,
          never_holds: Callable[[PendingJob], str | None]) -> None:
    """Refused, naming ``field``, when the task's partition could never run ``count`` of its
    replicas at once (each gang's members on nodes of their own)."""
    if count == 0:
        return
    ports = tuple(sorted(set((spec.get("ports") or {}).values())))
    request = TaskRequest(name, count, task.gpus, task.cpus, task.memory, task.gpu_type,
                          constraint=spec.get("constraint"),
                          nodes=frozenset(spec["nodelist"]) if spec.get("nodelist") else None,
                          exclusive=bool(spec.get("exclusive")), distinct=bool(spec.get("distinct_nodes")),
                          ports=ports, gang=int(spec.get("gang_size") or 1))
    why = never_holds(PendingJob(0, (request,)))
    if why is not None:
        raise invalid_parameter("body", field, f"task {name!r} could never run {units(count)} at once here: {why}")
