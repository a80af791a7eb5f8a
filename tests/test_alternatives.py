"""Resource alternatives (SkyPilot's accelerator lists and sets, ``any_of`` and ``ordered``):
every written form reads to the same normal form, the scheduler places a job on the first
alternative that fits (limits included), never overcommits with them, and a job is refused
only when none could ever run."""

from __future__ import annotations

from collections import defaultdict

import pytest
from builders import node, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.scheduler import PendingJob, Policy, TaskRequest, schedule
from corral.scheduler.plan import Reason
from corral.scheduler.snapshot import RunningJob
from corral.spec import load_job


def resources_of(text: str):
    return load_job(text).spec.tasks[0].resources


@pytest.mark.parametrize("written, options, in_order", [
    ("accelerators: H100:8", [("H100", 8)], True),
    ("accelerators: {H100: 8}", [("H100", 8)], True),
    ("accelerators: {H100:8}", [("H100", 8)], True),
    ("accelerators: [A100:8, H100:8]", [("A100", 8), ("H100", 8)], True),
    ("accelerators: {A100:8, H100:4}", [("A100", 8), ("H100", 4)], False),
    ("accelerators: {A100: 8, H100: 4}", [("A100", 8), ("H100", 4)], False),
    ("accelerators: [L4, {A10g: 2}]", [("L4", 1), ("A10g", 2)], True),
    ("any_of: [{accelerators: A100:8}, {accelerators: H100:4, cpus: 16}]", [("A100", 8), ("H100", 4)], False),
    ("ordered: [{accelerators: A100:8}, {accelerators: H100:4}]", [("A100", 8), ("H100", 4)], True),
])
def test_every_written_form_reads_and_round_trips(written: str, options, in_order: bool) -> None:
    resources = resources_of(f"resources:\n  {written}\nrun: x\n")
    assert [a.accelerators for a in resources.alternatives] == options
    assert resources.in_order is in_order and resources.accelerators == options[0]
    spec = load_job(f"resources:\n  {written}\nrun: x\n").spec
    stored = type(spec).model_validate_json(spec.model_dump_json())
    assert stored.tasks[0].resources == resources  # the stored normal form reads back to itself


def test_any_of_entries_inherit_the_tasks_own_fields() -> None:
    resources = resources_of("resources:\n  cpus: 8\n  memory: 32\n  any_of:\n    - {accelerators: A100:2}\n"
                             "    - {accelerators: H100:1, cpus: 16}\nrun: x\n")
    assert [(a.accelerators, a.cpus, a.memory) for a in resources.alternatives] == [
        (("A100", 2), 8.0, 32.0), (("H100", 1), 16.0, 32.0)]


@pytest.mark.parametrize("written, field, words", [
    ("accelerators: []", "resources", "no alternative"),
    ("any_of: []", "resources", "non-empty list"),
    ("accelerators: [A100:8]\n  any_of: [{cpus: 2}]", "resources", "not both"),
    ("any_of: [{accelerators: A100:1}]\n  ordered: [{accelerators: A100:1}]", "resources", "any_of or ordered"),
    ("any_of: [{accelerators: A100:1}, {acelerators: H100:1}]", "resources.any_of[1].acelerators", "accelerators"),
    ("any_of: [A100:1, H100:1]", "resources", "a mapping"),
    ("accelerators: [A100:1, [H100:1]]", "resources", "one accelerator"),
])
def test_bad_alternatives_name_the_field(written: str, field: str, words: str) -> None:
    from corral.spec import SpecError

    with pytest.raises(SpecError) as caught:
        load_job(f"name: t\nresources:\n  {written}\nrun: x\n")
    issue = caught.value.issues[0]
    assert issue.field.startswith(field) and words in issue.message, issue
    assert issue.line is not None


def choice_job(job_id: int, options, in_order: bool = True, replicas: int = 1, submitted_at: float = 0.0,
               user: str = "", qos: str = "") -> PendingJob:
    gpus, cpus, memory, gpu_type = options[0]
    return PendingJob(job_id, (TaskRequest("main", replicas, gpus, cpus, memory, gpu_type,
                                           alternatives=tuple(options), in_order=in_order),), submitted_at, user=user,
                      qos=qos)


A100_4, H100_4, H100_2 = (4, 1.0, 0.0, "A100"), (4, 1.0, 0.0, "H100"), (2, 1.0, 0.0, "H100")


def test_the_first_alternative_that_fits_wins() -> None:
    both = [node("a", gpus=4, gpu_type="A100"), node("h", gpus=4, gpu_type="H100")]
    (start,) = schedule(snapshot(both, [choice_job(1, [A100_4, H100_4])]), 0).starts
    assert start.choice == (0,) and start.allocations[0].node == "a"
    (start,) = schedule(snapshot(both[1:], [choice_job(1, [A100_4, H100_4])]), 0).starts
    assert start.choice == (1,) and start.allocations[0].node == "h" and len(start.allocations[0].gpus) == 4
    busy_a = [node("a", gpus=4, gpu_type="A100", free_gpus=set()), both[1]]
    (start,) = schedule(snapshot(busy_a, [choice_job(1, [A100_4, H100_4])]), 0).starts
    assert start.choice == (1,)


def test_a_job_without_alternatives_carries_no_choice() -> None:
    (start,) = schedule(snapshot([node("h", gpus=4)], [choice_job(1, [H100_4])]), 0).starts
    assert start.choice == ()


