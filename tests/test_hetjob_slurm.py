"""A heterogeneous batch script sent to a partition whose nodes are Slurm allocations (the
slurm-lab, Slurm 22.05): refused with a sentence when it would start, since there the script's
srun is Slurm's own, which knows no components of a corral job; its allocation is given back.
Skipped, with the reason, where no Slurm answers."""

from __future__ import annotations

import json

from test_slurm_fidelity import _cancel_ours, _prefix, _slurm, _wait, corral, usable_slurm  # noqa: F401


def test_a_hetjob_on_a_slurm_partition_fails_saying_why_and_leaves_no_allocation(corral) -> None:  # noqa: F811
    (corral.work / "het.sbatch").write_text("#!/bin/bash\n#SBATCH -N1 -t 2\n#SBATCH hetjob\n#SBATCH -N1\n"
                                            "srun --het-group=1 hostname\n")
    job = corral("sbatch", "--parsable", "-p", "gpu", "het.sbatch", check=True).stdout.strip()
    done = _wait(corral, job, timeout=120)
    assert done["state"] == "FAILED", done
    said = "heterogeneous batch script (#SBATCH hetjob) does not run in a partition whose nodes are Slurm"
    assert said in corral("events", job, check=True).stdout, corral("events", job).stdout
    assert said in json.dumps(done), done
    ours = [line for line in _slurm("squeue", "-h", "-o", "%j").splitlines()
            if line.strip() == f"{_prefix(corral.home)}{job}"]
    assert not ours
