"""The HTTP API over a real control loop and real local processes (SQLite, and PostgreSQL
when CORRAL_TEST_DB_URL is set)."""

from __future__ import annotations

import time
from pathlib import Path

from conftest import bearer, submit, wait_for, wait_state

ON_POSTGRESQL = True  # what the store keeps: checked on PostgreSQL too (conftest)


def test_openapi_and_health(server) -> None:
    spec = server.get("/openapi.json").json()
    for path in ("/v1/jobs", "/v1/jobs/{job}", "/v1/jobs/{job}/cancel", "/v1/jobs/{job}/logs",
                 "/v1/jobs/{job}/events", "/v1/nodes", "/v1/health"):
        assert path in spec["paths"], path
    health = server.get("/v1/health").json()
    assert health["status"] == "ok" and health["nodes"] == 2


def test_invalid_spec_is_rejected_with_field_and_line_and_nothing_is_stored(server) -> None:
    response = server.post("/v1/jobs", json={"yaml": "name: t\nresources:\n  acelerators: H100:1\n",
                                             "source": "bad.yaml"})
    assert response.status_code == 422
    (issue,) = response.json()["detail"]["errors"]
    assert issue["field"] == "resources.acelerators" and issue["line"] == 3
    assert "accelerators" in issue["message"]
    assert server.get("/v1/jobs", params={"all": True}).json() == []


def test_request_no_node_could_ever_satisfy_is_rejected(server) -> None:
    for text, words in [("resources: {accelerators: H100:8}\n", "8 GPUs"),
                        ("resources: {accelerators: B200:1}\n", "GPU type B200"),
                        ("resources: {memory: 512}\n", "memory"),
                        ("num_nodes: 3\nresources: {accelerators: H100:4}\n", "needs 12 GPUs")]:
        response = server.post("/v1/jobs", json={"yaml": text})
        assert response.status_code == 422, text
        assert words in response.json()["detail"]["errors"][0]["message"]
    assert server.get("/v1/jobs", params={"all": True}).json() == []


def test_job_group_runs_with_environment_and_gpus(server, tmp_path: Path) -> None:
    out = tmp_path / "env"
    out.mkdir()
    text = f"""
name: grp
execution: parallel
primary_tasks: [trainer]
termination_delay: 0s
---
name: trainer
num_nodes: 2
resources: {{accelerators: H100:2}}
envs: {{GREETING: hi}}
run: |
  env | grep -E '^(CORRAL|SKYPILOT|CUDA|MASTER|GREETING)' | sort > {out}/$CORRAL_TASK-$CORRAL_REPLICA
  printf '%s' "$CORRAL_NODE_IPS" | tr '\\n' ',' > {out}/../ips-$CORRAL_REPLICA
  while [ ! -f {out}/helper-0 ]; do sleep 0.02; done  # the helper's file is complete before we end
---
name: helper
run: env | grep -E '^(CORRAL|SKYPILOT|CUDA)' | sort > {out}/.helper && mv {out}/.helper {out}/helper-0; sleep 60
"""
    job = submit(server, text)
    assert job["state"] == "PENDING" and job["user"] == "alice"
    done = wait_state(server, job["id"], "SUCCEEDED", "FAILED")
    assert done["state"] == "SUCCEEDED" and done["exit_code"] == 0
    envs = {p.name: dict(line.split("=", 1) for line in p.read_text().splitlines()) for p in out.iterdir()
            if not p.name.startswith(".")}
    t0, t1, helper = envs["trainer-0"], envs["trainer-1"], envs["helper-0"]
    assert t0["CORRAL_HOSTNAME"] == "trainer-0.grp" and t1["CORRAL_REPLICA"] == "1"
    assert t0["CORRAL_NUM_REPLICAS"] == "2" and t0["SKYPILOT_NUM_NODES"] == "2"
    assert t0["SKYPILOT_JOBGROUP_NAME"] == "grp" == t0["CORRAL_JOBGROUP_NAME"]
    assert t0["SKYPILOT_NUM_GPUS_PER_NODE"] == "2" and t0["GREETING"] == "hi"
    assert t0["MASTER_PORT"] == t1["MASTER_PORT"]
    assert t0["MASTER_ADDR"] == t1["MASTER_ADDR"] == t0["CORRAL_ADDR"] != t1["CORRAL_ADDR"]
    ips = (tmp_path / "ips-1").read_text()
    assert ips == f"{t0['CORRAL_ADDR']},{t1['CORRAL_ADDR']}" == (tmp_path / "ips-0").read_text()
    assert t0["CORRAL_JOB_ID"] == str(job["id"])
    assert helper["CUDA_VISIBLE_DEVICES"] == ""
    gpus0 = set(t0["CUDA_VISIBLE_DEVICES"].split(","))
    gpus1 = set(t1["CUDA_VISIBLE_DEVICES"].split(","))
    assert len(gpus0) == len(gpus1) == 2
    replicas = {(t["name"], r["rank"]): r for t in done["tasks"] for r in t["replicas"]}
    assert replicas[("helper", 0)]["state"] == "KILLED"
    for (task, rank), r in replicas.items():
        if task == "trainer":
            assert set(map(str, r["gpus"])) == set(envs[f"trainer-{rank}"]["CUDA_VISIBLE_DEVICES"].split(","))
    if replicas[("trainer", 0)]["node"] == replicas[("trainer", 1)]["node"]:
        assert not gpus0 & gpus1
    causes = [(e["subject"], e["to_state"], e["cause"]) for e in server.get(f"/v1/jobs/{job['id']}/events").json()]
    assert ("job", "PENDING", "submitted") in causes and ("job", "SUCCEEDED", "primaries_succeeded") in causes
    assert ("helper-0", "KILLED", "termination_delay") in causes


