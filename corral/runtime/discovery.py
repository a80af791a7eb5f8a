"""Names and addresses of replicas, and the files through which processes find their peers.

Every replica has a stable name ``{task}-{rank}.{job}``; its address and ports are its
executor's choice (on the local executor its own loopback address, derived from the
replica's row id, so two replicas may listen on the same port; on Ray and Slurm its node's
IP, with the declared ports themselves: the scheduler keeps two replicas of one port off one
address, ``port_domain``).

Per job, two documents are rebuilt whenever membership, state or readiness changes: hosts
lines (the executor binds them over ``/etc/hosts`` where it can, and writes
``CORRAL_HOSTS_FILE``) and a JSON peers file (``CORRAL_PEERS_FILE``).
``resolver/sitecustomize.py`` makes Python's ``socket.getaddrinfo`` resolve the names from
the hosts file where the system resolver cannot."""

from __future__ import annotations

import ipaddress
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


def hostname(task: str, rank: int, job_name: str) -> str:
    return f"{task}-{rank}.{job_name}"


def peers_document(job_id: int, job_name: str, tasks: list[dict[str, Any]], updated_at: float) -> dict[str, Any]:
    """``tasks``: [{name, ports, replicas: [{rank, addr, state, ready, restarts}]}]."""
    return {
        "job_id": job_id,
        "job": job_name,
        "updated_at": updated_at,
        "tasks": {
            t["name"]: {
                "ports": t["ports"],
                "replicas": [{
                    "rank": r["rank"],
                    "hostname": hostname(t["name"], r["rank"], job_name),
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
    """The job's hosts lines. ``node_names`` (a batch script's job, whose programs name its
    nodes as Slurm does: ``scontrol show hostnames``, ``MASTER_ADDR=$(… | head -n1)``): each node
    of the job is also a name of the first replica on it, so a node name resolves as on Slurm."""
    lines = [f"# corral names of job {peers['job_id']} ({peers['job']}); rewritten as replicas change"]
    named: set[str] = set()
    for task, data in peers["tasks"].items():
        for r in data["replicas"]:
            if r["addr"]:
                node = r.get("node")
                alias = f" {node}" if node_names and node and node not in named else ""
                if alias:
                    named.add(node)
                lines.append(f"{r['addr']}\t{r['hostname']} {task}-{r['rank']}{alias}")
    return "\n".join(lines) + "\n"
