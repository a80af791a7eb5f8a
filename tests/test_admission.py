"""Admission's memory of admitted shapes: a submission whose shape was admitted before gets
the same answer the full checks give, its own dependencies are still checked, a shape that
differs only in who submits it or in its scheduling fields is checked afresh, and a pool that
changed forgets every shape."""

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


def spec(text: str = "", name: str = "a"):
    return load_job(f"name: {name}\nnum_nodes: 2\nresources: {{accelerators: H100:4}}\nrun: echo\n{text}").spec


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


def test_operator_rights_and_dependencies_are_checked_for_each_job(site) -> None:
    admission = Admission(site)
    pinned = spec("priority: 100\n")
    assert isinstance(admission(pinned, "root-op", lambda i: True), Admitted)
    refused = admission(pinned, "alice", lambda i: True)  # the operator's admitted shape is not alice's
    assert isinstance(refused, Refusal) and refused.field == "priority"
    waits = spec("dependency: afterok:7\n")
    assert isinstance(admission(waits, "alice", lambda i: i == 7), Admitted)
    missing = admission(waits, "alice", lambda i: False)  # same shape, but job 7 is gone
    assert missing == Refusal("dependency", "afterok:7: there is no job 7")


def test_a_pool_that_changed_forgets_every_shape(site) -> None:
    admission = Admission(site)
    assert isinstance(admission(spec(), "alice", lambda i: True), Admitted)
    site.nodes[:] = [n.model_copy(update={"gpus": 2}) for n in site.nodes]  # as the control loop swaps in a new inventory
    refused = admission(spec(), "alice", lambda i: True)
    assert isinstance(refused, Refusal) and refused.field == "resources"
