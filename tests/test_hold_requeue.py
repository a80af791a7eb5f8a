"""Hold, release and requeue over the real HTTP API, a real control loop and real local
processes: a held job never starts however free the pool, an operator's hold binds its
owner, and a requeued job comes back under the same id, also across a server restart in the
middle of its stop (where the partition's own preempt mode would have cancelled it)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from conftest import POOL, bearer, kill_leftovers, submit, wait_for, wait_state

ON_POSTGRESQL = True  # what the store keeps: checked on PostgreSQL too (conftest)

# preempt_mode cancel: only the durable requeue wish can bring a stopped job back
SITE = POOL + """
partitions:
  - {name: batch, nodes: ["gpu-*"], preempt_mode: cancel}
operators: [olga]
"""


@pytest.fixture
def site_config() -> str:
    return SITE


def _events(server, job_id: int) -> list[str]:
    return [e["cause"] for e in server.get(f"/v1/jobs/{job_id}/events").json()]


def test_a_held_job_waits_with_a_free_pool_until_released(server, tmp_path: Path) -> None:
    hog = submit(server, "name: hog\nnum_nodes: 2\nresources: {accelerators: H100:4}\nrun: sleep 60\n")
    wait_state(server, hog["id"], "RUNNING")
    ran = tmp_path / "ran"
    job = submit(server, f"name: later\nresources: {{accelerators: H100:1}}\nrun: touch {ran}\n")
    held = server.post(f"/v1/jobs/{job['id']}/hold").json()
    assert held == {"id": job["id"], "changed": True, "state": "PENDING", "hold": "user", "message": f"job {job['id']} held",
                    "elements": None}
    assert server.post(f"/v1/jobs/{job['id']}/hold").json()["changed"] is False  # already held: no change
    server.post(f"/v1/jobs/{hog['id']}/cancel")
    wait_state(server, hog["id"], "CANCELLED")
    time.sleep(2.5)  # several cycles and a rescan of the store with every GPU free
    now = server.get(f"/v1/jobs/{job['id']}").json()
    assert now["state"] == "PENDING" and now["reason"] == "JobHeldUser" and now["hold"] == "user"
    assert not ran.exists()
    assert server.get("/v1/jobs", params={"state": "PENDING"}).json()[0]["reason"] == "JobHeldUser"
    released = server.post(f"/v1/jobs/{job['id']}/release").json()
    assert released["changed"] is True and released["hold"] == ""
    assert wait_state(server, job["id"], "SUCCEEDED")["hold"] == ""
    assert ran.exists()
    assert _events(server, job["id"])[:3] == ["submitted", "held", "released"]


def test_submitted_held_and_the_state_rules(server) -> None:
    job = submit(server, "name: h\nrun: 'true'\n", scheduling={"hold": True})
    assert job["reason"] == "JobHeldUser" and job["hold"] == "user"
    time.sleep(1.5)
    assert server.get(f"/v1/jobs/{job['id']}").json()["state"] == "PENDING"
    server.post(f"/v1/jobs/{job['id']}/release")
    wait_state(server, job["id"], "SUCCEEDED")
    # an ended job can be neither held nor requeued; releasing it changes nothing
    for action in ("hold", "requeue"):
        response = server.post(f"/v1/jobs/{job['id']}/{action}")
        assert response.status_code == 409 and "SUCCEEDED" in response.json()["detail"], response.text
    assert server.post(f"/v1/jobs/{job['id']}/release").json()["changed"] is False
    pending = submit(server, "name: p\nrun: 'true'\n", scheduling={"hold": True})
    response = server.post(f"/v1/jobs/{pending['id']}/requeue")
    assert response.status_code == 409 and "starting or running" in response.json()["detail"]
    assert server.post("/v1/jobs/99999/hold").status_code == 404
    server.post(f"/v1/jobs/{pending['id']}/cancel")


def test_an_operators_hold_binds_the_owner(server) -> None:
    job = submit(server, "name: theirs\nrun: 'true'\n", scheduling={"hold": True})  # alice's
    olga = bearer(server.state, "olga")
    held = server.post(f"/v1/jobs/{job['id']}/hold", headers=olga).json()
    assert held["changed"] is True and held["hold"] == "admin"
    assert server.get(f"/v1/jobs/{job['id']}").json()["reason"] == "JobHeldAdmin"
    refused = server.post(f"/v1/jobs/{job['id']}/release")
    assert refused.status_code == 403 and "operator" in refused.json()["detail"]
    again = server.post(f"/v1/jobs/{job['id']}/hold").json()  # the owner's hold never downgrades it
    assert again["changed"] is False and again["hold"] == "admin"
    assert server.post(f"/v1/jobs/{job['id']}/release", headers=olga).json()["changed"] is True
    wait_state(server, job["id"], "SUCCEEDED")


def test_requeue_a_running_job_keeps_its_id_and_counts_the_restart(server, tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    job = submit(server, f"""
name: again
grace_period: 5s
resources: {{accelerators: H100:2}}
run: |
  echo "$CORRAL_RESTART_COUNT $CORRAL_CHECKPOINT_DIR" >> {starts}
  trap 'exit 0' TERM
  while true; do sleep 0.05; done
