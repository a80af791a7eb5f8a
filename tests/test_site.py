"""Site policy through the real server: priority order, preemption with grace signal and
requeue (same id, same checkpoint directory, restart count up), elastic shrink instead of
preemption, reasons for QOS limits and dependencies, admission refusals that name the
field, fair-share accounting, the partition's default time limit, config errors."""

from __future__ import annotations

from pathlib import Path
import time

import pytest

from corral.scheduler import Policy

from conftest import bearer, submit, wait_for, wait_state

SITE = """
nodes:
  - {name: gpu, count: 1, gpus: 4, gpu_type: H100, cpus: 8, memory: 64, labels: {leaf: l0}}
scheduler: {policy: corral, half_life: 1d}
partitions:
  - {name: batch, nodes: ["gpu-*"], max_time: 1h, preempt_mode: requeue}
  - {name: urgent, nodes: ["gpu-*"], priority_tier: 10}
  - {name: short, nodes: ["gpu-*"], default_time: 2s, max_time: 1m}
  - {name: ml-only, nodes: ["gpu-*"], accounts: [ml]}
accounts:
  - {name: ml, shares: 3, users: [alice]}
  - {name: physics, shares: 1}
qos:
  - {name: normal}
  - {name: capped, max_gpus_per_user: 2}
  - {name: rush, preempt: [normal]}
topology: [leaf]
"""


@pytest.fixture
def site_config() -> str:
    return SITE


def events(server, job_id: int) -> list[tuple[str, str | None, str]]:
    return [(e["subject"], e["to_state"], e["cause"]) for e in server.get(f"/v1/jobs/{job_id}/events").json()]


