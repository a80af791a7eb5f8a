"""The submission writer (group commit) on a real database: every acknowledged job is stored
exactly once, names clash within a batch as across batches, a singleton waits instead of
clashing, and a batch that fails is retried one job at a time so a bad row sinks only itself."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import func, select

from corral.api.intake import Clash, Intake
from corral.spec import load_job
from corral.store.database import make_engine, migrate, session_factory
from corral.store.repository import NewJob
from corral.store.tables import Job, Replica


@pytest.fixture
def sessions(db_url: str):
    engine = make_engine(db_url)
    migrate(engine)
    yield session_factory(engine)
    engine.dispose()


def new(name: str, user: str = "ann", singleton: bool = False) -> NewJob:
    dep = "dependency: singleton\n" if singleton else ""
    return NewJob(load_job(f"name: {name}\nnum_nodes: 2\n{dep}run: echo\n").spec, user, account=user, qos="normal")


def test_concurrent_submissions_are_stored_once_each_and_names_clash_exactly_once(sessions) -> None:
    handed: list[int] = []
    intake = Intake(sessions, lambda: 100.0, lambda row: handed.append(row.id))
    try:
        with ThreadPoolExecutor(16) as pool:
            unique = list(pool.map(lambda i: intake.submit(new(f"j{i}")).result(timeout=30), range(300)))
            same = list(pool.map(lambda _: intake.submit(new("dup")).result(timeout=30), range(40)))
    finally:
        intake.stop()
    ids = [row.id for row in unique]
    winners = [r for r in same if not isinstance(r, Clash)]
    assert len(winners) == 1  # one 'dup' is stored; every other names it
    assert len(set(ids)) == 300 and sorted(handed) == sorted(ids + [winners[0].id])  # each handed to the loop once
    assert {r.job_id for r in same if isinstance(r, Clash)} == {winners[0].id}
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(Job)) == 301
        assert s.scalar(select(func.count()).select_from(Replica)) == 602
        assert sorted(s.scalars(select(Job.id))) == sorted(ids + [winners[0].id])
    assert all(len(row.replicas) == 2 and all(r.id for r in row.replicas) for row in unique)


def test_a_singleton_is_stored_beside_its_namesake_and_other_users_do_not_clash(sessions) -> None:
    intake = Intake(sessions, lambda: 100.0, lambda row: None)
    try:
        first = intake.submit(new("train")).result(timeout=30)
        waiting = intake.submit(new("train", singleton=True)).result(timeout=30)
        bob = intake.submit(new("train", user="bob")).result(timeout=30)
        clash = intake.submit(new("train")).result(timeout=30)
    finally:
        intake.stop()
    assert not isinstance(waiting, Clash) and not isinstance(bob, Clash)
    assert clash == Clash(first.id)


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
