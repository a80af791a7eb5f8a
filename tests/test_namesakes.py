"""Namesakes through the real ``corral`` command: the same batch script submitted twice
(``for lr in …; do sbatch train.sh $lr; done``, Slurm's commonest workflow) and the same YAML
launched twice, a job group among them. Both jobs run at once; each keeps its name
(``SLURM_JOB_NAME``, ``corral queue``), the second's replicas are named under ``NAME-ID``
(``CORRAL_HOSTNAME``, its host name, ``corral status``, the hosts and peers files), and every
replica resolves its own job's peers by name, under its domain and under the job's name alike,
never the other job's. A singleton of the name gets a domain of its own and waits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import cli_for, wait_for

POOL = """
nodes:
  - {name: n, count: 4, gpus: 0, cpus: 4, memory: 16}
"""

# Resolves a name as the replica's programs do: through the system resolver where corral binds
# the job's hosts over /etc/hosts, else through the Python resolver it injects.
RESOLVE = """resolve() {
  if [ "$CORRAL_NAMES" = mount-namespace ]; then getent hosts "$1" | awk '{print $1}'
  else python3 -c 'import socket, sys; print(socket.gethostbyname(sys.argv[1]))' "$1"; fi
}
"""
# What one replica writes: its names and what it resolves, as JSON lines; then it waits for the
# test's release, so both jobs run at once.
REPORT = RESOLVE + """report() {  # $1: the peer to resolve, by task-rank
  printf '{"rank": "%s", "hostname": "%s", "uts": "%s", "names": "%s", "hosts": "%s", "name": "%s", "domain": "%s", "master": "%s", \
"addr": "%s", "by_domain": "%s", "by_name": "%s", "peers": %s}\\n' "$2" "$CORRAL_HOSTNAME" "$(hostname)" \
    "$CORRAL_NAMES" "$(awk -v n="$CORRAL_HOSTNAME" '$2 == n {$1 = ""; print substr($0, 2)}' "$CORRAL_HOSTS_FILE")" "$3" "$CORRAL_JOB_DOMAIN" "$MASTER_ADDR" "$CORRAL_ADDR" "$(resolve "$1.$CORRAL_JOB_DOMAIN")" \
    "$(resolve "$1.$3")" "$(python3 -c 'import json, os; print(json.dumps(json.load(open(os.environ["CORRAL_PEERS_FILE"]))))')" \
    >> "$OUT/$CORRAL_JOB_ID.jsonl"
  for _ in $(seq 600); do [ -e "$OUT/release" ] && exit 0; sleep 0.1; done; exit 1
}
"""


@pytest.fixture
def corral(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(POOL)
    run = cli_for(home, {"OUT": str(tmp_path)}, cwd=tmp_path)
    yield run
    run.stop()


def status(corral, job: str) -> dict:
    return json.loads(corral("status", job, "--json", check=True).stdout)


def addresses(data: dict) -> dict[str, str]:
    return {f"{t['name']}-{r['rank']}": r["addr"] for t in data["tasks"] for r in t["replicas"]}


def run_both(corral, tmp_path: Path, *submit: str) -> tuple[dict, dict]:
    """Submit twice, wait until both run, release them; both jobs' status once they succeeded."""
    ids = []
    for _ in range(2):
        proc = corral(*submit, check=True)
        ids.append(proc.stdout.split()[-1])
    wait_for(lambda: all(status(corral, i)["state"] == "RUNNING" for i in ids), timeout=60)
    wait_for(lambda: all(len((tmp_path / f"{i}.jsonl").read_text().splitlines()) == 2
                         if (tmp_path / f"{i}.jsonl").exists() else False for i in ids), timeout=60)
    queue = corral("queue", check=True).stdout
    assert all(f"{i}\ts1\t" in queue or f"{i}\tgrp\t" in queue for i in ids), queue  # both keep their name
    (tmp_path / "release").touch()
    wait_for(lambda: all(status(corral, i)["state"] == "SUCCEEDED" for i in ids), timeout=60)
    (tmp_path / "release").unlink()
    return status(corral, ids[0]), status(corral, ids[1])


