"""scheduler: the pure core. ``schedule(snapshot, now, policy) -> Plan`` with no I/O, no wall
clock and no unseeded randomness, so it is tested with builders and replayed by a simulator."""

from corral.scheduler.core import priorities, schedule
from corral.scheduler.plan import Allocation, Grow, Plan, Preemption, Reason, Shrink, Start
from corral.scheduler.policy import Account, Partition, Policy, PriorityWeights, Qos
from corral.scheduler.snapshot import (Dependency, Growable, NodeView, PendingJob, RunningJob, Shrinkable, Snapshot, TaskRequest,
                                       Topology)

__all__ = ["Account", "Allocation", "Dependency", "Grow", "Growable", "NodeView", "Partition", "PendingJob", "Plan", "Policy", "Preemption",
           "PriorityWeights", "Qos", "Reason", "RunningJob", "Shrink", "Shrinkable", "Snapshot", "Start", "TaskRequest",
           "Topology", "priorities", "schedule"]
