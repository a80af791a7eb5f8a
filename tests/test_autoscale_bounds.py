"""``corral scale`` on an autoscaled service, on a real in-process server with real processes:
a count alone pins the bounds (min = max = count) so the autoscaler never undoes it, ``--min/
--max`` give it room again and it works within them, every move says what and why in an
event; bad bounds are refused naming the field (in service replicas too for a gang), and the
bounds outlive a server restart."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from conftest import bearer, kill_leftovers, submit, wait_for, wait_state
from replica_servers import NAMED_SERVER

from corral.spec.world import submitter_environment


def service(tmp_path: Path, num_nodes: int = 1) -> str:
    (tmp_path / "serve.py").write_text(NAMED_SERVER)
    return f"""
name: llm
num_nodes: {num_nodes}
resources: {{accelerators: H100:1}}
service:
  readiness_probe: /
  replica_policy: {{min_replicas: 1, max_replicas: 4, target_qps_per_replica: 5,
                   upscale_delay_seconds: 1, downscale_delay_seconds: 1}}
  ports: 8080
run: exec {sys.executable} {tmp_path / 'serve.py'}
"""


def task_of(server, job_id: int) -> dict:
    return server.get(f"/v1/jobs/{job_id}").json()["tasks"][0]


def live(server, job_id: int) -> list[dict]:
    task = task_of(server, job_id)
    return [r for r in task["replicas"] if r["rank"] < task["num_nodes"] and r["state"] == "RUNNING"]


def events(server, job_id: int, cause: str) -> list[str]:
    return [e["message"] for e in server.get(f"/v1/jobs/{job_id}/events").json() if e["cause"] == cause]


def scale(server, job_id: int, **body):
    return server.post(f"/v1/jobs/{job_id}/scale", json={"task": "llm", **body})


def test_a_manual_scale_is_not_undone_and_bounds_give_the_autoscaler_room(server, tmp_path: Path) -> None:
    job_id = submit(server, service(tmp_path))["id"]
    wait_state(server, job_id, "RUNNING")
    wait_for(lambda: len(live(server, job_id)) == 1)

    # a count alone on an autoscaled task pins it: no load for many downscale delays moves nothing
    assert scale(server, job_id, replicas=3).status_code == 200
    task = task_of(server, job_id)
    assert (task["num_nodes"], task["min_nodes"], task["max_nodes"], task["autoscaled"]) == (3, 3, 3, True)
    assert "within bounds 3..3, pinned" in task["scale"]
    wait_for(lambda: len(live(server, job_id)) == 3, timeout=30)
    time.sleep(4)  # four downscale delays without a request: before, it went back to 1
    assert task_of(server, job_id)["num_nodes"] == 3 and len(live(server, job_id)) == 3
    assert not events(server, job_id, "autoscaled")
    (said,) = events(server, job_id, "scale_bounds")
    assert "alice set its bounds: 1..4 -> 3..3 replicas" in said and "pins it" in said

    # bounds alone: the count stays, then the autoscaler brings it down to the new min, saying why
    assert scale(server, job_id, min_nodes=2, max_nodes=4).status_code == 200
    assert (task_of(server, job_id)["min_nodes"], task_of(server, job_id)["max_nodes"]) == (2, 4)
    # new bounds alone ask for no count: one scale request so far (the count above), no "3 -> 3"
    assert len(events(server, job_id, "scale_requested")) == 1
    assert not [m for m in events(server, job_id, "scaled") if "3 -> 3" in m]
    wait_for(lambda: task_of(server, job_id)["num_nodes"] == 2, timeout=20)
    (why,) = events(server, job_id, "autoscaled")
    assert "3 -> 2 replicas" in why and "within its bounds 2..4" in why and "its min is 2" in why
    time.sleep(3)
    assert task_of(server, job_id)["num_nodes"] == 2  # the new min holds
    assert "autoscaled at 5 requests/s" in task_of(server, job_id)["scale"]

    # a count within new bounds given with them
    assert scale(server, job_id, replicas=4, max_nodes=4, min_nodes=4).status_code == 200
    wait_for(lambda: len(live(server, job_id)) == 4, timeout=30)

    # refused, naming the field, and nothing changes
    bad = scale(server, job_id, min_nodes=3, max_nodes=2)
    assert bad.status_code == 422 and "min_nodes" in bad.text and "min 3 replicas is above max 2" in bad.text
    bad = scale(server, job_id, max_nodes=9)  # 9 replicas of one GPU; the pool has 8
    assert bad.status_code == 422 and "max_nodes" in bad.text and "could never run 9 replicas" in bad.text
    bad = scale(server, job_id, replicas=0)
    assert bad.status_code == 422 and "--min 0 --max N" in bad.text
    bad = scale(server, job_id)
    assert bad.status_code == 422 and "give replicas, min_nodes and/or max_nodes" in bad.text
    task = task_of(server, job_id)
    assert (task["num_nodes"], task["min_nodes"], task["max_nodes"]) == (4, 4, 4)
    server.post(f"/v1/jobs/{job_id}/cancel")
    wait_state(server, job_id, "CANCELLED", timeout=30)


def test_gang_bounds_are_whole_service_replicas(server, tmp_path: Path) -> None:
    job_id = submit(server, service(tmp_path, num_nodes=2))["id"]
    wait_state(server, job_id, "RUNNING")
    task = task_of(server, job_id)
    assert (task["num_nodes"], task["min_nodes"], task["max_nodes"]) == (2, 2, 8)
    bad = scale(server, job_id, max_nodes=5)
    assert bad.status_code == 422 and "max_nodes" in bad.text and "multiple of 2" in bad.text
    # 5 gangs of two one-GPU members need 10 GPUs; the pool has 8
    bad = scale(server, job_id, max_nodes=10)
    assert bad.status_code == 422 and "10 replicas (5 service replica(s) of 2 nodes each)" in bad.text
    assert scale(server, job_id, replicas=4).status_code == 200  # pins two service replicas
    task = task_of(server, job_id)
    assert (task["num_nodes"], task["min_nodes"], task["max_nodes"]) == (4, 4, 4)
    wait_for(lambda: len(live(server, job_id)) == 4, timeout=30)
    for head in (0, 2):  # each gang's members on nodes of their own
        members = {r["rank"]: r["node"] for r in live(server, job_id)}
        assert members[head] != members[head + 1]
    server.post(f"/v1/jobs/{job_id}/cancel")
    wait_state(server, job_id, "CANCELLED", timeout=30)
    # a service replica of three nodes on a pool of two is refused at submission, saying why
    wide = server.post("/v1/jobs", json={"yaml": service(tmp_path, num_nodes=3), "cwd": os.getcwd(),
                                         "environment": submitter_environment(os.environ, None)})
    assert wide.status_code == 422, wide.text
    assert "service replicas of 3 nodes each" in wide.text and "2 node(s) of the pool could hold a member" in wide.text


def test_bounds_outlive_a_server_restart(corral_home: Path, db_url: str, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from corral.api.app import create_app
    from corral.server import build_state
    from corral.settings import Settings

    settings = Settings(home=corral_home, db_url=db_url, poll_interval_s=0.2)
    try:
        with TestClient(create_app(state := build_state(settings)), headers=bearer(state, "alice")) as server:
            job_id = submit(server, service(tmp_path))["id"]
            wait_state(server, job_id, "RUNNING")
            assert scale(server, job_id, replicas=2).status_code == 200
            wait_for(lambda: len(live(server, job_id)) == 2, timeout=30)
        with TestClient(create_app(state := build_state(settings)), headers=bearer(state, "alice")) as server:
            task = task_of(server, job_id)
            assert (task["num_nodes"], task["min_nodes"], task["max_nodes"]) == (2, 2, 2)
            wait_for(lambda: len(live(server, job_id)) == 2, timeout=30)
            time.sleep(4)  # the new server's autoscaler, no load, four downscale delays
            assert task_of(server, job_id)["num_nodes"] == 2 and not events(server, job_id, "autoscaled")
            server.post(f"/v1/jobs/{job_id}/cancel")
            wait_state(server, job_id, "CANCELLED", timeout=30)
    finally:
        kill_leftovers(corral_home)


def test_the_corral_scale_command_says_what_a_count_and_bounds_do(corral_home: Path, tmp_path: Path) -> None:
    from conftest import cli_for

    corral = cli_for(corral_home)
    try:
        spec = tmp_path / "llm.yaml"
        spec.write_text(service(tmp_path))
        job_id = corral("launch", "-d", str(spec), check=True).stdout.strip()
        wait_for(lambda: json.loads(corral("status", job_id, "--json", check=True).stdout)["state"] == "RUNNING",
                 timeout=30)
        pinned = corral("scale", job_id, "llm", "2", check=True).stdout
        assert "autoscaled, so the count pins it: min = max = 2" in pinned and "--min N --max M" in pinned
        shown = corral("status", job_id, check=True).stdout
        assert "2 replica(s) within bounds 2..2, pinned" in shown
        room = corral("scale", job_id, "llm", "--min", "1", "--max", "3", check=True).stdout
        assert "llm now within bounds 1..3, at 2 replica(s) now" in room, room
        assert "within bounds 1..3, autoscaled" in corral("status", job_id, check=True).stdout
        nothing = corral("scale", job_id, "llm")
        assert nothing.returncode == 2 and "--min N" in nothing.stderr
        upside = corral("scale", job_id, "llm", "--min", "3", "--max", "1")
        assert upside.returncode == 2 and "min 3 replicas is above max 1" in upside.stderr
        assert "--min: task 'llm'" in upside.stderr and "body." not in upside.stderr  # the option, not the API's field
        corral("cancel", job_id, check=True)
    finally:
        corral.stop()


def test_a_fixed_service_takes_a_new_count_as_a_deployment_and_keeps_it_through_a_requeue(server, tmp_path: Path) -> None:
    # README's gang example: service.replicas 2 of num_nodes 2 (4 replicas); `corral scale JOB llm 6`
    (tmp_path / "serve.py").write_text(NAMED_SERVER)
    job_id = submit(server, f"""
