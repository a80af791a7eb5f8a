"""An exec into an attempt's container (``corral exec``/``shell``, exec probes, the stop
signal) made in the moment between the attempt's RUNNING (its engine told to run it) and its
container's existence waits for the container instead of failing "no such container": found
by a `corral exec` made at once after RUNNING that printed nothing."""

from __future__ import annotations

import subprocess
import threading
import time
import uuid

from container_lab import IMAGE, MARKER, ensure_image, need_podman
from corral.node.container import exec_argv

RUN = ["--runtime", "runc", "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096", "--network", "host"]


def test_an_exec_made_before_its_container_runs_waits_for_it() -> None:
    podman = need_podman()
    ensure_image()
    name = f"corral-test-early-{uuid.uuid4().hex[:8]}"
    plain = subprocess.run([podman, "exec", name, "true"], capture_output=True, text=True)
    assert plain.returncode != 0  # what an exec without the wait gets at this moment
    result: dict = {}

    def early() -> None:
        result["done"] = subprocess.run(exec_argv(podman, name, f"cat {MARKER}", None), capture_output=True,
                                        text=True, timeout=60)

    waiting = threading.Thread(target=early)
    waiting.start()
    try:
        time.sleep(1.0)  # the exec is waiting; only now is the container made
        subprocess.run([podman, "run", "-d", "--rm", *RUN, "--name", name, IMAGE, "sleep", "60"], check=True,
                       capture_output=True)
        waiting.join(timeout=60)
        done = result["done"]
        assert (done.returncode, done.stdout) == (0, "inside\n"), done.stderr
    finally:
        subprocess.run([podman, "rm", "-f", "-t", "0", name], capture_output=True)
        waiting.join(timeout=10)


def test_an_exec_into_an_ended_container_does_not_wait() -> None:
    podman = need_podman()
    ensure_image()
    name = f"corral-test-ended-{uuid.uuid4().hex[:8]}"
    subprocess.run([podman, "run", *RUN, "--name", name, IMAGE, "true"], check=True, capture_output=True)
    try:
        started = time.monotonic()
        done = subprocess.run(exec_argv(podman, name, "true", None), capture_output=True, text=True, timeout=60)
        assert done.returncode != 0 and time.monotonic() - started < 2.0, done.stderr
    finally:
        subprocess.run([podman, "rm", "-f", "-t", "0", name], capture_output=True)


def test_the_wait_is_bounded_in_time_however_slow_the_engine_answers(tmp_path) -> None:
    """Each look is an engine process; on a busy node one took ~0.4 s, so fifty looks were
    ~24 s where 5 s was meant. An engine that takes a second per look and never finds the
    container: the exec is made after the bound, not after fifty looks."""
    engine = tmp_path / "slow-engine"
    engine.write_text('#!/bin/sh\nif [ "$1" = inspect ]; then sleep 1; exit 1; fi\necho "engine: $*"\n')
    engine.chmod(0o755)
    started = time.monotonic()
    done = subprocess.run(exec_argv(str(engine), "never-there", "true", None), capture_output=True, text=True,
                          timeout=120)
    took = time.monotonic() - started
    assert done.stdout.startswith("engine: exec never-there"), done
    assert 4.5 < took < 15, took
