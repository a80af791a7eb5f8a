"""scheduler: the pure core. ``schedule(snapshot, now, policy) -> Plan`` with no I/O, no wall
clock and no unseeded randomness, so it is tested with builders and replayed by a simulator."""

from corral.scheduler.core import Policy, schedule
from corral.scheduler.plan import Allocation, Plan, Reason, Start
from corral.scheduler.snapshot import NodeView, PendingJob, Snapshot, TaskRequest

__all__ = ["Allocation", "NodeView", "PendingJob", "Plan", "Policy", "Reason", "Snapshot", "Start",
           "TaskRequest", "schedule"]
