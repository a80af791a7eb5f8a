"""The read-only routes behind the dashboard's GPU map and accounting chart, over the real
HTTP API with a real control loop: ``/v1/allocations`` (which replica holds which GPU) and
``/v1/accounting`` (GPU- and CPU-hours per user or account, bucketed), who may read them, and
the pure bucketing they use."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest
from conftest import bearer, wait_for

from corral.api.histogram import grid, spread, step_for
from corral.store.repository import Run

ON_POSTGRESQL = True  # what the store keeps: checked on PostgreSQL too (conftest)

RUNS = "trap 'exit 0' TERM; while true; do sleep 0.2; done"


def iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, tz=timezone.utc).isoformat()


def test_spread_splits_runs_over_buckets_exactly() -> None:
    runs = [Run("alice", "ml", 30.0, 250.0, 2, 1.0),      # three buckets: 70 s, 100 s, 50 s
            Run("bob", "ml", 120.0, None, 1, 4.0),        # still running at now=150: 30 s
            Run("alice", "ml", -500.0, 10.0, 4, 0.0),     # began before the window: its 10 s inside
            Run("carol", "cv", 400.0, 500.0, 8, 0.0)]     # after the window: not counted
    alice, bob = spread(runs, lambda r: r.user, 0.0, 300.0, 100.0, now=150.0)
    assert alice.key == "alice" and alice.jobs == 2
    assert alice.gpu == pytest.approx([(70 * 2 + 10 * 4) / 3600, 100 * 2 / 3600, 50 * 2 / 3600])
    assert alice.cpu == pytest.approx([70 / 3600, 100 / 3600, 50 / 3600])
    assert bob.gpu == pytest.approx([0.0, 30 / 3600, 0.0]) and bob.cpu == pytest.approx([0.0, 120 / 3600, 0.0])
    [ml] = spread(runs[:2], lambda r: r.account, 0.0, 300.0, 100.0, now=150.0)
    assert ml.gpu_hours == pytest.approx((440 + 30) / 3600)
    # Buckets start on whole steps; a run spanning many of them costs the same.
    assert grid(130.0, 1000.0, 100.0) == (100.0, 9)
    [long] = spread([Run("a", "a", 0.0, 86400.0 * 30, 1, 0.0)], lambda r: r.user, 0.0, 86400.0 * 30, 60.0, now=0.0)
    assert len(long.gpu) == 43200 and long.gpu_hours == pytest.approx(720.0) and max(long.gpu) == pytest.approx(1 / 60)
    assert step_for(3600) == 60 and step_for(86400) == 3600 and step_for(30 * 86400) == 86400


def test_allocations_name_the_job_and_replica_holding_each_gpu(server) -> None:
    job = server.post("/v1/jobs", json={"yaml": f"name: held\nnum_nodes: 2\nresources: {{accelerators: H100:3}}\nrun: {RUNS}\n"}).json()["job"]
    wait_for(lambda: server.get(f"/v1/jobs/{job['id']}").json()["state"] == "RUNNING")
    replicas = server.get(f"/v1/jobs/{job['id']}").json()["tasks"][0]["replicas"]
    held = server.get("/v1/allocations").json()
    assert sorted((a["node"], tuple(a["gpus"]), a["replica"]) for a in held) == \
        sorted((r["node"], tuple(r["gpus"]), f"held-{r['rank']}") for r in replicas)
    assert {(a["job"], a["job_name"], a["user"], a["account"], a["state"]) for a in held} == \
        {(job["id"], "held", "alice", "alice", "RUNNING")}
    nodes = {n["name"]: n for n in server.get("/v1/nodes").json()}
    for a in held:  # what the map shows held is exactly what the pool says is not free
        assert not set(a["gpus"]) & set(nodes[a["node"]]["free_gpus"])
        assert len(nodes[a["node"]]["free_gpus"]) == 4 - len(a["gpus"])
    server.post(f"/v1/jobs/{job['id']}/cancel")
    wait_for(lambda: server.get("/v1/allocations").json() == [])


def test_a_user_and_a_viewer_read_the_whole_gpu_map_and_accounting_an_anonymous_caller_nothing(server) -> None:
    """docs/security.md gives a user and a viewer the queue, nodes, fair share and every job's
    status: the GPU map and the accounting show nothing those do not (each replica's node and
    GPUs are in its job; GPU-hours are the job list's times), so they read them whole, others'
    jobs included. Neither route changes anything; without a token both answer 401."""
    job = server.post("/v1/jobs", json={"yaml": f"name: held\nresources: {{accelerators: H100:2}}\nrun: {RUNS}\n"}).json()["job"]
    running = wait_for(lambda: (j := server.get(f"/v1/jobs/{job['id']}").json())["state"] == "RUNNING" and j)
    time.sleep(0.3)
    window = {"since": running["started_at"], "until": iso(time.time()), "step": 60}  # ended: the same for every caller
    seen = {"alice": (server.get("/v1/allocations").json(), server.get("/v1/accounting", params=window).json())}
    assert [(a["user"], a["job"], a["gpus"]) for a in seen["alice"][0]] == \
        [("alice", job["id"], running["tasks"][0]["replicas"][0]["gpus"])]
    assert [(s["key"], s["jobs"]) for s in seen["alice"][1]["series"]] == [("alice", 1)]
    for user, role in (("dave", "user"), ("vic", "viewer")):
        headers = bearer(server.state, user, role)
        assert server.get("/v1/whoami", headers=headers).json()["role"] == role
        allocations = server.get("/v1/allocations", headers=headers)
        accounting = server.get("/v1/accounting", params=window, headers=headers)
        assert (allocations.status_code, accounting.status_code) == (200, 200), (allocations.text, accounting.text)
        assert (allocations.json(), accounting.json()) == seen["alice"], role
        assert server.get(f"/v1/jobs/{job['id']}", headers=headers).json()["tasks"][0]["replicas"][0]["gpus"] == \
            seen["alice"][0][0]["gpus"]  # what the map shows, the job's status already does
    refused = server.post(f"/v1/jobs/{job['id']}/cancel", headers=headers)  # the viewer's: reading is all
    assert refused.status_code == 403
    assert refused.json()["detail"] == (f"cancelling another user's job (job {job['id']}, alice's) needs the operator "
                                        "role (you are vic, a viewer)")
    for path in ("/v1/allocations", "/v1/accounting"):
        anonymous = server.get(path, headers={"Authorization": ""})
        assert anonymous.status_code == 401 and "needs a token" in anonymous.json()["detail"]
        assert anonymous.headers["WWW-Authenticate"].startswith("Bearer")
    server.post(f"/v1/jobs/{job['id']}/cancel")


def test_accounting_matches_the_jobs_times(server) -> None:
    before = time.time() - 1
    gpu = server.post("/v1/jobs", json={"yaml": "name: gpu\nresources: {accelerators: H100:2, cpus: 1}\nrun: sleep 0.6\n"}).json()["job"]
    cpu = server.post("/v1/jobs", json={"yaml": "name: cpu\nresources: {cpus: 2}\nrun: sleep 0.3\n"},
                      headers=bearer(server.state, "bob")).json()["job"]
    # A pipeline holds one stage at a time: its largest counts, not their sum.
    stages = server.post("/v1/jobs", json={"yaml": "name: stages\n---\nresources: {accelerators: H100:1}\nrun: sleep 0.2\n"
                                                   "---\nresources: {accelerators: H100:3}\nrun: sleep 0.2\n"},
                         headers=bearer(server.state, "carol")).json()["job"]
    for job in (gpu, cpu, stages):
        wait_for(lambda: server.get(f"/v1/jobs/{job['id']}").json()["state"] == "SUCCEEDED")
    ran = {j["name"]: j for j in (server.get(f"/v1/jobs/{job['id']}").json() for job in (gpu, cpu, stages))}

    def elapsed(job: dict) -> float:
        return (datetime.fromisoformat(job["ended_at"]) - datetime.fromisoformat(job["started_at"])).total_seconds()

    answer = server.get("/v1/accounting", params={"since": iso(before), "until": iso(time.time() + 1), "step": 60})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["by"] == "user" and body["step"] == 60 and len(body["buckets"]) in (1, 2)
    series = {s["key"]: s for s in body["series"]}
    assert list(series)[-1] == "bob" and set(series) == {"alice", "bob", "carol"}  # the most GPU-hours first
    assert series["carol"]["gpu_hours"] == pytest.approx(3 * elapsed(ran["stages"]) / 3600, rel=1e-3)
    assert series["alice"]["gpu_hours"] == pytest.approx(2 * elapsed(ran["gpu"]) / 3600, rel=1e-3)
    assert series["alice"]["cpu_hours"] == pytest.approx(1 * elapsed(ran["gpu"]) / 3600, rel=1e-3)
    assert series["bob"]["gpu_hours"] == 0 and series["bob"]["cpu_hours"] == pytest.approx(2 * elapsed(ran["cpu"]) / 3600, rel=1e-3)
    assert sum(series["alice"]["gpu_hours_by_bucket"]) == pytest.approx(series["alice"]["gpu_hours"], abs=1e-5)
    only_bob = server.get("/v1/accounting", params={"since": iso(before), "by": "account", "user": "bob"}).json()
    assert [s["key"] for s in only_bob["series"]] == ["bob"] and only_bob["series"][0]["jobs"] == 1
    later = server.get("/v1/accounting", params={"since": iso(time.time() + 5), "until": iso(time.time() + 3600)}).json()
    assert later["series"] == [] and later["step"] == 60  # an hour in minutes

    refused = server.get("/v1/accounting", params={"since": iso(time.time()), "until": iso(time.time() - 60)})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["query", "since"]
    refused = server.get("/v1/accounting", params={"since": iso(time.time() - 86400 * 30), "step": 60})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["query", "step"]
    assert "at most 2000" in refused.json()["detail"][0]["msg"]
    refused = server.get("/v1/accounting", params={"since": "1900-01-01", "until": "1901-01-01"})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["query", "since"]
    refused = server.get("/v1/accounting", params={"since": "1970-01-01"})  # 56 years in weeks: too many bars
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["query", "since"]
    refused = server.get("/v1/accounting", params={"since": "9999-12-30T23:00:00", "until": "9999-12-31T23:59:59-14:00"})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["query", "until"]
    refused = server.get("/v1/accounting", params={"since": "0001-01-02", "until": "0001-01-01T00:00:00+14:00"})
    assert refused.status_code == 422 and "is not before until" in refused.json()["detail"][0]["msg"]
    refused = server.get("/v1/accounting", params={"step": 0.001})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["query", "step"]
    refused = server.get("/v1/accounting", params={"by": "team"})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["query", "by"]
    refused = server.get("/v1/accounting", params={"since": "yesterday"})
    assert refused.status_code == 422 and "ISO 8601" in refused.json()["detail"][0]["msg"]


def test_elastic_bounds_are_in_the_job(server) -> None:
    job = server.post("/v1/jobs", json={"yaml": "name: el\nnum_nodes: {min: 1, max: 3, initial: 2}\nrun: 'true'\n"}).json()["job"]
    assert (job["tasks"][0]["min_nodes"], job["tasks"][0]["max_nodes"], job["tasks"][0]["num_nodes"]) == (1, 3, 2)
    fixed = server.post("/v1/jobs", json={"yaml": "name: fx\nrun: 'true'\n"}).json()["job"]
    assert (fixed["tasks"][0]["min_nodes"], fixed["tasks"][0]["max_nodes"]) == (None, None)
