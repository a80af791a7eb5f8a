"""Reading replica logs: whole, or followed until the job ends, with every line prefixed by
its replica (``trainer-0 | ``) when several replicas are shown together."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

CHUNK = 1 << 16


class LogTail:
    """Incremental reader of a set of log files that may not exist yet."""

    def __init__(self, files: dict[str, Path], prefix: bool):
        self.files = files
        self.prefix = prefix
        self.offsets: dict[str, int] = {label: 0 for label in files}
        self.partial: dict[str, bytes] = {label: b"" for label in files}
        self.width = max((len(label) for label in files), default=0)

    def read(self, final: bool = False) -> list[bytes]:
        out: list[bytes] = []
        for label, path in self.files.items():
            try:
                with open(path, "rb") as fh:
                    if os.fstat(fh.fileno()).st_size < self.offsets[label]:
                        self.offsets[label] = 0  # rotated (copied, then truncated): read on from its start
                        self.partial[label] = b""
                    fh.seek(self.offsets[label])
                    data = fh.read(CHUNK * 16)
            except FileNotFoundError:
                continue
            self.offsets[label] += len(data)
            data = self.partial[label] + data
            lines = data.split(b"\n")
            self.partial[label] = lines.pop()
            if final and self.partial[label]:
                lines.append(self.partial[label])
                self.partial[label] = b""
            head = f"{label.ljust(self.width)} | ".encode() if self.prefix else b""
            out.extend(head + line + b"\n" for line in lines)
        return out


    def keep_last(self, count: int) -> None:
        """Start every file at its last ``count`` lines (``tail -n``): what is read next is
        those lines and whatever is written after them."""
        for label, path in self.files.items():
            try:
                with open(path, "rb") as fh:
                    self.offsets[label] = _last_lines_offset(fh, count)
            except FileNotFoundError:
                continue

    def drain(self) -> Iterator[bytes]:
        """Everything there is now, however large, a chunk at a time."""
        while True:
            before = dict(self.offsets)
            lines = self.read()
            if lines:
                yield b"".join(lines)
            elif self.offsets == before:  # nothing new: what is left is an unfinished last line
                break
        rest = self.read(final=True)
        if rest:
            yield b"".join(rest)


def _last_lines_offset(fh, count: int, block: int = 1 << 16) -> int:
    """The offset where the last ``count`` lines of an open file begin (an unfinished last
    line counts as one), read backwards a block at a time."""
    size = fh.seek(0, os.SEEK_END)
    if count <= 0 or size == 0:
        return size
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
                return start + i + 1
            end = i
        pos = start
    return 0


async def follow(tail: LogTail, ended: Callable[[], Awaitable[bool]], interval: float = 0.1) -> AsyncIterator[bytes]:
    """Yield new lines until ``ended()`` says the job is over and everything is drained."""
    checks = 0
    while True:
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
