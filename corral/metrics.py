"""What ``GET /metrics`` exposes, in Prometheus' text format (the ``prometheus-client``
library): counters and histograms the control loop and the API record as things happen, and
gauges read from the loop's memory and the store at scrape time, so they always agree with
``corral queue`` and ``corral nodes``. One registry per server (tests run several in one
process). Metric names follow Prometheus' conventions (``_total``, ``_seconds``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily, Metric

disable_created_metrics()  # no *_created series: they double the output and dashboards do not read them

_CYCLE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_START_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)
_PLACEMENT_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
_API_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class Metrics:
    """The server's metrics. ``read`` (set by the API) gives the scrape-time gauges."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.started_at = time.time()
        self.cycle = Histogram("corral_scheduler_cycle_seconds", "Duration of a scheduling pass",
                               buckets=_CYCLE_BUCKETS, registry=self.registry)
        self.placements = Histogram("corral_scheduler_placements_per_cycle", "Jobs started by one scheduling pass",
                                    buckets=_PLACEMENT_BUCKETS, registry=self.registry)
        self.start_latency = Histogram("corral_job_start_latency_seconds",
                                       "From submission to every replica running, per job start",
                                       buckets=_START_BUCKETS, registry=self.registry)
        self.restarts = Counter("corral_replica_restarts_total", "Replica restarts by cause", ["cause"],
                                registry=self.registry)
        self.probe_failures = Counter("corral_probe_failures_total", "Failed readiness and liveness probes",
                                      ["probe"], registry=self.registry)
        self.requests = Histogram("corral_api_request_seconds", "API request latency by route",
                                  ["method", "route", "status"], buckets=_API_BUCKETS, registry=self.registry)
        self.reader: Callable[[], dict[str, Any]] | None = None
        self.registry.register(_Snapshot(self))


class _Snapshot:
    """Gauges computed when scraped."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def describe(self) -> list[Metric]:
        return []  # computed at scrape time only; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("corral_up", "1 while the server answers")
        up.add_metric([], 1)
        yield up
        started = GaugeMetricFamily("corral_server_start_time_seconds",
                                    "When this server process started (a change is a restart)")
        started.add_metric([], self.metrics.started_at)
        yield started
        if self.metrics.reader is None:
            return
        data = self.metrics.reader()
        jobs = GaugeMetricFamily("corral_jobs", "Jobs by state (ended ones: all kept in the store)", labels=["state"])
        for state, count in sorted(data["jobs_by_state"].items()):
            jobs.add_metric([state], count)
        yield jobs
        pending = GaugeMetricFamily("corral_jobs_pending", "Pending jobs by reason and partition",
                                    labels=["reason", "partition"])
        for (reason, partition), count in sorted(data["pending"].items()):
            pending.add_metric([reason, partition], count)
        yield pending
        gpus = GaugeMetricFamily("corral_node_gpus", "GPUs of each node, allocated or idle",
                                 labels=["node", "state", "gpu_type", "infra"])
        for node in data["nodes"]:
            for state in ("allocated", "idle"):
                gpus.add_metric([node["name"], state, node["gpu_type"] or "", node["infra"]], node[state])
        yield gpus
        partitions = GaugeMetricFamily("corral_partition_gpus", "GPUs of each partition's nodes, allocated or idle",
                                       labels=["partition", "state"])
        for (partition, state), count in sorted(data["partitions"].items()):
            partitions.add_metric([partition, state], count)
        yield partitions
        accounts = GaugeMetricFamily("corral_account_gpus_allocated", "GPUs held by each account's running replicas",
                                     labels=["account"])
        for account, count in sorted(data["accounts"].items()):
            accounts.add_metric([account], count)
        yield accounts
        infra_up = GaugeMetricFamily("corral_infra_up", "1 while the engine of an infra answers, 0 while it does "
                                     "not (its partitions are DOWN)", labels=["infra"])
        for infra, up in sorted(data.get("infra_up", {}).items()):
            infra_up.add_metric([infra], up)
        yield infra_up
        partition_up = GaugeMetricFamily("corral_partition_up", "1 while a partition is UP, 0 while it is DOWN "
                                         "(the engine of its infra does not answer)", labels=["partition", "infra"])
        for partition, infra, up in data.get("partition_up", []):
            partition_up.add_metric([partition, infra], up)
        yield partition_up
        share = GaugeMetricFamily("corral_fair_share", "Fair-share factor of each account and user (as sshare)",
                                  labels=["account", "user"])
        for account, user, factor in data["fair_share"]:
            share.add_metric([account, user], factor)
        yield share
