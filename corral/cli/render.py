"""How the CLI prints tables: for a person, sized to the terminal (the key column always
shown whole, long text folded, optional columns left out when nothing else fits); for a pipe,
plain tab-separated rows with a header line, never wrapped, so ``grep``, ``cut -f`` and
``awk -F'\\t'`` work. Rich is imported only when a terminal is there to see it."""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from corral.states import JobState

GAP = 2  # spaces between columns
def terminal_columns() -> int:
    """The terminal's width, else 80 (shutil's helper would import three compressors)."""
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 80


_MARKUP = re.compile(r"\[/?(?:bold|red|green|yellow|dim|cyan)\]")  # the only tags the CLI writes


class Column:
    """One column of a table (a plain class: a dataclass costs an import of ``inspect``)."""

    __slots__ = ("header", "key", "fold", "right", "optional", "min_width")

    def __init__(self, header: str, key: bool = False, fold: bool = False, right: bool = False, optional: int = 0,
                 min_width: int = 0):
        self.header = header
        self.key = key  # never shortened or left out (the ID)
        self.fold = fold  # long free text: folded onto more lines rather than cut
        self.right = right
        self.optional = optional  # > 0: left out when the terminal is too narrow, highest first
        self.min_width = min_width


class _Lazy:
    """A Rich console created on first use (every command pays Rich's import otherwise)."""

    def __init__(self, stderr: bool):
        self.stderr = stderr
        self._console: Any = None

    def _get(self) -> Any:
        if self._console is None:
            from rich.console import Console

            stream = sys.stderr if self.stderr else sys.stdout
            self._console = Console(stderr=self.stderr, highlight=False, soft_wrap=True,
                                    width=None if stream.isatty() else 1 << 16)
        return self._console

    def print(self, text: Any = "", *, markup: bool = True, **kwargs: Any) -> None:
        stream = sys.stderr if self.stderr else sys.stdout
        if not stream.isatty() and isinstance(text, str):  # a pipe gets the words, without Rich
            stream.write((_MARKUP.sub("", text) if markup else text) + "\n")
            stream.flush()
            return
        self._get().print(text, markup=markup, **kwargs)


out, err = _Lazy(False), _Lazy(True)


class Usage(Exception):
    """Bad input on the command line, named by its option: exit 2, nothing sent."""

    def __init__(self, option: str, message: str):
        super().__init__(message)
        self.option, self.message = option, message


def fail(exc: Any, source: str | None = None) -> None:
    """Print a refusal from the server (a ``CorralError``), each issue with its file line and
    field; exit 2 for bad input, 1 otherwise."""
    err.print(f"[red]error:[/red] {exc.message}", markup=True)
    for issue in exc.errors:
        line = issue.get("line")
        where = (f"{source}:{line}: " if source else f"line {line}: ") if line else ""
        field = f"{issue['field']}: " if issue.get("field") else ""
        err.print(f"  {where}{issue['document']}: {field}{issue['message']}", markup=False)
    sys.exit(2 if exc.status in (400, 404, 409, 422) or exc.errors else 1)


# Slurm's short state names, and its COMPLETED for corral's SUCCEEDED
_STATES = {"PD": "PENDING", "R": "RUNNING", "CD": "SUCCEEDED", "COMPLETED": "SUCCEEDED", "F": "FAILED",
           "CA": "CANCELLED", "CANCELED": "CANCELLED", "TO": "TIMEOUT", "PR": "PREEMPTED", "ST": "STARTING",
           "CF": "STARTING", "CONFIGURING": "STARTING"}
JOB_STATES = tuple(s.value for s in JobState)


def states(values: list[str], option: str, allowed: tuple[str, ...] = JOB_STATES) -> list[str]:
    """``-s PD,R -s failed``: corral's state names, upper-case, Slurm's short forms mapped."""
    out = []
    for value in values:
        for part in filter(None, (p.strip().upper() for p in value.split(","))):
            name = _STATES.get(part, part)
            if name not in allowed:
                raise Usage(option, f"{part!r} is not a job state here; use {', '.join(allowed)} "
                                    "(or Slurm's PD, R, CD, F, CA, TO)")
            out.append(name)
    return out


def print_json(data: Any) -> None:
    import json

    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def moment(iso: str | None) -> str:
    """A time to come, local, with the date only when it is not today; N/A when unknown."""
    if not iso:
        return "N/A"
    from datetime import datetime

    when = datetime.fromisoformat(iso).astimezone()
    return when.strftime("%H:%M:%S" if when.date() == datetime.now().astimezone().date() else "%Y-%m-%dT%H:%M:%S")


def _plain(value: Any) -> str:
    text = "-" if value is None else str(value)
    return text.replace("\t", " ").replace("\n", " ")


def table(columns: list[Column], rows: list[list[Any]], *, width: int | None = None, tty: bool | None = None) -> None:
    """Print ``rows`` under ``columns`` (``None`` cells print as ``-``)."""
    cells = [[_plain(v) for v in row] for row in rows]
    if not (sys.stdout.isatty() if tty is None else tty):
        lines = ["\t".join(c.header for c in columns)] + ["\t".join(row) for row in cells]
        sys.stdout.write("\n".join(lines) + "\n")
        return
    width = width or terminal_columns()
    keep, widths = layout(columns, cells, width)
    from rich.table import Table

    grid = Table(box=None, pad_edge=False, padding=(0, GAP, 0, 0), header_style="bold", show_edge=False)
    for i in keep:
        c = columns[i]
        grid.add_column(c.header, width=widths[i], justify="right" if c.right else "left",
                        no_wrap=not c.fold, overflow="fold" if c.fold else "ellipsis")
    for row in cells:
        grid.add_row(*(row[i] for i in keep))
    from rich.console import Console

    Console(width=width, highlight=False, no_color=bool(os.environ.get("NO_COLOR"))).print(grid)


def layout(columns: list[Column], cells: list[list[str]], width: int) -> tuple[list[int], dict[int, int]]:
    """Which columns to show and how wide, so a row fits ``width``: natural widths when they
    fit; else folding text columns down to their minimum, then shortening the others to their
    header, then leaving optional columns out (highest ``optional`` first)."""
    natural = {i: max([len(c.header)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)}
    keep = list(range(len(columns)))

    def fit(shown: list[int]) -> dict[int, int] | None:
        widths = {i: natural[i] for i in shown}
        room = width - GAP * (len(shown) - 1)
        excess = sum(widths.values()) - room
        for soft in ([i for i in shown if columns[i].fold],
                     [i for i in shown if not columns[i].fold and not columns[i].key]):
            if excess <= 0:
                break
            for i in sorted(soft, key=lambda i: -widths[i]):  # the widest gives first
                floor = max(columns[i].min_width or min(len(columns[i].header), 12), 1)
                take = min(excess, max(0, widths[i] - floor))
                widths[i] -= take
                excess -= take
        return widths if excess <= 0 else None

    widths = fit(keep)
    for drop in sorted((i for i, c in enumerate(columns) if c.optional), key=lambda i: -columns[i].optional):
        if widths is not None:
            break
        keep.remove(drop)
        widths = fit(keep)
    if widths is None:  # even the essentials are wider than the terminal: shown as narrow as they go
        widths = {i: max(1, min(natural[i], columns[i].min_width or len(columns[i].header))) for i in keep}
        for i in keep:
            if columns[i].key:
                widths[i] = natural[i]
    return keep, widths
