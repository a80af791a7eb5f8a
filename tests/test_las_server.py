"""Preemption for shorter work (``scheduler.las``) over the real HTTP API, a real control
loop and real local processes on declared GPUs: a running job whose tasks declare
``preemptible: true`` is stopped with its grace period and requeued for a short job of the
same partition, its event says why, and it starts again (resumes) once the short job is done."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from conftest import POOL, submit, wait_for, wait_state
from corral.control.records import load_records
from corral.store.tables import Job

# one GPU-minute of attained service drops a job to the lower queue; no minimum run, so the
# test need not wait ten minutes
SITE = POOL + """
scheduler:
  policy: corral
  las: {thresholds: [1m], min_run: 0s, min_run_factor: 0, max_preempted: 1}
"""


@pytest.fixture
def site_config() -> str:
    return SITE


def test_a_preemptible_job_is_requeued_for_a_short_one_and_resumes(server, tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    long = submit(server, f"name: long\nnum_nodes: 2\nresources: {{accelerators: H100:4}}\npreemptible: true\n"
                          f"restart_cost: 0s\ngrace_period: 2s\nrun: echo start >> {starts}; sleep 120\n")
    wait_state(server, long["id"], "RUNNING")
    time.sleep(8.5)  # 8 GPUs x 8.5 s: past the one GPU-minute threshold
    done = tmp_path / "done"
    short = submit(server, f"name: short\nresources: {{accelerators: H100:4}}\nrun: touch {done}\n")
    wait_state(server, short["id"], "SUCCEEDED", timeout=90)
    assert done.exists()
    events = server.get(f"/v1/jobs/{long['id']}/events").json()
    stopped = next(e for e in events if e["cause"] == "preempted")
    assert stopped["message"].startswith("preempted for shorter work: attained ")
    assert re.fullmatch(rf"preempted for shorter work: attained \d+ GPU-min, job {short['id']} waited \d+ min; "
                        "it will be requeued", stopped["message"]), stopped["message"]
    # requeued under the same id, and started again: its run began a second time
    wait_state(server, long["id"], "RUNNING", timeout=60)
    wait_for(lambda: starts.read_text().count("start") == 4, timeout=60)  # 2 replicas, 2 attempts each
    # what it attained in its first attempt (8 GPUs for 8.5 s and more) is stored, not only
    # remembered: a server started now reads it back for the job's queue
    with server.state.sessions() as s:
        stored = s.get(Job, long["id"]).attained_gpu_s
        assert stored >= 8 * 8.5
        assert load_records(s, [long["id"]])[long["id"]].attained_gpu_s == stored
    server.post(f"/v1/jobs/{long['id']}/cancel")
    wait_state(server, long["id"], "CANCELLED", timeout=30)


def test_a_job_that_did_not_declare_it_is_never_stopped_for_shorter_work(server, tmp_path: Path) -> None:
    long = submit(server, "name: long\nnum_nodes: 2\nresources: {accelerators: H100:4}\ngrace_period: 2s\n"
                          "run: sleep 120\n")
    wait_state(server, long["id"], "RUNNING")
    time.sleep(8.5)
    short = submit(server, "name: short\nresources: {accelerators: H100:4}\nrun: 'true'\n")
    time.sleep(3.0)  # many cycles
    assert server.get(f"/v1/jobs/{long['id']}").json()["state"] == "RUNNING"
    assert server.get(f"/v1/jobs/{short['id']}").json()["state"] == "PENDING"
    server.post(f"/v1/jobs/{long['id']}/cancel")
    wait_state(server, short["id"], "SUCCEEDED", timeout=30)
