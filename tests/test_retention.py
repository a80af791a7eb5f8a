"""Housekeeping: ended jobs' logs and checkpoints go after the site's retention (records
stay), running jobs' files never do, and a log past its cap is rotated in place; the logs API
serves a rotated log whole (its rotated part first), tailed and followed."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from corral.control.retention import Housekeeper, Retention, rotate
from corral.settings import Settings
from corral.spec import load_job
from sqlalchemy import update

from corral.store import repository
from corral.store.tables import Job
from corral.store.database import make_engine, migrate, session_factory

ON_POSTGRESQL = True  # what the store keeps: checked on PostgreSQL too (conftest)


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


PAD = "x" * 80
ROTATING = """name: rot
envs: {{FLAG: {flag}}}
run: |
  seq -f "line%06g {pad}" 1 200000
  while [ ! -f "$FLAG" ]; do sleep 0.05; done
  seq -f "line%06g {pad}" 200001 200100
  sleep 60
"""


def _lines(first: int, last: int) -> str:
    return "".join(f"line{i:06d} {PAD}\n" for i in range(first, last + 1))


def test_the_logs_api_serves_a_rotated_log_whole_tailed_and_followed(corral_home: Path, tmp_path: Path,
                                                                      db_url: str) -> None:
    """18 MB are written at once, more than the socket buffers hold, so the reader following
    them is megabytes behind when the log is rotated: it must go on in the rotated copy."""
    from test_auth import Served

    server = Served(corral_home, tmp_path, db_url, [])
    try:
        flag = tmp_path / "go"
        job = server.admin.submit(ROTATING.format(flag=flag, pad=PAD))["job"]
        log = corral_home / "logs" / str(job["id"]) / "rot-0.log"
        auth = {"Authorization": server.admin.headers["Authorization"]}
        with httpx.Client(base_url=server.url, headers=auth, timeout=30) as http, \
                http.stream("GET", f"/v1/jobs/{job['id']}/logs", params={"follow": True}) as followed:
            first = len(_lines(1, 1))
            deadline = time.monotonic() + 60
            while not (log.exists() and log.stat().st_size == 200_000 * first):
                assert time.monotonic() < deadline, "the job did not write its first lines"
                time.sleep(0.05)
            time.sleep(0.5)  # the follower sends what the socket takes, then waits for the reader
            assert rotate(log, 0)  # copied to rot-0.log.1, truncated in place: as past its size cap
            flag.touch()
            seen = bytearray()
            chunks = followed.iter_bytes()
            while seen.count(b"\n") < 200_100:
                seen += next(chunks)
            # followed across the rotation, from megabytes behind it: nothing lost, nothing twice
            assert seen.decode() == _lines(1, 200_100)
            assert (corral_home / "logs" / str(job["id"]) / "rot-0.log.1").read_text() == _lines(1, 200_000)
            assert log.read_text() == _lines(200_001, 200_100)

            assert http.get(f"/v1/jobs/{job['id']}/logs").text == _lines(1, 200_100)
            assert http.get(f"/v1/jobs/{job['id']}/logs", params={"tail": 150}).text == _lines(199_951, 200_100)
            assert http.get(f"/v1/jobs/{job['id']}/logs", params={"tail": 7}).text == _lines(200_094, 200_100)
            # followed from a tail that reaches into the rotated part
            with http.stream("GET", f"/v1/jobs/{job['id']}/logs", params={"follow": True, "tail": 150}) as late:
                got, parts = b"", late.iter_bytes()
                while got.count(b"\n") < 150:
                    got += next(parts)
            assert got.decode() == _lines(199_951, 200_100)
        server.admin.cancel(job["id"])
    finally:
        server.stop()
