"""Parsers for the scalar quantities users write: durations, CPU counts, memory sizes and
accelerator requests, in the forms SkyPilot and Slurm users already type.

Each parser raises ``ValueError`` with a message meant for the user; the spec layer adds
the field and line."""

from __future__ import annotations

import math
import re

from corral.spec.source import shown

_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|min|s|m|h|d)")


def parse_duration(value: object) -> float:
    """Seconds from ``30``, ``"30s"``, ``"5m"``, ``"1h30m"``, ``"2d"`` or Slurm's
    ``"HH:MM:SS"`` / ``"D-HH:MM:SS"``."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like '30s' or '5m', got {shown(value)}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = _parse_duration_text(value.strip())
    else:
        raise ValueError(f"expected a duration like '30s' or '5m', got {shown(value)}")
    if seconds < 0 or math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"a duration must be a finite number of seconds >= 0, got {shown(value)}")
    return seconds


def _parse_duration_text(text: str) -> float:
    if not text:
        raise ValueError("empty duration")
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    slurm = re.fullmatch(r"(?:(\d+)-)?(\d+):(\d{1,2})(?::(\d{1,2}))?", text)
    if slurm:
        days, a, b, c = slurm.groups()
        if c is None:  # MM:SS
            h, m, s = 0, int(a), int(b)
        else:
            h, m, s = int(a), int(b), int(c)
        return int(days or 0) * 86400 + h * 3600 + m * 60 + s
    pos, total = 0, 0.0
    for match in _DURATION_PART.finditer(text.replace(" ", "")):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text.replace(" ", "")) or pos == 0:
        raise ValueError(f"cannot read {text!r} as a duration; use e.g. '30s', '5m', '1h30m' or 'HH:MM:SS'")
    return total


def parse_cpus(value: object) -> float:
    """CPUs from ``4``, ``0.5``, ``"4"`` or ``"4+"`` (at least 4: corral reserves the minimum)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a CPU count like 4, 0.5 or '4+', got {shown(value)}")
    if isinstance(value, (int, float)):
        cpus = float(value)
    elif isinstance(value, str) and re.fullmatch(r"\s*\d+(\.\d+)?\+?\s*", value):
        cpus = float(value.strip().rstrip("+"))
    else:
        raise ValueError(f"expected a CPU count like 4, 0.5 or '4+', got {shown(value)}")
    if not cpus > 0 or math.isinf(cpus):
        raise ValueError(f"a CPU count must be > 0, got {shown(value)}")
    return cpus


_MEMORY_UNITS = {"": 1.0, "g": 1.0, "gb": 1.0, "gi": 1.0, "gib": 1.0, "m": 1 / 1024, "mb": 1 / 1024,
                 "mi": 1 / 1024, "mib": 1 / 1024, "t": 1024.0, "tb": 1024.0, "ti": 1024.0, "tib": 1024.0}


def parse_memory(value: object) -> float:
    """Memory in GB from ``32``, ``"32+"``, ``"32GB"``, ``"512MB"`` or ``"1TB"`` (a bare number
    means GB, as in SkyPilot; binary and decimal suffixes are treated alike)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a memory size like 32, '32GB' or '32+', got {shown(value)}")
    if isinstance(value, (int, float)):
        gb = float(value)
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*\+?\s*", value)
        if not m or m.group(2).lower() not in _MEMORY_UNITS:
            raise ValueError(f"cannot read {shown(value)} as memory; use e.g. 32, '32GB', '512MB' or '32+'")
        gb = float(m.group(1)) * _MEMORY_UNITS[m.group(2).lower()]
    else:
        raise ValueError(f"expected a memory size like 32, '32GB' or '32+', got {shown(value)}")
    if gb < 0 or math.isinf(gb):
        raise ValueError(f"memory must be >= 0, got {shown(value)}")
    return gb


_GPU_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")


def parse_accelerators(value: object) -> tuple[str | None, int]:
    """``(gpu_type, count)`` from ``"H100:8"``, ``"H100"``, ``{"H100": 8}``, ``8`` or ``"8"``.

    A bare number asks for that many GPUs of any type; ``"H100"`` alone means one."""
    if value is None:
        return None, 0
    if isinstance(value, bool):
        raise ValueError(f"expected accelerators like 'H100:8', got {shown(value)}")
    if isinstance(value, int):
        return None, _gpu_count(value, value)
    if isinstance(value, dict):
        if len(value) != 1:
            raise ValueError("accelerators as a mapping must name exactly one type, e.g. {H100: 8}")
        ((name, count),) = value.items()
        if count is None:  # {H100:8}: YAML read "H100:8" as a key without a value
            return parse_accelerators(str(name))
        return _gpu_type(str(name)), _gpu_count(count, value)
    if isinstance(value, list):
        raise ValueError("one alternative names one accelerator, e.g. 'H100:8'")
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return None, _gpu_count(int(text), value)
        name, sep, count = text.partition(":")
        if not sep:
            return _gpu_type(name), 1
        try:
            number = float(count)
        except ValueError:
            raise ValueError(f"cannot read the count in {shown(value)}; use e.g. 'H100:8'") from None
        return _gpu_type(name), _gpu_count(number, value)
    raise ValueError(f"expected accelerators like 'H100:8', got {shown(value)}")


def _gpu_type(name: str) -> str:
    if not _GPU_TYPE.fullmatch(name):
        raise ValueError(f"{shown(name)} is not a valid accelerator type")
    return name


def _gpu_count(count: object, original: object) -> int:
    if isinstance(count, bool) or not isinstance(count, (int, float)) or not math.isfinite(count):
        raise ValueError(f"the GPU count in {shown(original)} must be a finite number")
    if count != int(count):
        raise ValueError(f"fractional GPUs ({shown(original)}) are not supported; ask for whole GPUs")
    if count < 0:
        raise ValueError(f"the GPU count in {shown(original)} must be >= 0")
    return int(count)
