"""The submitter's world that travels with a job: the directory it was submitted from and
which of the submitter's environment variables its replicas start with, by Slurm's
``--export`` rule (``ALL``, ``NONE``, or a list of ``VAR`` and ``VAR=value``).

The client reads its own environment and drops the *session-only* variables (what belongs to
one login session or to the job corral itself sets up); the server keeps what the export
mode selects and never adds its own environment (``corral.runtime.environment``)."""

from __future__ import annotations

import fnmatch
import functools
import re
from dataclasses import dataclass
from typing import Mapping

from pydantic import BaseModel, ConfigDict, Field

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Never carried by ALL: they describe the submitting session (its terminal, display, SSH
# connection, shell bookkeeping) or are the job's own, set by corral for every replica
# (Slurm's and corral's variables, ranks, GPUs), or are corral's credentials. A variable
# named explicitly in a list (``--export=SSH_AUTH_SOCK``) is carried all the same.
SESSION_ONLY = (
    "SLURM_*", "SLURMD_*", "SBATCH_*", "SRUN_*", "SALLOC_*",  # the submitting shell's own allocation
    "CORRAL_*", "SKYPILOT_*",  # corral's token, server and home; the job's variables corral sets
    "CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",  # the replica's GPUs are its own
    "SSH_*", "DISPLAY", "WAYLAND_DISPLAY", "XAUTHORITY", "XDG_SESSION_*", "XDG_RUNTIME_DIR", "XDG_SEAT*",
    "XDG_VTNR", "DBUS_SESSION_BUS_ADDRESS", "GPG_AGENT_INFO", "KRB5CCNAME",
    "TERM_SESSION*", "TERM_PROGRAM*", "ITERM_*", "TMUX", "TMUX_PANE", "STY", "WINDOW", "WINDOWID",
    "VSCODE_*", "PROMPT_COMMAND", "PS1", "PS2", "COLUMNS", "LINES",
    "PWD", "OLDPWD", "SHLVL", "_",
)

# What one submission may carry: a Linux process takes at most 128 KiB in one variable and
# about 2 MiB of arguments and environment together.
MAX_VARIABLES = 4096
MAX_VALUE_BYTES = 128 * 1024
MAX_TOTAL_BYTES = 512 * 1024

EXPORT_HELP = "ALL, NONE, or a comma-separated list of VAR and VAR=value (optionally after ALL)"


@functools.lru_cache(maxsize=64)
def _matcher(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    """One regular expression for shell patterns (a submission checks every variable against
    all of them: one match each, not one per pattern)."""
    return re.compile("|".join(fnmatch.translate(p) for p in patterns)) if patterns else None


def session_only(name: str, extra: tuple[str, ...] = ()) -> bool:
    return _matcher(SESSION_ONLY + extra).match(name) is not None  # type: ignore[union-attr]


def dropped(names: tuple[str, ...], drop: tuple[str, ...]) -> list[str]:
    """Which of ``names`` the site's ``drop`` patterns never let a job carry."""
    matcher = _matcher(drop)
    return [n for n in names if matcher is not None and matcher.match(n)]


@dataclass(frozen=True)
class Export:
    """A parsed ``--export``: everything (``all``) or nothing of the submitter's environment,
    plus the variables ``names`` takes from it and the ``values`` it sets."""

    all: bool
    names: tuple[str, ...] = ()
    values: tuple[tuple[str, str], ...] = ()

    @property
    def text(self) -> str:
        """The normalised form, as Slurm writes it: ``ALL``, ``NONE``, ``ALL,A=1``, ``A,B=2``."""
        items = list(self.names) + [f"{k}={v}" for k, v in self.values]
        if self.all:
            return ",".join(["ALL"] + items)
        return ",".join(items) if items else "NONE"

    @property
    def shown(self) -> str:
        """Short, for a status line: values are not repeated."""
        items = list(self.names) + [f"{k}=…" for k, _ in self.values]
        head = ["ALL"] if self.all else ([] if items else ["NONE"])
        return ",".join(head + items)


def parse_export(text: str) -> Export:
    """Slurm's ``--export``: ``ALL`` (the default), ``NONE``, or ``[ALL,]VAR[,VAR=value…]``
    (``NIL`` is read as ``NONE``). A list without ``ALL`` carries only the variables it names."""
    if not isinstance(text, str):
        raise ValueError(f"--export takes {EXPORT_HELP}")
    items = _split_values(text)
    if not items:
        raise ValueError(f"--export takes {EXPORT_HELP}")
    first = items[0].upper()
    everything = first == "ALL"
    if first in ("ALL", "NONE", "NIL"):  # NONE,A is A: only the variables named
        items = items[1:]
    names: list[str] = []
    values: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not _NAME.fullmatch(key):
            raise ValueError(f"{item[:60]!r} is not VAR or VAR=value")
        if "\x00" in value:
            raise ValueError(f"{key}: a value cannot hold a NUL byte")
        if sep:
            values[key] = value
        elif key not in names:
            names.append(key)
    return Export(everything, tuple(names), tuple(values.items()))


def _split_values(text: str) -> list[str]:
    """The items of a list: a comma starts a new item only where ``VAR`` or ``VAR=`` follows,
    so a value may hold commas before what is no name (``--export=ALL,DIRS=/a,/b`` sets DIRS to ``/a,/b``)."""
    parts: list[str] = []
    for piece in text.split(","):
        name = piece.split("=", 1)[0].strip()
        if parts and "=" in parts[-1] and not _NAME.fullmatch(name):
            parts[-1] += "," + piece
        elif piece.strip():
            parts.append(piece.strip())
    return parts


def submitter_environment(environ: Mapping[str, str], export: str | None) -> dict[str, str]:
    """What a client sends of its own environment for ``export`` (None: every variable but the
    session-only ones, so the server's default mode can choose among them)."""
    mode = parse_export(export) if export else Export(True)
    if not mode.all:
        return {k: environ[k] for k in mode.names if k in environ}
    session = _matcher(SESSION_ONLY)
    return {k: v for k, v in environ.items() if not session.match(k) or k in mode.names}


def check_environment(environ: Mapping[str, str]) -> str | None:
    """Why an environment is not one a submission may carry (a phrase after "the submitter's
    environment"), or None."""
    if len(environ) > MAX_VARIABLES:
        return (f"holds {len(environ)} variables, more than {MAX_VARIABLES}: submit with --export=NONE or a list "
                "of the variables the job needs")
    total = 0
    for key, value in environ.items():
        if not isinstance(key, str) or not _NAME.fullmatch(key):
            return f"holds {str(key)[:60]!r}, which is not a valid variable name"
        if not isinstance(value, str) or "\x00" in value:
            return f"holds {key} with a NUL byte (or not as text)"
        size = len(key) + 2 + (len(value) if value.isascii() else len(value.encode("utf-8", "replace")))
        if size > MAX_VALUE_BYTES:
            return f"holds {key} of {size // 1024} KiB; one variable may hold at most {MAX_VALUE_BYTES // 1024} KiB"
        total += size
    if total > MAX_TOTAL_BYTES:
        return (f"is {total // 1024} KiB, more than {MAX_TOTAL_BYTES // 1024} KiB: submit with --export=NONE or "
                "a list of the variables the job needs")
    return None


class World(BaseModel):
    """Stored with the job: where it was submitted from, its export mode (normalised), and
    the variables that mode selected of the submitter's environment: exactly what replicas
    start with, before the job's own ``envs``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cwd: str | None = None
    export: str = "ALL"
    environment: dict[str, str] = Field(default_factory=dict)


def selected(self, extra_session_only: tuple[str, ...] = ()) -> dict[str, str]:
        """The variables replicas start with, before the job's own ``envs``."""
        return select(self.environment, parse_export(self.export), extra_session_only)


def select(environ: Mapping[str, str], mode: Export, extra_session_only: tuple[str, ...] = ()) -> dict[str, str]:
    """What ``mode`` takes of ``environ``: every variable but the session-only ones (ALL),
    the named ones (a list), then the values it sets. What the site drops
    (``extra_session_only``) is never taken, even when named."""
    session, dropped = _matcher(SESSION_ONLY), _matcher(tuple(extra_session_only))
    if mode.all:
        chosen = {k: v for k, v in environ.items() if not session.match(k) or k in mode.names}
    else:
        chosen = {k: environ[k] for k in mode.names if k in environ}
    if dropped is not None:
        chosen = {k: v for k, v in chosen.items() if not dropped.match(k)}
    chosen.update(mode.values)
    return chosen
