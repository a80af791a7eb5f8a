"""corral's ``srun`` and ``scontrol`` for batch scripts off Slurm (``corral.runtime.batchenv``
explains where they run and why). Run as ``python srun.py srun|scontrol ARGS``.

``srun CMD`` starts a job step: its tasks spread over the job's nodes (``-N``, ``-n``,
``--ntasks-per-node``, ``-w``), each with ``SLURM_PROCID``, ``SLURM_LOCALID``,
``SLURM_NODEID``, ``SLURM_STEP_ID`` and its node's GPUs (split by ``--gpus-per-task``, or
each task's even share with ``--exact``). Every task is a process group of its own, so a
signal meant for the batch shell alone (``--signal=B:…``) never reaches it, while ``srun``
forwards the others it receives (a stop, a ``--signal`` without ``B:``). Output goes where
the step's own goes (the job's log), prefixed by the task id with ``-l``. The exit code is
the highest of the tasks' (128+N for a task ended by signal N), as Slurm's. ``--overlap`` is
what every step does here: steps share the job's allocation."""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: import corral from the tree this file is in
    sys.path[0] = str(Path(__file__).resolve().parents[2])

import fcntl  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)

# (long, short, takes a value); values are parsed in ``_step``
_OPTIONS = {
    "nodes": "N", "ntasks": "n", "ntasks-per-node": None, "nodelist": "w", "cpus-per-task": "c",
    "gpus": "G", "gpus-per-node": None, "gpus-per-task": None, "gres": None, "job-name": "J", "chdir": "D",
    "wait": "W", "export": None, "mem": None, "mem-per-cpu": None, "cpu-bind": None, "mpi": None,
    "distribution": "m", "time": "t", "kill-on-bad-exit": "K", "label": "l", "overlap": None, "exact": None,
    "unbuffered": "u", "quiet": "Q", "verbose": "v", "exclusive": None, "gpu-bind": None,
}
# accepted, with a warning: they change nothing a step on corral's nodes could honour
_IGNORED = ("mem", "mem-per-cpu", "cpu-bind", "mpi", "distribution", "time", "gpu-bind")
_FLAGS = {"label", "overlap", "exact", "unbuffered", "quiet", "verbose"}
_OPTIONAL = {"kill-on-bad-exit": "1", "exclusive": "exclusive"}
_SHORT = {v: k for k, v in _OPTIONS.items() if v}


class UsageError(Exception):
    pass


