"""``corral status`` as a person reads it: a replica whose container image is being pulled says
PULLING and why, not a silent STARTING (the API's replica ``reason``)."""

from __future__ import annotations

from argparse import Namespace

from corral.cli import views


def _job(reason: str | None, state: str = "STARTING") -> dict:
    replica = {"rank": 0, "state": state, "ready": False, "node": "local", "pid": 42, "gpus": [], "exit_code": None,
               "restarts": 0, "hostname": "serve-0.web", "reason": reason}
    task = {"name": "serve", "primary": True, "workdir": "/w", "endpoint": None, "restart": None, "alternatives": 1,
            "replicas": [replica]}
    return {"id": 7, "name": "web", "user": "alice", "state": "STARTING", "reason": None, "exit_code": None,
            "message": None, "cwd": "/w", "export": None, "tasks": [task]}


def _shown(monkeypatch, capsys, job: dict) -> str:
    monkeypatch.setattr(views, "_read", lambda call: job)
    views.status(Namespace(job="7", json=False))
    return capsys.readouterr().out


def test_a_replica_pulling_its_image_says_so(monkeypatch, capsys) -> None:
    shown = _shown(monkeypatch, capsys, _job("pulling image nvcr.io/nvidia/pytorch:24.05-py3 (or starting its container)"))
    row = next(line for line in shown.splitlines() if line.split()[:1] == ["serve-0"])
    assert "PULLING" in row and "STARTING" not in row
    assert "serve-0: pulling image nvcr.io/nvidia/pytorch:24.05-py3" in shown


def test_a_replica_without_a_reason_shows_its_state(monkeypatch, capsys) -> None:
    shown = _shown(monkeypatch, capsys, _job(None))
    row = next(line for line in shown.splitlines() if line.split()[:1] == ["serve-0"])
    assert "STARTING" in row and "PULLING" not in row and "pulling" not in shown


def test_an_endpoint_counts_the_replicas_the_task_has_now_not_those_scaled_away(monkeypatch, capsys) -> None:
    job = _job(None, state="RUNNING")
    task = job["tasks"][0]
    task["replicas"][0]["ready"] = True
    task["replicas"] += [{**task["replicas"][0], "rank": 1}] + [
        {**task["replicas"][0], "rank": rank, "state": "KILLED", "ready": False} for rank in (2, 3)]
    task.update(endpoint="127.0.0.1:4000", num_nodes=2)
    assert "endpoint 127.0.0.1:4000 (2 of 2 replicas ready)" in _shown(monkeypatch, capsys, job)
