"""The submission writer (group commit) on a real database: every acknowledged job is stored
exactly once; namesakes are all stored, within a batch as across batches, the first keeping its
name as its replicas' domain and each other getting ``NAME-ID`` (a singleton too,
an array's elements named apart); and a batch that fails is retried one job at a
time so a bad row sinks only itself.
Then the same promises over HTTP against a real server process: concurrent clients, rejected
specs among them, every acknowledged id stored once and seen by the control loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import replace
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from conftest import kill_leftovers, wait_for
from corral.api.intake import Intake
from corral.api.schemas import JobOut
from corral.control.records import record_of
from corral.credentials import read_local_token
from corral.spec import load_job
from corral.spec.models import TaskSpec
from corral.store.database import make_engine, migrate, session_factory
from corral.store.repository import NewJob
from corral.store.tables import Event, Job, Replica, Task


@pytest.fixture
def sessions(db_url: str):
    engine = make_engine(db_url)
    migrate(engine)
    yield session_factory(engine)
    engine.dispose()


def new(name: str, user: str = "ann", singleton: bool = False) -> NewJob:
    dep = "dependency: singleton\n" if singleton else ""
    return NewJob(load_job(f"name: {name}\nnum_nodes: 2\n{dep}run: echo\n").spec, user, account=user, qos="normal")


def test_concurrent_submissions_are_stored_once_each_and_namesakes_get_domains_of_their_own(sessions) -> None:
    handed: list[int] = []
    intake = Intake(sessions, lambda: 100.0, lambda row: handed.append(row.id))
    try:
        with ThreadPoolExecutor(16) as pool:
            unique = list(pool.map(lambda i: intake.submit(new(f"j{i}")).result(timeout=30), range(300)))
            same = list(pool.map(lambda _: intake.submit(new("dup")).result(timeout=30), range(40)))
    finally:
        intake.stop()
    ids = [row.id for row in unique]
    dups = sorted(row.id for row in same)
    assert len(set(ids)) == 300 and sorted(handed) == sorted(ids + dups)  # each handed to the loop once
    assert all(row.domain is None for row in unique)  # a name of its own: its replicas' domain
    # the first 'dup' keeps the name as its domain; every other has its id in its own
    assert {row.id: row.domain for row in same} == {dups[0]: None, **{i: f"dup-{i}" for i in dups[1:]}}
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(Job)) == 340
        assert s.scalar(select(func.count()).select_from(Replica)) == 680
        assert sorted(s.scalars(select(Job.id))) == sorted(ids + dups)
        assert dict(s.execute(select(Job.id, Job.domain).where(Job.name == "dup")).all()) == \
            {row.id: row.domain for row in same}  # stored as answered
    assert all(len(row.replicas) == 2 and all(r.id for r in row.replicas) for row in unique)


def test_a_namesake_singleton_included_gets_a_domain_of_its_own_other_users_keep_theirs(sessions) -> None:
    intake = Intake(sessions, lambda: 100.0, lambda row: None)
    try:
        first = intake.submit(new("train")).result(timeout=30)
        waiting = intake.submit(new("train", singleton=True)).result(timeout=30)
        bob = intake.submit(new("train", user="bob")).result(timeout=30)
        second = intake.submit(new("train")).result(timeout=30)
        # a job *named* as the second's domain: that domain is taken, so it gets one of its own
        named_so = intake.submit(new(f"train-{second.id}")).result(timeout=30)
    finally:
        intake.stop()
    # a singleton too: a namesake held when it started may be released and run beside it
    assert first.domain is None and waiting.domain == f"train-{waiting.id}"
    assert bob.domain is None  # names (and domains) are per user
    assert second.domain == f"train-{second.id}" and record_of(second).names_domain == second.domain
    assert named_so.domain == f"train-{second.id}-{named_so.id}"


def test_a_job_is_found_by_name_live_first_and_by_any_domain(sessions) -> None:
    """``corral status|cancel NAME`` means the live job of that name, not a newer one that ended;
    a domain (``NAME-ID``, or ``NAME.ID`` where a job is named ``NAME-ID``) finds its job."""
    from sqlalchemy import update

    from corral.store.repository import find_job

    intake = Intake(sessions, lambda: 100.0, lambda row: None)
    try:
        live = intake.submit(new("amb")).result(timeout=30)
        ended = intake.submit(new("amb")).result(timeout=30)
        first = intake.submit(new("nm")).result(timeout=30)
        # named as the next namesake's domain would be: that namesake's domain is then NAME.ID
        squatter = intake.submit(new(f"nm-{first.id + 2}")).result(timeout=30)
        dotted = intake.submit(new("nm")).result(timeout=30)
    finally:
        intake.stop()
    with sessions() as session:
        session.execute(update(Job).where(Job.id == ended.id).values(state="SUCCEEDED"))
        session.commit()
        assert find_job(session, "amb", "ann").id == live.id
        assert find_job(session, ended.domain, "ann").id == ended.id  # an ended job by its domain
        assert find_job(session, dotted.domain, "ann").id == dotted.id
        assert squatter.id == first.id + 1 and dotted.domain == f"nm.{dotted.id}"  # (ids in order)
        assert find_job(session, "nm", "ann").id == first.id  # its live holder, not the newest namesake


def test_a_name_ended_jobs_had_is_free_again_and_a_namesake_ahead_of_its_id_is_avoided(sessions) -> None:
    from corral.store.repository import active_domains
    from corral.runtime.discovery import choose_domain

    intake = Intake(sessions, lambda: 100.0, lambda row: None)
    try:
        first = intake.submit(new("run")).result(timeout=30)
        second = intake.submit(new("run")).result(timeout=30)
        with sessions() as s:
            s.execute(Job.__table__.update().where(Job.id == first.id).values(state="SUCCEEDED"))
            s.commit()
        third = intake.submit(new("run")).result(timeout=30)  # the plain name is free again
        fourth = intake.submit(new("run")).result(timeout=30)
        elements = intake.submit(*(replace(new("arr"), array_index=i, array_head=i == 0)  # an array of 3
                                   for i in range(3))).result(timeout=30)
    finally:
        intake.stop()
    assert second.domain == f"run-{second.id}" and third.domain is None and fourth.domain == f"run-{fourth.id}"
    assert [e.domain for e in elements] == [None, f"arr-{elements[1].id}", f"arr-{elements[2].id}"]
    assert {e.array_job_id for e in elements} == {elements[0].id}
    with sessions() as s:
        assert active_domains(s, ["run"], ["run"])["ann"] == {f"run-{second.id}": "run", "run": "run",
                                                              f"run-{fourth.id}": "run"}
    # a job named 'x-9' holds the domain that job 9 named 'x' would get: job 9 gets 'x.9', no name's
    assert choose_domain("x", 9, {"x": "x", "x-9": "x-9"}) == "x.9"
    assert choose_domain("x", 9, {"x": "x-3"}) == "x-9"  # held by another name's job


def test_a_failing_batch_is_retried_one_by_one_and_only_the_bad_job_fails(sessions, monkeypatch) -> None:
    from corral.store import repository

    real = repository.create_jobs
    gate = threading.Event()

    def create_jobs(session, jobs, now):
        gate.wait(5)  # let the whole burst queue up into one batch
        if any(j.spec.name == "poison" for j in jobs):
            raise RuntimeError("cannot store poison")
        return real(session, jobs, now)

    monkeypatch.setattr(repository, "create_jobs", create_jobs)
    intake = Intake(sessions, lambda: 100.0, lambda row: None)
    try:
        futures = [intake.submit(new(name)) for name in ("a", "b", "poison", "c")]
        gate.set()
        results = {}
        for name, future in zip(("a", "b", "poison", "c"), futures):
            try:
                results[name] = future.result(timeout=30)
            except RuntimeError as exc:
                results[name] = exc
    finally:
        intake.stop()
    assert isinstance(results["poison"], RuntimeError)
    assert all(not isinstance(results[n], Exception) for n in "abc")
    with sessions() as s:
        assert sorted(s.scalars(select(Job.name))) == ["a", "b", "c"]


def test_a_batch_failing_after_its_inserts_ran_leaves_no_trace_and_is_stored_once(sessions, monkeypatch) -> None:
    """The failure comes after the batch's rows were written (as a lost connection or a full
    disk would): the transaction rolls back whole, and the one-by-one retry stores each job
    once, hands each to the control loop once, and answers every request."""
    from corral.store import repository

    real = repository.create_jobs
    gate = threading.Event()
    failed: list[int] = []

    def create_jobs(session, jobs, now):
        gate.wait(5)
        rows = real(session, jobs, now)
        if len(jobs) > 1 and not failed:
            failed.append(len(jobs))
            raise RuntimeError("connection lost after the inserts")
        return rows

    monkeypatch.setattr(repository, "create_jobs", create_jobs)
    handed: list[int] = []
    intake = Intake(sessions, lambda: 100.0, lambda row: handed.append(row.id))
    try:
        futures = [intake.submit(new(f"f{i}")) for i in range(12)]
        gate.set()
        rows = [f.result(timeout=30) for f in futures]
    finally:
        intake.stop()
    assert failed and failed[0] > 1  # a real multi-job batch failed
    ids = [r.id for r in rows]
    assert len(set(ids)) == 12 and sorted(handed) == sorted(ids)
    with sessions() as s:
        assert sorted(s.scalars(select(Job.id))) == sorted(ids)
        assert s.scalar(select(func.count()).select_from(Replica)) == 24
        assert s.scalar(select(func.count()).select_from(Event)) == 12


def test_a_row_the_database_refuses_mid_batch_sinks_only_its_own_job(sessions, monkeypatch) -> None:
    """A real refusal by the database (NOT NULL) on the last insert of a batch, after its jobs,
    tasks and replicas went in (on PostgreSQL, inside the pipeline): the batch rolls back
    whole, the retry stores every other job once, and only the refused job's request fails."""
    from sqlalchemy.exc import IntegrityError

    from corral.store import repository

    real = repository._first_event
    monkeypatch.setattr(repository, "_first_event", lambda job, item, now: {
        **real(job, item, now), **({"cause": None} if job.name == "poison" else {})})
    gate = threading.Event()
    real_create = repository.create_jobs
    monkeypatch.setattr(repository, "create_jobs", lambda *a: gate.wait(5) and real_create(*a))
    handed: list[int] = []
    intake = Intake(sessions, lambda: 100.0, lambda row: handed.append(row.id))
    names = ["a", "b", "poison", "c", "d"]
    try:
        futures = [intake.submit(new(name)) for name in names]
        gate.set()
        results = {}
        for name, future in zip(names, futures):
            try:
                results[name] = future.result(timeout=30)
            except IntegrityError as exc:
                results[name] = exc
    finally:
        intake.stop()
    assert isinstance(results.pop("poison"), IntegrityError)
    ids = sorted(row.id for row in results.values())
    assert len(set(ids)) == 4 and sorted(handed) == ids
    with sessions() as s:
        assert sorted(s.scalars(select(Job.name))) == ["a", "b", "c", "d"]
        assert sorted(s.scalars(select(Job.id))) == ids
        assert s.scalar(select(func.count()).select_from(Replica)) == 8
        assert sorted(s.scalars(select(Event.job_id))) == ids


