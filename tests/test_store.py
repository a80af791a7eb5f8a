"""The store on SQLite and (when CORRAL_TEST_DB_URL is set) PostgreSQL: migrations, job
creation, queries and the cancel request."""

from __future__ import annotations

from sqlalchemy import inspect

from corral.spec import load_job
from corral.store import repository
from corral.store.database import make_engine, migrate, session_factory

ON_POSTGRESQL = True  # what the store keeps: checked on PostgreSQL too (conftest)

GROUP = """
name: g
execution: parallel
primary_tasks: [a]
termination_delay: {default: 5s, b: 9s}
---
name: a
num_nodes: 2
resources: {accelerators: H100:2, cpus: 1, memory: 4}
run: echo a
---
name: b
run: echo b
"""


def test_migrations_create_the_schema_and_are_idempotent(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    migrate(engine)
    tables = set(inspect(engine).get_table_names())
    assert {"jobs", "tasks", "replicas", "events", "alembic_version"} <= tables


def test_create_find_list_and_cancel(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate(engine)
    sessions = session_factory(engine)
    spec = load_job(GROUP).spec
    with sessions() as s:
        job = repository.create_job(s, spec, "alice", 100.0)
        s.commit()
        job_id = job.id
    with sessions() as s:
        job = repository.find_job(s, str(job_id))
        assert job.name == "g" and job.user == "alice" and job.state == "PENDING" and job.is_group
        assert [(t.name, t.primary, t.termination_delay) for t in job.tasks] == [("a", True, 5.0), ("b", False, 9.0)]
        assert [(r.task, r.rank) for r in job.replicas] == [("a", 0), ("a", 1), ("b", 0)]
        assert job.tasks[0].gpus == 2 and job.tasks[0].gpu_type == "H100"
        assert repository.find_job(s, "g").id == job_id
        assert repository.find_job(s, "nope") is None
        other = repository.create_job(s, load_job("name: x\nrun: echo\n").spec, "bob", 101.0)
        s.commit()
        assert [j.id for j in repository.list_jobs(s)] == [job_id, other.id]
        assert [j.id for j in repository.list_jobs(s, user="bob")] == [other.id]
        assert repository.request_cancel(s, job.id, 102.0, "alice")
        assert not repository.request_cancel(s, job.id, 103.0, "alice")  # once
        s.commit()
        events = repository.job_events(s, job_id)
        assert [e.cause for e in events] == ["submitted", "cancel_requested"]
    with sessions() as s:
        assert repository.find_job(s, str(job_id)).cancel_requested_at == 102.0