def test_concurrent_replicas_never_share_a_gpu(server, tmp_path: Path) -> None:
    # each runs until released, so that what is asked of the 8 running and the 2 waiting is
    # not a race with their starts (a fixed 0.8 s) nor with their ends (a 1.5 s run)
    release = tmp_path / "release"
    ids = [submit(server, f"name: g{i}\nresources: {{accelerators: 1}}\n"
                          f"run: echo $CUDA_VISIBLE_DEVICES@$CORRAL_NODE > {tmp_path}/{i}; "
                          f"while [ ! -e {release} ]; do sleep 0.05; done\n")["id"]
           for i in range(10)]

    def said() -> list[str]:
        return [text for i in range(10) if (p := tmp_path / str(i)).exists() and (text := p.read_text().strip())]

    def jobs(state: str) -> list[dict]:
        return [j for j in server.get("/v1/jobs").json() if j["state"] == state]

    wait_for(lambda: len(said()) >= 8 and len(jobs("RUNNING")) >= 8, timeout=30)
    assert len(jobs("RUNNING")) == 8  # 2 nodes x 4 GPUs, one GPU each
    pending = jobs("PENDING")
    # backfill reserves for every blocked job it examines, so both wait on Resources
    assert [j["reason"] for j in pending] == ["Resources", "Resources"]
    seen = said()
    assert len(seen) == len(set(seen)) == 8, seen
    nodes = server.get("/v1/nodes").json()
    assert all(n["free_gpus"] == [] for n in nodes)
    release.touch()
    for job_id in ids:
        assert wait_state(server, job_id, "SUCCEEDED", "FAILED")["state"] == "SUCCEEDED"
    assert all(len(n["free_gpus"]) == 4 for n in server.get("/v1/nodes").json())


def test_primary_failure_stops_auxiliaries_at_once(server) -> None:
    job = submit(server, """
name: pf
execution: parallel
primary_tasks: [main]
termination_delay: 60s
---
name: main
run: sleep 0.3; exit 7
---
name: side
run: sleep 60
""")
    start = time.monotonic()
    done = wait_state(server, job["id"], "FAILED", "SUCCEEDED")
    assert done["state"] == "FAILED" and done["exit_code"] == 7
    assert time.monotonic() - start < 5  # not the 60 s termination delay
    side = done["tasks"][1]["replicas"][0]
    assert side["state"] == "KILLED"


