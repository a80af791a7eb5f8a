"""``/metrics`` scraped while jobs run: the numbers match what the API (and so ``corral
queue`` and ``corral nodes``) says, and the histograms and counters saw what happened."""

from __future__ import annotations

import time
from pathlib import Path

from conftest import submit, wait_for, wait_state
from prometheus_client.parser import text_string_to_metric_families

ON_POSTGRESQL = True  # what the store keeps: checked on PostgreSQL too (conftest)


def scrape(server) -> dict[str, dict[tuple, float]]:
    response = server.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_metrics_match_the_queue_and_the_nodes(server, tmp_path: Path) -> None:
    hog = submit(server, "name: hog\nnum_nodes: 2\nresources: {accelerators: H100:3}\nrun: sleep 30\n")
    wait_state(server, hog["id"], "RUNNING")
    waiting = submit(server, "name: waiting\nresources: {accelerators: H100:4}\nrun: 'true'\n")
    held = submit(server, "name: held\nrun: 'true'\n", scheduling={"hold": True})
    flaky = submit(server, f"""
name: flaky
restart: {{policy: on_failure, max_restarts: 1, backoff: {{initial: 0s}}}}
run: |
  if [ ! -f {tmp_path}/once ]; then touch {tmp_path}/once; exit 3; fi
  sleep 30
""")
    probed = submit(server, "name: probed\nreadiness_probe: {exec: 'false', period: 0.2s}\nrun: sleep 30\n")
    wait_state(server, flaky["id"], "RUNNING")
    wait_for(lambda: server.get(f"/v1/jobs/{flaky['id']}").json()["tasks"][0]["replicas"][0]["restarts"] == 1)
    wait_state(server, waiting["id"], "PENDING")
    wait_for(lambda: server.get(f"/v1/jobs/{waiting['id']}").json()["reason"] == "Resources")
    time.sleep(0.6)  # a few failed readiness probes
    data = scrape(server)

    jobs = server.get("/v1/jobs", params={"all": True}).json()
    for state in ("PENDING", "RUNNING", "SUCCEEDED", "FAILED"):
        assert data["corral_jobs"][(("state", state),)] == sum(j["state"] == state for j in jobs), state
    pending = {(("partition", j["partition"]), ("reason", j["reason"])) for j in jobs if j["state"] == "PENDING"}
    assert set(data["corral_jobs_pending"]) == pending
    assert data["corral_jobs_pending"][(("partition", held["partition"]), ("reason", "JobHeldUser"))] == 1

    nodes = server.get("/v1/nodes").json()
    for node in nodes:
        labels = (("gpu_type", "H100"), ("infra", "local"), ("node", node["name"]))
        assert data["corral_node_gpus"][labels + (("state", "idle"),)] == len(node["free_gpus"])
        assert data["corral_node_gpus"][labels + (("state", "allocated"),)] == node["gpus"] - len(node["free_gpus"])
    assert data["corral_account_gpus_allocated"][(("account", "alice"),)] == 6  # the hog's 2 x 3
    assert (("account", "alice"), ("user", "alice")) in data["corral_fair_share"]

    assert data["corral_job_start_latency_seconds_count"][()] >= 3  # hog, flaky, probed started
    assert data["corral_scheduler_cycle_seconds_count"][()] >= 1
    assert data["corral_scheduler_placements_per_cycle_sum"][()] == 3  # hog, flaky, probed
    assert data["corral_replica_restarts_total"][(("cause", "exit"),)] == 1
    assert data["corral_probe_failures_total"][(("probe", "readiness"),)] >= 1
    routes = {dict(k)["route"] for k in data["corral_api_request_seconds_count"]}
    assert {"/v1/jobs", "/v1/jobs/{job}"} <= routes  # templates, never raw ids
    assert not any(ch.isdigit() for r in routes for ch in r.replace("/v1/", "/"))  # no job id leaks in
    assert data["corral_up"][()] == 1 and data["corral_server_start_time_seconds"][()] > 1.7e9
    for job in (hog, waiting, held, flaky, probed):
        server.post(f"/v1/jobs/{job['id']}/cancel")


def test_the_grafana_dashboard_reads_only_metrics_the_server_exposes(server) -> None:
    import json
    import re

    dashboard = json.loads((Path(__file__).parent.parent / "docs" / "grafana" / "corral.json").read_text())
    exposed = set()
    for family in text_string_to_metric_families(server.get("/metrics").text):  # declared, with samples or not
        suffixes = ("_bucket", "_sum", "_count") if family.type == "histogram" else ("_total",) if family.type == "counter" else ("",)
        exposed |= {family.name + suffix for suffix in suffixes}
    used = {name for panel in dashboard["panels"] for target in panel["targets"]
            for name in re.findall(r"corral_[a-z_]+", target["expr"])}
    assert used and used <= exposed, used - exposed