name: llm
num_nodes: 2
resources: {{accelerators: H100:1}}
service: {{replicas: 2, readiness_probe: /, ports: 8080}}
run: exec {sys.executable} {tmp_path / 'serve.py'}
""")["id"]
    wait_state(server, job_id, "RUNNING")
    assert task_of(server, job_id)["num_nodes"] == 4
    odd = scale(server, job_id, replicas=5)
    assert odd.status_code == 422 and "multiple of 2" in odd.text
    none = scale(server, job_id, replicas=0)
    assert none.status_code == 422 and "at least 2 replicas (1 service replica(s) of 2 nodes each)" in none.text
    assert scale(server, job_id, replicas=6).status_code == 200
    wait_for(lambda: len(live(server, job_id)) == 6, timeout=30)
    assert task_of(server, job_id)["num_nodes"] == 6
    # a requeue starts it again at its new size, not at the file's
    assert server.post(f"/v1/jobs/{job_id}/requeue").status_code == 200
    wait_for(lambda: server.get(f"/v1/jobs/{job_id}").json()["requeues"] == 1 and len(live(server, job_id)) == 6,
             timeout=60)
    # a batch task of a fixed count is not a service: its count stays the file's
    batch = submit(server, "name: train\nnum_nodes: 1\nrun: sleep 60\n")["id"]
    wait_state(server, batch, "RUNNING")
    refused = server.post(f"/v1/jobs/{batch}/scale", json={"task": "train", "replicas": 2})
    assert refused.status_code == 422 and "is not elastic: its file fixes it at 1 replica " in refused.text


def test_a_replica_added_by_scale_that_finds_no_place_says_why(server, tmp_path: Path) -> None:
    (tmp_path / "serve.py").write_text(NAMED_SERVER)
    blocker = submit(server, "name: blocker\nresources: {accelerators: H100:4}\nrun: sleep 600\n")["id"]
    wait_state(server, blocker, "RUNNING")
    job_id = submit(server, f"""
name: llm
resources: {{accelerators: H100:2}}
service: {{replicas: 1, readiness_probe: /, ports: 8080}}
run: exec {sys.executable} {tmp_path / 'serve.py'}
""")["id"]
    wait_state(server, job_id, "RUNNING")
    assert scale(server, job_id, replicas=3).status_code == 200  # 4 GPUs left: room for two

    def waiting_one() -> dict | None:
        return next((r for r in task_of(server, job_id)["replicas"] if r["reason"]), None)

    waiting = wait_for(waiting_one, timeout=30)
    assert waiting["state"] == "PENDING" and waiting["reason"] == "waiting for a place (reason Resources)"
    assert wait_for(lambda: len(live(server, job_id)) == 2, timeout=30)
    # the reason goes once it has a place
    server.post(f"/v1/jobs/{blocker}/cancel")
    wait_for(lambda: len(live(server, job_id)) == 3, timeout=30)
    assert all(r["reason"] is None for r in task_of(server, job_id)["replicas"])
