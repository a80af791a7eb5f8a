"""Admission holds a job to the shape the scheduler will: a job that asks for more distinct
nodes than the pool has, for a node feature no node has, or for nodes that are not in the
pool is refused at submission with both numbers or the missing thing (as sbatch refuses it),
never accepted to pend forever on Resources."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.admission import Admitted, Refusal, admit
from corral.site import load_site
from corral.spec import load_job
from corral.spec.sbatch import load_batch

SITE = """
nodes:
  - {name: a100, count: 2, gpus: 8, gpu_type: A100, cpus: 16, memory: 64, labels: {a100: "true"}}
  - {name: cpu, count: 3, cpus: 16, memory: 64}
"""


@pytest.fixture
def site(tmp_path: Path):
    path = tmp_path / "config.yaml"
    path.write_text(SITE)
    return load_site(path)


def _batch(text: str):
    """A batch script as the server loads it: its YAML documents, validated."""
    import yaml

    batch = load_batch(text, source="job.sh")
    return load_job(yaml.safe_dump_all(batch.documents)).spec


def _admit(site, spec):
    return admit(spec, "alice", site, lambda i: True)


def test_more_distinct_nodes_than_the_pool_has_is_refused_with_both_numbers(site) -> None:
    refused = _admit(site, load_job("name: wide\nnum_nodes: 6\ndistinct_nodes: true\nrun: hostname\n").spec)
    assert isinstance(refused, Refusal) and "6 distinct nodes" in refused.message and "5 node(s)" in refused.message
    fits = _admit(site, load_job("name: fits\nnum_nodes: 5\ndistinct_nodes: true\nrun: hostname\n").spec)
    assert isinstance(fits, Admitted)


def test_a_batch_script_with_a_constraint_counts_only_the_matching_nodes(site) -> None:
    script = "#!/bin/bash\n#SBATCH --nodes=3\n#SBATCH --constraint=a100\nsrun hostname\n"
    refused = _admit(site, _batch(script))
    assert isinstance(refused, Refusal) and "3 distinct nodes" in refused.message and "2 node(s)" in refused.message
    two = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --constraint=a100\nsrun hostname\n"
    assert isinstance(_admit(site, _batch(two)), Admitted)


def test_a_feature_or_nodelist_no_node_has_is_refused(site) -> None:
    feature = _admit(site, load_job("name: f\nconstraint: h100\nrun: hostname\n").spec)
    assert isinstance(feature, Refusal) and "constraint h100" in feature.message
    listed = _admit(site, load_job("name: n\nnodelist: [gpu-9]\nrun: hostname\n").spec)
    assert isinstance(listed, Refusal) and "gpu-9" in listed.message


def test_without_an_account_tree_a_user_charges_only_their_own(site) -> None:
    own = admit(load_job("name: a\naccount: alice\nrun: x\n").spec, "alice", site, lambda i: True)
    assert isinstance(own, Admitted) and own.account == "alice"
    other = admit(load_job("name: b\naccount: bob\nrun: x\n").spec, "alice", site, lambda i: True)
    assert isinstance(other, Refusal) and other.field == "account" and "'bob'" in other.message
    by_admin = admit(load_job("name: c\naccount: bob\nrun: x\n").spec, "alice", site, lambda i: True,
                     any_account=True)
    assert isinstance(by_admin, Admitted) and by_admin.account == "bob"
