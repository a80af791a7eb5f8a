"""A job's long poll: ``GET /v1/jobs/{job}?wait=S`` with ``If-None-Match`` answers once the
job differs from the one last seen (its ``ETag``), or as it is after ``S`` seconds; the SDK's
``wait`` and ``corral launch`` use it instead of polling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import kill_leftovers, submit, wait_state

from corral.client import Client


def test_an_unchanged_job_is_answered_after_the_wait_a_changed_one_at_once(server) -> None:
    job = submit(server, "name: done\nrun: 'true'\n")
    wait_state(server, job["id"], "SUCCEEDED")
    first = server.get(f"/v1/jobs/{job['id']}")
    tag = first.headers["etag"]
    assert first.json()["state"] == "SUCCEEDED" and tag.startswith('"')
    again = server.get(f"/v1/jobs/{job['id']}")
    assert again.headers["etag"] == tag  # the same job, the same tag
    began = time.monotonic()
    held = server.get(f"/v1/jobs/{job['id']}", params={"wait": 0.6}, headers={"If-None-Match": tag})
    assert held.status_code == 200 and held.json() == first.json() and held.headers["etag"] == tag
    assert time.monotonic() - began >= 0.55  # nothing changed: held for the whole wait
    began = time.monotonic()
    stale = server.get(f"/v1/jobs/{job['id']}", params={"wait": 30}, headers={"If-None-Match": '"older"'})
    assert stale.json()["state"] == "SUCCEEDED" and time.monotonic() - began < 5  # it differs: at once
    began = time.monotonic()
    plain = server.get(f"/v1/jobs/{job['id']}", params={"wait": 30})  # nothing seen yet: at once
    assert plain.status_code == 200 and time.monotonic() - began < 5


def test_a_long_poll_answers_when_the_job_changes(server) -> None:
    job = submit(server, "name: slow\nrun: sleep 30\n")
    seen = server.get(f"/v1/jobs/{job['id']}")
    answered: dict = {}

    def poll() -> None:
        began = time.monotonic()
        response = server.get(f"/v1/jobs/{job['id']}", params={"wait": 40},
                              headers={"If-None-Match": seen.headers["etag"]})
        answered.update(response=response, after=time.monotonic() - began)

    waiter = threading.Thread(target=poll)
    waiter.start()
    time.sleep(0.3)
    assert server.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200
    waiter.join(timeout=30)
    assert not waiter.is_alive()
    assert answered["after"] < 20, answered["after"]  # not the 40 s wait: the change ended it
    assert answered["response"].headers["etag"] != seen.headers["etag"]
    assert answered["response"].json() != seen.json()


def test_polls_waiting_on_quiet_jobs_do_not_read_them_every_cycle(server, monkeypatch) -> None:
    """Only a cycle that wrote a waiter's job makes it read the job again: twenty polls on five
    ended jobs read each once in their three seconds, while the loop cycles on (a poll per
    cycle each was ~1 CPU-s a second for 300 of them)."""
    from corral.api.routes import jobs as routes

    ids = [submit(server, f"name: q{i}\nrun: 'true'\n")["id"] for i in range(5)]
    for job_id in ids:
        wait_state(server, job_id, "SUCCEEDED")
    tags = {job_id: server.get(f"/v1/jobs/{job_id}").headers["etag"] for job_id in ids}
    reads: list[str] = []
    real = routes._job_body
    monkeypatch.setattr(routes, "_job_body", lambda state, job, user: (reads.append(job), real(state, job, user))[1])
    busy = submit(server, "name: busy\nrun: 'for i in $(seq 30); do sleep 0.1; done'\n")  # cycles go on meanwhile
    began = time.monotonic()
    threads = [threading.Thread(target=lambda j=job_id: server.get(
        f"/v1/jobs/{j}", params={"wait": 3}, headers={"If-None-Match": tags[j]})) for job_id in ids for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert time.monotonic() - began >= 2.9
    assert sorted(reads) == sorted(str(j) for j in ids for _ in range(4)), reads  # each poll's first read only
    server.post(f"/v1/jobs/{busy['id']}/cancel")


def test_a_poll_by_name_stays_on_its_job_and_takes_weak_and_listed_tags(server) -> None:
    first = submit(server, "name: twin\nrun: sleep 30\n")
    wait_state(server, first["id"], "RUNNING")
    seen = server.get("/v1/jobs/twin")
    assert seen.json()["id"] == first["id"]
    answered: dict = {}

    def poll() -> None:
        began = time.monotonic()
        response = server.get("/v1/jobs/twin", params={"wait": 2},
                              headers={"If-None-Match": f'"other", W/{seen.headers["etag"]}'})
        answered.update(id=response.json()["id"], after=time.monotonic() - began)

    waiter = threading.Thread(target=poll)
    waiter.start()
    time.sleep(0.3)
    second = submit(server, "name: twin\nrun: sleep 30\n")  # the name now finds this one first
    waiter.join(timeout=20)
    assert answered["id"] == first["id"] and answered["after"] >= 1.9, answered
    for job in (first, second):
        server.post(f"/v1/jobs/{job['id']}/cancel")


@pytest.mark.parametrize("wait", ["-1", "61", "soon"])
def test_a_bad_wait_is_refused_naming_it(server, wait: str) -> None:
    job = submit(server, "name: w\nrun: 'true'\n")
    response = server.get(f"/v1/jobs/{job['id']}", params={"wait": wait}, headers={"If-None-Match": '"x"'})
    assert response.status_code == 422, response.text
    assert "wait" in response.text


def test_a_long_poll_of_no_job_is_refused_at_once(server) -> None:
    began = time.monotonic()
    response = server.get("/v1/jobs/999999", params={"wait": 30}, headers={"If-None-Match": '"x"'})
    assert response.status_code == 404 and "no job" in response.text
    assert time.monotonic() - began < 5


@pytest.fixture
def real_server(corral_home: Path) -> Iterator[tuple]:
    """A corral server process of ``corral_home``: (the CLI's argv, its environment, its URL,
    the owner's token); stopped, and its leftovers killed, at the end."""
    from corral.credentials import read_local_token

    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["CORRAL_HOME"] = str(corral_home)
    cli = [sys.executable, "-m", "corral.cli.main"]
    subprocess.run(cli + ["server", "start"], env=env, check=True, capture_output=True, timeout=120)
    try:
        url = json.loads((corral_home / "server.json").read_text())["url"]
        yield cli, env, url, read_local_token(corral_home)
    finally:
        subprocess.run(cli + ["server", "stop"], env=env, capture_output=True, timeout=120)
        kill_leftovers(corral_home)


def test_the_sdk_s_wait_answers_when_the_job_changes_not_at_its_next_poll(real_server) -> None:
    _, _, url, token = real_server
    with Client(url, token) as client:
        job = client.submit("name: nap\nrun: sleep 2\n")["job"]
        began = time.monotonic()
        # polled every 60 s this would answer after a minute; the long poll answers at the end
        done = client.wait(job["id"], timeout=50, interval=60)
        assert done["state"] == "SUCCEEDED"
        assert time.monotonic() - began < 20, time.monotonic() - began


def test_a_server_stopping_answers_its_long_polls_at_once(real_server, corral_home: Path) -> None:
    """They are answered (200, the job as it is), not cut off with a 500 when uvicorn's
    graceful shutdown ends, and the stop does not wait for them."""
    import httpx

    cli, env, url, token = real_server
    auth = {"Authorization": f"Bearer {token}"}
    try:
        with Client(url, token) as client:
            job = client.submit("name: long\nrun: sleep 120\n")["job"]
            client.wait(job["id"], states=("RUNNING",), timeout=60)
        tag = httpx.get(f"{url}/v1/jobs/{job['id']}", headers=auth).headers["etag"]
        answers: list = []

        def poll() -> None:
            began = time.monotonic()
            response = httpx.get(f"{url}/v1/jobs/{job['id']}", params={"wait": 60},
                                 headers={**auth, "If-None-Match": tag}, timeout=90)
            answers.append((response.status_code, response.json()["state"], time.monotonic() - began))

        pollers = [threading.Thread(target=poll) for _ in range(20)]
        for p in pollers:
            p.start()
        time.sleep(1.5)
        assert answers == []  # the job runs on, unchanged: they wait
        began = time.monotonic()
        subprocess.run(cli + ["server", "stop"], env=env, check=True, capture_output=True, timeout=120)
        for p in pollers:
            p.join(timeout=30)
        assert time.monotonic() - began < 10
        assert len(answers) == 20 and {(status, state) for status, state, _ in answers} == {(200, "RUNNING")}
        assert "Traceback" not in (corral_home / "server.log").read_text()
    finally:  # its job ended before the fixture stops the server again
        subprocess.run(cli + ["server", "start"], env=env, capture_output=True, timeout=120)
        subprocess.run(cli + ["cancel", "-n", "long"], env=env, capture_output=True, timeout=60)
