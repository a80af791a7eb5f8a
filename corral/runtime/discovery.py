"""Names and addresses of replicas, and the files through which processes find their peers.

Every replica has a stable name ``{task}-{rank}.{job}`` and, on the local executor, its own
loopback address (Linux routes all of 127.0.0.0/8 to ``lo``), so two replicas may listen on
the same port. The address derives from the replica's row id, so it survives restarts.

Per job, two files are rewritten atomically whenever membership, state or readiness
changes: a hosts-format file (``CORRAL_HOSTS_FILE``) for tools that read one, and a JSON
peers file (``CORRAL_PEERS_FILE``). ``resolver/sitecustomize.py`` makes Python's ordinary
``socket.getaddrinfo`` resolve the names from the hosts file."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

RESOLVER_DIR = Path(__file__).parent / "resolver"


def loopback_address(replica_id: int) -> str:
    """127.a.b.c, skipping 127.0.x.x (where other local services live) and .0/.255 hosts."""
    index = replica_id - 1
    c = 1 + index % 254
    b = (index // 254) % 256
    a = 1 + (index // (254 * 256)) % 254
    return f"127.{a}.{b}.{c}"


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
                    "endpoints": {name: f"{r['addr']}:{port}" for name, port in t["ports"].items()},
                } for r in t["replicas"]],
            } for t in tasks
        },
    }


def hosts_text(peers: dict[str, Any]) -> str:
    lines = [f"# corral names of job {peers['job_id']} ({peers['job']}); rewritten as replicas change"]
    for task, data in peers["tasks"].items():
        for r in data["replicas"]:
            lines.append(f"{r['addr']}\t{r['hostname']} {task}-{r['rank']}")
    return "\n".join(lines) + "\n"


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_discovery(directory: Path, peers: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    write_atomically(directory / "peers.json", json.dumps(peers, indent=1))
    write_atomically(directory / "hosts", hosts_text(peers))
