"""Batch-script forms real scripts use: a job name that is not a host name part keeps its
meaning (made one, with a warning), the command line's -J overrides the directive's as sbatch
does, --wait-all-nodes is how corral starts every job, and the GPUs said twice (--gres and an
equal --gpus-per-node) are one request."""

from __future__ import annotations

import pytest

from corral.spec import SpecError
from corral.spec.sbatch import load_batch, parse_command_line

SCRIPT = "#!/bin/bash\n#SBATCH -J 1B3-rotary.slurm\n#SBATCH --nodes=2\n{extra}srun python train.py\n"


def _task(batch, name: str) -> dict:
    return next(d for d in batch.documents if d.get("name") == name)


def test_a_name_that_is_not_a_host_name_part_runs_under_a_derived_one() -> None:
    notes: list[str] = []
    batch = load_batch(SCRIPT.format(extra=""), source="1B3.slurm", warnings=notes)
    header = batch.documents[0]
    assert header["name"] == "1B3-rotary-slurm"
    assert any("1B3-rotary.slurm" in n and "1B3-rotary-slurm" in n for n in notes + batch.warnings)
    with pytest.raises(SpecError):  # nothing usable left: still refused, naming the option
        load_batch("#!/bin/bash\n#SBATCH -J ...\necho\n", source="x.sh")


def test_the_command_lines_job_name_overrides_the_directives() -> None:
    given, rest, issues, _ = parse_command_line(["-J", "mine", "job.sh"])
    assert rest == ["job.sh"] and not issues
    batch = load_batch(SCRIPT.format(extra=""), source="job.sh", overrides=given)
    assert batch.documents[0]["name"] == "mine"


def test_wait_all_nodes_is_accepted() -> None:
    notes: list[str] = []
    batch = load_batch(SCRIPT.format(extra="#SBATCH --wait-all-nodes=1\n"), source="job.sh", warnings=notes)
    assert any("--wait-all-nodes" in n for n in notes + batch.warnings)


@pytest.mark.parametrize("gpus, each", [("#SBATCH --gres=gpu:4\n#SBATCH --gpus-per-node=4\n", 4),
                                        ("#SBATCH --gres=gpu:h100:4\n#SBATCH --gpus-per-node=4\n", "h100:4")])
def test_equal_gres_and_gpus_per_node_are_one_request(gpus: str, each) -> None:
    batch = load_batch(SCRIPT.format(extra=gpus), source="job.sh")
    assert [d["resources"]["accelerators"] for d in batch.documents[1:]] == [each, each]


def test_different_gres_and_gpus_per_node_are_still_refused() -> None:
    with pytest.raises(SpecError) as refused:
        load_batch(SCRIPT.format(extra="#SBATCH --gres=gpu:4\n#SBATCH --gpus-per-node=8\n"), source="job.sh")
    assert "give the GPUs once" in str(refused.value)


def test_wrap_in_a_script_is_refused_naming_its_line() -> None:
    with pytest.raises(SpecError) as refused:
        load_batch("#!/bin/bash\n#SBATCH -N1\n#SBATCH --wrap=hostname\nhostname\n")
    issue = refused.value.issues[0]
    assert issue.field == "--wrap" and issue.line == 3 and "command line" in issue.message