def test_stored_rows_carry_their_own_ids_and_the_validated_spec(sessions) -> None:
    """The ids handed back (PostgreSQL takes them from the sequences, SQLite from RETURNING)
    are the rows' own, and the control loop's record reuses the spec validated at submit."""
    group = load_job("name: g\nexecution: parallel\n---\nname: a\nnum_nodes: 3\nrun: echo\n"
                     "---\nname: b\nrun: echo\n").spec
    intake = Intake(sessions, lambda: 100.0, lambda row: None)
    try:
        rows = [f.result(timeout=30) for f in [intake.submit(new("one")),
                                               intake.submit(NewJob(group, "ann", account="ann", qos="normal")),
                                               intake.submit(new("two"))]]
    finally:
        intake.stop()
    with sessions() as s:
        for row in rows:
            tasks = s.execute(select(Task.id, Task.name).where(Task.job_id == row.id).order_by(Task.position)).all()
            assert [(t.id, t.name) for t in row.tasks] == [tuple(t) for t in tasks]
            replicas = s.execute(select(Replica.id, Replica.task, Replica.rank).where(Replica.job_id == row.id)).all()
            assert sorted((r.id, r.task, r.rank) for r in row.replicas) == sorted(tuple(r) for r in replicas)
            assert s.scalar(select(Event.cause).where(Event.job_id == row.id)) == "submitted"
    for row in rows:  # the answer, built without validation, is what validating it gives
        answer = JobOut.of(row)
        assert JobOut.model_validate_json(answer.model_dump_json()) == answer
    record = record_of(rows[1])
    assert [t.service for t in record.tasks] == list(group.tasks)
    assert record.tasks[0].service is group.tasks[0]  # not validated a second time
    assert all(TaskSpec.model_validate_json(json.dumps(t.spec)) == t.service for t in record.tasks)


