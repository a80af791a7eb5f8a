"""The Slurm provisioner's book of allocations against a fake Slurm (no Slurm needed): an
allocation given back when its job is requeued is never taken for the job's again while
Slurm still lists it under the job's name, and a job with no Slurm job known says so."""

from __future__ import annotations

from pathlib import Path

from corral.executors.contract import Allocation as Fate, Provision, ProvisionRequest, ReplicaShape
from corral.executors.slurm.allocations import Allocations
from corral.executors.slurm.cli import JobInfo, NodeShare
from corral.executors.slurm.shape import NodeKind

KIND = NodeKind(gpus=8, cpus=64, memory_mb=512_000, gpu_type="h100", gpu_types=("h100",))


class FakeSlurm:
    """Slurm's queue as a dict; an sbatch runs its job at once; scancel --batch (the hold
    script's signal) leaves the job running, as it does for the moment it takes to end."""

    def __init__(self) -> None:
        self.queue: dict[str, JobInfo] = {}
        self.next_id = 100

    def node_kind(self, target, timeout=None):  # noqa: ANN001
        return KIND

    def submit(self, argv: list[str], script: str) -> str:
        self.next_id += 1
        slurm_id = str(self.next_id)
        name = next(a.split("=", 1)[1] for a in argv if a.startswith("--job-name="))
        self.queue[slurm_id] = JobInfo(slurm_id, name, "RUNNING", "None",
                                       (NodeShare("gpu001", 1, 1024, 1, "h100"),))
        return slurm_id

    def jobs(self, ids: list[str]) -> dict[str, JobInfo]:
        return {i: self.queue[i] for i in ids if i in self.queue}

    def by_name(self, name: str) -> list[str]:
        return [i for i, info in self.queue.items() if info.name == name]

    def node_facts(self, hosts: list[str]) -> dict:
        return {}

    def cancel(self, target: str, signal: str | None = None, batch: bool = False) -> bool:
        return True


def _request(job_id: int) -> ProvisionRequest:
    return ProvisionRequest(job_id, (ReplicaShape(1, 1, 1),), "H100", None, 10.0, "gpu", "", "")


def test_an_allocation_given_back_for_a_requeue_is_never_taken_again(tmp_path: Path) -> None:
    slurm = FakeSlurm()
    allocations = Allocations(slurm, "t", tmp_path, lambda: None)
    assert allocations.provision(_request(7)).state == Provision.READY
    first = allocations.slurm_id(7)
    assert [n.name for n in allocations.nodes()] == [f"s{first}-gpu001"]
    allocations.release(7)  # the job was requeued: its allocation is given back ...
    assert allocations.nodes() == [] and not allocations.holds(7)
    assert slurm.queue[first].state == "RUNNING"  # ... and still runs, under the job's name, while it ends
    again = allocations.provision(_request(7))
    second = allocations.slurm_id(7)
    assert again.state == Provision.READY and again.submitted == f"Slurm job {second}" and second != first
    assert [n.name for n in allocations.nodes()] == [f"s{second}-gpu001"]


def test_a_job_with_no_slurm_job_known_says_so_without_naming_none(tmp_path: Path) -> None:
    allocations = Allocations(FakeSlurm(), "t", tmp_path, lambda: None)
    fate, words = allocations.allocation(7)
    assert fate == Fate.ENDED and "None" not in words and "Slurm allocation" in words
