"""The ``file_mounts`` sources the Ray driver sends to nodes that do not see them (another
machine, a worker in a namespace of its own): each source is packed once per job on the
machine the server runs on (where the job was submitted), read with the job's account's
rights, and put in Ray's object store; a node that lacks it fetches it from there once
(``actor.ReplicaActor`` asks, then unpacks it under the job's lock: ``corral.node.mounts``). No copy program, no agent of corral's: Ray's
own transport. The objects are dropped when the job ends.

A source over the cluster's limit (config.yaml ``infra.ray.file_mounts_max_gb``) is not
sent: the replica fails with a sentence naming the mount, its size and the limit."""

from __future__ import annotations

import threading
from typing import Any

from corral.node.mounts import pack_as
from corral.node.staging import human


class Sources:
    def __init__(self, ray, limit_gb: float):  # noqa: ANN001 - the ray module
        self._ray = ray
        self.limit = int(limit_gb * 2**30)
        self._lock = threading.Lock()
        self._sent: dict[tuple[int, str], Any] = {}  # (job, source) -> its object ref, or why it is refused
        self._packing: dict[tuple[int, str], threading.Lock] = {}

    def archives(self, job_id: int, sources: list[str], mounts: list[tuple[str, str]],
                 reader: tuple[int, int, tuple[int, ...]] | None = None) -> dict[str, list | str]:
        """For each source: ``[object ref]`` (in a list, so Ray hands the actor the reference,
        not the object), or the sentence saying why it cannot be sent. ``reader``: the job's
        account (uid, gid, groups) where this process is root for others: a source is read
        with its rights, never the server's."""
        out: dict[str, list | str] = {}
        for source in sources:
            with self._lock:
                lock = self._packing.setdefault((job_id, source), threading.Lock())
            with lock:  # replicas starting together: packed and put once
                with self._lock:
                    known = self._sent.get((job_id, source))
                if known is None:
                    remote = next((r for r, s in mounts if s == source), source)
                    known = self._ship(source, remote, reader)
                    with self._lock:
                        self._sent[(job_id, source)] = known
            out[source] = known if isinstance(known, str) else [known]
        return out

    def _ship(self, source: str, remote: str, reader) -> Any:  # noqa: ANN001
        where = f"file_mounts.{remote}: {source}"
        try:
            packed = pack_as(reader, source, self.limit)
        except OSError as exc:
            return f"{where} cannot be read on the submitting machine ({exc.strerror or exc})"
        if packed is None:
            return (f"{where} is larger than the {human(self.limit)} that corral copies to a Ray node that "
                    "does not see it (config.yaml infra.ray.file_mounts_max_gb): put it on a filesystem the "
                    "nodes share, or raise the limit")
        return self._ray.put(packed)

    def drop(self, job_id: int) -> None:
        """The job ended: its sources leave the object store (once no actor holds them)."""
        with self._lock:
            for slot in [k for k in self._sent if k[0] == job_id]:
                self._sent.pop(slot)
                self._packing.pop(slot, None)