def test_auxiliary_failure_lets_primaries_finish_but_fails_the_job(server, tmp_path: Path) -> None:
    marker = tmp_path / "primary-finished"
    job = submit(server, f"""
name: af
execution: parallel
primary_tasks: [main]
---
name: main
run: sleep 1; touch {marker}
---
name: side
run: exit 5
""")
    done = wait_state(server, job["id"], "FAILED", "SUCCEEDED")
    assert marker.exists()
    assert done["state"] == "FAILED" and done["exit_code"] == 5
    assert [t["replicas"][0]["state"] for t in done["tasks"]] == ["SUCCEEDED", "FAILED"]


def test_cancel_sends_sigterm_then_sigkill_after_grace(server, tmp_path: Path) -> None:
    got, trapping = tmp_path / "got-term", tmp_path / "trapping"
    job = submit(server, f"""
name: stubborn
grace_period: 1s
run: |
  trap 'echo term > {got}' TERM
  touch {trapping}
  while true; do sleep 0.1; done
""")
    wait_state(server, job["id"], "RUNNING")
    wait_for(trapping.exists, timeout=20)  # (a SIGTERM before its trap would end it at once)
    started = time.monotonic()
    assert server.post(f"/v1/jobs/{job['id']}/cancel").json()["cancelled"] is True
    done = wait_state(server, job["id"], "CANCELLED")
    elapsed = time.monotonic() - started
    assert got.read_text().strip() == "term"  # the process saw SIGTERM first
    assert 0.9 <= elapsed < 5, elapsed  # and was killed after the 1 s grace
    replica = done["tasks"][0]["replicas"][0]
    assert replica["state"] == "KILLED" and replica["exit_code"] == 137
    causes = [e["cause"] for e in server.get(f"/v1/jobs/{job['id']}/events").json()]
    assert "killed" in causes and "cancel_requested" in causes


def test_cancel_force_kills_now_also_a_job_in_its_grace_period(server, tmp_path: Path) -> None:
    """scancel -s KILL, kubectl delete --force: a program ignoring its stop signal with a long
    grace period is SIGKILLed now, by its owner, whether or not its grace period has begun."""
    spec = "grace_period: 1h\nrun: |\n  trap '' TERM\n  touch {marker}\n  while true; do sleep 0.1; done\n"
    markers = [tmp_path / f"ignoring{n}" for n in range(2)]
    waiting, direct = (submit(server, f"name: stubborn{n}\n" + spec.format(marker=markers[n])) for n in range(2))
    for job, marker in zip((waiting, direct), markers):
        wait_state(server, job["id"], "RUNNING")
        wait_for(marker.exists, timeout=20)  # it ignores SIGTERM only from here: a TERM before would end it
    assert server.post(f"/v1/jobs/{waiting['id']}/cancel").json()["cancelled"] is True
    time.sleep(1.0)
    assert server.get(f"/v1/jobs/{waiting['id']}").json()["state"] == "RUNNING"  # in its 1 h grace period
    for job in (waiting, direct):
        started = time.monotonic()
        assert server.post(f"/v1/jobs/{job['id']}/cancel", params={"force": True}).json()["cancelled"] is True
        done = wait_state(server, job["id"], "CANCELLED", timeout=10)
        assert time.monotonic() - started < 5
        replica = done["tasks"][0]["replicas"][0]
        assert replica["state"] == "KILLED" and replica["exit_code"] == 137, replica
        told = [e["message"] for e in server.get(f"/v1/jobs/{job['id']}/events").json()]
        assert any("cancel --force by" in (m or "") for m in told), told


def test_cancel_pending_job(server) -> None:
    blocker = submit(server, "name: blocker\nnum_nodes: 2\nresources: {accelerators: H100:4}\nrun: sleep 30\n")
    wait_state(server, blocker["id"], "RUNNING")  # else the small job, favoured by priority, would go first
    waiting = submit(server, "name: waiting\nresources: {accelerators: H100:1}\nrun: echo never\n")
    assert wait_state(server, waiting["id"], "PENDING")["reason"] in ("Resources", None)
    server.post(f"/v1/jobs/{waiting['id']}/cancel")
    done = wait_state(server, waiting["id"], "CANCELLED")
    assert done["tasks"][0]["replicas"][0]["pid"] is None
    server.post(f"/v1/jobs/{blocker['id']}/cancel")
    wait_state(server, blocker["id"], "CANCELLED")


