"""The GRPO example end to end (shortened): reward rises, a rollout replica killed mid-run
comes back under its name and the run goes on, and a scale to 3 rollouts is picked up by
the trainer without a restart."""

from __future__ import annotations

import json
import os
import signal
import statistics
from pathlib import Path

from conftest import wait_for, wait_state
from corral.spec.world import submitter_environment

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "grpo"


ITERATIONS = 200  # ~0.07 s each here; the margin covers a killed replica's restart, then the scale-up's start


def test_grpo_learns_survives_a_killed_rollout_and_scales(server, tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    response = server.post("/v1/jobs", json={
        "yaml": (EXAMPLE / "grpo.yaml").read_text(), "source": str(EXAMPLE / "grpo.yaml"),
        "cwd": str(EXAMPLE.parents[1]), "environment": submitter_environment(os.environ, None),  # as corral launch
        "env": {"GRPO_ITERATIONS": str(ITERATIONS), "GRPO_METRICS": str(metrics)}})
    assert response.status_code == 201, response.text
    job_id = response.json()["job"]["id"]

    def rows() -> list[dict]:
        return [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []

    wait_for(lambda: len(rows()) >= 10, timeout=120)
    rollout = next(t for t in server.get(f"/v1/jobs/{job_id}").json()["tasks"] if t["name"] == "rollout")
    victim = rollout["replicas"][1]
    os.killpg(victim["pid"], signal.SIGKILL)  # the documented recovery demo: kill -9 a rollout replica
    wait_for(lambda: next(t for t in server.get(f"/v1/jobs/{job_id}").json()["tasks"]
                          if t["name"] == "rollout")["replicas"][1]["restarts"] == 1, timeout=30)
    assert server.post(f"/v1/jobs/{job_id}/scale", json={"task": "rollout", "replicas": 3}).status_code == 200

    def third_ready() -> bool:
        job = server.get(f"/v1/jobs/{job_id}").json()
        replicas = next(t for t in job["tasks"] if t["name"] == "rollout")["replicas"]
        return len(replicas) == 3 and bool(replicas[2]["ready"]) or job["state"] != "RUNNING"
    wait_for(third_ready, timeout=120)
    ready_at = len(rows())
    assert ready_at < ITERATIONS - 10, f"the third rollout became ready only after iteration {ready_at}"

    done = wait_state(server, job_id, "SUCCEEDED", "FAILED", timeout=240)
    log = server.get(f"/v1/jobs/{job_id}/logs", params={"replica": "trainer-0"}).text
    assert done["state"] == "SUCCEEDED", log[-2000:]
    history = rows()
    assert [r["iteration"] for r in history] == list(range(ITERATIONS)), log  # no iteration lost or repeated
    first = statistics.fmean(r["mean_reward"] for r in history[:10])
    last = statistics.fmean(r["mean_reward"] for r in history[-10:])
    assert last > first + 0.2, (first, last)
    assert any(r["rollout_replicas"] == 3 for r in history[ready_at + 1:])  # the scaled-up replica was used
    assert all(history[i + 1]["weight_version"] > history[i]["weight_version"] for i in range(len(history) - 1))
    for key in ("generation_s", "reward_s", "training_s", "weight_sync_s"):
        assert all(r[key] >= 0 for r in history)
    rollout = next(t for t in done["tasks"] if t["name"] == "rollout")["replicas"]
    assert rollout[1]["restarts"] == 1 and rollout[1]["addr"] == victim["addr"]


def test_a_reply_cut_short_by_a_killed_replica_is_a_connection_error() -> None:
    """A rollout killed between its reply's headers and body made the trainer crash with
    http.client.IncompleteRead (not an OSError) and redo an iteration from its checkpoint."""
    import socket
    import sys
    import threading

    sys.path.insert(0, str(EXAMPLE))
    try:
        from wire import call
    finally:
        sys.path.remove(str(EXAMPLE))
    listener = socket.create_server(("127.0.0.1", 0))

    def die_mid_reply() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: 50\r\n\r\n")
        conn.close()

    threading.Thread(target=die_mid_reply, daemon=True).start()
    try:
        call(f"http://127.0.0.1:{listener.getsockname()[1]}/generate", {"version": 1})
    except OSError as exc:
        assert "cut short" in str(exc)
    else:
        raise AssertionError("a reply cut short returned")
    finally:
        listener.close()
