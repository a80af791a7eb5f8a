"""The Ray driver: corral's Ray client, in a process of its own that the server's
``RayExecutor`` talks to (``link``), so that Ray's client library, which ends its process
when the cluster's head stays away for a minute, never ends the server. corral's scheduler
decides placement; Ray realises it.

* Nodes come from Ray's own view (``ray.nodes()``): GPUs, the ``accelerator_type:*``
  resource as GPU type, CPUs, memory, and node labels (``switch``/``leaf`` for topology). A
  node that joins is schedulable; one that leaves is DOWN, and its attempts are lost (their
  fences end them on the node: ``fence``).
* Each replica's resources are held in Ray's accounting by a placement group pinned to the
  node corral chose, a gang's all or none (``groups``).
* Each attempt is a detached actor named after its key (``actor.ReplicaActor``) that runs
  ``setup``/``run`` as a process on that node with the same environment contract as locally;
  ``CUDA_VISIBLE_DEVICES`` are the GPUs Ray assigned.
* Logs are pulled from the node into the server's log directory while attempts run
  (``logcopy``). A replica in a container is STARTED once its container runs (its image
  pulled), and its exit carries what a failed pull said. Its node is sent the job's
  file_mounts it does not see through Ray's object store (``sources``).
* After a server (or driver) restart the actors are found again by name: running ones are
  adopted, ended ones report their exit, and none is started twice.

Names on the cluster carry the *node scope* (the server's home and that home's instance),
so a home made anew never takes an earlier home's actors, groups or node directories for
its own."""

from __future__ import annotations

import dataclasses

import logging
import threading
import time
from typing import Any

from corral.executors.contract import (Binding, EventStream, Handle, Kind, Launch, LaunchError, Observed, Started,
                                      Wake)
from corral.executors.ray import logcopy
from corral.executors.ray.groups import Groups
from corral.executors.ray.ports import NodePorts
from corral.executors.ray.relay import READ_WAIT_S
from corral.executors.ray.sources import Sources
from corral.pool import NodeSpec
from corral.runtime.discovery import port_domain

log = logging.getLogger("corral.ray")

START_TIMEOUT_S = 60.0
CALL_TIMEOUT_S = 15.0
POLL_S = 0.5
KICK_S = 0.02  # how long a start sent meanwhile may wait for the watcher to add it to its wait
UNAVAILABLE_S = 20.0  # an actor unreachable this long (its node still in the cluster) is lost


FENCED = "its fence on the node ends its processes when its Ray worker or the raylet dies"


