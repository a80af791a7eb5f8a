"""An elastic task that grows on its own (``num_nodes: {min, max, initial, grow: true}``) on a
real local server over the declared pool of 2 nodes x 4 GPUs: it starts at its initial size,
grows into the idle GPUs up to its max, gives back what it grew when a pending job needs the
GPUs (that job starts), and no GPU is ever held twice."""

from __future__ import annotations

import os
import threading
import time

import pytest

from conftest import POOL, submit, wait_for, wait_state

LOOP = "run: |\n  trap 'exit 0' TERM\n  while true; do sleep 0.05; done\n"


def live(server, job_id: int) -> list[dict]:
    job = server.get(f"/v1/jobs/{job_id}").json()
    return [r for t in job["tasks"] for r in t["replicas"] if r["state"] in ("STARTING", "RUNNING")]


def events(server, job_id: int) -> list[dict]:
    return server.get(f"/v1/jobs/{job_id}/events").json()


class Overcommit:
    """Watches every live replica of the given jobs while the test runs: a (node, GPU) held by
    two replicas at once is recorded."""

    def __init__(self, server, job_ids: list[int]):
        self.server, self.job_ids, self.seen, self.stop = server, job_ids, [], threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.stop.is_set():
            held: dict[tuple[str, int], str] = {}
            for job_id in list(self.job_ids):
                for r in live(self.server, job_id):
                    for gpu in r["gpus"]:
                        key = (r["node"], gpu)
                        if key in held:
                            self.seen.append((key, held[key], r["name"] if "name" in r else r["rank"]))
                        held[key] = f"{job_id}/{r['rank']}"
            self.stop.wait(0.1)

    def close(self) -> list:
        self.stop.set()
        self.thread.join(5)
        return self.seen


def test_a_growing_task_fills_idle_gpus_then_gives_them_back_to_a_pending_job(server) -> None:
    grower = submit(server, "name: grower\nnum_nodes: {min: 1, max: 6, initial: 2, grow: true}\n"
                            "resources: {accelerators: H100:1}\n" + LOOP)
    watch = Overcommit(server, [grower["id"]])
    try:
        wait_state(server, grower["id"], "RUNNING")
        # 8 GPUs, nothing else wants them: it grows to its max (6), not to 8
        wait_for(lambda: len(live(server, grower["id"])) == 6 and
                 all(r["state"] == "RUNNING" for r in live(server, grower["id"])), timeout=30)
        grew = [e for e in events(server, grower["id"]) if e["cause"] == "grew"]
        assert grew and "grew into idle GPUs" in grew[0]["message"]
        task = server.get(f"/v1/jobs/{grower['id']}").json()["tasks"][0]
        assert task["num_nodes"] == 6 and "grows on its own into idle GPUs" in task["scale"]  # corral status
        # a job of 4 GPUs: 2 are idle, the other 2 are lent to the grower, which gives them back
        other = submit(server, "name: other\nresources: {accelerators: H100:4}\n" + LOOP)
        watch.job_ids.append(other["id"])
        wait_state(server, other["id"], "RUNNING", timeout=40)
        shrunk = [e for e in events(server, grower["id"]) if e["cause"] == "shrunk"]
        assert shrunk and f"for job {other['id']}" in shrunk[-1]["message"]
        wait_for(lambda: len(live(server, grower["id"])) == 4, timeout=20)
        ranks = sorted(r["rank"] for r in live(server, grower["id"]))
        assert ranks == [0, 1, 2, 3]  # the highest ranks went
        # nothing is left idle to grow into, and it never goes below what it started with
        assert len(live(server, grower["id"])) + 4 <= 8
        # the other job ends: its GPUs are idle, but the grower was just shrunk for it, so it
        # waits its settle time (60 s) before growing again instead of thrashing
        server.post(f"/v1/jobs/{other['id']}/cancel")
        wait_state(server, other["id"], "CANCELLED")
        time.sleep(3.0)
        assert len(live(server, grower["id"])) == 4
        assert not [e for e in events(server, grower["id"]) if e["cause"] == "grew"][len(grew):]
    finally:
        overlaps = watch.close()
        for job in server.get("/v1/jobs").json():
            if job["state"] in ("PENDING", "STARTING", "RUNNING"):
                server.post(f"/v1/jobs/{job['id']}/cancel")
    assert overlaps == []