def test_arrays_in_one_batch_are_each_named_by_their_first_element(sessions) -> None:
    """Array elements stored in the same batch as other jobs and another array: each element's
    array is its first element's id, in the rows handed back and in the database (PostgreSQL
    writes it with the pipelined inserts, SQLite after them)."""
    def array(name: str, indices: tuple[int, ...], throttle: int | None) -> list[NewJob]:
        spec = new(name).spec
        return [NewJob(spec, "ann", account="ann", qos="normal", array_index=index, array_throttle=throttle,
                       array_head=i == 0) for i, index in enumerate(indices)]

    gate = threading.Event()
    intake = Intake(sessions, lambda: 100.0, lambda row: gate.wait(5))  # the first batch waits: the rest queue up
    try:
        futures = [intake.submit(new("lone")), intake.submit(*array("sweep", (1, 3, 5), 2)),
                   intake.submit(new("between")), intake.submit(*array("grid", (0, 1), None))]
        gate.set()
        lone, sweep, between, grid = [f.result(timeout=30) for f in futures]
    finally:
        intake.stop()
    assert lone.array_job_id is None and between.array_job_id is None
    for elements, indices, throttle in ((sweep, [1, 3, 5], 2), (grid, [0, 1], None)):
        head = elements[0].id
        assert [e.array_job_id for e in elements] == [head] * len(indices)
        assert [e.array_index for e in elements] == indices and {e.array_throttle for e in elements} == {throttle}
        answer = JobOut.of(elements[-1])
        assert (answer.array_job_id, answer.array_index) == (head, indices[-1])
    with sessions() as s:
        stored = {r.id: (r.array_job_id, r.array_index, r.array_throttle)
                  for r in s.execute(select(Job.id, Job.array_job_id, Job.array_index, Job.array_throttle))}
    assert stored == {j.id: (j.array_job_id, j.array_index, j.array_throttle) for j in [lone, *sweep, between, *grid]}
    assert stored[sweep[2].id] == (sweep[0].id, 5, 2) and stored[lone.id] == (None, None, None)