class RayDriver(EventStream):
    name = "ray"

    def __init__(self, config, settings, scope: str, namespace: str, wake: Wake = lambda: None):
        super().__init__(wake)
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

        from corral.executors.ray import actor as rayactor

        self._ray = ray
        self._affinity = NodeAffinitySchedulingStrategy
        self._in_group = PlacementGroupSchedulingStrategy
        self.scope = scope
        self.prefix = config.node_prefix
        self.namespace = namespace
        self.settings = settings
        self.address = config.address
        if not ray.is_initialized():
            ray.init(address=config.address, namespace=self.namespace, log_to_driver=False,
                     logging_level=logging.WARNING, configure_logging=False)
        self._actor_class = ray.remote(rayactor.ReplicaActor)
        self._ports = NodePorts(ray, ray.remote(rayactor.free_ports), self._pinned)
        self._kill_tree = ray.remote(rayactor.kill_tree)
        self._cleanup = ray.remote(rayactor.cleanup_job)
        self._runtime_dir = rayactor.node_dirs(scope)[2]
        self._lock = threading.RLock()
        self._nodes: dict[str, NodeSpec] = {}
        self._gone_nodes: set[str] = set()
        self._node_ids: dict[str, tuple[str, str]] = {}  # name -> (Ray node id, IP)
        self._version = 0
        self._live: dict[str, dict] = {}  # key -> {"actor", "ref", "job", "node", "label", "offset"}
        self._starting: dict[str, dict] = {}  # key -> {"ref", "actor", "handle", "job", "label", "deadline", "data"}
        self._sending: dict[str, dict] = {}  # starts waiting for their file_mounts sources to be sent
        self._pulling: dict[str, dict] = {}  # key -> {"ref", "handle", "gpus", "detail"}: running once its container does
        self._sources = Sources(ray, config.file_mounts_max_gb)
        self._docs: dict[int, tuple[str, str]] = {}  # job -> (hosts, peers) last published
        self._closed = threading.Event()
        self._kick = threading.Event()  # a start was sent: the watcher stops waiting on older refs
        self._suspects: set[str] = set()  # Ray node ids whose raylet died, before Ray says so
        self.answered = time.monotonic()  # when Ray last answered a look at its nodes
        self._holds = Groups(self)
        self._refresh_nodes()
        self._thread = threading.Thread(target=self._watch, name="corral-ray-watcher", daemon=True)
        self._thread.start()
        self._looker = threading.Thread(target=self._look, name="corral-ray-nodes", daemon=True)
        self._looker.start()

    # -- inventory ---------------------------------------------------------------------------
    def nodes(self) -> list[NodeSpec]:
        with self._lock:
            return list(self._nodes.values())

    @property
    def inventory_version(self) -> int:
        return self._version

    def _node_name(self, info: dict, shared_ip: bool) -> str:
        """``corral.node`` if the node carries that label, else the prefix and its IP (and
        its raylet's port where several nodes share one IP, as in a one-host test)."""
        labels = info.get("Labels") or {}
        if labels.get("corral.node"):
            return str(labels["corral.node"])
        name = f"{self.prefix}-{info['NodeManagerAddress'].replace('.', '-').replace(':', '-')}"
        return f"{name}-{info['NodeManagerPort']}" if shared_ip else name

    def _refresh_nodes(self) -> list[str]:
        """Take Ray's view of its nodes; returns the names of nodes that went away."""
        nodes, ids = {}, {}
        alive = [info for info in self._ray.nodes() if info.get("Alive")]
        self.answered = time.monotonic()
        with self._lock:
            self._suspects &= {info["NodeID"] for info in alive}
            alive = [info for info in alive if info["NodeID"] not in self._suspects]
        ips = [info["NodeManagerAddress"] for info in alive]
        for info in alive:
            res = info.get("Resources") or {}
            gpu_types = [k.split(":", 1)[1] for k in res if k.startswith("accelerator_type:")]
            labels = {str(k): str(v) for k, v in (info.get("Labels") or {}).items()
                      if not str(k).startswith("ray.io/") and k != "corral.node"}
            name = self._node_name(info, ips.count(info["NodeManagerAddress"]) > 1)
            nodes[name] = NodeSpec(name=name, gpus=int(res.get("GPU", 0)), gpu_type=gpu_types[0] if gpu_types else None,
                                   cpus=max(float(res.get("CPU", 0.0)), 0.001),
                                   memory=round(float(res.get("memory", 0.0)) / 2**30, 3), labels=labels,
                                   address=port_domain(info["NodeManagerAddress"]))
            ids[name] = (info["NodeID"], info["NodeManagerAddress"])
        with self._lock:
            gone = [n for n in self._nodes if n not in nodes]
            self._gone_nodes = (self._gone_nodes | set(gone)) - set(nodes)
            if nodes != self._nodes:
                self._nodes, self._node_ids = nodes, ids
                self._version += 1
                self._wake_loop()
        return gone

    def _ip(self, node: str) -> str:
        with self._lock:
            if node not in self._node_ids:
                raise LaunchError(f"Ray node {node} is not in the cluster")
            return self._node_ids[node][1]

    def _node_id(self, node: str) -> str:
        with self._lock:
            if node not in self._node_ids:
                raise LaunchError(f"Ray node {node} is not in the cluster")
            return self._node_ids[node][0]

    def _pinned(self, node: str):
        with self._lock:
            if node not in self._node_ids:
                raise LaunchError(f"Ray node {node} is not in the cluster")
            return self._affinity(self._node_ids[node][0], soft=False)

    # -- binding -------------------------------------------------------------------------------
    def bind(self, job_id: int, replica_id: int, node: str, ports: dict[str, int],
             previous: Binding | None) -> Binding:
        """The declared ports themselves: the scheduler placed the replica where no other of
        corral's holds them on this address, so only a process corral did not start (checked on
        the node) makes one move, and the binding says so."""
        ip = self._ip(node)
        if previous is not None and previous.addr == ip and set(previous.ports) == set(ports):
            return previous
        chosen = self._ports.take(node, list(ports.values()), 0)
        moved = [f"{want} is in use on {node}" for want, got in zip(ports.values(), chosen) if want != got]
        return Binding(ip, dict(zip(ports, chosen)), "; ".join(moved))

    def rendezvous_port(self, node: str) -> int:
        return self._ports.take(node, [], 1)[0]

    # -- reservations (``groups``) -------------------------------------------------------------
    def reserve(self, job_id: int, generation: int, slots) -> None:
        self._holds.reserve(job_id, generation, slots)

    def release(self, job_id: int) -> None:
        with self._lock:
            self._docs.pop(job_id, None)
        self._holds.release(job_id)

    # -- attempts ------------------------------------------------------------------------------
    def _actor_name(self, key: str) -> str:
        return f"corral-{self.scope}-{key}"

    def start(self, launch: Launch) -> Started:
        group, doomed = self._holds.held(launch.job_id, launch.label)
        with self._lock:
            hosts, peers = self._docs.get(launch.job_id, ("", "{}"))
        if doomed is not None:  # lost like any replica whose node died: its restart policy decides
            node, why = doomed
            self._emit(Observed(launch.key, Kind.LOST, node=node, reason=why))
            return Started({"actor": self._actor_name(launch.key), "key": launch.key, "node": node,
                            "scope": self.scope, "pending": True}, confirmed=False, detail="its node left")
        if group is None:
            raise LaunchError(f"no Ray reservation for {launch.label}")
        name = self._actor_name(launch.key)
        options: dict[str, Any] = {"name": name, "namespace": self.namespace, "lifetime": "detached",
                                   "num_cpus": launch.cpus, "num_gpus": len(launch.gpus), "max_restarts": 0,
                                   "max_concurrency": 16,
                                   "scheduling_strategy": self._in_group(group[1], placement_group_bundle_index=0)}
        if launch.memory > 0:
            options["memory"] = int(launch.memory * 2**30)
        try:
            actor = self._actor_class.options(**options).remote(self.scope)
        except Exception as exc:
            raise LaunchError(f"Ray refused the replica's actor: {_short(exc)}") from exc
        data = {"key": launch.key, "job_id": launch.job_id, "setup": launch.setup, "run": launch.run,
                "env": launch.env, "cwd": launch.cwd, "hosts": launch.hosts,
                "repo": list(launch.repo) if launch.repo else None, "dirs": list(launch.dirs),
                "container": dataclasses.asdict(launch.container) if launch.container else None,
                "file_mounts": [list(m) for m in launch.file_mounts],
                "reader": [launch.run_as.uid, launch.run_as.gid, list(launch.run_as.groups)] if launch.run_as else None}
        handle = {"actor": name, "key": launch.key, "node": launch.node, "scope": self.scope, "pending": True}
        with self._lock:  # the watcher confirms the start (STARTED) or reports it failed (LOST)
            self._starting[launch.key] = {"ref": actor.start.remote(data, hosts, peers), "actor": actor,
                                          "handle": handle, "job": launch.job_id, "label": launch.label,
                                          "deadline": time.monotonic() + START_TIMEOUT_S, "data": data}
        self._kick.set()
        return Started(handle, confirmed=False, detail=f"actor {name}")

    def _confirm(self, key: str, entry: dict, ready: bool) -> None:
        """The actor answered its start (or ran out of time): STARTED with the GPUs Ray
        bound, or LOST with why, and nothing of the attempt left behind."""
        handle = dict(entry["handle"])
        node = handle["node"]
        try:
            if not ready:
                raise TimeoutError(f"not started within {START_TIMEOUT_S:g}s")
            info = self._ray.get(entry["ref"], timeout=CALL_TIMEOUT_S)
        except Exception as exc:
            try:
                self._ray.kill(entry["actor"], no_restart=True)
            except Exception:
                pass
            self._end_remote_tree(key, node)
            self._emit(Observed(key, Kind.LOST, node=node,
                                reason=f"could not start on {node}: {_short(exc)}"))
            return
        if "need" in info:  # its node does not see some of the job's file_mounts: sent first, then started
            with self._lock:
                self._sending[key] = entry
            threading.Thread(target=self._send, args=(key, entry, info["need"]), daemon=True).start()
            return
        self._track(key, entry["actor"], entry["job"], node, entry["label"], 0)
        if "failed" in info:  # its mounts could not appear: its end (and why) comes with its wait
            return
        handle.pop("pending", None)
        handle.update(node_pid=info["node_pid"], gpus=info["gpus"])
        self._started(key, entry["actor"], handle, node, info["gpus"], f"pid {info['node_pid']} on {node}",
                      info.get("pulling"))

    def _started(self, key: str, actor, handle: Handle, node: str, gpus, detail: str, pulling: bool) -> None:
        """STARTED, or once its container runs when its image is still being pulled (STARTING)."""
        if pulling:
            with self._lock:
                self._pulling[key] = {"ref": actor.until_running.remote(), "handle": handle, "node": node,
                                      "gpus": gpus, "detail": detail}
            self._kick.set()
            return
        self._emit(Observed(key, Kind.STARTED, handle=handle, node=node, gpus=tuple(gpus) if gpus is not None else None,
                            detail=detail))

    def _running(self, key: str, ref) -> None:
        with self._lock:
            entry = self._pulling.pop(key, None)
            live = key in self._live
        try:
            runs = bool(self._ray.get(ref, timeout=CALL_TIMEOUT_S))
        except Exception:
            runs = False  # its actor died: its wait says so
        if entry is not None and runs and live:
            self._started(key, None, entry["handle"], entry["node"], entry["gpus"],
                          entry["detail"] + ", in its container", False)

    def _send(self, key: str, entry: dict, need: list[str]) -> None:
        """The sources its node lacks go through Ray's object store (``sources``); then it starts."""
        data = entry["data"]
        try:
            reader = data.get("reader")
            archives = self._sources.archives(entry["job"], need, [tuple(m) for m in data["file_mounts"]],
                                              (reader[0], reader[1], tuple(reader[2])) if reader else None)
        except Exception as exc:
            archives = {source: f"{source} could not be sent to the node: {_short(exc)}" for source in need}
        with self._lock:
            if self._sending.pop(key, None) is None:
                return  # killed meanwhile: it never starts
            hosts, peers = self._docs.get(entry["job"], ("", "{}"))
            self._starting[key] = {**entry, "ref": entry["actor"].start.remote({**data, "archives": archives}, hosts,
                                                                               peers),
                                   "deadline": time.monotonic() + START_TIMEOUT_S}
        self._kick.set()

    def _track(self, key: str, actor, job_id: int, node: str, label: str, offset: int) -> None:
        with self._lock:
            self._live[key] = {"actor": actor, "ref": actor.wait.remote(), "job": job_id, "node": node,
                               "label": label, "offset": offset}

    def adopt(self, attempts: list[tuple[str, Handle | None]]) -> None:
        for key, handle in attempts:
            try:  # by the name it was started under (a home made anew over a kept database has a new scope)
                actor = self._ray.get_actor((handle or {}).get("actor") or self._actor_name(key),
                                            namespace=self.namespace)
            except ValueError:
                actor = None
            if actor is None:
                if handle is None:
                    self._emit(Observed(key, Kind.ABSENT, reason="no Ray actor was started for this attempt"))
                else:
                    node = handle.get("node")
                    self._end_remote_tree(key, node, handle.get("scope"))
                    self._emit(Observed(key, Kind.LOST, node=node,
                                        reason=f"its Ray actor on {node} is gone (node down or actor killed)"))
                continue
            try:
                status = self._ray.get(actor.status.remote(), timeout=CALL_TIMEOUT_S)
            except Exception as exc:
                node = (handle or {}).get("node")
                self._emit(Observed(key, Kind.LOST, node=node, reason=f"its Ray actor does not answer: {_short(exc)}"))
                continue
            job_id, label = _job_and_label(key)
            node = (handle or {}).get("node") or ""
            offset = logcopy.offset_file(self.settings.log_file(job_id, label), key)
            if status["state"] == "absent":
                self._ray.kill(actor, no_restart=True)
                self._emit(Observed(key, Kind.ABSENT, reason="its Ray actor never started the process"))
            elif status["state"] == "running":
                new = dict(handle or {"actor": self._actor_name(key), "key": key, "node": node,
                                      "scope": self.scope})
                new.pop("pending", None)
                new.update(node_pid=status.get("node_pid"), gpus=status.get("gpus"))
                self._track(key, actor, job_id, node, label, offset)
                with self._lock:
                    watched = key in self._pulling
                if not watched:  # adopted again while pulling: one watch is enough
                    self._started(key, actor, new, node, status.get("gpus"), f"pid {status.get('node_pid')} on {node}",
                                  status.get("pulling"))
            elif status.get("fenced"):
                self._pump(key, actor, job_id, label, offset, final=True)
                self._emit(Observed(key, Kind.LOST, node=node,
                                    reason=f"{status['fenced']} on {node}; its fence there ended the attempt"))
            else:
                self._pump(key, actor, job_id, label, offset, final=True)
                self._emit(Observed(key, Kind.EXITED, code=status.get("code"), reason=status.get("reason") or "",
                                    permanent=bool(status.get("permanent"))))

    def signal(self, handle: Handle, signum: int) -> bool:
        with self._lock:
            live = self._live.get(handle["key"])
            starting = self._starting.get(handle["key"]) or self._sending.get(handle["key"])
        if live is None and starting is not None and signum == 9:
            # killed before its start was confirmed: it must never run
            with self._lock:
                self._starting.pop(handle["key"], None)
                self._sending.pop(handle["key"], None)
            try:
                self._ray.kill(starting["actor"], no_restart=True)
            except Exception:
                pass
            self._end_remote_tree(handle["key"], handle.get("node"), handle.get("scope"))
            self._emit(Observed(handle["key"], Kind.LOST, node=handle.get("node"), reason="killed while starting"))
            return True
        if live is None:
            return False
        try:
            return bool(self._ray.get(live["actor"].signal.remote(signum), timeout=CALL_TIMEOUT_S))
        except Exception:
            return False

    def forget(self, handle: Handle) -> None:
        try:
            actor = self._ray.get_actor(handle["actor"], namespace=self.namespace)
        except (ValueError, KeyError):
            return
        try:
            self._ray.get(actor.forget.remote(), timeout=CALL_TIMEOUT_S)
        except Exception:
            pass
        self._ray.kill(actor, no_restart=True)  # its bundle is free for the replica's next attempt

    # -- discovery, probes, logs ------------------------------------------------------------------
    def publish(self, job_id: int, nodes: set[str], hosts: str, peers: str) -> None:
        with self._lock:
            self._docs[job_id] = (hosts, peers)
            actors = [v["actor"] for v in self._live.values() if v["job"] == job_id]
        for actor in actors:  # one per attempt; the files are per node, written by each
            actor.publish.remote(job_id, hosts, peers)

    def attempt_env(self, job_id: int) -> dict[str, str]:
        directory = self._runtime_dir / str(job_id)
        return {"CORRAL_HOSTS_FILE": str(directory / "hosts"), "CORRAL_PEERS_FILE": str(directory / "peers.json")}

    def exec_probe(self, handle: Handle, command: str, env: dict[str, str], cwd: str | None,
                   timeout: float) -> tuple[bool, str]:
        with self._lock:
            live = self._live.get(handle["key"]) if handle else None
        if live is None:
            return False, "the replica is not running"
        try:
            ok, detail = self._ray.get(live["actor"].exec_probe.remote(command, env, cwd, timeout),
                                       timeout=timeout + CALL_TIMEOUT_S)
            return bool(ok), str(detail)
        except Exception as exc:
            return False, f"probe on the node failed: {_short(exc)}"

    def shell(self, handle: Handle, ident: str | None, op: str, args: tuple):
        """A process the attempt's actor runs in its world (``relay``): ``ident`` None opens one
        (``args``: its request) and answers its id there; else ``op`` on that process."""
        with self._lock:
            live = self._live.get(handle["key"]) if handle else None
        if live is None:
            raise LaunchError("the replica is not running")
        if ident is None:
            return str(self._ray.get(live["actor"].shell_open.remote(*args), timeout=CALL_TIMEOUT_S))
        return self._ray.get(live["actor"].shell_call.remote(ident, op, args), timeout=CALL_TIMEOUT_S + READ_WAIT_S)

    def cleanup_job(self, job_id: int) -> None:
        self._sources.drop(job_id)
        with self._lock:
            nodes = list(self._node_ids)
        for node in nodes:
            try:
                self._cleanup.options(num_cpus=0, scheduling_strategy=self._pinned(node)).remote(self.scope, job_id)
            except LaunchError:
                continue

    def close(self) -> None:
        self._closed.set()
        self._kick.set()
        self._thread.join(timeout=5)
        # Detached actors and placement groups outlive the server; the next one adopts them.
        self._ray.shutdown()

    # -- the watcher thread -------------------------------------------------------------------------
    def _look(self) -> None:
        """Ray's view of its nodes, once a second, on a thread of its own: how the server
        knows Ray answers (``answered``), whatever the watcher is waiting for."""
        while not self._closed.wait(1.0):
            try:
                for node in self._refresh_nodes():
                    self._node_gone(node)
            except Exception:
                log.debug("Ray does not answer a look at its nodes", exc_info=True)

    def _watch(self) -> None:
        next_logs = 0.0
        while not self._closed.is_set():
            self._kick.clear()
            with self._lock:
                refs = {v["ref"]: k for k, v in self._live.items()}
                starts = {v["ref"]: k for k, v in self._starting.items()}
                pulls = {v["ref"]: k for k, v in self._pulling.items()}
            try:
                everything = list(refs) + list(starts) + list(pulls)
                ready = []
                if everything:  # wake at the first answer (or a new start), then take every answer there is
                    until = time.monotonic() + POLL_S
                    while not ready and not self._kick.is_set() and time.monotonic() < until:
                        ready, _ = self._ray.wait(everything, num_returns=1, timeout=KICK_S)
                    if ready:
                        ready, _ = self._ray.wait(everything, num_returns=len(everything), timeout=0)
                else:
                    self._kick.wait(POLL_S)
                for ref in sorted(ready, key=lambda r: r not in pulls):  # a container ran, then ended
                    if ref in pulls:
                        self._running(pulls[ref], ref)
                    elif ref in starts:
                        with self._lock:
                            entry = self._starting.pop(starts[ref], None)
                        if entry is not None:
                            self._confirm(starts[ref], entry, True)
                    else:
                        self._ended(refs[ref], ref)
                with self._lock:
                    late = [k for k, v in self._starting.items() if v["deadline"] < time.monotonic()]
                    entries = [(k, self._starting.pop(k)) for k in late]
                for key, entry in entries:
                    self._confirm(key, entry, False)
                if time.monotonic() >= next_logs:
                    next_logs = time.monotonic() + POLL_S
                    self._pump_all()
            except Exception:  # the watcher must outlive a flaky call to the cluster
                log.exception("Ray watcher step failed")
                self._closed.wait(1.0)

    def _ended(self, key: str, ref) -> None:
        with self._lock:
            live = self._live.pop(key, None)
            self._pulling.pop(key, None)
        if live is None:
            return
        try:
            end = self._ray.get(ref, timeout=CALL_TIMEOUT_S)
        except Exception as exc:
            if type(exc).__name__ == "ActorUnavailableError" and time.monotonic() < live.setdefault(
                    "unavailable_until", time.monotonic() + UNAVAILABLE_S):
                # Unreachable is not dead: ask again, unless its node left (then _node_gone says
                # lost) or it stays unreachable too long. Declaring it lost while it may still
                # run would start a second one beside it.
                if live["node"] in self._refresh_nodes_and_gone():
                    self._emit(Observed(key, Kind.LOST, node=live["node"],
                                        reason=f"node {live['node']} left the Ray cluster; {FENCED}"))
                    return
                time.sleep(0.2)
                with self._lock:
                    live["ref"] = live["actor"].wait.remote()
                    self._live[key] = live
                return
            self._end_remote_tree(key, live["node"])
            self._emit(Observed(key, Kind.LOST, node=live["node"],
                                reason=f"its Ray actor on {live['node']} died ({type(exc).__name__}); {FENCED}"))
            return
        self._pump(key, live["actor"], live["job"], live["label"], live["offset"], final=True)
        if not isinstance(end, dict):  # an actor of an earlier corral: its code, or why its fence ended it
            end = {"fenced": end} if isinstance(end, str) else {"code": end}
        if end.get("fenced"):  # its fence ended it: the node's raylet (or the actor's worker) died
            self._suspect(live["node"])
            self._emit(Observed(key, Kind.LOST, node=live["node"],
                                reason=f"{end['fenced']} on {live['node']}; its fence there ended the attempt"))
            return
        self._emit(Observed(key, Kind.EXITED, code=end.get("code"), reason=end.get("reason") or "",
                            permanent=bool(end.get("permanent"))))

    def _suspect(self, node: str) -> None:
        """A node whose raylet died is out of the inventory now, before Ray declares it dead
        (Ray's health checks take seconds): nothing more is placed there. It is back only as a
        new Ray node (a raylet started again has a new id)."""
        with self._lock:
            if node in self._node_ids:
                self._suspects.add(self._node_ids[node][0])
        for gone in self._refresh_nodes():
            self._node_gone(gone)

    def _node_gone(self, node: str) -> None:
        with self._lock:
            keys = [k for k, v in self._live.items() if v["node"] == node]
            for k in keys:
                self._live.pop(k)
            starting = [k for k, v in (self._starting | self._sending).items() if v["handle"]["node"] == node]
            for k in starting:
                self._starting.pop(k, None)
                self._sending.pop(k, None)
            for k in keys:
                self._pulling.pop(k, None)
        for key in keys + starting:
            self._emit(Observed(key, Kind.LOST, node=node, reason=f"node {node} left the Ray cluster; {FENCED}"))

    def _refresh_nodes_and_gone(self) -> set[str]:
        """Nodes that are gone now (refreshing Ray's view first)."""
        for node in self._refresh_nodes():
            self._node_gone(node)
        with self._lock:
            return set(self._gone_nodes)

    def _end_remote_tree(self, key: str, node: str | None, scope: str | None = None) -> None:
        """An actor died while its node lives: end what its attempt left running there (its
        fence does too; this reaches what the fence could not)."""
        if not node or node in self._refresh_nodes_and_gone():
            return  # its fence ends it there: no Ray path to the node is left
        try:
            ref = self._kill_tree.options(num_cpus=0, scheduling_strategy=self._pinned(node)).remote(scope or self.scope,
                                                                                                      key)
            self._ray.get(ref, timeout=5.0)
        except Exception:
            log.debug("could not reach %s to end %s", node, key, exc_info=True)

    def _pump_all(self) -> None:
        with self._lock:
            live = list(self._live.items())
        for key, entry in live:
            self._pump(key, entry["actor"], entry["job"], entry["label"], entry["offset"])

    def _pump(self, key: str, actor, job_id: int, label: str, offset: int, final: bool = False) -> None:
        offset = logcopy.pump(self._ray, actor, self.settings.log_file(job_id, label), key, offset, final)
        with self._lock:
            if key in self._live:
                self._live[key]["offset"] = offset


def _job_and_label(key: str) -> tuple[int, str]:
    job, task, rank, _ = key.split(".")
    return int(job), f"{task}-{rank}"


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}"[:300]
