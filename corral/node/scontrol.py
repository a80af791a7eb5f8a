"""corral's ``scontrol`` for batch scripts off Slurm: what scripts ask of it, ``show
hostnames``/``hostlist``/``hostlistsorted`` (the launch glue of every multi-node script) and
``show job`` of the script's own job, read from the step's Slurm variables. Run through
``srun.py scontrol ARGS`` (``corral.runtime.batchenv`` writes the shim)."""

from __future__ import annotations

import os
import sys


def scontrol(argv: list[str]) -> int:
    from hostlist import collect_hostlist, expand_hostlist

    words = [w for w in argv if w not in ("-o", "--oneliner")]
    if len(words) >= 2 and words[0] == "show" and words[1] in ("hostnames", "hostname", "hostlist", "hostlistsorted"):
        text = ",".join(words[2:]) or os.environ.get("SLURM_JOB_NODELIST", "")
        if not text:
            print("scontrol: error: no hostlist given and SLURM_JOB_NODELIST is not set", file=sys.stderr)
            return 1
        try:
            if words[1].startswith("hostname"):
                print("\n".join(expand_hostlist(text)))
            else:
                names = expand_hostlist(text)
                print(collect_hostlist(sorted(names) if words[1] == "hostlistsorted" else names))
        except Exception:
            print(f"scontrol: error: invalid hostlist {text!r}", file=sys.stderr)
            return 1
        return 0
    if len(words) >= 2 and words[0] == "show" and words[1] == "job":
        return _show_job(words[2] if len(words) > 2 else os.environ.get("SLURM_JOB_ID", ""))
    print(f"scontrol: error: corral's scontrol shows hostnames, hostlist and this job only, not "
          f"'{' '.join(argv)}'", file=sys.stderr)
    return 1


def _show_job(ident: str) -> int:
    env = os.environ
    if not ident or ident != env.get("SLURM_JOB_ID"):
        print(f"slurm_load_jobs error: Invalid job id specified ({ident})", file=sys.stderr)
        return 1
    limit = env.get("SLURM_JOB_TIME_LIMIT")
    fields = [
        ("JobId", ident), ("JobName", env.get("SLURM_JOB_NAME", "")), ("UserId", env.get("SLURM_JOB_USER", "")),
        ("Account", env.get("SLURM_JOB_ACCOUNT", "")), ("QOS", env.get("SLURM_JOB_QOS", "")),
        ("JobState", "RUNNING"), ("Partition", env.get("SLURM_JOB_PARTITION", "")),
        ("TimeLimit", _clock(int(limit)) if limit else "UNLIMITED"), ("Restarts", env.get("SLURM_RESTART_COUNT", "0")),
        ("NodeList", env.get("SLURM_JOB_NODELIST", "")), ("BatchHost", env.get("SLURMD_NODENAME", "")),
        ("NumNodes", env.get("SLURM_NNODES", "")), ("NumTasks", env.get("SLURM_NTASKS", "")),
        ("CPUs/Task", env.get("SLURM_CPUS_PER_TASK", "1")), ("WorkDir", os.getcwd()),
        ("ArrayJobId", env.get("SLURM_ARRAY_JOB_ID", "")), ("ArrayTaskId", env.get("SLURM_ARRAY_TASK_ID", "")),
    ]
    print("   ".join(f"{k}={v}" for k, v in fields if v != ""))
    return 0


def _clock(seconds: int) -> str:
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text
