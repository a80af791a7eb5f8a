"""How a job group is sized for Slurm (pure: no Slurm needed): first-fit packing onto the
partition's node shape, the sbatch options, GRES parsing, and finding a job's allocation again
by its Slurm job name."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.executors.slurm.cli import parse_gres
from corral.executors.slurm.shape import NodeKind, Replica, Shape, job_name, job_of, pack, sbatch_args

H100_NODE = NodeKind(gpus=8, cpus=64, memory_mb=512_000, gpu_type="h100")


def test_the_rl_group_packs_onto_four_nodes():
    group = [Replica(8, 1, 0)] * 2 + [Replica(4, 1, 0)] * 2 + [Replica(1, 1, 0), Replica(0, 1, 0)]
    assert pack(group, H100_NODE) == Shape(nodes=4, gpus=8, cpus=2, memory_mb=0)


def test_half_a_cpu_is_a_whole_one_for_a_step():
    assert pack([Replica(0, 0.1, 0)] * 3, H100_NODE).cpus == 3


def test_alone_replicas_get_a_node_each():
    # a two-node batch script: the script's replica and the node holder never share a node
    shape = pack([Replica(4, 2, 1, alone=True), Replica(4, 2, 1, alone=True)], H100_NODE)
    assert shape.nodes == 2 and shape.gpus == 4 and shape.memory_mb == 1024


def test_a_replica_no_node_holds_is_refused_with_the_shapes():
    with pytest.raises(ValueError, match="16 GPUs.*8 GPUs"):
        pack([Replica(16, 1, 0)], H100_NODE)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 8), st.integers(1, 64), st.integers(0, 500), st.booleans()),
                min_size=1, max_size=30))
def test_packing_fits_every_replica_within_the_node_shape(specs):
    replicas = [Replica(g, c, m, alone) for g, c, m, alone in specs]
    shape = pack(replicas, H100_NODE)
    assert shape.gpus <= H100_NODE.gpus and shape.cpus <= H100_NODE.cpus and shape.memory_mb <= H100_NODE.memory_mb
    assert shape.nodes >= sum(1 for r in replicas if r.alone)  # alone ones never share
    assert shape.nodes * shape.gpus >= sum(r.gpus for r in replicas)  # the allocation holds them all
    assert shape.nodes <= len(replicas)


def test_sbatch_options_carry_the_jobs_limits():
    argv = sbatch_args(Shape(4, 8, 2, 2048), "corral-abc-7", 3600, 30, "gpu", "ml", "high", "h100", "/x/slurm-%j.out",
                       exclusive=True, constraint="ib")
    assert "--exclusive" in argv and "--constraint=ib" in argv and "--nodes=4" in argv
    assert "--gres=gpu:h100:8" in argv and "--mem=2048M" in argv and "--cpus-per-task=2" in argv
    assert "--time=62" in argv  # corral's limit plus the grace, a minute more: corral ends it first
    assert "--signal=TERM@30" in argv and "--requeue" in argv
    assert {"--partition=gpu", "--account=ml", "--qos=high", "--job-name=corral-abc-7"} <= set(argv)
    plain = sbatch_args(Shape(1, 0, 1, 0), "n", None, 10, None, None, None, None, "/o")
    assert not any(a.startswith(("--gres", "--mem", "--time", "--partition", "--account", "--qos")) for a in plain)


def test_a_jobs_allocation_is_found_by_its_name():
    name = job_name("e5b786fc47", 12)
    assert job_of(name, "e5b786fc47") == 12
    assert job_of(name, "other") is None and job_of("corral-e5b786fc47-x", "e5b786fc47") is None


@pytest.mark.parametrize("detail,expected", [
    ("gpu:h100:8(IDX:0-7)", (8, "h100", tuple(range(8)))),
    ("gpu:4(IDX:0,2-3,5)", (4, None, (0, 2, 3, 5))),
    ("gpu:a100:2(IDX:N/A)", (2, "a100", ())),
    ("", (0, None, ())),
])
def test_gres_detail_is_read(detail, expected):
    assert parse_gres(detail) == expected


def test_a_gpu_type_no_node_of_the_partition_has_is_a_misfit_at_submission() -> None:
    from pathlib import Path
    from types import SimpleNamespace

    from corral.executors.contract import ReplicaShape
    from corral.executors.slurm.allocations import Allocations

    kind = NodeKind(gpus=8, cpus=64, memory_mb=512_000, gpu_type="h100", gpu_types=("h100",))
    allocations = Allocations(SimpleNamespace(node_kind=lambda target, timeout: kind), "t", Path("/nonexistent"),
                              lambda: None)
    why = allocations.misfit("gpu", [ReplicaShape(8, 4, 0, gpu_type="A100")], 2.0)
    assert why is not None and "GPU type A100" in why and "h100" in why
    assert allocations.misfit("gpu", [ReplicaShape(8, 4, 0, gpu_type="H100")], 2.0) is None  # any case
    assert allocations.misfit("gpu", [ReplicaShape(0, 4, 0, gpu_type=None)], 2.0) is None


def test_more_replicas_of_one_port_than_the_partition_has_addresses_is_a_misfit_at_submission() -> None:
    from pathlib import Path
    from types import SimpleNamespace

    from corral.executors.contract import ReplicaShape
    from corral.executors.slurm.allocations import Allocations

    def misfit(spaces: int, replicas: list) -> str | None:
        kind = NodeKind(gpus=8, cpus=64, memory_mb=512_000, gpu_type="h100", gpu_types=("h100",), port_spaces=spaces)
        allocations = Allocations(SimpleNamespace(node_kind=lambda target, timeout: kind), "t", Path("/nonexistent"),
                                  lambda: None)
        return allocations.misfit("gpu", replicas, 2.0)

    two = [ReplicaShape(0, 1, 0, distinct=True, ports=(8000,)) for _ in range(2)]
    why = misfit(1, two)
    assert why is not None and "2 replicas declare port 8000" in why and "1 address" in why
    assert misfit(2, two) is None  # two addresses: one each
    assert misfit(0, two) is None  # addresses not known: Slurm decides, the reason says it later
    assert misfit(1, [ReplicaShape(0, 1, 0, ports=(8000,)), ReplicaShape(0, 1, 0, ports=(9000,))]) is None
