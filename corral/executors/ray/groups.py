"""The Ray driver's holds on its nodes: each replica's resources reserved in Ray's own
accounting by a placement group pinned to the node corral chose (a bundle label selector on
``ray.io/node-id``), so no other Ray user can take them between decision and start. A gang's
groups are all made ready before any of its replicas starts, and all removed if one cannot
be (all or none); a replica whose node leaves the cluster meanwhile is *doomed*: reported
lost at its start, so its restart policy (or the job's requeue) decides, as for any lost
replica. A restart reuses its replica's group: same node, same GPUs. Groups are detached
and named after the job, so a restarted server finds (and releases) an earlier one's."""

from __future__ import annotations

import logging
import time
from typing import Any

from corral.executors.contract import LaunchError

log = logging.getLogger("corral.ray")

RESERVE_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 15.0


class Groups:
    def __init__(self, driver) -> None:  # noqa: ANN001 - the RayDriver (its nodes, its lock)
        self._driver = driver
        self._ray = driver._ray
        self._groups: dict[tuple[int, str], Any] = {}  # (job, label) -> (name, its placement group)
        self._earlier: dict[int, list[str]] | None = None  # job -> placement groups of an earlier server
        self._doomed: dict[tuple[int, str], tuple[str, str]] = {}  # (job, label) -> (node, why) lost at reserve

    def held(self, job_id: int, label: str) -> tuple[Any, tuple[str, str] | None]:
        """The replica's group (or None), and (node, why) if it was doomed at its reservation."""
        with self._driver._lock:
            return self._groups.get((job_id, label)), self._doomed.pop((job_id, label), None)

    def reserve(self, job_id: int, generation: int, slots) -> None:
        """All or nothing: every slot's group ready, or none held (``LaunchError``)."""
        made, waits = [], []
        for label, node, gpus, cpus, memory in slots:
            name = f"corral-{self._driver.scope}-j{job_id}g{generation}-{label}-{node}"
            with self._driver._lock:
                existing = self._groups.get((job_id, label))
                self._doomed.pop((job_id, label), None)
                gone = node in self._driver._gone_nodes
            if existing is not None and existing[0] == name:
                continue
            if gone:
                self._doom(job_id, label, node)
                continue
            pg = self._earlier_group(job_id, name)
            if pg is None:
                bundle: dict[str, float] = {"CPU": cpus}
                if len(gpus):
                    bundle["GPU"] = float(len(gpus))
                if memory > 0:
                    bundle["memory"] = float(int(memory * 2**30))
                pg = self._ray.util.placement_group([bundle], strategy="STRICT_PACK", name=name, lifetime="detached",
                                                    bundle_label_selector=[{"ray.io/node-id": self._driver._node_id(node)}])
                made.append(pg)
            waits.append(((job_id, label), name, pg, node))
        pending = {pg.ready(): entry for entry in waits for pg in [entry[2]]}
        deadline = time.monotonic() + RESERVE_TIMEOUT_S
        try:
            while pending and time.monotonic() < deadline:
                ready, _ = self._ray.wait(list(pending), num_returns=len(pending), timeout=1.0)
                for ref in ready:
                    self._ray.get(ref, timeout=CALL_TIMEOUT_S)
                    pending.pop(ref)
                gone = self._driver._refresh_nodes_and_gone()
                for ref, (slot, _, pg, node) in list(pending.items()):
                    if node in gone:  # a node that died meanwhile: its replica is lost, not the gang refused
                        pending.pop(ref)
                        waits.remove((slot, _, pg, node))
                        self._remove_group(pg)
                        self._doom(job_id, slot[1], node)
            if pending:
                raise TimeoutError(f"{len(pending)} not ready")
        except Exception as exc:
            from corral.executors.ray.driver import _short

            for pg in made:  # all or none: nothing of the gang stays held
                self._remove_group(pg)
            with self._driver._lock:
                for label, *_ in slots:
                    self._doomed.pop((job_id, label), None)
            raise LaunchError(f"Ray could not reserve {len(slots)} replica(s) within {RESERVE_TIMEOUT_S:g}s: "
                              f"{_short(exc)}") from exc
        with self._driver._lock:
            for slot, name, pg, _ in waits:
                old = self._groups.get(slot)
                if old is not None and old[0] != name:  # placed again elsewhere: the old hold goes
                    self._remove_group(old[1])
                self._groups[slot] = (name, pg)

    def _doom(self, job_id: int, label: str, node: str) -> None:
        with self._driver._lock:
            self._doomed[(job_id, label)] = (node, f"node {node} left the Ray cluster while the job's replicas "
                                                   "were being reserved")

    def release(self, job_id: int) -> None:
        with self._driver._lock:
            mine = [k for k in self._groups if k[0] == job_id]
            groups = [self._groups.pop(k)[1] for k in mine]
            for slot in [k for k in self._doomed if k[0] == job_id]:
                self._doomed.pop(slot)
        for pg in groups:
            self._remove_group(pg)
        for name in self._earlier_groups().pop(job_id, []):  # made before a server restart
            try:
                self._remove_group(self._ray.util.get_placement_group(name))
            except ValueError:
                pass

    def _earlier_group(self, job_id: int, name: str):  # noqa: ANN202 - a Ray PlacementGroup
        """The group ``name`` if an earlier server made it, else None (Ray's GCS is asked only
        when its table named one: not once per replica)."""
        if name not in self._earlier_groups().get(job_id, ()):
            return None
        try:
            return self._ray.util.get_placement_group(name)
        except ValueError:
            return None

    def _earlier_groups(self) -> dict[int, list[str]]:
        """Live placement groups of this scope that an earlier server made, by job: read from
        Ray's table once (it keeps removed groups too, so reading it per job would grow)."""
        if self._earlier is None:
            self._earlier = {}
            prefix = f"corral-{self._driver.scope}-j"
            for info in self._ray.util.placement_group_table().values():
                name = str(info.get("name", ""))
                if name.startswith(prefix) and info.get("state") != "REMOVED":
                    job = name[len(prefix):].split("g", 1)[0]
                    if job.isdigit():
                        self._earlier.setdefault(int(job), []).append(name)
        return self._earlier

    def _remove_group(self, pg) -> None:
        try:
            self._ray.util.remove_placement_group(pg)
        except Exception:
            log.debug("placement group already gone", exc_info=True)