def test_preemption_sends_the_grace_signal_and_requeues_keeping_id_and_checkpoint(server, tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    low = submit(server, f"""
name: low
resources: {{accelerators: H100:4}}
stop_signal: SIGUSR1
grace_period: 5s
run: |
  echo "start $CORRAL_RESTART_COUNT $CORRAL_CHECKPOINT_DIR" >> {marks}
  trap 'echo "signal $CORRAL_RESTART_COUNT" >> {marks}; exit 0' USR1
  while true; do sleep 0.1; done
""")
    assert low["partition"] == "batch" and low["account"] == "ml" and low["time_limit"] == 3600.0
    wait_for(lambda: marks.exists() and "start 0" in marks.read_text())
    high = submit(server, "name: high\nresources: {accelerators: H100:2}\nrun: echo urgent\n",
                  scheduling={"partition": "urgent"})
    assert wait_state(server, high["id"], "SUCCEEDED")["state"] == "SUCCEEDED"
    wait_for(lambda: "start 1" in marks.read_text(), timeout=20)
    lines = marks.read_text().splitlines()
    assert lines[1] == "signal 0"  # the preempted replica saw its stop signal before anything else happened
    first_dir, second_dir = lines[0].split()[2], lines[2].split()[2]
    assert first_dir == second_dir  # CORRAL_CHECKPOINT_DIR is stable across the requeue
    again = wait_state(server, low["id"], "RUNNING")
    assert again["id"] == low["id"] and again["requeues"] == 1
    assert again["tasks"][0]["replicas"][0]["restarts"] == 1
    seen = events(server, low["id"])
    assert ("job", "PREEMPTED", "preempted") in seen and ("job", "PENDING", "requeued") in seen
    assert ("low-0", "KILLED", "preempted") in seen
    # the preemptor started only after the victim had stopped
    high_events = server.get(f"/v1/jobs/{high['id']}/events").json()
    low_events = server.get(f"/v1/jobs/{low['id']}/events").json()
    killed = next(e["ts"] for e in low_events if e["to_state"] == "KILLED")
    scheduled = next(e["ts"] for e in high_events if e["cause"] == "scheduled" and e["subject"] == "job")
    assert scheduled >= killed
    server.post(f"/v1/jobs/{low['id']}/cancel")
    wait_state(server, low["id"], "CANCELLED")


def test_the_preemptor_starts_and_its_requeued_victim_waits_behind_it(server) -> None:
    """QOS preemption within one partition: the victim, older and no lower in the queue, used to
    take its room back once requeued, be preempted again, and so on, the preemptor never
    starting (23 preemptions in 30 s in a trial)."""
    low = submit(server, "name: low\nresources: {accelerators: H100:4}\ngrace_period: 1s\nrun: sleep 300\n")
    wait_state(server, low["id"], "RUNNING")
    rush = submit(server, "name: rush\nresources: {accelerators: H100:4}\nrun: sleep 300\n",
                  scheduling={"qos": "rush"})
    wait_state(server, rush["id"], "RUNNING", timeout=30)
    time.sleep(1.5)  # a few cycles: the victim does not come back while the preemptor runs
    assert server.get(f"/v1/jobs/{rush['id']}").json()["state"] == "RUNNING"
    waiting = server.get(f"/v1/jobs/{low['id']}").json()
    assert waiting["state"] == "PENDING" and waiting["requeues"] == 1, waiting
    assert [e for e in events(server, low["id"]) if e[2] == "preempted" and e[0] == "job"] == \
        [("job", "PREEMPTED", "preempted")]  # once
    for job in (rush, low):
        server.post(f"/v1/jobs/{job['id']}/cancel")
        wait_state(server, job["id"], "CANCELLED")


def test_an_elastic_task_shrinks_instead_of_its_job_being_preempted(server) -> None:
    group = submit(server, """
name: rl
execution: parallel
primary_tasks: [trainer]
---
name: trainer
run: sleep 60
---
name: rollout
num_nodes: {min: 1, max: 4, initial: 4}
resources: {accelerators: H100:1}
run: sleep 60
""")
    wait_state(server, group["id"], "RUNNING")
    urgent = submit(server, "name: urgent\nresources: {accelerators: H100:2}\nrun: echo ok\n",
                    scheduling={"partition": "urgent"})
    assert wait_state(server, urgent["id"], "SUCCEEDED")["state"] == "SUCCEEDED"
    job = server.get(f"/v1/jobs/{group['id']}").json()
    assert job["state"] == "RUNNING" and job["requeues"] == 0
    rollout = next(t for t in job["tasks"] if t["name"] == "rollout")
    assert rollout["num_nodes"] == 2
    assert ("rollout", None, "shrunk") in events(server, group["id"])
    server.post(f"/v1/jobs/{group['id']}/cancel")
    wait_state(server, group["id"], "CANCELLED")


def test_priority_order_and_the_priority_view(server, tmp_path: Path) -> None:
    # the blocker holds the node until both are seen waiting (a fixed second ran out under load
    # before the second was ranked: one started at once, nothing to order)
    go = tmp_path / "go"
    blocker = submit(server, f"name: blocker\nresources: {{accelerators: H100:4}}\nrun: until [ -e {go} ]; do sleep 0.1; done\n")
    wait_state(server, blocker["id"], "RUNNING")
    late = submit(server, "name: niced\nresources: {accelerators: H100:4}\nrun: echo a\n", scheduling={"nice": 5000})
    early = submit(server, "name: plain\nresources: {accelerators: H100:4}\nrun: echo b\n")
    wait_for(lambda: len(server.get("/v1/priority").json()) == 2)
    ranked = server.get("/v1/priority").json()
    assert [r["id"] for r in ranked] == [early["id"], late["id"]]
    assert ranked[1]["nice"] == 5000 and ranked[0]["priority"] - ranked[1]["priority"] == pytest.approx(5000, abs=50)
    assert ranked[0]["fair_share"] > 0
    # no time limit: waited seconds of the 1-day cap (each as of when it was last scored)
    assert all(0 <= r["expansion"] < 10000 * 60 / 86400 for r in ranked)
    go.touch()
    a, b = wait_state(server, late["id"], "SUCCEEDED"), wait_state(server, early["id"], "SUCCEEDED")
    assert b["started_at"] < a["started_at"]


@pytest.mark.parametrize("site_config", [SITE.replace("half_life: 1d}", "half_life: 1d, starve_after: 8s}")])
def test_a_starving_job_is_first_in_line_and_shown_so(server) -> None:
    # bob holds the whole node; alice, who holds nothing, is short of her share: her jobs may starve
    bob = bearer(server.state, "bob")
    text = "name: blocker\nresources: {accelerators: H100:4}\nrun: sleep 30\n"
    blocker = server.post("/v1/jobs", headers=bob, json={"yaml": text}).json()["job"]
    wait_state(server, blocker["id"], "RUNNING")
    # 3 of the 4 GPUs: starving after 8 s x (1 - its size), a few seconds
    old = submit(server, "name: niced\nresources: {accelerators: H100:3}\nrun: echo a\n", scheduling={"nice": 5000})
    wait_for(lambda: len(server.get("/v1/priority").json()) == 1)
    new = submit(server, "name: plain\nresources: {accelerators: H100:3}\nrun: echo b\n")
    wait_for(lambda: len(server.get("/v1/priority").json()) == 2)
    ranked = server.get("/v1/priority").json()
    if not ranked[0]["starving"]:  # while the old one is young, priority still decides
        assert [r["id"] for r in ranked] == [new["id"], old["id"]]
    wait_for(lambda: server.get("/v1/priority").json()[0]["starving"], timeout=15)
    ranked = server.get("/v1/priority").json()
    assert [r["id"] for r in ranked] == [old["id"], new["id"]]
    assert ranked[0]["priority"] < ranked[1]["priority"]  # ahead despite the nice
    server.post(f"/v1/jobs/{blocker['id']}/cancel", headers=bob)
    a, b = wait_state(server, old["id"], "SUCCEEDED"), wait_state(server, new["id"], "SUCCEEDED")
    assert a["started_at"] < b["started_at"]


def test_reasons_for_qos_limits_and_dependencies(server) -> None:
    jobs = [submit(server, f"name: c{i}\nresources: {{accelerators: H100:1}}\nrun: sleep 30\n",
                   scheduling={"qos": "capped"}) for i in range(3)]
    wait_for(lambda: server.get(f"/v1/jobs/{jobs[2]['id']}").json()["reason"] == "QOSMaxGPUsPerUser")
    # the reason is committed with the claims (STARTING); the launches follow in the same cycle
    assert [wait_state(server, j["id"], "RUNNING")["state"] for j in jobs[:2]] == ["RUNNING", "RUNNING"]
    after = submit(server, "name: after\nrun: echo later\n", scheduling={"dependency": f"afterok:{jobs[0]['id']}"})
    wait_for(lambda: server.get(f"/v1/jobs/{after['id']}").json()["reason"] == "Dependency")
    doomed = submit(server, "name: doomed\nrun: echo never\n",
                    scheduling={"dependency": f"afternotok:{jobs[1]['id']}", "kill_on_invalid_dep": True})
    for j in jobs:
        server.post(f"/v1/jobs/{j['id']}/cancel")
    # job 0 was cancelled, not successful: afterok can never hold now
    wait_for(lambda: server.get(f"/v1/jobs/{after['id']}").json()["reason"] == "DependencyNeverSatisfied")
    assert server.get(f"/v1/jobs/{after['id']}").json()["state"] == "PENDING"  # reported, kept (no kill asked)
    assert wait_state(server, doomed["id"], "SUCCEEDED", "CANCELLED")["state"] == "SUCCEEDED"  # cancelled = not ok
    ok = submit(server, "name: first\nrun: 'true'\n")
    then = submit(server, "name: then\nrun: echo go\n", scheduling={"dependency": f"afterok:{ok['id']}"})
    assert wait_state(server, then["id"], "SUCCEEDED")["state"] == "SUCCEEDED"
    server.post(f"/v1/jobs/{after['id']}/cancel")


def test_singleton_queues_behind_a_job_of_the_same_name(server) -> None:
    one = submit(server, "name: sweep\nrun: sleep 1\n", scheduling={"dependency": "singleton"})
    two = submit(server, "name: sweep\nrun: echo second\n", scheduling={"dependency": "singleton"})
    wait_for(lambda: server.get(f"/v1/jobs/{two['id']}").json()["reason"] == "Dependency")
    a, b = wait_state(server, one["id"], "SUCCEEDED"), wait_state(server, two["id"], "SUCCEEDED")
    assert b["started_at"] >= a["ended_at"]


@pytest.mark.parametrize("scheduling, field, words", [
    ({"partition": "bach"}, "partition", "did you mean 'batch'"),
    ({"partition": "ml-only", "account": "physics"}, "account", "accepts accounts ml"),
    ({"account": "chem"}, "account", "no account is named"),
    ({"qos": "gold"}, "qos", "no QOS is named"),
    ({"time_limit": "2h"}, "time_limit", "longer than partition 'batch'"),
    ({"dependency": "afterok:999"}, "dependency", "there is no job 999"),
    ({"qos": "capped", "partition": "urgent"}, "qos", "more than QOS 'capped'"),
])
def test_admission_refuses_what_could_never_run_naming_the_field(server, scheduling, field, words) -> None:
    text = "name: x\nresources: {accelerators: H100:3}\nrun: 'true'\n"
    response = server.post("/v1/jobs", json={"yaml": text, "scheduling": scheduling})
    assert response.status_code == 422, response.text
    (issue,) = response.json()["detail"]["errors"]
    assert issue["field"] == field and words in issue["message"]
    assert server.get("/v1/jobs", params={"all": True}).json() == []


@pytest.mark.parametrize("scheduling, words", [
    ({"priority": 1e6}, "setting a job's priority needs the operator role (you are alice, a user)"),
    ({"nice": -100}, "a negative nice (-100, raising the job above others) needs the operator role"),
    ({"account": "physics"}, "account 'physics' does not list alice among its users"),
])
def test_raising_a_priority_or_charging_anothers_account_is_forbidden(server, scheduling, words) -> None:
    text = "name: x\nrun: 'true'\n"
    response = server.post("/v1/jobs", json={"yaml": text, "scheduling": scheduling})
    assert response.status_code == 403, response.text
    assert words in response.json()["detail"]
    assert server.get("/v1/jobs", params={"all": True}).json() == []


@pytest.mark.parametrize("site_config", [SITE + "operators: [alice]\n"])
def test_an_operator_fixes_a_priority_and_others_may_lower_their_own(server) -> None:
    fixed = submit(server, "name: vip\nrun: sleep 30\n", scheduling={"priority": 123456, "nice": -10})
    assert fixed["nice"] == -10
    bob = server.post("/v1/jobs", json={"yaml": "name: b\nrun: 'true'\n", "scheduling": {"priority": 1}},
                      headers=bearer(server.state, "bob"))
    assert bob.status_code == 403 and "setting a job's priority needs the operator role" in bob.json()["detail"]
    polite = server.post("/v1/jobs", json={"yaml": "name: b\nrun: 'true'\n", "scheduling": {"nice": 50}},
                         headers=bearer(server.state, "bob"))
    assert polite.status_code == 201, polite.text
    server.post(f"/v1/jobs/{fixed['id']}/cancel")


def test_partition_default_time_limit_applies(server) -> None:
    job = submit(server, "name: forever\nrun: sleep 60\n", scheduling={"partition": "short"})
    assert job["time_limit"] == 2.0
    assert wait_state(server, job["id"], "TIMEOUT", timeout=30)["state"] == "TIMEOUT"


def test_usage_is_accrued_and_shown_in_share(server) -> None:
    job = submit(server, "name: burn\nresources: {accelerators: H100:2}\nrun: sleep 1.5\n")
    wait_state(server, job["id"], "SUCCEEDED")
    rows = {(r["account"], r["user"]): r for r in server.get("/v1/share").json()}
    assert rows[("ml", "alice")]["raw_usage"] >= 2.0  # >= 2 GPUs x ~1.5 s, slightly decayed
    assert rows[("ml", "")]["norm_shares"] == pytest.approx(0.75)
    assert rows[("ml", "alice")]["fair_share"] < 0.5  # ml used everything, more than its 75 %


def test_a_bad_site_config_is_refused_with_field_and_line(tmp_path: Path) -> None:
    from corral.site import load_site
    from corral.spec import SpecError
    config = tmp_path / "config.yaml"
    config.write_text(SITE.replace("max_time: 1h", "max_tim: 1h"))
    with pytest.raises(SpecError) as info:
        load_site(config)
    assert "line 6" in str(info.value).replace(f"{config}:6", "line 6") and "did you mean 'max_time'" in str(info.value)


@pytest.mark.parametrize("replace, line, words", [
    ("  - {name: capped, max_gpus_per_user: 2}", 15, "did you mean 'normal'"),
    ('nodes: ["gpu-*"], max_time: 1h', 6, "'cpu-*' matches no node"),
    ("topology: [leaf]", 17, "no node has the label 'spine'"),
    ("  - {name: physics, shares: 1}", 12, "no account is named 'chem'"),
])
def test_site_config_errors_name_the_line(tmp_path: Path, replace: str, line: int, words: str) -> None:
    from corral.site import load_site
    from corral.spec import SpecError
    broken = {
        "  - {name: capped, max_gpus_per_user: 2}": "  - {name: capped, preempt: [normla]}",
        'nodes: ["gpu-*"], max_time: 1h': 'nodes: ["cpu-*"], max_time: 1h',
        "topology: [leaf]": "topology: [leaf, spine]",
        "  - {name: physics, shares: 1}": "  - {name: physics, shares: 1, parent: chem}",
    }[replace]
    config = tmp_path / "config.yaml"
    config.write_text(SITE.replace(replace, broken))
    with pytest.raises(SpecError) as info:
        load_site(config)
    assert f"{config}:{line}:" in str(info.value) and words in str(info.value)


def test_qos_preemption_cycles_are_refused(tmp_path: Path) -> None:
    from corral.site import load_site
    from corral.spec import SpecError
    config = tmp_path / "config.yaml"
    config.write_text(SITE.replace("  - {name: normal}", "  - {name: normal, preempt: [capped]}").replace(
        "  - {name: capped, max_gpus_per_user: 2}", "  - {name: capped, preempt: [normal]}"))
    with pytest.raises(SpecError, match="QOS preemption has a cycle: normal -> capped -> normal"):
        load_site(config)


def test_scheduler_settings_override_the_named_policy(tmp_path: Path) -> None:
    from corral.site import load_site
    from corral.spec.loader import SpecError
    config = tmp_path / "config.yaml"
    config.write_text(SITE.replace("scheduler: {policy: corral, half_life: 1d}",
                                   "scheduler: {policy: corral, half_life: 1d, size_fades: false, max_age: 2d,\n"
                                   "            expansion_cap: 6h, weights: {fair_share: 20000, expansion: 2500}}"))
    policy = load_site(config).policy
    assert policy.name == "corral" and not policy.weights.size_fades and policy.weights.favor_small
    assert policy.weights.max_age_s == 2 * 86400 and policy.weights.fair_share == 20000
    assert policy.weights.expansion == 2500 and policy.weights.expansion_cap_s == 6 * 3600
    assert policy.weights.age == 5000 and policy.packing == "best_fit"  # the rest stays the named policy's
    config.write_text(SITE.replace("scheduler: {policy: corral, half_life: 1d}", "scheduler: {policy: slurm}"))
    assert load_site(config).policy.packing == "first_fit"  # Slurm's node choice comes with its policy
    config.write_text(SITE.replace("scheduler: {policy: corral, half_life: 1d}",
                                   "scheduler: {policy: slurm, packing: best_fit}"))
    assert load_site(config).policy.packing == "best_fit"
    config.write_text(SITE)
    assert load_site(config).policy.weights.size_fades and load_site(config).policy.weights.expansion == 0
    config.write_text(SITE.replace("scheduler: {policy: corral, half_life: 1d}",
                                   "scheduler: {policy: corral, half_life: 1d, expansion_cap: 0s}"))
    with pytest.raises(SpecError, match="scheduler.expansion_cap"):
        load_site(config)
    config.write_text(SITE.replace("scheduler: {policy: corral, half_life: 1d}", "scheduler: {policy: corral, age_power: 3}"))
    assert load_site(config).policy.weights.age_power == 3
    config.write_text(SITE.replace("scheduler: {policy: corral, half_life: 1d}", "scheduler: {policy: corral, age_power: 0.5}"))
    with pytest.raises(SpecError, match="scheduler.age_power"):  # below 1, young jobs would age fastest
        load_site(config)
    config.write_text(SITE.replace("scheduler: {policy: corral, half_life: 1d}", "scheduler: {policy: corral, starve_after: 1d}"))
    assert load_site(config).policy.weights.starve_after_s == 86400
    config.write_text(SITE.replace("scheduler: {policy: corral, half_life: 1d}", "scheduler: {policy: corral, starve_after: off}"))
    assert load_site(config).policy.weights.starve_after_s == float("inf")
    config.write_text(SITE.replace("scheduler: {policy: corral, half_life: 1d}", "scheduler: {policy: corral, starve_after: soon}"))
    with pytest.raises(SpecError, match="scheduler.starve_after"):
        load_site(config)
    config.write_text(SITE.replace("scheduler: {policy: corral, half_life: 1d}", "scheduler: {policy: slurm, size_by: gpu_time}"))
    assert load_site(config).policy.weights.size_by == "gpu_time"
    config.write_text(SITE.replace("scheduler: {policy: corral, half_life: 1d}", "scheduler: {policy: slurm, size_by: area}"))
    with pytest.raises(SpecError, match="scheduler.size_by"):
        load_site(config)
    config.write_text(SITE.replace("scheduler: {policy: corral, half_life: 1d}",
                                   "scheduler: {policy: corral, learn_durations: true, starve_over_share: 3}"))
    policy = load_site(config).policy
    assert policy.learn_durations and policy.weights.starve_over_share == 3
    assert not Policy.named("corral").learn_durations and not Policy.named("slurm").learn_durations
    for bad in ("learn_durations: maybe", "starve_over_share: -1", "starve_over_share: .inf"):
        field = bad.split(":")[0]
        config.write_text(SITE.replace("scheduler: {policy: corral, half_life: 1d}", f"scheduler: {{policy: corral, {bad}}}"))
        with pytest.raises(SpecError, match=f"scheduler.{field}"):
            load_site(config)
