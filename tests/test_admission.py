"""Admission's memory of admitted shapes: a submission whose shape was admitted before gets
the same answer the full checks give, its own dependencies are still checked, a shape that
differs only in who submits it, their right to charge any account, its scheduling fields or
whether its partition is a Slurm one is checked afresh, and a pool that changed forgets every
shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral import admission as admission_module
from corral.admission import Admission, Admitted, Refusal, admit
from corral.site import load_site
from corral.spec import load_job

SITE = """
nodes:
  - {name: gpu, count: 2, gpus: 4, gpu_type: H100, cpus: 16, memory: 64}
partitions:
  - {name: batch, nodes: ["gpu-*"], max_time: 1h, default_time: 10m}
  - {name: ml-only, nodes: ["gpu-*"], accounts: [ml]}
accounts:
  - {name: ml, users: [alice]}
  - {name: physics}
operators: [root-op]
"""


@pytest.fixture
def site(tmp_path: Path):
    path = tmp_path / "config.yaml"
    path.write_text(SITE)
    return load_site(path)


def spec(text: str = "", name: str = "a", nodes: int = 2):
    return load_job(f"name: {name}\nnum_nodes: {nodes}\nresources: {{accelerators: H100:4}}\nrun: echo\n{text}").spec


def test_a_remembered_shape_answers_as_the_full_checks_do(site, monkeypatch) -> None:
    admission = Admission(site)
    first = admission(spec(name="a"), "alice", lambda i: True)
    assert first == Admitted("batch", "ml", "normal", 600.0)
    calls: list[str] = []
    monkeypatch.setattr(admission_module, "admit", lambda *a, **k: calls.append("admit") or admit(*a, **k))
    # another job of that shape (another name): answered from memory, the same answer
    assert admission(spec(name="b"), "alice", lambda i: True) == first and calls == []
    # another user, or other scheduling fields, are other shapes: checked in full
    assert admission(spec(name="c"), "bob", lambda i: True) == Admitted("batch", "bob", "normal", 600.0)
    refused = admission(spec("partition: ml-only\n", name="d"), "bob", lambda i: True)
    assert isinstance(refused, Refusal) and refused.field == "account"
    assert calls == ["admit", "admit"]
    # a refusal is not remembered: the same shape is refused again, by the full checks
    assert admission(spec("partition: ml-only\n", name="e"), "bob", lambda i: True) == refused
    assert calls == ["admit", "admit", "admit"]


def test_an_admins_admitted_shape_is_not_a_users_and_dependencies_are_checked_for_each_job(site) -> None:
    admission = Admission(site)
    charges_physics = spec("account: physics\n")  # physics lists no users: only an admin may charge it
    assert admission(charges_physics, "alice", lambda i: True, any_account=True) == \
        Admitted("batch", "physics", "normal", 600.0)
    # the same user and shape through a user's token: the admin's answer is not reused
    refused = admission(charges_physics, "alice", lambda i: True)
    assert isinstance(refused, Refusal) and refused.field == "account" and refused.forbidden
    assert "may not charge it" in refused.message
    waits = spec("dependency: afterok:7\n")
    assert isinstance(admission(waits, "alice", lambda i: i == 7), Admitted)
    missing = admission(waits, "alice", lambda i: False)  # same shape, but job 7 is gone
    assert missing == Refusal("dependency", "afterok:7: there is no job 7")


def test_a_slurm_partitions_shape_is_not_sized_against_the_pool(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(SITE.replace("partitions:\n", "partitions:\n  - {name: cluster, infra: slurm, slurm_partition: gpu}\n"))
    site = load_site(path)
    admission = Admission(site)
    # twice the local pool: only Slurm can say whether it ever runs
    assert admission(spec("partition: cluster\n", nodes=4), "alice", lambda i: True) == \
        Admitted("cluster", "ml", "normal", None)
    refused = admission(spec("partition: batch\n", nodes=4), "alice", lambda i: True)
    assert isinstance(refused, Refusal) and refused.field == "resources"
    # were the partition no longer Slurm's, the same shape is checked afresh (and cannot fit)
    site.provisioned.pop("cluster")
    refused = admission(spec("partition: cluster\n", nodes=4), "alice", lambda i: True)
    assert isinstance(refused, Refusal) and refused.field == "resources"


def test_a_pool_that_changed_forgets_every_shape(site) -> None:
    admission = Admission(site)
    assert isinstance(admission(spec(), "alice", lambda i: True), Admitted)
    site.nodes[:] = [n.model_copy(update={"gpus": 2}) for n in site.nodes]  # as the control loop swaps in a new inventory
    refused = admission(spec(), "alice", lambda i: True)
    assert isinstance(refused, Refusal) and refused.field == "resources"
