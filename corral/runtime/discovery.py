"""Names and addresses of replicas, and the files through which processes find their peers.

Every replica has a stable name ``{task}-{rank}.{domain}``; its address and ports are its
executor's choice (on the local executor its own loopback address, derived from the
replica's row id, so two replicas may listen on the same port; on Ray and Slurm its node's
IP, with the declared ports themselves: the scheduler keeps two replicas of one port off one
address, ``port_domain``).

Per job, two documents are rebuilt whenever membership, state or readiness changes: hosts
lines (the executor binds them over ``/etc/hosts`` where it can, and writes
``CORRAL_HOSTS_FILE``) and a JSON peers file (``CORRAL_PEERS_FILE``).
``resolver/sitecustomize.py`` makes Python's ``socket.getaddrinfo`` resolve the names from
the hosts file where the system resolver cannot.

A job's domain is its name, unless another active job of its user already holds that domain
when it is submitted: then it is ``{name}-{id}`` (``choose_domain``). Slurm and SkyPilot accept
any number of jobs of one name (``for lr in …; do sbatch train.sh $lr; done``), and the job
keeps its name everywhere a name is shown; only its replicas' names differ, so that no two
active jobs of one user answer to the same host name. In a job's own hosts file each replica
also answers to ``{task}-{rank}.{name}`` (its job's replica, never another job's: the file is
the job's own), so a script that spells its job's name finds its own peers, however many
namesakes run."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RESOLVER_DIR = Path(__file__).parents[1] / "node" / "resolver"


LOOPBACK = "loopback"


def port_domain(addr: str) -> str:
    """The port space a node's replicas share, named for the scheduler: its address, or
    ``loopback`` for every node on a loopback address (nodes of this very machine, such as a
    Slurm or Ray lab's, share its one network stack, whatever loopback address each is given)."""
    try:
        return LOOPBACK if ipaddress.ip_address(addr).is_loopback else addr
    except ValueError:
        return addr  # a host name: its own machine


def hostname(task: str, rank: int, domain: str) -> str:
    return f"{task}-{rank}.{domain}"


def choose_domain(name: str, job_id: int, taken: Mapping[str, str]) -> str:
    """The domain of a new job's replica names, given ``taken``: the domains its user's
    active jobs hold (domain -> the name of the job holding it). Its name when that is free
    (also for a ``dependency: singleton``: a namesake held when it started may be released
    and run beside it, as in Slurm). Otherwise ``{name}-{id}``,
    which no other job's ``{name}-{id}`` can equal (an id has no '-': the last '-' splits it one
    way only); but a job may have been *named* so (``s1-28``), and then it is ``{name}.{id}``,
    which no name can be (a name has no '.')."""
    if name not in taken:
        return name
    suffixed = f"{name}-{job_id}"
    return suffixed if suffixed not in taken else f"{name}.{job_id}"


def peers_document(job_id: int, job_name: str, tasks: list[dict[str, Any]], updated_at: float,
                   domain: str | None = None) -> dict[str, Any]:
    """``tasks``: [{name, ports, replicas: [{rank, addr, state, ready, restarts}]}];
    ``domain``: that of the replicas' names (None: the job's name)."""
    domain = domain or job_name
    return {
        "job_id": job_id,
        "job": job_name,
        "domain": domain,
        "updated_at": updated_at,
        "tasks": {
            t["name"]: {
                "ports": t["ports"],
                "replicas": [{
                    "rank": r["rank"],
                    "hostname": hostname(t["name"], r["rank"], domain),
                    "addr": r["addr"],
                    "state": r["state"],
                    "ready": r["ready"],
                    "restarts": r["restarts"],
                    "node": r.get("node"),
                    "ports": r.get("ports", t["ports"]),
                    # the declared ports this replica could not have, and the ones it has instead
                    "moved_ports": {name: {"declared": port, "bound": r["ports"][name]}
                                    for name, port in t["ports"].items()
                                    if r.get("ports") and r["ports"].get(name, port) != port},
                    "endpoints": {name: f"{r['addr']}:{port}" for name, port in r.get("ports", t["ports"]).items()},
                    # a multi-node service replica's members: which gang (its head is the gang's rank 0)
                    **({"gang": r["gang"]} if r.get("gang") is not None else {}),
                } for r in t["replicas"]],
            } for t in tasks
        },
    }


def hosts_text(peers: dict[str, Any], node_names: bool = False) -> str:
    """The job's hosts lines: each replica's name first (what reverse lookups answer), then its
    name under the job's own name when its domain differs (the job's own replica: this file is
    its alone), then the short ``{task}-{rank}``. ``node_names`` (a batch script's job, whose
    programs name its nodes as Slurm does: ``scontrol show hostnames``, ``MASTER_ADDR=$(… |
    head -n1)``): each node of the job is also a name of the first replica on it."""
    domain = peers.get("domain") or peers["job"]
    lines = [f"# corral names of job {peers['job_id']} ({peers['job']}"
             + (f", domain {domain}" if domain != peers["job"] else "") + "); rewritten as replicas change"]
    named: set[str] = set()
    for task, data in peers["tasks"].items():
        for r in data["replicas"]:
            if r["addr"]:
                alias = f" {task}-{r['rank']}.{peers['job']}" if domain != peers["job"] else ""
                node = r.get("node")
                on_node = f" {node}" if node_names and node and node not in named else ""
                if on_node:
                    named.add(node)
                lines.append(f"{r['addr']}\t{r['hostname']}{alias} {task}-{r['rank']}{on_node}")
    return "\n".join(lines) + "\n"