""")
    wait_state(server, job["id"], "RUNNING")
    wait_for(lambda: starts.exists() and starts.read_text().count("\n") == 1)
    answer = server.post(f"/v1/jobs/{job['id']}/requeue").json()
    assert answer["changed"] is True
    wait_for(lambda: starts.read_text().count("\n") == 2, timeout=20)
    back = wait_state(server, job["id"], "RUNNING")
    assert back["id"] == job["id"] and back["requeues"] == 1
    assert back["tasks"][0]["replicas"][0]["restarts"] == 1
    first, second = starts.read_text().splitlines()
    assert first.split()[0] == "0" and second.split()[0] == "1"
    assert first.split()[1] == second.split()[1]  # the same checkpoint directory
    causes = _events(server, job["id"])
    assert causes.index("requeue_requested") < causes.index("requeue") < causes.index("requeued")
    server.post(f"/v1/jobs/{job['id']}/cancel")
    wait_state(server, job["id"], "CANCELLED")


def test_a_requeue_asked_for_survives_a_server_restart_mid_stop(corral_home: Path, db_url: str,
                                                                tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from corral.api.app import create_app
    from corral.server import build_state
    from corral.settings import Settings

    starts = tmp_path / "starts"
    settings = Settings(home=corral_home, db_url=db_url, poll_interval_s=0.2)
    try:
        with TestClient(create_app(state := build_state(settings)), headers=bearer(state, "alice")) as server:
            job = submit(server, f"""
name: stubborn
grace_period: 3s
run: |
  echo "$CORRAL_RESTART_COUNT" >> {starts}
  trap '' TERM
  while true; do sleep 0.05; done
