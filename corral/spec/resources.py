"""Per-replica resources in every form SkyPilot accepts, alternatives included.

``accelerators`` may be ``H100:8``, ``{H100: 8}``, ``{H100:8}`` (YAML reads that as a key
without a value), a list of alternatives in order of preference (``[A100:8, H100:8]``), or a
set of alternatives with no preference (``{A100:8, H100:8}``); ``any_of`` / ``ordered`` list
whole resource alternatives (accelerators, cpus, memory) over the task's own fields. Every
form is normalised to SkyPilot's own ``ordered`` / ``any_of`` lists, each entry complete, and
the task's own fields set to the first entry. That normal form is what is stored, and it
validates again to itself. The scheduler places a task on the first alternative that fits
(in order for ``ordered``; any for ``any_of``, the earliest start when none fits now)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (BeforeValidator, SerializerFunctionWrapHandler, ValidationInfo,
                      field_serializer, field_validator, model_serializer, model_validator)

from corral.spec.base import Strict
from corral.spec.container import DOCKER_PREFIX, image_of, qualified
from corral.spec.instances import gpus_of
from corral.spec.quantity import parse_accelerators, parse_cpus, parse_memory

# Cloud-only knobs: a SkyPilot file that sets them still runs here, with a warning.
IGNORED_RESOURCE_FIELDS = frozenset({
    "cloud", "region", "zone", "instance_type", "use_spot", "disk_size", "disk_tier",
    "infra", "job_recovery", "labels", "accelerator_args", "network_tier",
    "autostop", "spot_recovery", "volumes",
})
DEFAULT_CPUS = 0.1  # a task that asks for nothing still fits five to a 2-core laptop
MAX_ALTERNATIVES = 16

Accelerators = Annotated[tuple[str | None, int], BeforeValidator(parse_accelerators)]
Cpus = Annotated[float, BeforeValidator(parse_cpus)]
Memory = Annotated[float, BeforeValidator(parse_memory)]


def warn(info: ValidationInfo, message: str) -> None:
    if info.context is not None:
        info.context.setdefault("warnings", []).append(message)


def drop_ignored(data: Any, ignored: frozenset[str], where: str, info: ValidationInfo) -> Any:
    if isinstance(data, dict):
        for key in sorted(ignored & data.keys()):
            warn(info, f"{where}{key} is ignored on corral's infra")
        data = {k: v for k, v in data.items() if k not in ignored}
    return data


def from_instance_type(data: Any, where: str, info: ValidationInfo) -> Any:
    """A GPU ``instance_type`` without ``accelerators`` asks for that machine's GPUs (never
    none); with ``accelerators`` those say what the job needs. A machine without GPUs is left
    for ``drop_ignored`` to warn about."""
    if not isinstance(data, dict) or data.get("instance_type") is None:
        return data
    if not isinstance(data["instance_type"], str) or not 0 < len(data["instance_type"]) <= 128:
        raise ValueError("instance_type is a cloud machine type's name, e.g. p4d.24xlarge")
    kind = gpus_of(data["instance_type"])
    if kind is None:
        return data
    rest = {k: v for k, v in data.items() if k != "instance_type"}
    if rest.get("accelerators") is None and not rest.get("any_of") and not rest.get("ordered"):
        rest["accelerators"] = f"{kind[0]}:{kind[1]}"
        warn(info, f"{where}instance_type {data['instance_type']} asks here for the GPUs it carries, "
                   f"{kind[0]}:{kind[1]}")
    else:
        warn(info, f"{where}instance_type {data['instance_type']} is ignored: accelerators say what it needs")
    return rest


def take_image(data: Any, where: str, info: ValidationInfo) -> tuple[Any, str | None]:
    """``image_id`` out of a resources mapping: a container image (``docker:IMAGE``, checked),
    or None; a cloud machine image (an AMI, a GCP image) is dropped with a warning."""
    if not isinstance(data, dict) or "image_id" not in data:
        return data, None
    value = data["image_id"]
    rest = {k: v for k, v in data.items() if k != "image_id"}
    if value is None:
        return rest, None
    if isinstance(value, str) and value.startswith(DOCKER_PREFIX):
        return rest, value  # checked by Resources' own validator, which names the field
    if isinstance(value, str) and "/" in value and not value.startswith("projects/"):
        try:  # a registry path without SkyPilot's prefix: never run on the bare node instead
            image_of(DOCKER_PREFIX + value)
        except ValueError:
            pass
        else:
            raise ValueError(f"{where.removeprefix('resources.')}image_id {value!r} reads as a container image: "
                             f"write docker:{value} "
                             "(without docker: SkyPilot takes it for a cloud machine image)")
    warn(info, f"{where}image_id {value!r} is a cloud machine image: ignored (a container image is "
               "written docker:IMAGE)")
    return rest, None


def _dump(value: tuple[str | None, int]) -> str | int:
    # Dumped in the written form, so a stored spec validates again unchanged.
    return value[1] if value[0] is None else f"{value[0]}:{value[1]}"


class Alternative(Strict):
    """One complete resource alternative."""

    accelerators: Accelerators = (None, 0)
    cpus: Cpus = DEFAULT_CPUS
    memory: Memory = 0.0

    @model_validator(mode="before")
    @classmethod
    def _ignore_cloud_fields(cls, data: Any, info: ValidationInfo) -> Any:
        data = from_instance_type(data, "resources alternative: ", info)
        return drop_ignored(data, IGNORED_RESOURCE_FIELDS, "resources alternative: ", info)

    @field_serializer("accelerators")
    def _dump_accelerators(self, value: tuple[str | None, int]) -> str | int:
        return _dump(value)


def _images_of_alternatives(data: dict[str, Any], image: str | None,
                            info: ValidationInfo) -> tuple[dict[str, Any], str | None]:
    """An ``image_id`` written in ``any_of`` / ``ordered`` entries becomes the task's: a task
    runs in one image whichever alternative it gets."""
    for key in ("any_of", "ordered"):
        entries = data.get(key)
        if not isinstance(entries, list):
            continue
        kept = []
        for i, entry in enumerate(entries):
            entry, own = take_image(entry, f"{key}[{i}].", info)
            if own is not None and image is not None and own != image:
                raise ValueError(f"{key}[{i}].image_id {own!r} differs from {image!r}: a task runs in "
                                 "one image whichever alternative it gets")
            image = image or own
            kept.append(entry)
        data = {**data, key: kept}
    return data, image


def _accelerator_choices(value: Any) -> tuple[list[Any], bool] | None:
    """The alternatives an ``accelerators`` value lists and whether in order, or None for a
    single accelerator request."""
    if isinstance(value, list):
        return list(value), True
    if isinstance(value, dict) and (len(value) > 1 or any(v is None for v in value.values())):
        # {H100:8} and {A100:8, H100:8}: keys without values; {A100: 8, H100: 8}: a set too
        return [k if v is None else {k: v} for k, v in value.items()], len(value) == 1
    return None


class Resources(Strict):
    """Per-replica resources: the task's own fields are its first (or only) alternative."""

    accelerators: Accelerators = (None, 0)
    cpus: Cpus = DEFAULT_CPUS
    memory: Memory = 0.0
    any_of: tuple[Alternative, ...] = ()  # alternatives, no preference between them
    ordered: tuple[Alternative, ...] = ()  # alternatives, the first that fits wins
    # the container every replica runs in (``docker:IMAGE``, SkyPilot's form); one per task
    image_id: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _normalise(cls, data: Any, info: ValidationInfo) -> Any:
        data = from_instance_type(data, "resources.", info)
        data, image = take_image(data, "resources.", info)
        data = drop_ignored(data, IGNORED_RESOURCE_FIELDS, "resources.", info)
        if not isinstance(data, dict):
            return data
        data, image = _images_of_alternatives(data, image, info)
        normal = cls._alternatives(data, info)
        return {**normal, "image_id": image} if image and isinstance(normal, dict) else normal

    @field_validator("image_id")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        if value is not None:
            image_of(value)
        return value

    @property
    def image(self) -> str | None:
        """The container image replicas run in: ``image_id`` without ``docker:``, its registry
        written out (``corral.spec.container.qualified``); None without one."""
        return qualified(self.image_id[len(DOCKER_PREFIX):].strip()) if self.image_id else None

    @classmethod
    def _alternatives(cls, data: dict[str, Any], info: ValidationInfo) -> Any:
        if "any_of" in data and "ordered" in data:
            raise ValueError("resources take any_of or ordered, not both")
        key = "any_of" if "any_of" in data else "ordered" if "ordered" in data else None
        base = {k: v for k, v in data.items() if k not in ("any_of", "ordered")}
        choices = _accelerator_choices(base.get("accelerators"))
        if key is not None and choices is not None:
            entries = data[key] if isinstance(data[key], list) else []
            cloud_only = entries and all(isinstance(e, dict) and set(e) <= IGNORED_RESOURCE_FIELDS for e in entries)
            if not cloud_only:
                raise ValueError(f"give alternatives either in accelerators or in {key}, not both")
            # {accelerators: {H100:8, H200:8}, any_of: [{use_spot: true}, {use_spot: false}]}: the
            # entries choose only among cloud offers, so the accelerators are the alternatives
            knobs = sorted({k for e in entries for k in e})
            warn(info, f"resources.{key} chooses only {', '.join(knobs)} (cloud offers): ignored; the "
                       "alternatives are those in accelerators")
            key = None
        if key is not None:
            entries = data[key]
            if not isinstance(entries, list) or not entries:
                raise ValueError(f"{key} must be a non-empty list of resource alternatives")
            if not all(isinstance(e, dict) for e in entries):
                raise ValueError(f"each entry of {key} is a mapping like {{accelerators: H100:8}}")
            nested = [i for i, e in enumerate(entries) if "any_of" in e or "ordered" in e
                      or _accelerator_choices(e.get("accelerators")) is not None]
            if nested:
                raise ValueError(f"{key}[{nested[0]}] lists alternatives of its own; an alternative names "
                                 "one accelerator (alternatives do not nest)")
            merged = [{**{k: v for k, v in base.items()}, **e} for e in entries]
        elif choices is not None:
            entries, ordered = choices
            if not entries:
                raise ValueError("accelerators lists no alternative")
            key = "ordered" if ordered else "any_of"
            merged = [{**base, "accelerators": choice} for choice in entries]
        else:
            return data
        if len(merged) > MAX_ALTERNATIVES:
            raise ValueError(f"at most {MAX_ALTERNATIVES} resource alternatives, got {len(merged)}")
        if len(merged) == 1:  # {H100:8}: one accelerator written as a set
            return merged[0]
        first = merged[0]
        return {**{k: first[k] for k in ("accelerators", "cpus", "memory") if k in first}, key: merged}

    @field_serializer("accelerators")
    def _dump_accelerators(self, value: tuple[str | None, int]) -> str | int:
        return _dump(value)

    @model_serializer(mode="wrap")
    def _dump_without_empty_lists(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items()
                if not (k in ("any_of", "ordered") and not v) and not (k == "image_id" and v is None)}

    @model_validator(mode="after")
    def _two_or_more(self) -> Resources:
        # the normal form keeps one alternative as the task's own fields, never a list of one
        if len(self.any_of) == 1 or len(self.ordered) == 1:
            raise ValueError("a list of one alternative: write it as the task's own resources")
        return self

    @property
    def gpu_type(self) -> str | None:
        return self.accelerators[0]

    @property
    def gpus(self) -> int:
        return self.accelerators[1]

    @property
    def alternatives(self) -> tuple[Alternative, ...]:
        """Every alternative, the task's own first; one when it names none."""
        return self.any_of or self.ordered or (
            Alternative.model_construct(accelerators=self.accelerators, cpus=self.cpus, memory=self.memory),)

    @property
    def in_order(self) -> bool:
        return not self.any_of
