"""Housekeeping: ended jobs' logs and checkpoints go after the site's retention (records
stay), running jobs' files never do, and a log past its cap is rotated in place."""

from __future__ import annotations

from pathlib import Path

from corral.control.retention import Housekeeper, Retention, rotate
from corral.settings import Settings
from corral.spec import load_job
from sqlalchemy import update

from corral.store import repository
from corral.store.tables import Job
from corral.store.database import make_engine, migrate, session_factory


def test_ended_jobs_files_go_after_retention_and_running_ones_stay(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", db_url=f"sqlite:///{tmp_path / 'c.db'}")
    settings.ensure_dirs()
    engine = make_engine(settings.db_url)
    migrate(engine)
    sessions = session_factory(engine)
    now = 1_000_000.0
    spec = load_job("name: x\nrun: 'true'\n").spec
    ids = []
    with sessions() as s:
        for ended in (now - 40 * 86400, now - 3600, None):  # old, recent, still running
            job = repository.create_job(s, spec, "ann", now - 50 * 86400, account="ann", qos="normal")
            if ended is not None:
                s.execute(update(Job).where(Job.id == job.id)
                          .values(state="SUCCEEDED", ended_at=ended))
            ids.append(job.id)
        s.commit()
    for job_id in ids:
        (settings.logs_dir / str(job_id)).mkdir(parents=True)
        (settings.logs_dir / str(job_id) / "x-0.log").write_text("hi\n")
        (settings.checkpoints_dir / str(job_id)).mkdir(parents=True)
    keeper = Housekeeper(settings, sessions, Retention(logs_s=30 * 86400, checkpoints_s=float("inf")),
                         lambda: [], clock=lambda: now)
    keeper.sweep()
    assert [(settings.logs_dir / str(i)).exists() for i in ids] == [False, True, True]
    assert all((settings.checkpoints_dir / str(i)).exists() for i in ids)  # "off": kept for ever
    with sessions() as s:
        assert repository.load_job(s, ids[0]) is not None  # the record stays for accounting


def test_a_log_past_its_cap_is_rotated_and_the_writer_appends_at_the_new_end(tmp_path: Path) -> None:
    log = tmp_path / "r-0.log"
    with open(log, "ab", buffering=0) as writer:  # how a replica holds its log
        writer.write(b"x" * 2000)
        assert rotate(log, 1000)
        writer.write(b"after\n")
    assert (tmp_path / "r-0.log.1").read_bytes() == b"x" * 2000
    assert log.read_bytes() == b"after\n"
    assert not rotate(log, 1000)
