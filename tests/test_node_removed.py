"""A node taken out of config.yaml while a replica runs on it, then the server restarted:
as a node deleted from a cluster, the replica there is ended (its process really gone, never
alive beside a replacement) and reported lost naming the node, and every scheduling cycle
still runs (before, each one failed with KeyError on the node, so cancels timed out)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import psutil

from conftest import cli_events, cli_for, shared_account, wait_for

NODES = """
nodes:
  - {{name: keep, gpus: 2, gpu_type: H100, cpus: 8, memory: 64}}
{drop}"""
DROP = "  - {name: drop, gpus: 2, gpu_type: H100, cpus: 8, memory: 64}\n"


def _status(corral, job: str) -> dict:
    return json.loads(corral("status", job, "--json", check=True).stdout)


def test_a_replica_on_a_node_removed_from_the_configuration_is_ended_and_lost(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    config = home / "config.yaml"
    config.write_text(NODES.format(drop=DROP) + shared_account(NODES))
    corral = cli_for(home, timeout=120)
    try:
        spec = tmp_path / "pair.yaml"
        spec.write_text("name: pair\nnum_nodes: 2\nresources: {accelerators: H100:2}\nrun: exec sleep 600\n")
        job = corral("launch", "-d", str(spec), check=True).stdout.strip()
        running = wait_for(lambda: (s := _status(corral, job))["state"] == "RUNNING"
                           and all(r["pid"] for r in s["tasks"][0]["replicas"]) and s, timeout=60)
        on_drop = next(r for r in running["tasks"][0]["replicas"] if r["node"] == "drop")
        victim = psutil.Process(on_drop["pid"])

        corral("server", "stop", check=True)  # its replicas run on, as they do across restarts
        assert victim.is_running()
        config.write_text(NODES.format(drop="") + shared_account(NODES))
        corral("queue", check=True)  # the server starts again, without the node

        # the process on the removed node is gone before anything else happens to its replica
        wait_for(lambda: not victim.is_running() or victim.status() == psutil.STATUS_ZOMBIE, timeout=30)
        told = wait_for(lambda: [e for e in cli_events(corral, job)
                                 if "node drop is no longer in the site's configuration" in (e.get("message") or "")],
                        timeout=30)
        assert told, cli_events(corral, job)
        # as for any lost node, the gang is requeued (its other replica stopped first)
        wait_for(lambda: any(e["subject"] == "job" and e["cause"] == "requeued" for e in cli_events(corral, job)),
                 timeout=60)
        # the scheduler keeps cycling with work pending: a job that cannot fit waits with a reason,
        # and a cancel is carried out (each timed out before)
        other = tmp_path / "other.yaml"
        other.write_text("name: other\nresources: {accelerators: H100:2}\nrun: exec sleep 600\n")
        waiting = corral("launch", "-d", str(other), check=True).stdout.strip()
        wait_for(lambda: _status(corral, waiting)["state"] in ("PENDING", "RUNNING"), timeout=30)
        assert corral("cancel", job, timeout=60).returncode == 0
        wait_for(lambda: _status(corral, job)["state"] == "CANCELLED", timeout=60)
        events = cli_events(corral, job)
        assert not [e for e in events if "lost database write" in (e.get("message") or "")], events
        assert not any(r["node"] == "drop" and r["state"] == "RUNNING"
                       for r in _status(corral, job)["tasks"][0]["replicas"])
        assert not victim.is_running() or victim.status() == psutil.STATUS_ZOMBIE
        assert os.path.exists(home)
    finally:
        corral.stop()