# -- over HTTP, against a real server process ------------------------------------------------

@pytest.fixture
def live(corral_home: Path, db_url: str):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env |= {"CORRAL_HOME": str(corral_home), "CORRAL_DB_URL": db_url}
    cli = [sys.executable, "-m", "corral.cli.main"]
    subprocess.run(cli + ["server", "start"], env=env, check=True, capture_output=True, timeout=120)
    try:
        url = json.loads((corral_home / "server.json").read_text())["url"]
        owner = {"Authorization": f"Bearer {read_local_token(corral_home)}"}
        made = httpx.post(f"{url}/v1/tokens", json={"user": "alice", "note": "test"}, headers=owner, timeout=60)
        made.raise_for_status()
        yield url, {"Authorization": f"Bearer {made.json()['token']}"}  # alice, a user
    finally:
        subprocess.run(cli + ["server", "stop"], env=env, capture_output=True, timeout=120)
        kill_leftovers(corral_home)


GANG = "num_nodes: 2\nresources: {accelerators: H100:4}\nrun: sleep 60\n"  # the whole pool: one runs, the rest wait


def test_concurrent_http_submissions_are_stored_once_beside_rejected_neighbours(live: tuple[str, dict],
                                                                                db_url: str) -> None:
    url, alice = live
    requests: list[tuple[str, dict]] = []
    for i in range(96):
        requests.append(("ok", {"yaml": f"name: j{i}\n{GANG}"}))
        if i % 8 == 0:
            requests += [("yaml", {"yaml": f"name: y{i}\nrun: [unclosed\n"}),
                         ("field", {"yaml": f"name: t{i}\nnum_nodes: 1\nrn: echo\n"}),
                         ("admission", {"yaml": f"name: p{i}\n{GANG}", "scheduling": {"partition": "nope"}}),
                         ("dup", {"yaml": f"name: dup{i}\n{GANG}"}), ("dup", {"yaml": f"name: dup{i}\n{GANG}"})]
    local = threading.local()

    def send(item: tuple[str, dict]) -> tuple[str, dict, httpx.Response]:
        if not hasattr(local, "client"):
            local.client = httpx.Client(base_url=url, timeout=60, headers=alice)
        return item[0], item[1], local.client.post("/v1/jobs", json=item[1])

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(send, requests))
    acknowledged: list[int] = []
    for kind, body, response in answers:
        if kind == "ok":
            assert response.status_code == 201, response.text
            acknowledged.append(response.json()["job"]["id"])
        elif kind == "dup":  # both stored (as Slurm does), under replica domains of their own
            assert response.status_code == 201, response.text
            acknowledged.append(response.json()["job"]["id"])
        else:
            assert response.status_code == 422, response.text
            errors = response.json()["detail"]["errors"]
            if kind == "yaml":
                assert errors[0]["line"] == 2
            elif kind == "field":
                assert errors[0]["field"] == "rn" and errors[0]["line"] == 3
            else:
                assert errors[0]["field"] == "partition"
    dups = [r.json()["job"] for kind, _, r in answers if kind == "dup"]
    by_name: dict[str, list[dict]] = {}
    for job in sorted(dups, key=lambda j: j["id"]):
        by_name.setdefault(job["name"], []).append(job)
    assert all([j["domain"] for j in pair] == [name, f"{name}-{pair[1]['id']}"] for name, pair in by_name.items())
    assert len(acknowledged) == 96 + len(dups) and len(set(acknowledged)) == len(acknowledged)

    engine = make_engine(db_url)
    try:
        with session_factory(engine)() as s:
            stored = list(s.scalars(select(Job.id)))
            assert sorted(stored) == sorted(acknowledged)  # each acknowledged job once, nothing else
            per_job = dict(s.execute(select(Replica.job_id, func.count()).group_by(Replica.job_id)).all())
            assert all(per_job[i] == 2 for i in acknowledged)
            submitted = list(s.scalars(select(Event.job_id).where(Event.cause == "submitted")))
            assert sorted(submitted) == sorted(acknowledged)
    finally:
        engine.dispose()

    # the control loop heard of every one: one holds the pool, each other waits with a reason
    with httpx.Client(base_url=url, timeout=60, headers=alice) as client:
        def placed() -> list[dict] | None:
            jobs = client.get("/v1/jobs", params={"limit": 1000}).json()
            waiting = [j for j in jobs if j["state"] == "PENDING"]
            started = [j for j in jobs if j["state"] in ("STARTING", "RUNNING")]
            done = len(started) == 1 and len(waiting) == len(acknowledged) - 1 and \
                all(j["reason"] not in (None, "") for j in waiting)
            return jobs if done else None

        jobs = wait_for(placed, timeout=60)
    assert {j["user"] for j in jobs} == {"alice"}  # whom the token speaks for


def test_the_loop_is_told_a_submission_arrives_before_it_is_stored(sessions) -> None:
    """So executors can get ready for its start while it is stored (the local one warms the
    kernel's cgroup lock): the intake says so as the request comes in."""
    seen: list[int] = []

    def arriving() -> None:
        with sessions() as s:
            seen.append(s.scalar(select(func.count()).select_from(Job)))

    intake = Intake(sessions, lambda: 100.0, lambda row: None, arriving=arriving)
    try:
        intake.submit(new("a")).result(timeout=30)
        intake.submit(new("b")).result(timeout=30)
    finally:
        intake.stop()
    assert seen == [0, 1]  # once per submission, each before its own job was stored


def test_only_executors_that_anticipate_are_told() -> None:
    from types import SimpleNamespace

    from corral.control.loop import ControlLoop

    told: list[str] = []

    class Ready:
        def anticipate(self) -> None:
            told.append("ready")

    class Plain:
        pass

    ControlLoop.arriving(SimpleNamespace(inventory=SimpleNamespace(executors={"a": Ready(), "b": Plain()})))
    assert told == ["ready"]
