"""Where the tests find a real Slurm: ``SLURM_CONF`` when set, else the slurm-lab's
``slurm.env`` (``CORRAL_SLURM_LAB``, default /tmp/slurmlab)."""

from __future__ import annotations

import os
from pathlib import Path

LAB_ENV = Path(os.environ.get("CORRAL_SLURM_LAB", "/tmp/slurmlab")) / "slurm.env"


def slurm_env(keep_job_variables: bool = True) -> dict[str, str]:
    """This process's environment with ``SLURM_CONF`` pointing at the lab when none is set;
    without ``keep_job_variables``, the ``SLURM_*`` variables of a job this process may run
    in are left out (they would read as options to srun and sbatch)."""
    env = {k: v for k, v in os.environ.items()
           if keep_job_variables or not k.startswith("SLURM_") or k == "SLURM_CONF"}
    if "SLURM_CONF" not in env and LAB_ENV.exists():
        for line in LAB_ENV.read_text().splitlines():
            line = line.removeprefix("export ").strip()
            if line.startswith("SLURM_CONF="):
                env["SLURM_CONF"] = line.split("=", 1)[1].strip("'\"")
    return env