def test_logs_whole_and_followed(server) -> None:
    job = submit(server, """
name: talk
execution: parallel
---
name: a
run: for i in 1 2 3; do echo a$i; sleep 0.1; done
---
name: b
run: echo b1
""")
    with server.stream("GET", f"/v1/jobs/{job['id']}/logs", params={"follow": True}) as response:
        text = b"".join(response.iter_raw()).decode()
    assert "a-0 | a1" in text and "a-0 | a3" in text and "b-0 | b1" in text
    one = server.get(f"/v1/jobs/{job['id']}/logs", params={"replica": "a-0"}).text
    assert one == "a1\na2\na3\n"
    assert server.get(f"/v1/jobs/{job['id']}/logs", params={"replica": "zz-0"}).status_code == 404


def test_a_namesake_is_accepted_and_its_replicas_named_under_a_domain_of_its_own(server) -> None:
    first = submit(server, "name: dup\nrun: sleep 30\n")
    second = server.post("/v1/jobs", json={"yaml": "name: dup\nrun: sleep 30\n"})
    assert second.status_code == 201, second.text  # as Slurm accepts namesakes
    second = second.json()["job"]
    assert first["domain"] == "dup" and first["tasks"][0]["replicas"][0]["hostname"] == "dup-0.dup"
    # the job keeps its name; its replicas' names are under NAME-ID
    assert second["name"] == "dup" and second["domain"] == f"dup-{second['id']}"
    assert second["tasks"][0]["replicas"][0]["hostname"] == f"dup-0.dup-{second['id']}"
    assert server.get(f"/v1/jobs/dup-{second['id']}").json()["id"] == second["id"]  # found by its domain
    peers = server.get(f"/v1/jobs/{second['id']}/endpoints").json()
    assert peers["job"] == "dup" and peers["domain"] == f"dup-{second['id']}"
    assert peers["tasks"]["dup"]["replicas"][0]["hostname"] == f"dup-0.dup-{second['id']}"
    other_user = server.post("/v1/jobs", json={"yaml": "name: dup\nrun: echo\n"}, headers=bearer(server.state, "bob"))
    assert other_user.status_code == 201 and other_user.json()["job"]["domain"] == "dup"  # domains are per user
    for job in (first, second):
        server.post(f"/v1/jobs/{job['id']}/cancel")
        wait_state(server, job["id"], "CANCELLED")
    again = server.post("/v1/jobs", json={"yaml": "name: dup\nrun: echo\n"})
    assert again.status_code == 201 and again.json()["job"]["domain"] == "dup"  # no active namesake: its name


def test_list_filters_and_unknown_job(server) -> None:
    job = submit(server, "name: quick\nrun: 'true'\n")
    wait_state(server, job["id"], "SUCCEEDED")
    assert server.get("/v1/jobs").json() == []
    assert [j["id"] for j in server.get("/v1/jobs", params={"all": True}).json()] == [job["id"]]
    assert [j["id"] for j in server.get("/v1/jobs", params={"state": "succeeded"}).json()] == [job["id"]]
    assert server.get("/v1/jobs", params={"state": "bogus"}).status_code == 422
    assert server.get("/v1/jobs", params={"all": True, "user": "bob"}).json() == []
    assert server.get("/v1/jobs/quick").json()["id"] == job["id"]
    assert server.get("/v1/jobs/999").status_code == 404


def test_hostile_identifiers_and_filters_are_refused_not_500(server) -> None:
    job = submit(server, "name: quick\nrun: 'true'\n")
    for path in ("/v1/jobs/%C2%B2", f"/v1/jobs/{2**63}", f"/v1/jobs/{10**40}", "/v1/jobs/" + "x" * 300,
                 "/v1/jobs/..%2F..%2Fetc"):
        assert server.get(path).status_code == 404, path
    for params in ({"name": "a\x00b"}, {"user": "\x00"}, {"state": "RUNNING\x00"}):
        response = server.get("/v1/jobs", params=params)
        assert response.status_code == 422, params
        assert response.json()["detail"][0]["loc"][0] == "query" and "NUL" in response.json()["detail"][0]["msg"]
    assert server.get("/v1/jobs/a%00b").status_code == 422
    assert server.get("/v1/jobs", params={"name": "n" * 64, "all": True}).json() == []
    assert server.get("/v1/jobs", params={"user": "u" * 65, "all": True}).json() == []
    bogus = server.get("/v1/jobs", params={"state": "AAA"})
    (issue,) = bogus.json()["detail"]
    assert bogus.status_code == 422 and issue["loc"] == ["query", "state"] and "AAA" in issue["msg"]
    assert server.get(f"/v1/jobs/{job['id']}").status_code == 200
    assert server.get("/v1/health").json()["status"] == "ok"


