"""The bounded search for shorter-work victims (``attained.Victims``, ``Las.max_searches``):
the same plans as a search by every blocked job over every running job, where the bound is
not reached; no search at all by a job that could find no victim; at most ``max_searches``
searches per cycle."""

from __future__ import annotations

from dataclasses import replace
from unittest import mock

from hypothesis import given, settings, strategies as st

from corral.scheduler import Allocation, Policy, RunningJob, Snapshot, attained, preemption, schedule
from corral.scheduler.policy import Las
from tests.builders import job, node, task

NOW = 100_000.0
LAS = Las(thresholds_gpu_s=(3600.0, 8 * 3600.0), min_run_factor=3.0, min_run_s=600.0, max_preempted=2,
          promote_after=4.0)


def _policy(**kw) -> Policy:
    return Policy.named("corral", las=replace(LAS, **kw))


def _reference_of(self: attained.Victims, pending, claimed):
    """What every blocked job searched before the index: each running job through ``victim``."""
    return [r for r in self.running if not r.ending and r.id not in claimed
            and attained.victim(pending, r, self.policy, self.now)]


def _unbounded():
    """The search as it was: no job skipped, candidates from every running job."""
    original = attained.Victims.__init__

    def init(self, running, policy, now):
        original(self, running, policy, now)
        self.running = list(running)
    return (mock.patch.object(attained.Victims, "__init__", init),
            mock.patch.object(attained.Victims, "could", lambda self, j: 10**9),
            mock.patch.object(attained.Victims, "of", _reference_of))


@st.composite
def cycles(draw):
    """Three 8-GPU nodes filled in part by running jobs of random attained service, start,
    checkpointing and state, and a backlog of pending jobs of random size and past service."""
    running, jid = [], 1
    for n in range(3):
        gpu = 0
        while gpu < 8 and draw(st.booleans()):
            size = draw(st.integers(1, 8 - gpu))
            alloc = Allocation("main", 0, f"n{n}", tuple(range(gpu, gpu + size)), 0.0, 0.0)
            gpu += size
            state = draw(st.sampled_from(["run", "run", "run", "ending", "worn", "fresh"]))
            running.append(RunningJob(
                jid, (alloc,), NOW + draw(st.floats(60.0, 86400.0)), user=f"u{jid % 3}",
                started_at=NOW - (300.0 if state == "fresh" else draw(st.floats(700.0, 60_000.0))),
                preemptible=draw(st.booleans()) or state != "run", ending=state == "ending",
                preempted=2 if state == "worn" else 0, attained_gpu_s=draw(st.sampled_from([0.0, 5000.0, 40_000.0]))))
            jid += 1
    pending = []
    for k in range(draw(st.integers(1, 12))):
        p = job(100 + k, task(gpus=draw(st.integers(1, 16))), submitted_at=NOW - draw(st.floats(0.0, 50_000.0)))
        pending.append(replace(p, user=f"u{k % 3}", attained_gpu_s=draw(st.sampled_from([0.0, 0.0, 4000.0, 50_000.0]))))
    held = {f"n{n}": set() for n in range(3)}
    for r in running:
        held[r.allocations[0].node].update(r.allocations[0].gpus)
    nodes = tuple(node(n, gpus=8, free_gpus=set(range(8)) - g) for n, g in held.items())
    return Snapshot(nodes, tuple(pending), tuple(running))


def _same(a, b) -> None:
    assert a.starts == b.starts
    assert a.preemptions == b.preemptions
    assert a.reasons == b.reasons
    assert a.reserved_starts == b.reserved_starts


@settings(max_examples=150, deadline=None)
@given(cycles())
def test_the_plan_is_the_one_every_blocked_job_searching_every_running_job_gave(snapshot: Snapshot) -> None:
    policy = _policy()  # 12 pending jobs at most: the bound (100) is never reached
    bounded = schedule(snapshot, NOW, policy)
    patches = _unbounded()
    with patches[0], patches[1], patches[2]:
        reference = schedule(snapshot, NOW, policy)
    _same(bounded, reference)


def _counting():
    calls = []
    real = preemption.find

    def find(*args, **kw):
        calls.append(args[0].id)
        return real(*args, **kw)
    return calls, mock.patch.object(preemption, "find", find)


def test_a_backlog_that_could_stop_nothing_does_not_search() -> None:
    # every GPU is held by young (top-queue) work: no running job is below a new job's queue
    young = [RunningJob(i + 1, (Allocation("main", 0, f"n{i}", tuple(range(8)), 0.0, 0.0),), NOW + 3600.0,
                        user="a", started_at=NOW - 400.0, preemptible=True) for i in range(2)]
    backlog = tuple(job(100 + k, task(gpus=1 + k % 8), submitted_at=k) for k in range(300))
    nodes = tuple(node(f"n{i}", gpus=8, free_gpus=set()) for i in range(2))
    calls, patch = _counting()
    with patch:
        plan = schedule(Snapshot(nodes, backlog, tuple(young)), NOW, _policy())
    assert calls == [] and plan.preemptions == []
    # one old checkpointing job of 8 GPUs: the first blocked job takes it, and the other 299
    # then see nothing left to stop
    old = replace(young[1], started_at=0.0)
    calls, patch = _counting()
    with patch:
        plan = schedule(Snapshot(nodes, backlog, (young[0], old)), NOW, _policy())
    assert len(calls) == 1
    assert [(p.for_job, p.victims) for p in plan.preemptions] == [(calls[0], (2,))]


def test_at_most_max_searches_blocked_jobs_search_per_cycle() -> None:
    # five nodes each held by an old checkpointing 8-GPU job; five new 8-GPU jobs
    old = tuple(RunningJob(i + 1, (Allocation("main", 0, f"n{i}", tuple(range(8)), 0.0, 0.0),), NOW + 86400.0,
                           user="a", started_at=0.0, preemptible=True) for i in range(5))
    nodes = tuple(node(f"n{i}", gpus=8, free_gpus=set()) for i in range(5))
    pending = tuple(job(100 + k, task(gpus=8), submitted_at=NOW - 100 + k) for k in range(5))
    snap = Snapshot(nodes, pending, old)
    assert len(schedule(snap, NOW, _policy()).preemptions) == 5
    calls, patch = _counting()
    with patch:
        plan = schedule(snap, NOW, _policy(max_searches=2))
    assert calls == [100, 101] and [p.for_job for p in plan.preemptions] == [100, 101]
