"""The queue's totals: how many live jobs are in each state and how many GPUs they hold,
filtered like ``/v1/jobs``. A view of a long queue shows these beside its first page (``corral
queue``, the dashboard) instead of listing every job to count them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from corral.api.deps import SessionDep, StateDep
from corral.api.errors import documented
from corral.api.schemas import QueueOut
from corral.store import repository

router = APIRouter(prefix="/v1", tags=["jobs"], responses=documented(401, 403))

Filter = Annotated[str | None, Query(max_length=64)]


@router.get("/queue", response_model=QueueOut)
def queue(session: SessionDep, state: StateDep, user: Filter = None, account: Filter = None, partition: Filter = None):
    """Live jobs by state (held ones counted among the pending and apart), and the GPUs their
    replicas hold now, for the jobs of ``user``, ``account`` and ``partition`` (any, if not given)."""
    # asked of the loop before the store is read: no database connection is held while it answers
    gpus = sum(len(h.gpus) for h in state.read(state.loop.reads.held)
               if (not user or h.user == user) and (not account or h.account == account)
               and (not partition or h.partition == partition))
    counts, held = repository.count_live(session, user=user, account=account, partition=partition)
    return QueueOut(pending=counts.get("PENDING", 0), held=held, starting=counts.get("STARTING", 0),
                    running=counts.get("RUNNING", 0), preempted=counts.get("PREEMPTED", 0), gpus=gpus)
