"""Run times the server learns from its own history (``scheduler.durations.DurationModel``), and
the prediction each job is given from them.

Users' time limits are several times their real run times, so a scheduler that plans with
them fills backfill windows badly. The server remembers how long each user's jobs really ran
and predicts a waiting job's run time from the same user's last runs of the same name and
GPU count (see ``durations`` for the fallbacks). Three moments matter:

* **start-up** (``seed``): the model is filled from the store's newest finished runs
  (``SEED_JOBS`` jobs that SUCCEEDED or hit their TIMEOUT, one bounded query on the
  ``(state, id)`` index), so a restarted server predicts at once; the predictions active jobs
  started with are read back (``recover``).
* **a job's end** (``ended``): its run time is kept aside and learned only once the cycle that
  ended it is committed (``committed``); a cycle whose writes are lost drops it (``lost``), and
  the job, ended again by the retried cycle, is learned then, once.
* **the scheduling pass** (``requests``): every pending job gets its prediction. The policy
  plans with it only when ``learn_durations`` is on (backfill windows, reservations, the
  job-size factor, running jobs' planned ends); either way it is published, so ``corral queue
  --start`` and the dashboard show it, and the prediction a job starts with is stored
  (``jobs.predicted_run_s``), which is what ``corral acct`` judges accuracy by.

Predictions are cached per job and recomputed only for users whose history changed since, so
a pass over 50,000 pending jobs costs a dictionary look-up each (``bench/runtimes.py``)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import replace

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from corral.control.journal import Journal
from corral.control.records import JobRec
from corral.scheduler import PendingJob
from corral.scheduler.durations import DurationModel
from corral.states import JobState
from corral.store.tables import Job, Task

SEED_JOBS = 10_000  # the newest finished runs read at start-up (0.3-0.5 s from a 100,000-job SQLite store)
LEARNED = (JobState.SUCCEEDED, JobState.TIMEOUT)  # a run that failed or was cancelled says little about the next
_REMEMBERED = 4096  # job ids recently learned from: a job's end is never learned twice

_ACTIVE = (JobState.STARTING.value, JobState.RUNNING.value, JobState.PREEMPTED.value)


def gpus_of(job: JobRec) -> int:
    """The GPUs a job asks for at once, all tasks together: the key its history is kept under."""
    return sum(t.num_nodes * t.gpus for t in job.tasks)


class RunTimes:
    def __init__(self, use: bool, model: DurationModel | None = None):
        self.use = use  # the policy plans with predictions (``Policy.learn_durations``)
        self.model = model if model is not None else DurationModel()  # (an empty model is falsy: it has a len)
        self.predictions: dict[int, float] = {}  # pending job -> its prediction, as of the last pass
        self.at_start: dict[int, float] = {}  # active job -> the prediction it started with
        # pending job -> (its request as the queue holds it, the prediction, the request scheduled)
        self._given: dict[int, tuple[PendingJob, float | None, PendingJob]] = {}
        # pending jobs whose prediction changed at the last pass: their priority (the job-size
        # factor plans with it) is computed again instead of reused
        self.rescored: list[int] = []
        self._changed: set[str] = set()  # users learned from since the last pass
        self._ending: dict[int, tuple[str, str, int, float]] = {}  # ended this cycle, not yet committed
        self._learned: deque[int] = deque(maxlen=_REMEMBERED)
        self._learned_ids: set[int] = set()

    # -- history ------------------------------------------------------------------------------
    def seed(self, s: Session, limit: int = SEED_JOBS) -> int:
        """Learn from the store's newest ``limit`` finished runs (oldest first, so the newest
        stay in each key's window); how many were read."""
        newest = (select(Job.id).where(Job.state.in_([state.value for state in LEARNED]),
                                       Job.started_at.is_not(None), Job.ended_at.is_not(None))
                  .order_by(Job.id.desc()).limit(limit).subquery())
        gpus = (select(Task.job_id, func.sum(Task.num_nodes * Task.gpus).label("gpus"))
                .where(Task.job_id.in_(select(newest.c.id))).group_by(Task.job_id).subquery())
        rows = s.execute(select(Job.id, Job.user, Job.name, Job.started_at, Job.ended_at, gpus.c.gpus)
                         .join(gpus, gpus.c.job_id == Job.id).order_by(Job.id)).all()
        for row in rows:  # (ended already: none of them ends again, so none is remembered)
            self.model.observe(row.user, row.name, int(row.gpus or 0), row.ended_at - row.started_at)
        self._changed.clear()
        self._given.clear()
        return len(rows)

    def recover(self, s: Session, active: Iterable[int]) -> None:
        """The predictions the active jobs started with, read back from the store (after a
        restart, or a cycle whose writes were lost)."""
        ids = list(active)
        self.at_start = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            for job_id, predicted in s.execute(select(Job.id, Job.predicted_run_s).where(
                    Job.id.in_(chunk), Job.state.in_(_ACTIVE), Job.predicted_run_s.is_not(None))):
                self.at_start[job_id] = predicted

    def ended(self, job: JobRec, state: JobState, now: float) -> None:
        """A job is over: a run that succeeded or met its time limit is kept to learn from
        once the cycle that ended it is committed."""
        self.at_start.pop(job.id, None)
        if state in LEARNED and job.started_at is not None and now > job.started_at:
            self._ending[job.id] = (job.user, job.name, gpus_of(job), now - job.started_at)

    def committed(self) -> None:
        """The cycle's writes are durable: learn from the runs it ended."""
        if not self._ending:
            return
        ending, self._ending = self._ending, {}
        for job_id, (user, name, gpus, run_s) in ending.items():
            if job_id in self._learned_ids:
                continue
            self.model.observe(user, name, gpus, run_s)
            self._remember(job_id)
            self._changed.add(user)

    def lost(self) -> None:
        """The cycle's writes were lost: what it ended has not ended yet."""
        self._ending.clear()

    def _remember(self, job_id: int) -> None:
        if len(self._learned) == self._learned.maxlen:
            self._learned_ids.discard(self._learned[0])
        self._learned.append(job_id)
        self._learned_ids.add(job_id)

    # -- predictions ----------------------------------------------------------------------------
    def predict(self, job: JobRec) -> float | None:
        """A job's expected run time from its user's history, at most its time limit; None
        without history, or for a pipeline's later stage (its run so far already counts)."""
        if job.started_at is not None:
            return None
        return self.model.predict(job.user, job.name, gpus_of(job), job.time_limit)

    def requests(self, jobs: Iterable[JobRec]) -> list[PendingJob]:
        """What the scheduler reads of the pending jobs: each job's request, carrying its
        prediction when the policy plans with them; ``predictions`` is renewed beside it."""
        given, changed, use = self._given, self._changed, self.use
        fresh: dict[int, tuple[PendingJob, float | None, PendingJob]] = {}
        shown: dict[int, float] = {}
        out, rescored = [], []
        for job in jobs:
            base = job.request
            cached = given.get(job.id)
            if cached is None or cached[0] is not base or job.user in changed:
                guess = self.predict(job)
                if cached is not None and cached[0] is base and cached[1] == guess:
                    pass  # the user's history moved, not this job's prediction: its request stands
                else:
                    if cached is not None and cached[1] != guess and use:
                        rescored.append(job.id)
                    scheduled = replace(base, expected=guess) if use and guess is not None else base
                    cached = (base, guess, scheduled)
            fresh[job.id] = cached
            if cached[1] is not None:
                shown[job.id] = cached[1]
            out.append(cached[2])
        self._given, self.predictions, self.rescored = fresh, shown, rescored
        changed.clear()
        return out

    def started(self, job: JobRec, journal: Journal) -> None:
        """A job the scheduler starts keeps the prediction it starts with (in the store too:
        accuracy is judged by what the scheduler knew then). A pipeline's later stage keeps
        the one its first stage started with."""
        if job.started_at is not None:
            return
        guess = self.predictions.get(job.id)
        if guess is None:
            self.at_start.pop(job.id, None)
        else:
            self.at_start[job.id] = guess
        journal.job(job.id, predicted_run_s=guess)

    def planned_end(self, job: JobRec, limit_end: float, now: float) -> tuple[float, float | None]:
        """A running job's (expected end, latest end) for the scheduler: its predicted end
        while that is ahead and the policy plans with predictions, else its time limit's end
        alone (a job past its prediction is planned to its limit: Tsafrir's correction)."""
        guess = self.at_start.get(job.id) if self.use else None
        if guess is None:
            return limit_end, None
        end = (job.started_at if job.started_at is not None else now) + guess
        if end <= now or end >= limit_end:
            return limit_end, None
        return end, limit_end