def parse_args(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    opts: dict[str, str] = {}
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return opts, argv[i + 1:]
        if not word.startswith("-") or word == "-":
            return opts, argv[i:]
        if word.startswith("--"):
            name, sep, value = word[2:].partition("=")
            value = value if sep else None
        else:
            name = _SHORT.get(word[1:2], "")
            value = word[2:].lstrip("=") or None
        if name not in _OPTIONS:
            raise UsageError(f"unrecognized option '{word}'")
        if name in _FLAGS:
            if value is not None and word.startswith("-") and not word.startswith("--"):
                # bundled short flags like -lK: the rest are more flags
                argv = argv[:i] + [word[:2], "-" + word[2:]] + argv[i + 1:]
                value = None
            opts[name] = "1"
        elif value is None and name in _OPTIONAL:
            opts[name] = _OPTIONAL[name]
        else:
            if value is None:
                i += 1
                if i >= len(argv):
                    raise UsageError(f"option '{word}' requires an argument")
                value = argv[i]
            opts[name] = value
        i += 1
    return opts, []


def _int(opts: dict[str, str], name: str) -> int | None:
    if name not in opts:
        return None
    value = opts[name].split("-")[0]
    if not value.isdigit() or int(value) < 0:
        raise UsageError(f"--{name}: {opts[name]!r} is not a whole number")
    return int(value)


def _gpu_count(text: str | None) -> int | None:
    if text is None:
        return None
    number = text.rsplit(":", 1)[-1]
    if not number.isdigit():
        raise UsageError(f"{text!r} is not a GPU count like 2 or a100:2")
    return int(number)


def plan_step(opts: dict[str, str], nodes: list[dict], env: dict[str, str]) -> list[dict]:
    """Every task of the step: its node, node index, local id and GPUs."""
    from hostlist import expand_hostlist

    by_name = {n["name"]: (i, n) for i, n in enumerate(nodes)}
    if "nodelist" in opts:
        try:
            wanted = expand_hostlist(opts["nodelist"])
        except Exception:
            raise UsageError(f"--nodelist: {opts['nodelist']!r} is not a node list") from None
        missing = [w for w in wanted if w not in by_name]
        if missing:
            raise UsageError(f"--nodelist: {', '.join(missing)} not in the job's allocation "
                             f"({env.get('SLURM_JOB_NODELIST', '')})")
        chosen = [by_name[w] for w in wanted]
    else:
        chosen = [by_name[n["name"]] for n in nodes]
    count_nodes = _int(opts, "nodes")
    ntasks = _int(opts, "ntasks")
    per_node = _int(opts, "ntasks-per-node")
    if count_nodes is not None:
        if count_nodes < 1 or count_nodes > len(chosen):
            raise UsageError(f"--nodes={count_nodes}: the job has {len(chosen)} node(s) to run on")
        chosen = chosen[:count_nodes]
    elif ntasks is not None and "nodelist" not in opts and per_node is None:
        chosen = chosen[:max(1, min(len(chosen), ntasks))]
    if ntasks is None:
        if per_node is not None:
            ntasks = per_node * len(chosen)
        elif count_nodes is not None or "nodelist" in opts:
            ntasks = len(chosen)
        else:
            ntasks = int(env.get("SLURM_NTASKS", len(chosen)))
    if ntasks < len(chosen):
        chosen = chosen[:ntasks]
    per = per_node or -(-ntasks // len(chosen))
    if per * len(chosen) < ntasks:
        raise UsageError(f"--ntasks={ntasks} does not fit {len(chosen)} node(s) x {per} task(s)")
    gpt = _gpu_count(opts.get("gpus-per-task"))
    if gpt is None and not any(k in opts for k in ("gpus", "gpus-per-node", "gres")) and env.get("SLURM_GPUS_PER_TASK"):
        gpt = int(env["SLURM_GPUS_PER_TASK"])
    step_gpus = _gpu_count(opts.get("gpus-per-node") or (opts.get("gres") or "").replace("gpu", "", 1).lstrip(":")
                           or None) if ("gpus-per-node" in opts or "gres" in opts) else None
    if "gpus" in opts:
        step_gpus = -(-(_gpu_count(opts["gpus"]) or 0) // len(chosen))
    tasks = []
    for rank in range(ntasks):
        index, node = chosen[rank // per]
        local = rank % per
        on_node = min(per, ntasks - (rank // per) * per)
        have = list(node["gpus"])
        if step_gpus is not None:
            have = have[:step_gpus]
        if gpt is not None:
            gpus = have[local * gpt:(local + 1) * gpt]
            if len(gpus) < gpt:
                raise UsageError(f"--gpus-per-task={gpt}: node {node['name']} holds {len(node['gpus'])} GPU(s) "
                                 f"for the job, not enough for {on_node} task(s)")
        elif ("exact" in opts or "exclusive" in opts) and have:
            share = len(have) // on_node
            gpus = have[local * share:(local + 1) * share]
        else:
            gpus = have
        tasks.append({"rank": rank, "node": node["name"], "node_index": index, "local": local, "gpus": gpus,
                      "addr": node.get("addr", "")})
    return tasks


def _step_id(env: dict[str, str]) -> int:
    """The job's next step id, from a counter next to its runtime files (shared by every
    srun of the job, so concurrent steps get distinct ids)."""
    base = Path(env.get("CORRAL_HOSTS_FILE") or f"/tmp/corral-steps-{env.get('SLURM_JOB_ID', '0')}").parent
    path = base / f"steps.{env.get('SLURM_JOB_ID', '0')}"
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        text = handle.read().strip()
        step = int(text) if text.isdigit() else 0
        handle.seek(0)
        handle.truncate()
        handle.write(str(step + 1))
    return step


def _task_env(base: dict[str, str], task: dict, tasks: list[dict], step: int, opts: dict[str, str]) -> dict[str, str]:
    from corral.runtime.batchenv import compressed_counts, hostlist

    nodes = list(dict.fromkeys(t["node"] for t in tasks))
    counts = [sum(1 for t in tasks if t["node"] == n) for n in nodes]
    gpus = ",".join(str(g) for g in task["gpus"])
    env = dict(base)
    if opts.get("export", "ALL").upper().startswith("NONE"):
        env = {k: v for k, v in env.items() if k.startswith(("SLURM", "CORRAL_", "CUDA_")) or k in
               ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TERM", "PYTHONPATH", "TMPDIR")}
    for item in opts.get("export", "").split(","):
        key, sep, value = item.partition("=")
        if sep and key:
            env[key] = value
    env.update({
        "SLURM_PROCID": str(task["rank"]), "SLURM_LOCALID": str(task["local"]),
        "SLURM_NODEID": str(task["node_index"]), "SLURMD_NODENAME": task["node"], "SLURM_TOPOLOGY_ADDR": task["node"],
        "SLURM_STEP_ID": str(step), "SLURM_STEPID": str(step),
        "SLURM_STEP_NUM_TASKS": str(len(tasks)), "SLURM_STEP_NUM_NODES": str(len(nodes)),
        "SLURM_STEP_NODELIST": hostlist(nodes), "SLURM_STEP_TASKS_PER_NODE": compressed_counts(counts),
        "SLURM_NTASKS": str(len(tasks)), "SLURM_NPROCS": str(len(tasks)), "SLURM_NNODES": str(len(nodes)),
        "SLURM_NODELIST": hostlist(nodes), "SLURM_TASKS_PER_NODE": compressed_counts(counts),
        "SLURM_STEP_GPUS": gpus, "SLURM_JOB_GPUS": gpus, "CUDA_VISIBLE_DEVICES": gpus,
        "CORRAL_NODE": task["node"],
    })
    if "cpus-per-task" in opts:
        env["SLURM_CPUS_PER_TASK"] = opts["cpus-per-task"]
    if "job-name" in opts:
        env["SLURM_JOB_NAME"] = opts["job-name"]
    for name in ("CORRAL_SBATCH_OUTPUT", "CORRAL_SBATCH_ERROR", "CORRAL_SBATCH_OUTPUT_PATTERN",
                 "CORRAL_SBATCH_ERROR_PATTERN"):
        env.pop(name, None)
    return env


def _restore_signals() -> None:
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_DFL)


def srun(argv: list[str]) -> int:
    from corral.node import stepcontainer
    from corral.spec import pyxis

    env = dict(os.environ)
    try:
        given, argv = pyxis.split(argv)
        container = pyxis.container_of(given)
        opts, command = parse_args(argv)
        if not command:
            raise UsageError("no command to run")
        nodes = json.loads(env.get("CORRAL_SBATCH_NODES") or "null")
        if not nodes:
            raise UsageError("not inside a batch job (no job node layout: SLURM_JOB_ID and CORRAL_SBATCH_NODES)")
        tasks = plan_step(opts, nodes, env)
        ignored = [f"--{name}" for name in _IGNORED if name in opts]
        if ignored and "quiet" not in opts:
            print(f"srun: warning: {', '.join(ignored)} ignored on corral's nodes", file=sys.stderr)
        wait_s = _int(opts, "wait") or 0
        kill_bad = opts.get("kill-on-bad-exit", "0") not in ("0", "")
    except (UsageError, ValueError) as exc:
        print(f"srun: error: {exc}", file=sys.stderr)
        return 1
    step = _step_id(env)
    boxes: list = []  # each task's container (``stepcontainer.Box``), when the step runs in one
    try:
        return _run_step(opts, command, tasks, step, env, container, boxes, wait_s, kill_bad)
    except stepcontainer.StepContainerError as exc:
        print(f"srun: error: {exc}", file=sys.stderr)
        return 1
    finally:
        for box in boxes:
            box.remove()


def _run_step(opts: dict[str, str], command: list[str], tasks: list[dict], step: int, env: dict[str, str],
              container, boxes: list, wait_s: int, kill_bad: bool) -> int:
    from corral.node import stepcontainer

    cwd = opts.get("chdir") or os.getcwd()
    label = "label" in opts
    batch_only = env.get("CORRAL_SBATCH_BATCH_SIGNAL", "")
    procs: list[subprocess.Popen] = []
    lock = threading.Lock()

    def forward(signum: int, _frame) -> None:
        if batch_only and signal.Signals(signum).name == batch_only:
            return  # --signal=B:…: meant for the batch shell only
        with lock:
            for proc in procs:
                if proc.poll() is None:
                    try:
                        os.killpg(proc.pid, signum)
                    except ProcessLookupError:
                        pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    pumps = []
    started = []
    for task in tasks:  # every task's container made (and its image pulled) before any task starts
        task_env = _task_env(env, task, tasks, step, opts)
        argv = command
        if container is not None:  # Pyxis's options: the task runs in that container (``node.stepcontainer``)
            box = stepcontainer.prepare(container, stepcontainer.task_key(env, str(step), str(task["rank"])),
                                        task_env, cwd)
            boxes.append(box)
            box.ready(pull_image=len(boxes) == 1)  # one pull for the step: every task runs the same image
            argv = box.argv(command)
        started.append((task, task_env, argv))
    for task, task_env, argv in started:
        try:
            proc = subprocess.Popen(argv, env=task_env, cwd=cwd, process_group=0, preexec_fn=_restore_signals,
                                    stdout=subprocess.PIPE if label else None,
                                    stderr=subprocess.STDOUT if label else None)
        except OSError as exc:
            print(f"srun: error: task {task['rank']}: {command[0]}: {exc.strerror}", file=sys.stderr)
            forward(signal.SIGKILL, None)
            return 2
        with lock:
            procs.append(proc)
        if label:
            thread = threading.Thread(target=_pump, args=(proc, task["rank"]), daemon=True)
            thread.start()
            pumps.append(thread)
    codes = _wait_all(procs, wait_s, kill_bad, forward)
    for thread in pumps:
        thread.join(timeout=5)
    return max(codes) if codes else 0


_OUT_LOCK = threading.Lock()


def _pump(proc: subprocess.Popen, rank: int) -> None:
    for line in iter(proc.stdout.readline, b""):
        with _OUT_LOCK:
            sys.stdout.buffer.write(f"{rank}: ".encode() + line)
            sys.stdout.buffer.flush()


def _wait_all(procs: list[subprocess.Popen], wait_s: int, kill_bad: bool, forward) -> list[int]:
    """Every task's exit code (128+N when a signal ended it); ``--kill-on-bad-exit`` ends the
    step at the first failure, ``--wait`` once the first task has ended for that long."""
    first_end: float | None = None
    stopping_at: float | None = None
    while True:
        codes = [proc.poll() for proc in procs]
        if all(c is not None for c in codes):
            return [128 - c if c < 0 else c for c in codes]
        now = time.monotonic()
        ended = [c for c in codes if c is not None]
        if ended and first_end is None:
            first_end = now
        bad = kill_bad and any(c != 0 for c in ended)
        late = wait_s and first_end is not None and now - first_end >= wait_s
        if (bad or late) and stopping_at is None:
            if late and not bad:
                print(f"srun: error: a task ended; the others are stopped {wait_s} s later (--wait)", file=sys.stderr)
            forward(signal.SIGTERM, None)
            stopping_at = now
        elif stopping_at is not None and now - stopping_at > 2:
            forward(signal.SIGKILL, None)
        time.sleep(0.02)


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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "corral-container":  # a batch script in its own container (``node.stepcontainer``)
        from corral.node import stepcontainer

        return stepcontainer.main(argv[1:])
    if argv and argv[0] in ("slurm-srun", "task-container"):  # Slurm's own srun, Pyxis's options off Pyxis
        from corral.node import slurmstep

        return slurmstep.main(argv[1:]) if argv[0] == "slurm-srun" else slurmstep.task(argv[1:])
    if not argv or argv[0] not in ("srun", "scontrol"):
        print("usage: srun.py srun|scontrol|corral-container|slurm-srun|task-container ARGS", file=sys.stderr)
        return 2
    return srun(argv[1:]) if argv[0] == "srun" else scontrol(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
