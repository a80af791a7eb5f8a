"""Job array specifications, Slurm's ``--array`` syntax: ``0-99``, ``1,3,5-9:2``, with an
optional ``%N`` throttle (at most N elements running at once). An array is one submission
that becomes one job per index on the queue, each with its own state; the whole array is
named by the id of its first element (``SLURM_ARRAY_JOB_ID``) and an element by
``ARRAYID_INDEX``."""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_ELEMENTS = 10_000  # like Slurm's default MaxArraySize (1001) raised for sweeps; bounds one request
MAX_INDEX = 4_000_000

_RANGE = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?")


@dataclass(frozen=True)
class ArraySpec:
    indices: tuple[int, ...]  # sorted, distinct
    throttle: int | None = None  # at most this many elements running at once

    def __str__(self) -> str:
        return fold(self.indices, self.throttle)

    @property
    def extent(self) -> tuple[int, int, int, int]:
        """(count, lowest, highest, step): the step is the distance between neighbouring
        indices when it is the same everywhere, else 1, as Slurm's ``SLURM_ARRAY_TASK_STEP``."""
        items = self.indices
        gaps = {b - a for a, b in zip(items, items[1:])}
        return len(items), items[0], items[-1], gaps.pop() if len(gaps) == 1 else 1


def parse_array(text: str) -> ArraySpec:
    """``0-15%4`` → indices 0..15, throttle 4; raises ``ValueError`` naming what is wrong."""
    raw = str(text).strip()
    body, sep, limit = raw.partition("%")
    throttle = None
    if sep:
        if not limit.isdigit() or int(limit) < 1:
            raise ValueError(f"the throttle after '%' must be a whole number >= 1, got {limit!r} in {raw!r}")
        throttle = int(limit)
    if not body:
        raise ValueError("an array needs indices, e.g. 0-99, 1,3,5-9:2 or 0-15%4")
    indices: set[int] = set()
    for part in body.split(","):
        match = _RANGE.fullmatch(part.strip())
        if not match:
            raise ValueError(f"{part!r} is not an index, a range (5-9) or a stepped range (5-9:2) in {raw!r}")
        first, last, step = int(match.group(1)), match.group(2), match.group(3)
        end = int(last) if last is not None else first
        stride = int(step) if step is not None else 1
        if end < first:
            raise ValueError(f"the range {part!r} ends before it starts")
        if stride < 1:
            raise ValueError(f"the step of {part!r} must be >= 1")
        if end > MAX_INDEX:
            raise ValueError(f"index {end} is above the largest array index, {MAX_INDEX}")
        if (end - first) // stride + 1 + len(indices) > MAX_ELEMENTS:
            raise ValueError(f"an array has at most {MAX_ELEMENTS} elements")
        indices.update(range(first, end + 1, stride))
    return ArraySpec(tuple(sorted(indices)), throttle)


def fold(indices: tuple[int, ...] | list[int], throttle: int | None = None) -> str:
    """``[3-7,9]`` style (as squeue folds pending elements), with ``%N`` when throttled."""
    parts: list[str] = []
    items = sorted(indices)
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        parts.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(parts) + (f"%{throttle}" if throttle else "")