def test_the_body_passes_the_same_rules_as_the_file_and_nothing_is_stored(server) -> None:
    base = {"yaml": "run: echo hi\n"}
    cases = [({"name": "my job"}, "name"), ({"name": "../etc"}, "name"), ({"name": "x" * 64}, "name"),
             ({"name": "n" * 10_000}, "name"), ({"env": {"A=B": "1"}}, "env"), ({"env": {"A": "a\x00b"}}, "env.A"),
             ({"base_dir": "relative/dir"}, "cwd"), ({"cwd": "relative/dir"}, "cwd"),
             ({"scheduling": {"partition": "p\x00"}}, "partition"),
             ({"yaml": "run: \"echo \\0\"\n"}, "run"), ({"yaml": "run: true\n"}, "run"),
             ({"yaml": "name: a\nname: b\nrun: echo\n"}, "")]
    for extra, field in cases:
        response = server.post("/v1/jobs", json={**base, **extra})
        assert response.status_code == 422, (extra, response.text[:300])
        errors = response.json()["detail"]["errors"]
        assert any(e["field"] == field for e in errors), (extra, errors)
        assert len(response.text) < 2000  # a 10 KB name is not echoed back
    huge = server.post("/v1/jobs", content=b'{"yaml": "' + b"x" * (9 << 20) + b'"}',
                       headers={"content-type": "application/json"})
    assert huge.status_code == 413
    assert server.get("/v1/jobs", params={"all": True}).json() == []
    # and the loop keeps scheduling: a good job still runs to the end
    job = submit(server, "name: fine\nrun: 'true'\n")
    assert wait_state(server, job["id"], "SUCCEEDED")["exit_code"] == 0
    assert server.get("/v1/health").json()["status"] == "ok"


def test_logs_are_whole_past_a_megabyte(server) -> None:
    job = submit(server, "name: chatty\nrun: python3 -c \"print(('x' * 1023 + chr(10)) * 3072, end='')\"\n")
    wait_state(server, job["id"], "SUCCEEDED")
    text = server.get(f"/v1/jobs/{job['id']}/logs").content
    assert len(text) == 3 << 20 and text.count(b"\n") == 3072


def test_list_pages_with_a_cursor(server) -> None:
    ids = [submit(server, f"name: p{i}\nrun: 'true'\n", scheduling={"hold": True})["id"] for i in range(5)]
    first = server.get("/v1/jobs", params={"limit": 2})
    assert [j["id"] for j in first.json()] == ids[:2] and first.headers["x-next-after"] == str(ids[1])
    second = server.get("/v1/jobs", params={"limit": 2, "after": first.headers["x-next-after"]})
    assert [j["id"] for j in second.json()] == ids[2:4]
    last = server.get("/v1/jobs", params={"limit": 2, "after": ids[3]})
    assert [j["id"] for j in last.json()] == ids[4:] and "x-next-after" not in last.headers
    assert server.get("/v1/jobs", params={"after": -1}).status_code == 422


def test_a_lone_surrogate_in_a_request_is_refused_naming_the_field_not_a_server_error(server) -> None:
    """JSON may carry ``\\udcff`` (a lone surrogate: no UTF-8 encodes it); the 422 that names
    the field must still be rendered."""
    answer = server.post("/v1/jobs", content='{"yaml": "name: a\\nrun: true\\n", "cwd": "/tmp/x\\udcff"}',
                         headers={"Content-Type": "application/json"})
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"][0]["loc"] == ["body", "cwd"], answer.text