def check(first: dict, second: dict, tmp_path: Path, peer: str, name: str, batch: bool = False) -> None:
    """Each replica's names, and every name it resolved, are its own job's. ``batch``: a batch
    script's, whose nodes are named as Slurm names them (its host name is its node's, and its
    node's name is also its own in the hosts file: each replica here is alone on its node)."""
    assert first["domain"] == name and second["domain"] == f"{name}-{second['id']}"
    assert first["name"] == second["name"] == name
    for job, other in ((first, second), (second, first)):
        mine, theirs = addresses(job), addresses(other)
        assert set(mine.values()).isdisjoint(theirs.values())
        seen = [json.loads(line) for line in (tmp_path / f"{job['id']}.jsonl").read_text().splitlines()]
        labels = {f"{t['name']}-{r['rank']}": r["hostname"] for t in job["tasks"] for r in t["replicas"]}
        nodes = {f"{t['name']}-{r['rank']}": r["node"] for t in job["tasks"] for r in t["replicas"]}
        assert sorted(labels.values()) == sorted(f"{label}.{job['domain']}" for label in labels)  # corral status
        for one in seen:
            label = one["hostname"].split(".", 1)[0]
            assert one["hostname"] == labels[label]  # its name as corral status shows it
            # its line in the job's hosts file: its name first, then (a namesake's) under the job's name
            assert one["hosts"].split() == [one["hostname"]] + ([f"{label}.{name}"] if job is second else []) \
                + [label] + ([nodes[label]] if batch else [])
            if one["names"] == "mount-namespace":  # (in a UTS namespace of its own: its host name too)
                assert one["uts"] == (nodes[label] if batch else one["hostname"])
            assert one["name"] == name and one["domain"] == job["domain"] and one["addr"] == mine[label]
            # its own job's peer, under the domain and under the job's own name; never the other's
            assert one["by_domain"] == one["by_name"] == mine[peer], (one, mine, theirs)
            assert one["master"] in mine.values()
            peers = one["peers"]
            assert peers["job"] == name and peers["domain"] == job["domain"]
            assert {r["hostname"] for t in peers["tasks"].values() for r in t["replicas"]} == set(labels.values())


def test_a_batch_script_submitted_twice_runs_twice_each_job_resolving_its_own_peers(corral, tmp_path: Path) -> None:
    (tmp_path / "s1.sbatch").write_text("#!/bin/bash\n#SBATCH -N 2\n#SBATCH -o s1-%j.out\n" + REPORT
                                        + 'srun bash -c "$(declare -f resolve report); report node-0 '
                                          '\\$SLURM_PROCID \\$CORRAL_JOB_NAME"\n')
    first, second = run_both(corral, tmp_path, "sbatch", "s1.sbatch")
    check(first, second, tmp_path, "node-0", "s1", batch=True)
    # a singleton of the name waits behind its namesakes, under a domain of its own (a held
    # namesake released while it runs would otherwise answer to the same names)
    held = corral("sbatch", "-J", "s1", "--wrap", "sleep 60", check=True).stdout.split()[-1]
    single = corral("sbatch", "--dependency=singleton", "s1.sbatch", check=True).stdout.split()[-1]
    assert status(corral, held)["domain"] == "s1"
    wait_for(lambda: status(corral, single)["reason"] == "Dependency")
    assert status(corral, single)["domain"] == f"s1-{single}"
    corral("cancel", held, single, check=True)


@pytest.mark.parametrize("group", [False, True], ids=["task", "group"])
def test_a_yaml_launched_twice_runs_twice_each_job_resolving_its_own_peers(corral, tmp_path: Path,
                                                                          group: bool) -> None:
    def run(peer: str, name: str) -> str:
        return "run: |\n  " + REPORT.replace("\n", "\n  ") + f"report {peer} $CORRAL_REPLICA {name}\n"
    if group:
        text = ("name: grp\nexecution: parallel\n---\nname: trainer\nnum_nodes: 1\n" + run("reward-0", "grp")
                + "---\nname: reward\nnum_nodes: 1\n" + run("trainer-0", "grp"))
    else:
        text = "name: s1\nnum_nodes: 2\n" + run("s1-1", "s1")
    (tmp_path / "job.yaml").write_text(text)
    first, second = run_both(corral, tmp_path, "launch", "-d", "job.yaml")
    if group:  # each task resolves the other one: check each replica against its own peer
        for job in (first, second):
            lines = [json.loads(x) for x in (tmp_path / f"{job['id']}.jsonl").read_text().splitlines()]
            mine = addresses(job)
            assert {x["hostname"].split(".")[0]: x["by_domain"] for x in lines} == \
                {"trainer-0": mine["reward-0"], "reward-0": mine["trainer-0"]}
            assert all(x["by_name"] == x["by_domain"] for x in lines)
        assert first["domain"] == "grp" and second["domain"] == f"grp-{second['id']}"
        return
    check(first, second, tmp_path, "s1-1", "s1")