def test_a_task_that_did_not_ask_stays_at_its_size(server) -> None:
    job = submit(server, "name: still\nnum_nodes: {min: 1, max: 6, initial: 2}\nresources: {accelerators: H100:1}\n"
                         + LOOP)
    wait_state(server, job["id"], "RUNNING")
    wait_for(lambda: len([r for r in live(server, job["id"]) if r["state"] == "RUNNING"]) == 2)
    time.sleep(2.0)  # several passes
    assert len(live(server, job["id"])) == 2
    assert not [e for e in events(server, job["id"]) if e["cause"] == "grew"]
    server.post(f"/v1/jobs/{job['id']}/cancel")
    wait_state(server, job["id"], "CANCELLED")


def test_a_count_given_by_hand_caps_a_growing_task(server) -> None:
    """As a HorizontalPodAutoscaler would undo a bare `kubectl scale`, growth would undo a
    scale-down at once (stopping replicas only to start them again): the count caps it."""
    grower = submit(server, "name: capped\nnum_nodes: {min: 1, max: 6, initial: 2, grow: true}\n"
                            "resources: {accelerators: H100:1}\n" + LOOP)
    wait_for(lambda: len(live(server, grower["id"])) == 6, timeout=30)
    for count in (3, 1):
        done = server.post(f"/v1/jobs/{grower['id']}/scale", json={"task": "capped", "replicas": count})
        assert done.status_code == 200, done.text
        wait_for(lambda c=count: len(live(server, grower["id"])) == c, timeout=30)
        time.sleep(2.0)  # idle GPUs all around: it stays at the count
        assert len(live(server, grower["id"])) == count
        task = server.get(f"/v1/jobs/{grower['id']}").json()["tasks"][0]
        assert task["max_nodes"] == count, task
    grew = server.post(f"/v1/jobs/{grower['id']}/scale", json={"task": "capped", "max_nodes": 4})
    assert grew.status_code == 200, grew.text
    wait_for(lambda: len(live(server, grower["id"])) == 4, timeout=30)  # room again: it grows into it


@pytest.mark.parametrize("site_config", [POOL + "scheduler: {grow: false}\n"])
def test_a_site_without_growth_says_so_at_submission_and_the_task_keeps_its_count(server) -> None:
    from corral.spec.world import submitter_environment

    done = server.post("/v1/jobs", json={"yaml": "name: kept\nnum_nodes: {min: 1, max: 6, initial: 2, grow: true}\n"
                                                 "resources: {accelerators: H100:1}\n" + LOOP, "cwd": os.getcwd(),
                                         "environment": submitter_environment(os.environ, None)})
    assert done.status_code == 201, done.text
    assert any("grow is off on this site" in w for w in done.json()["warnings"]), done.json()
    job_id = done.json()["job"]["id"]
    wait_for(lambda: len(live(server, job_id)) == 2 and
             all(r["state"] == "RUNNING" for r in live(server, job_id)), timeout=30)
    time.sleep(1.5)
    assert len(live(server, job_id)) == 2
    # status says it too, not "grows on its own"
    scale = server.get(f"/v1/jobs/{job_id}").json()["tasks"][0]["scale"]
    assert "this site has growth off" in scale and "grows on its own" not in scale, scale


@pytest.mark.parametrize("site_config", ["nodes: [{name: cpu, count: 2, cpus: 2, memory: 4}]\n"])
def test_a_task_without_gpus_grows_into_idle_cpus_and_gives_them_back(server) -> None:
    grower = submit(server, "name: cpugrow\nnum_nodes: {min: 1, max: 4, initial: 1, grow: true}\n"
                            "resources: {cpus: 1}\n" + LOOP)
    wait_for(lambda: len(live(server, grower["id"])) == 4, timeout=30)  # every CPU of the pool
    grew = [e["message"] for e in events(server, grower["id"]) if e["cause"] == "grew"]
    assert grew and all("idle resources (CPUs, memory)" in m for m in grew), grew
    waiting = submit(server, "name: needs2\nresources: {cpus: 2}\nrun: echo ran\n")
    wait_state(server, waiting["id"], "SUCCEEDED", timeout=60)  # before, it waited for the grower's end
    shrunk = [e["message"] for e in events(server, grower["id"]) if e["cause"] == "shrunk"]
    assert shrunk and f"to make room for job {waiting['id']}" in shrunk[0], shrunk
