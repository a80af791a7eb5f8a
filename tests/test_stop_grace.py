"""A stop's grace period counts from when the signal is sent, not from the cycle that decided
it: the send comes after a commit, and on a loaded server or a slow engine (one ``scancel``
per replica of a large job) that can take a good part of the grace away."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from conftest import submit, wait_for, wait_state


def test_the_grace_period_counts_from_the_signal_s_send(server, tmp_path: Path) -> None:
    term, beat = tmp_path / "term-at", tmp_path / "beat-at"
    job = submit(server, f"""
name: stubborn
grace_period: 2s
run: |
  trap 'date +%s.%N > {term}' TERM
  while true; do date +%s.%N > {beat}.new; mv {beat}.new {beat}; sleep 0.05; done
""")
    wait_state(server, job["id"], "RUNNING")
    wait_for(lambda: beat.exists(), timeout=20)
    executor = server.state.loop.inventory.executors["local"]
    real_signal = executor.signal

    def slow_signal(handle, signum):  # an engine that takes 1.5 s to deliver a stop signal
        if signum == signal.SIGTERM:
            time.sleep(1.5)
        return real_signal(handle, signum)

    executor.signal = slow_signal
    assert server.post(f"/v1/jobs/{job['id']}/cancel").json()["cancelled"] is True
    done = wait_state(server, job["id"], "CANCELLED", timeout=30)
    assert done["tasks"][0]["replicas"][0]["exit_code"] == 137  # it trapped TERM and was killed
    lived = float(beat.read_text()) - float(term.read_text())
    # its last heartbeat came the whole grace period after SIGTERM reached it (0.5 s when the
    # grace was counted from the decision); the heartbeat's 0.05 s period is the slack
    assert lived >= 1.85, lived
