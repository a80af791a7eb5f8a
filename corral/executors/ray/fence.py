"""The fence of one attempt on a Ray node: a small process its actor starts beside the
attempt, which ends the attempt's whole process tree the moment the actor's worker or the
node's raylet dies. The attempt runs in a session of its own, so neither death takes it
along; without the fence a raylet killed under a running replica leaves it running while
corral, told that the node left the cluster, starts its next attempt elsewhere (alive twice).

The actor holds the write end of a pipe whose read end only the fence holds: when the worker
dies, however it dies, the pipe reads end-of-file. The raylet (the worker's parent) is
watched too, since a worker may outlive its raylet by a second or more. The fence never
carries the attempt's key in its environment, so ending the attempt's tree spares it.

The fence leaves the worker's children at once (a double fork): a Ray worker that exits
cleanly, as one does when it finds its raylet gone, SIGKILLs its direct children
(``RAY_kill_child_processes_on_worker_exit``), which would take the fence along with the
attempt's first process and leave the rest of the attempt's tree running. It holds a second
pipe's write end until it exits, so the actor can wait for it without being its parent."""

from __future__ import annotations

import os
import select
import sys
import time
from pathlib import Path

WATCH_S = 0.1  # how often the raylet is looked at
FENCED_FILE = "fenced"  # in the attempt's run directory: why its fence ended it


def _stat(pid: int) -> tuple[str, str] | None:
    """A process's state and start time (in clock ticks since boot), or None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[0], fields[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, since: str | None) -> bool:
    """Whether ``pid`` still runs as the process first seen (a reused pid is not it)."""
    if since is None:
        return True  # nothing to watch
    now = _stat(pid)
    return now is not None and now[0] != "Z" and now[1] == since


def watch(fd: int, raylet: int) -> str | None:
    """Wait until the actor's worker or the raylet is gone (say which), or until the actor
    says the attempt ended and its tree was reaped (None: nothing to do)."""
    first = _stat(raylet) if raylet > 1 else None
    since = first[1] if first is not None else None
    # poll, not select: a Ray worker's descriptors can pass 1024, which select cannot take
    waiting = select.poll()
    waiting.register(fd, select.POLLIN)
    while True:
        if waiting.poll(WATCH_S * 1000):
            try:
                data = os.read(fd, 64)
            except OSError:
                data = b""
            if not data:
                return "its Ray worker died"
            if b"ended" in data:
                return None
        if not _alive(raylet, since):
            return "the node's raylet died"


def main(argv: list[str]) -> int:
    fd, raylet, nodescope, key = int(argv[0]), int(argv[1]), argv[2], argv[3]
    if os.fork() > 0:  # the actor's child ends here; the fence goes on as an orphan (see above)
        os._exit(0)
    why = watch(fd, raylet)
    if why is None:
        return 0
    started = time.monotonic()
    # imported only now: a fence whose attempt ends by itself (nearly every one) never pays
    # for it. Five fences importing it at a group's start took ~0.25 s of CPU from the Ray
    # workers starting beside them on two cores; a kill ~50 ms later is nothing beside the
    # seconds Ray takes to declare a node dead and corral to start the attempt elsewhere.
    from corral.executors.ray.actor import node_runner

    runner = node_runner(nodescope)
    try:  # said before the kill, so the actor (if it still lives) reports a loss, not an exit
        (runner.run_dir(key) / FENCED_FILE).write_text(why)
    except OSError:
        pass
    left = runner.end_tree(key, runner.started_pid(key), thorough=True)
    took = time.monotonic() - started
    print(f"corral fence: {why}; ended attempt {key} in {took:.2f}s"
          + (f" ({len(left)} process(es) could not be killed)" if left else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
