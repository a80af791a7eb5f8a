"""Run times learned from history, so the scheduler plans with what a job will likely take
rather than the time limit its user asked for.

Users' limits are several times the real run time and heavily rounded (Mu'alem & Feitelson,
TPDS 2001), so a scheduler that plans with them fills backfill windows badly and cannot tell a
ten-minute job from a ten-hour one with the same limit. Users repeat themselves, though: the
same person resubmits the same script with the same shape many times. Tsafrir, Etsion &
Feitelson (TPDS 2007) predict a job from its user's last two similar jobs and gain on both
wait and slowdown; Helios (SC '21) predicts from jobs of the same user and name on GPU
traces. ``DurationModel`` does the same, from the most specific history it has:

  1. the user's jobs of the same name and GPU count;
  2. the user's jobs of the same name;
  3. the user's jobs of the same GPU count;
  4. any of the user's jobs.

Each key keeps its last ``depth`` run times; the prediction is their mean in log space
(a geometric mean: one run twenty times longer than the rest moves it a little, not twenty
times), never above the job's own time limit (the job cannot run past it), never below a
minute. With no history at all there is no prediction and the scheduler plans with the limit,
as Slurm does.

``max_spread`` (``Policy.learn_spread``, a site knob) trusts a history only when it is
consistent: when the longest of the runs the prediction comes from is more than
``max_spread`` times the shortest, the job gets no prediction and is planned with its limit.
A user whose jobs of one shape run ten minutes one time and ten hours the next gives a
prediction that is wrong both ways; a short one lets the job slip into a backfill window in
front of a reservation it then delays (what learned run times lost on Philly windows).

A job that outlives its prediction is planned, from then on, with its time limit (Tsafrir's
correction): backfill must not keep treating a running job as about to end. ``planned_end``
says when that is.

The model is pure data and arithmetic: the control loop feeds it the jobs that ended (run
times of jobs that succeeded, or were stopped by their time limit), the simulator feeds it
its replayed completions. ``accuracy`` scores predictions against what happened, as
``corral acct`` and the simulator report it."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

MIN_PREDICTION_S = 60.0
DEPTH = 4


@dataclass
class DurationModel:
    depth: int = DEPTH
    max_spread: float = math.inf  # longest / shortest run of a history still trusted
    _history: dict[tuple, deque] = field(default_factory=dict)
    version: int = 0  # bumps on every observation: a cached prediction older than it may be stale

    def observe(self, user: str, name: str, gpus: int, run_s: float) -> None:
        """A job of ``user`` named ``name`` with ``gpus`` GPUs ran ``run_s`` seconds."""
        if not run_s > 0 or math.isinf(run_s):
            return
        value = math.log(max(run_s, 1.0))
        for key in _keys(user, name, gpus):
            runs = self._history.get(key)
            if runs is None:
                runs = self._history[key] = deque(maxlen=self.depth)
            runs.append(value)
        self.version += 1

    def predict(self, user: str, name: str, gpus: int, time_limit: float | None) -> float | None:
        """The expected run time in seconds, or None without history."""
        for key in _keys(user, name, gpus):
            runs = self._history.get(key)
            if runs:
                if self.max_spread != math.inf and (len(runs) < 2 or max(runs) - min(runs) > math.log(self.max_spread)):
                    return None  # one run, or runs too unlike each other: plan with the limit
                guess = max(MIN_PREDICTION_S, math.exp(sum(runs) / len(runs)))
                return min(guess, time_limit) if time_limit is not None else guess
        return None

    def __len__(self) -> int:
        return len(self._history)


def _keys(user: str, name: str, gpus: int) -> tuple[tuple, ...]:
    if name:
        return (("un", user, name, gpus), ("n", user, name), ("ug", user, gpus), ("u", user))
    return (("ug", user, gpus), ("u", user))


def planned_end(started_at: float, expected: float | None, time_limit: float | None, now: float) -> float:
    """When a running job is planned to give its resources back: at its predicted end while
    that is still ahead, else at its time limit (inf without one)."""
    if expected is not None and started_at + expected > now:
        return started_at + expected
    return started_at + time_limit if time_limit is not None else math.inf


@dataclass
class Accuracy:
    """How good predictions were: over the jobs that had one, the share within a factor of
    two of the real run time, the median ratio predicted / real, and the same for the users'
    time limits (what the scheduler would have planned with otherwise)."""

    jobs: int = 0
    within_2x: float = 0.0
    median_ratio: float = 0.0
    limit_within_2x: float = 0.0
    limit_median_ratio: float = 0.0

    def as_dict(self) -> dict:
        return {"jobs": self.jobs, "within_2x": round(self.within_2x, 4), "median_ratio": round(self.median_ratio, 3),
                "limit_within_2x": round(self.limit_within_2x, 4),
                "limit_median_ratio": round(self.limit_median_ratio, 3)}


def accuracy(rows: list[tuple[float, float, float | None]]) -> Accuracy:
    """``rows``: (predicted, real, time limit or None) per job that had a prediction."""
    rows = [r for r in rows if r[1] > 0 and r[0] > 0]
    if not rows:
        return Accuracy()
    ratios = sorted(p / real for p, real, _ in rows)
    near = sum(0.5 <= r <= 2.0 for r in ratios) / len(ratios)
    limited = sorted(limit / real for _, real, limit in rows if limit)
    return Accuracy(len(rows), near, _median(ratios),
                    sum(0.5 <= r <= 2.0 for r in limited) / len(limited) if limited else 0.0,
                    _median(limited) if limited else 0.0)


def _median(values: list[float]) -> float:
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2
