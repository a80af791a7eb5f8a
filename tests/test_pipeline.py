"""Serial pipelines (SkyPilot's multi-document file without ``execution: parallel``): one
job whose stages run in file order, each placed when its turn comes (so together they may ask
for more than the pool has), a failed stage ending the job, and a requeue resuming at the
stage it was in (real processes)."""

from __future__ import annotations

from pathlib import Path

from conftest import submit, wait_for, wait_state


def pipeline(out: Path, fail_at: str = "", hold: float = 0.0) -> str:
    def stage(name: str, gpus: str, replicas: int = 1) -> str:
        code = "exit 3" if name == fail_at else "true"
        return (f"---\nname: {name}\nnum_nodes: {replicas}\nresources: {{accelerators: {gpus}}}\n"
                f"run: |\n  echo $CORRAL_TASK-$CORRAL_REPLICA $(date +%s.%N) $CUDA_VISIBLE_DEVICES >> {out}\n"
                f"  sleep {hold}\n  {code}\n")
    return "name: pipe\n" + stage("prep", "H100:4", 2) + stage("train", "H100:4") + stage("report", "0")


def test_stages_run_in_order_each_with_its_own_resources(server, tmp_path: Path) -> None:
    out = tmp_path / "out"
    job = submit(server, pipeline(out, hold=0.5))  # 8 + 4 GPUs in all: only one stage at a time fits 8
    assert job["group"] and [t["name"] for t in job["tasks"]] == ["prep", "train", "report"]
    assert job["gpus"] == 8  # what it holds at most, at once
    wait_for(lambda: out.exists() and "train-0" in out.read_text(), timeout=20)
    during = server.get("/v1/nodes").json()
    assert sum(len(n["free_gpus"]) for n in during) == 4  # stage 1 gave its GPUs back
    done = wait_state(server, job["id"], "SUCCEEDED", "FAILED", timeout=30)
    assert done["state"] == "SUCCEEDED"
    lines = [line.split() for line in out.read_text().splitlines()]
    order = [who for who, *_ in lines]
    assert sorted(order[:2]) == ["prep-0", "prep-1"] and order[2:] == ["train-0", "report-0"]
    starts = {who: float(at) for who, at, *_ in lines}
    assert max(starts["prep-0"], starts["prep-1"]) + 0.5 <= starts["train-0"] < starts["report-0"]
    causes = [e["cause"] for e in server.get(f"/v1/jobs/{job['id']}/events").json()]
    assert causes.count("next_stage") == 2
    assert all(t["replicas"][0]["state"] == "SUCCEEDED" for t in done["tasks"])


def test_a_failed_stage_fails_the_job_and_later_stages_never_run(server, tmp_path: Path) -> None:
    out = tmp_path / "out"
    job = submit(server, pipeline(out, fail_at="train"))
    done = wait_state(server, job["id"], "SUCCEEDED", "FAILED", timeout=30)
    assert done["state"] == "FAILED" and done["exit_code"] == 3
    assert "report" not in out.read_text()
    report = next(t for t in done["tasks"] if t["name"] == "report")["replicas"][0]
    assert report["state"] == "KILLED" and report["node"] is None


def test_a_requeued_pipeline_resumes_at_its_stage(server, tmp_path: Path) -> None:
    out = tmp_path / "out"
    job = submit(server, f"""name: pipe
---
name: prep
run: echo prep >> {out}
---
name: train
resources: {{accelerators: H100:4}}
run: |
  echo train $CORRAL_RESTART_COUNT >> {out}
  trap 'exit 0' TERM
  while true; do sleep 0.05; done
""")
    wait_for(lambda: out.exists() and "train 0" in out.read_text(), timeout=20)
    wait_state(server, job["id"], "RUNNING")
    assert server.post(f"/v1/jobs/{job['id']}/requeue").json()["changed"] is True
    wait_for(lambda: "train 1" in out.read_text(), timeout=30)
    again = wait_state(server, job["id"], "RUNNING")
    assert again["requeues"] == 1
    assert out.read_text().splitlines() == ["prep", "train 0", "train 1"]  # the stage done stays done
    server.post(f"/v1/jobs/{job['id']}/cancel")
    wait_state(server, job["id"], "CANCELLED", timeout=30)


def test_a_stage_no_node_can_hold_is_refused_but_stages_need_not_fit_together(server) -> None:
    never = server.post("/v1/jobs", json={"yaml": "name: p\n---\nname: a\nrun: 'true'\n---\nname: b\n"
                                                  "resources: {accelerators: H100:8}\nrun: 'true'\n"})
    assert never.status_code == 422 and "8 GPUs" in never.json()["detail"]["errors"][0]["message"]
    fits = server.post("/v1/jobs", json={"yaml": "name: p\n---\nname: a\nnum_nodes: 2\nresources: {accelerators: H100:4}\n"
                                                 "run: 'true'\n---\nname: b\nnum_nodes: 2\n"
                                                 "resources: {accelerators: H100:4}\nrun: 'true'\n"})
    assert fits.status_code == 201
    assert wait_state(server, fits.json()["job"]["id"], "SUCCEEDED", "FAILED", timeout=30)["state"] == "SUCCEEDED"