""")
            wait_state(server, job["id"], "RUNNING")
            wait_for(lambda: starts.exists() and starts.read_text().count("\n") == 1)
            assert server.post(f"/v1/jobs/{job['id']}/requeue").json()["changed"] is True
            wait_state(server, job["id"], "PREEMPTED")  # stopping: TERM ignored, KILL in 3 s
        # the server is gone mid-stop; its replica is still alive; the next server takes over
        with TestClient(create_app(state := build_state(settings)), headers=bearer(state, "alice")) as server:
            back = wait_state(server, job["id"], "RUNNING", timeout=30)
            assert back["requeues"] == 1
            wait_for(lambda: starts.read_text().count("\n") == 2)
            assert starts.read_text().split() == ["0", "1"]
            assert "cancelled" not in " ".join(_events(server, job["id"]))
            server.post(f"/v1/jobs/{job['id']}/cancel")
            wait_state(server, job["id"], "CANCELLED", timeout=15)
    finally:
        kill_leftovers(corral_home)


def test_logs_tail(server, tmp_path: Path) -> None:
    job = submit(server, "name: chatty\nrun: 'for i in $(seq 1 500); do echo line $i; done; printf unfinished'\n")
    wait_state(server, job["id"], "SUCCEEDED")
    whole = server.get(f"/v1/jobs/{job['id']}/logs").text
    assert whole.splitlines()[0] == "line 1" and whole.splitlines()[-1] == "unfinished"
    last = server.get(f"/v1/jobs/{job['id']}/logs", params={"tail": 3}).text.splitlines()
    assert last == ["line 499", "line 500", "unfinished"]
    assert server.get(f"/v1/jobs/{job['id']}/logs", params={"tail": 0}).text == ""
    assert server.get(f"/v1/jobs/{job['id']}/logs", params={"tail": 10_000}).text == whole
    assert server.get(f"/v1/jobs/{job['id']}/logs", params={"tail": -1}).status_code == 422


def test_requeue_hold_stops_a_running_job_and_keeps_it_held(server, tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    job = submit(server, f"name: parked\nrun: |\n  echo x >> {starts}\n  trap 'exit 0' TERM\n"
                         "  while true; do sleep 0.05; done\n")
    wait_state(server, job["id"], "RUNNING")
    answer = server.post(f"/v1/jobs/{job['id']}/requeue", params={"hold": True}).json()
    assert answer["changed"] is True and answer["hold"] == "user"
    back = wait_state(server, job["id"], "PENDING", timeout=20)
    assert back["reason"] == "JobHeldUser" and back["requeues"] == 1
    time.sleep(1.5)  # a rescan and several cycles: it stays held
    assert server.get(f"/v1/jobs/{job['id']}").json()["state"] == "PENDING"
    assert starts.read_text().count("x") == 1
    server.post(f"/v1/jobs/{job['id']}/release")
    wait_state(server, job["id"], "RUNNING")
    wait_for(lambda: starts.read_text().count("x") == 2)
    server.post(f"/v1/jobs/{job['id']}/cancel")
    wait_state(server, job["id"], "CANCELLED")


def test_only_the_owner_or_an_operator_changes_a_job_and_names_are_per_user(server) -> None:
    mine = submit(server, "name: train\nrun: 'true'\n", scheduling={"hold": True})
    bobs = server.post("/v1/jobs", json={"yaml": "name: train\nrun: 'true'\n", "scheduling": {"hold": True}},
                       headers=bearer(server.state, "bob")).json()["job"]
    assert server.get("/v1/jobs/train").json()["id"] == mine["id"]  # alice's "train"
    assert server.get("/v1/jobs/train", headers=bearer(server.state, "bob")).json()["id"] == bobs["id"]
    for action in ("hold", "release", "requeue", "cancel"):
        refused = server.post(f"/v1/jobs/{bobs['id']}/{action}")
        detail = refused.json()["detail"]
        assert refused.status_code == 403 and "another user's job" in detail and "bob's" in detail, action
        assert "needs the operator role (you are alice, a user)" in detail
    assert server.post(f"/v1/jobs/{bobs['id']}/release", headers=bearer(server.state, "olga")).json()["changed"] is True
    for job in (mine, bobs):
        server.post(f"/v1/jobs/{job['id']}/cancel", headers=bearer(server.state, "olga"))


def test_many_concurrent_writes_neither_fail_nor_stall(server) -> None:
    from concurrent.futures import ThreadPoolExecutor

    job = submit(server, "name: busy\nrun: 'true'\n", scheduling={"hold": True})
    started = time.monotonic()
    with ThreadPoolExecutor(40) as pool:
        codes = list(pool.map(lambda i: server.post(f"/v1/jobs/{job['id']}/{'hold' if i % 2 else 'release'}").status_code,
                              range(160)))
    assert set(codes) <= {200, 409} and time.monotonic() - started < 20  # 409: released, it ran
    health = server.get("/v1/health").json()
    assert health["status"] == "ok"
    server.post(f"/v1/jobs/{job['id']}/cancel")


def test_a_requeued_elastic_job_comes_back_at_its_initial_size(server) -> None:
    job = submit(server, "name: el\nnum_nodes: {min: 1, max: 6, initial: 2}\nresources: {accelerators: H100:3}\n"
                         "run: |\n  trap 'exit 0' TERM\n  while true; do sleep 0.05; done\n")
    wait_state(server, job["id"], "RUNNING")
    assert server.post(f"/v1/jobs/{job['id']}/scale", json={"task": "el", "replicas": 4}).status_code == 200
    wait_for(lambda: len(server.get(f"/v1/jobs/{job['id']}").json()["tasks"][0]["replicas"]) == 4)
    assert server.post(f"/v1/jobs/{job['id']}/requeue").json()["changed"] is True
    back = wait_for(lambda: (lambda j: j if j["state"] == "RUNNING" and j["requeues"] == 1 else None)(
        server.get(f"/v1/jobs/{job['id']}").json()), timeout=30)
    assert back["tasks"][0]["num_nodes"] == 2
    live = [(r["rank"], r["state"]) for r in back["tasks"][0]["replicas"] if r["state"] != "KILLED"]
    assert live == [(0, "RUNNING"), (1, "RUNNING")]  # ranks 2 and 3 retired, as after a scale-down
    server.post(f"/v1/jobs/{job['id']}/cancel")
    wait_state(server, job["id"], "CANCELLED")


def test_an_owner_never_lifts_an_operators_hold_even_racing_it(server) -> None:
    from corral.store import repository

    job = submit(server, "name: raced\nrun: 'true'\n", scheduling={"hold": True})
    with server.state.sessions() as s:
        found = repository.find_job(s, str(job["id"]))
        assert repository.set_hold(s, found.id, "admin", 1.0, "olga") is True  # the operator's hold lands first
        # the owner's release, checked before the operator's hold landed, is still refused by the update
        assert repository.set_hold(s, found.id, "", 2.0, "alice", operator=False) is False
        assert repository.set_hold(s, found.id, "", 3.0, "olga", operator=True) is True
        s.commit()
    server.post(f"/v1/jobs/{job['id']}/cancel")
