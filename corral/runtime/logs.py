"""Reading replica logs: whole, or followed until the job ends, with every line prefixed by
its replica (``trainer-0 | ``) when several replicas are shown together.

A log past its size cap is rotated by copy-then-truncate (``control.retention.rotate``,
logrotate's copytruncate): ``NAME.log.1`` then holds the older part and ``NAME.log`` goes on
from empty. A log is read as the two together, the rotated part first; a log followed across
a rotation goes on in the rotated copy from where it was, then in the new file."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

CHUNK = 1 << 16
# what corral's own shell around a batch script prints before it fails the job (``spec.batchshell``),
# or its container runner (``node.stepcontainer``: an image it could not pull, say)
LAST_WORDS = ("corral: the job failed: ", "corral: error: ")


def last_words(path: Path, tail: int = 4096, code: int | None = None) -> str:
    """Why a replica failed where its exit code alone does not say: the sentence corral's shell
    printed last when it failed the job itself (its ``--output`` directory missing, its setup
    failing, say), a port taken (``Address already in use``), or for the shell's own codes
    (126: found but not executable, 127: not found) the shell's line saying what, or for a
    container engine's own (125) its ``Error:`` line; "" otherwise."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - tail))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    said = [line.split(": ", 2)[2].strip() for line in text.splitlines() if line.startswith(LAST_WORDS)]
    if said:
        return said[-1][:500]
    killed = code is not None and (code < 0 or 128 < code < 160)  # ended by a signal: stopped, not a failed bind
    if not killed and "address already in use" in text.lower():  # EADDRINUSE, as Python, uvicorn, vLLM, NCCL print it
        return ("its log says a port it binds is already in use on its node (replicas on one machine share a "
                "port only when each binds its own address, $CORRAL_ADDR, not 0.0.0.0, or when the server "
                "gives each a network of its own: infra: {local: {network: namespace}} in config.yaml)")
    if code in (126, 127):
        shell = [line.strip() for line in text.splitlines() if _SHELL_SAYS.search(line)]
        if shell:
            return f"its log says: {shell[-1][:300]}"
    if code == 125:  # Podman's and Docker's own failure (a bind's source gone, a refused option)
        engine = [line.strip() for line in text.splitlines() if _ENGINE_SAYS.match(line.strip())]
        if engine:
            return f"its container engine said: {engine[-1][:300]}"
    return ""


# how bash and sh say a command could not be run (exit 127: not found; 126: not executable)
_SHELL_SAYS = re.compile(r"command not found|[Pp]ermission denied|No such file or directory|cannot execute")
# how Podman and Docker say they could not run a container (their exit 125)
_ENGINE_SAYS = re.compile(r"(Error: |docker: Error response from daemon: |Error response from daemon: )\S")


def rotated(path: Path) -> Path:
    """Where rotation keeps the older part of the log at ``path``."""
    return path.with_name(path.name + ".1")


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


class LogTail:
    """Incremental reader of a set of log files that may not exist yet."""

    def __init__(self, files: dict[str, Path], prefix: bool):
        self.files = files
        self.prefix = prefix
        self.offsets: dict[str, int] = {label: 0 for label in files}
        # a rotated copy still to be read before the live file, from this offset
        self.backlog: dict[str, tuple[Path, int] | None] = {
            label: (rotated(path), 0) if _size(rotated(path)) else None for label, path in files.items()}
        self.partial: dict[str, bytes] = {label: b"" for label in files}
        self.width = max((len(label) for label in files), default=0)

    def _take(self, label: str, budget: int) -> bytes:
        """Up to ``budget`` new bytes of one replica's log: its rotated part, then the live file."""
        path = self.files[label]
        live = _size(path)
        if live is not None and live < self.offsets[label]:  # rotated since the last read
            copy = rotated(path)
            left = _size(copy)
            self.backlog[label] = (copy, self.offsets[label]) if left is not None and left > self.offsets[label] else None
            self.offsets[label] = 0
        data = b""
        behind = self.backlog[label]
        if behind is not None:
            copy, offset = behind
            try:
                with open(copy, "rb") as fh:
                    fh.seek(offset)
                    data = fh.read(budget)
            except FileNotFoundError:
                pass
            self.backlog[label] = (copy, offset + len(data)) if len(data) == budget else None
            if len(data) == budget:
                return data
        try:
            with open(path, "rb") as fh:
                fh.seek(self.offsets[label])
                more = fh.read(budget - len(data))
        except FileNotFoundError:
            return data
        self.offsets[label] += len(more)
        return data + more

    def read(self, final: bool = False) -> list[bytes]:
        out: list[bytes] = []
        for label in self.files:
            data = self.partial[label] + self._take(label, CHUNK * 16)
            lines = data.split(b"\n")
            self.partial[label] = lines.pop()
            if final and self.partial[label]:
                lines.append(self.partial[label])
                self.partial[label] = b""
            head = f"{label.ljust(self.width)} | ".encode() if self.prefix else b""
            out.extend(head + line + b"\n" for line in lines)
        return out

    def keep_last(self, count: int) -> None:
        """Start every file at its last ``count`` lines (``tail -n``), reaching back into its
        rotated part when the live file holds fewer: what is read next is those lines and
        whatever is written after them."""
        for label, path in self.files.items():
            self.backlog[label] = None
            try:
                with open(path, "rb") as fh:
                    self.offsets[label], found = _last_lines(fh, count)
            except FileNotFoundError:
                self.offsets[label], found = 0, 0
            copy = rotated(path)
            if self.offsets[label] == 0 and found < count and _size(copy):
                with open(copy, "rb") as fh:
                    self.backlog[label] = (copy, _last_lines(fh, count - found)[0])

    def drain(self) -> Iterator[bytes]:
        """Everything there is now, however large, a chunk at a time."""
        while True:
            before = (dict(self.offsets), dict(self.backlog))
            lines = self.read()
            if lines:
                yield b"".join(lines)
            elif (self.offsets, self.backlog) == before:  # nothing new: what is left is an unfinished last line
                break
        rest = self.read(final=True)
        if rest:
            yield b"".join(rest)


def _last_lines(fh, count: int, block: int = 1 << 16) -> tuple[int, int]:
    """Where the last ``count`` lines of an open file begin (an unfinished last line counts
    as one), read backwards a block at a time, and how many lines that is (fewer when the
    file has fewer)."""
    size = fh.seek(0, os.SEEK_END)
    if count <= 0 or size == 0:
        return size, 0
    fh.seek(size - 1)
    pos = size - 1 if fh.read(1) == b"\n" else size  # a final newline ends the last line, starts none
    seen = 0
    while pos > 0:
        start = max(0, pos - block)
        fh.seek(start)
        chunk = fh.read(pos - start)
        end = len(chunk)
        while (i := chunk.rfind(b"\n", 0, end)) >= 0:
            seen += 1
            if seen == count:
                return start + i + 1, count
            end = i
        pos = start
    return 0, seen + 1


async def follow(tail: LogTail, ended: Callable[[], Awaitable[bool]], interval: float = 0.1,
                 allowed: Callable[[], bool] = lambda: True) -> AsyncIterator[bytes]:
    """Yield new lines until ``ended()`` says the job is over and everything is drained, or at
    once when ``allowed()`` no longer holds (the reader's token was revoked)."""
    checks = 0
    while allowed():
        lines = tail.read()
        if lines:
            yield b"".join(lines)
            continue
        checks += 1
        if checks % 3 == 1 and await ended():
            rest = tail.read(final=True)
            if rest:
                yield b"".join(rest)
            return
        await asyncio.sleep(interval)
