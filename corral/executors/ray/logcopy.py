"""A replica's log, copied from its Ray node into the server's log directory while its
attempt runs (and once more when it ends), so ``corral logs`` works unchanged and keeps what
a dead node wrote before it died. How much of an attempt's node log the server holds is kept
beside the log, so a restarted server goes on where the last one stopped."""

from __future__ import annotations

from pathlib import Path

CALL_TIMEOUT_S = 15.0
CHUNK = 1 << 20


def pump(ray, actor, path: Path, key: str, offset: int, final: bool = False) -> int:  # noqa: ANN001
    """Append what the attempt wrote on its node since ``offset`` to ``path``; the new offset.
    Not ``final``: one chunk at most, so a chatty replica does not hold up the others."""
    while True:
        try:
            data = ray.get(actor.read_log.remote(offset), timeout=CALL_TIMEOUT_S)
        except Exception:
            return offset
        if not data:
            return offset
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as fh:
            fh.write(data)
        offset += len(data)
        offset_file(path, key, offset)
        if not final and len(data) < CHUNK:
            return offset


def offset_file(log_path: Path, key: str, value: int | None = None) -> int:
    """How much of an attempt's node log the server has copied (survives a server restart)."""
    marker = log_path.with_name(f".{log_path.name}.{key}.offset")
    if value is None:
        try:
            return int(marker.read_text())
        except (OSError, ValueError):
            return 0
    marker.write_text(str(value))
    return value
