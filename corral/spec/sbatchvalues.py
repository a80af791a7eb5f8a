"""The values of sbatch's options (``corral.spec.sbatch``'s option table): Slurm's time and
memory formats, node and task counts, GPU requests (``--gres``, ``--gpus…``), ``--signal``,
filename patterns, job names usable as host name parts, dependencies, ``--export`` lists and
node lists. Each parser returns the value or raises ValueError saying what is wrong."""

from __future__ import annotations

import re

from corral.scheduler.dependency import parse as parse_dependency
from corral.scheduler.features import parse_constraint
from corral.spec.models import NAME_RE, NAME_RULE
from corral.spec.service import STOP_SIGNALS


def slurm_minutes(text: str) -> float | None:
    """Seconds from Slurm's time formats: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``,
    ``D-H:M:S``; ``UNLIMITED``/``INFINITE`` is None."""
    text = text.strip()
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return None
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not match:
        raise ValueError(f"{text!r} is not a Slurm time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS")
    days, a, b, c = match.groups()
    numbers = [int(x) for x in (a, b, c) if x is not None]
    if days is None:  # M, M:S, H:M:S
        h, m, s = ([0, numbers[0], 0] if len(numbers) == 1 else [0, *numbers] if len(numbers) == 2 else numbers)
    else:  # D-H, D-H:M, D-H:M:S
        h, m, s = (numbers + [0, 0])[:3]
    seconds = int(days or 0) * 86400 + h * 3600 + m * 60 + s
    if seconds <= 0:
        raise ValueError(f"{text!r} is not a positive time limit")
    return float(seconds)


_SIZE_UNITS = {"K": 1 / 2**20, "M": 1 / 2**10, "G": 1.0, "T": 2.0**10}


def slurm_size_gb(text: str) -> float:
    """GB from ``--mem`` values: a number of megabytes, or with K, M, G or T."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)B?", text.strip().upper())
    if not match:
        raise ValueError(f"{text!r} is not a memory size like 16G, 512M or 16000 (megabytes)")
    return float(match.group(1)) * _SIZE_UNITS[match.group(2) or "M"]


def _count(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"{text!r} is not a whole number >= 1")
    return int(text)


def _nodes(text: str) -> int:
    low, _, high = text.partition("-")
    count = _count(low)
    if high:
        _count(high)
    return count


def _gpus(text: str) -> tuple[str | None, int]:
    """``[type:]N`` (``--gpus``, ``--gpus-per-node``, ``--gpus-per-task``)."""
    kind, sep, number = text.rpartition(":")
    if not number.isdigit():
        raise ValueError(f"{text!r} is not a GPU count like 4 or a100:4")
    return (kind or None) if sep else None, int(number)


def _gres(text: str) -> tuple[str | None, int]:
    """``gpu``, ``gpu:N`` or ``gpu:type:N`` (other generic resources are refused)."""
    found: tuple[str | None, int] | None = None
    for item in text.split(","):
        parts = item.strip().split(":")
        if parts[0] != "gpu":
            raise ValueError(f"generic resource {parts[0]!r} is not one corral schedules (only gpu)")
        if len(parts) == 1:
            found = (None, 1)
        elif len(parts) == 2:
            found = (None, int(parts[1])) if parts[1].isdigit() else (parts[1], 1)
        elif len(parts) == 3 and parts[2].isdigit():
            found = (parts[1], int(parts[2]))
        else:
            raise ValueError(f"{item!r} is not gpu, gpu:N or gpu:TYPE:N")
    if found is None:
        raise ValueError("--gres needs gpu[:type]:N")
    return found


def _signal(text: str) -> tuple[bool, str, float]:
    """``[{R|B}:]SIG[@seconds]`` → (batch only, signal name, seconds before the limit)."""
    batch = False
    body = text
    if ":" in text.split("@")[0]:
        flags, body = text.split(":", 1)
        if not set(flags.upper()) <= {"B", "R"}:
            raise ValueError(f"{text!r}: the flags before ':' are B (batch shell) and R (reservation)")
        batch = "B" in flags.upper()
    name, _, when = body.partition("@")
    if name.isdigit():
        import signal as _signal_module
        try:
            name = _signal_module.Signals(int(name)).name
        except ValueError:
            raise ValueError(f"{name} is not a signal number") from None
    name = name.upper() if name.upper().startswith("SIG") else f"SIG{name.upper()}"
    if name not in STOP_SIGNALS:
        raise ValueError(f"{name} is not a signal corral sends; use one of {', '.join(STOP_SIGNALS)}")
    if when and not when.isdigit():
        raise ValueError(f"{when!r} after '@' is not a number of seconds")
    return batch, name, float(when or 60)


_PATTERN_CODES = set("jJxAaNntsu%")


def _pattern(text: str) -> str:
    for match in re.finditer(r"%(\d*)(.)?", text):
        if match.group(2) is None or match.group(2) not in _PATTERN_CODES:
            raise ValueError(f"{text!r}: %{match.group(2) or ''} is not a filename pattern corral fills in "
                             "(%j %J %x %A %a %N %n %t %s %u %%)")
    return text


def _name(text: str) -> str:
    """The job name, made a host name part where it is not one (``1B3-rotary.slurm`` runs as
    ``1B3-rotary-slurm``: replicas are reached as ``task-rank.NAME``)."""
    if NAME_RE.fullmatch(text):
        return text
    safe = re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-_")[:63].rstrip("-_")
    if not NAME_RE.fullmatch(safe):
        raise ValueError(f"{text!r} is not a job name corral can use as a host name part: {NAME_RULE}")
    return safe


def _dependency(text: str) -> str:
    parts = []
    for part in text.replace("?", ",").split(","):
        if not part.strip():
            continue
        if "+" in part:
            raise ValueError(f"{part!r}: a delay after '+' is not supported")
        if "_" in part:
            raise ValueError(f"{part!r}: dependencies on single array elements are not supported; "
                             "name the element's own job id")
        parts.append(part.strip())
    parse_dependency(",".join(parts))  # raises with what is wrong
    return ",".join(parts)


def _export(text: str) -> tuple[bool, tuple[str, ...]]:
    items = [i.strip() for i in text.split(",") if i.strip()]
    if not items:
        raise ValueError("--export takes ALL, NONE or a list of VAR or VAR=value")
    first = items[0].upper()
    none = first == "NONE" or first not in ("ALL", "NIL")
    rest = items[1:] if first in ("ALL", "NONE", "NIL") else items
    for item in rest:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(=.*)?", item):
            raise ValueError(f"{item!r} is not VAR or VAR=value")
    return none, tuple(rest)


def _yes_no(text: str) -> bool:
    if text.lower() not in ("yes", "no"):
        raise ValueError(f"{text!r}: use yes or no")
    return text.lower() == "yes"


def _nodelist(text: str) -> tuple[str, ...]:
    from hostlist import expand_hostlist

    try:
        return tuple(expand_hostlist(text))
    except Exception:  # the library's BadHostlist
        raise ValueError(f"{text!r} is not a node list like gpu-[0-3],cpu-1") from None


def _constraint(text: str) -> str:
    parse_constraint(text)
    return text


def _text(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text.strip()


def _nice(text: str) -> int:
    if not re.fullmatch(r"-?\d+", text.strip()):
        raise ValueError(f"{text!r} is not a whole number")
    return int(text)
