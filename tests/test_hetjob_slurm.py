"""A heterogeneous batch script sent to a partition whose nodes are Slurm allocations (the
slurm-lab, Slurm 22.05) is refused at submission with a sentence, as sbatch refuses what it
cannot run: there the script's srun would be Slurm's own, which knows no components of a
corral job. Nothing is stored and no allocation is asked for. Skipped, with the reason, where
no Slurm answers."""

from __future__ import annotations

import json

from test_slurm_fidelity import _cancel_ours, _prefix, _slurm, corral, usable_slurm  # noqa: F401


def test_a_hetjob_on_a_slurm_partition_is_refused_at_submission_and_asks_slurm_for_nothing(corral) -> None:  # noqa: F811
    (corral.work / "het.sbatch").write_text("#!/bin/bash\n#SBATCH -N1 -t 2\n#SBATCH hetjob\n#SBATCH -N1\n"
                                            "srun --het-group=1 hostname\n")
    before = json.loads(corral("queue", "--all", "--json", check=True).stdout)
    refused = corral("sbatch", "--parsable", "-p", "gpu", "het.sbatch")
    assert refused.returncode != 0, refused.stdout
    said = "heterogeneous batch script (#SBATCH hetjob) does not run in partition 'gpu'"
    assert said in refused.stderr, refused.stderr
    assert json.loads(corral("queue", "--all", "--json", check=True).stdout) == before  # nothing stored
    assert not [line for line in _slurm("squeue", "-h", "-o", "%j").splitlines()
                if line.strip().startswith(_prefix(corral.home))]