def test_limits_hold_per_alternative() -> None:
    policy = Policy.named("corral")
    from dataclasses import replace

    from corral.scheduler.policy import Qos

    policy = replace(policy, qos=(Qos("normal", max_gpus_per_user=2),))
    pool = [node("h", gpus=8, gpu_type="H100")]
    (start,) = schedule(snapshot(pool, [choice_job(1, [H100_4, H100_2], user="u", qos="normal")]), 0, policy).starts
    assert start.choice == (1,) and len(start.allocations[0].gpus) == 2
    plan = schedule(snapshot(pool, [choice_job(1, [H100_4, (3, 1.0, 0.0, "H100")], user="u", qos="normal")]), 0, policy)
    assert not plan.starts and plan.reasons[1] is Reason.QOS_USER_GPUS


def test_no_alternative_fitting_now_reserves_in_order_or_the_earliest() -> None:
    pool = [node("a", gpus=4, gpu_type="A100", free_gpus=set()), node("h", gpus=4, gpu_type="H100", free_gpus=set())]
    from corral.scheduler.plan import Allocation

    running = (RunningJob(90, (Allocation("x", 0, "a", (0, 1, 2, 3), 1.0, 0.0),), expected_end=1000.0),
               RunningJob(91, (Allocation("x", 0, "h", (0, 1, 2, 3), 1.0, 0.0),), expected_end=100.0))
    for in_order, expected in ((True, 1000.0), (False, 100.0)):
        snap = snapshot(pool, [choice_job(1, [A100_4, H100_4], in_order=in_order)])
        snap = type(snap)(snap.nodes, snap.pending, running)
        plan = schedule(snap, 0, Policy.named("corral"))  # backfill: reservations
        assert not plan.starts and plan.reasons[1] is Reason.RESOURCES
        assert plan.reserved_starts[1] == expected
        assert plan.reserved_on[1][0].node == ("a" if in_order else "h")


def test_a_missing_type_in_one_alternative_is_not_the_reason_when_another_exists() -> None:
    pool = [node("h", gpus=4, gpu_type="H100", free_gpus={0})]
    plan = schedule(snapshot(pool, [choice_job(1, [(1, 1.0, 0.0, "B200"), H100_2])]), 0)
    assert plan.reasons[1] is Reason.RESOURCES


option_strategy = st.tuples(st.integers(0, 8), st.sampled_from([0.5, 1.0, 4.0]), st.just(0.0),
                            st.sampled_from(["H100", "A100", None]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 8), st.sampled_from(["H100", "A100"])), min_size=1, max_size=5),
       st.lists(st.tuples(st.lists(option_strategy, min_size=1, max_size=3), st.integers(1, 3), st.booleans()),
                min_size=1, max_size=8))
def test_alternatives_never_overcommit_and_start_one_whole_alternative(pool_spec, job_specs) -> None:
    nodes = [node(f"n{i}", gpus=g, cpus=8, gpu_type=t) for i, (g, t) in enumerate(pool_spec)]
    jobs = [choice_job(i + 1, options, in_order, replicas) for i, (options, replicas, in_order) in enumerate(job_specs)]
    plan = schedule(snapshot(nodes, jobs), 0)
    by_name = {n.name: n for n in nodes}
    used: dict[str, set[int]] = defaultdict(set)
    cpus: dict[str, float] = defaultdict(float)
    for start in plan.starts:
        pending = jobs[start.job_id - 1]
        options = pending.tasks[0].alternatives
        index = start.choice[0] if start.choice else 0
        gpus, _, _, gpu_type = options[index]
        assert len(start.allocations) == pending.tasks[0].replicas  # the whole gang, one alternative
        for a in start.allocations:
            assert len(a.gpus) == gpus
            if gpus and gpu_type:
                assert by_name[a.node].gpu_type == gpu_type
            assert not used[a.node] & set(a.gpus)
            used[a.node] |= set(a.gpus)
            cpus[a.node] += a.cpus
            assert cpus[a.node] <= 8 + 1e-6
    assert plan.started_ids() | set(plan.reasons) == {j.id for j in jobs}


def test_a_job_runs_on_the_alternative_the_pool_has(server, tmp_path) -> None:
    from conftest import wait_state

    out = tmp_path / "gpus"
    response = server.post("/v1/jobs", json={"yaml": f"name: alt\nresources:\n  accelerators: [B200:1, H100:2]\n"
                                                     f"run: echo $CUDA_VISIBLE_DEVICES > {out}\n"})
    assert response.status_code == 201, response.text
    assert response.json()["warnings"] == []
    job = response.json()["job"]
    assert job["tasks"][0]["alternatives"] == 2 and job["tasks"][0]["alternative"] is None
    done = wait_state(server, job["id"], "SUCCEEDED")
    task = done["tasks"][0]
    assert (task["gpu_type"], task["gpus"], task["alternative"]) == ("H100", 2, 2)
    assert done["gpus"] == 2 and len(out.read_text().strip().split(",")) == 2
    scheduled = next(e for e in server.get(f"/v1/jobs/{job['id']}/events").json() if e["cause"] == "scheduled")
    assert "alt on H100:2 (alternative 2 of 2)" in scheduled["message"]
    never = server.post("/v1/jobs", json={"yaml": "resources:\n  any_of: [{accelerators: B200:1}, {accelerators: A100:1}]\n"
                                                  "run: x\n"})
    assert never.status_code == 422
    message = never.json()["detail"]["errors"][0]["message"]
    assert "with any resource alternative" in message
    assert "alternative 1: " in message and "B200" in message and "alternative 2: " in message and "A100" in message
