"""corral's ``srun`` and ``scontrol`` for batch scripts off Slurm (``corral.runtime.batchenv``
explains where they run and why). Run as ``python srun.py srun|scontrol ARGS``.

``srun CMD`` starts a job step: its tasks spread over the job's nodes (``-N``, ``-n``,
``--ntasks-per-node``, ``-w``), each with ``SLURM_PROCID``, ``SLURM_LOCALID``,
``SLURM_NODEID``, ``SLURM_STEP_ID`` and its node's GPUs (split by ``--gpus-per-task``, or
each task's even share with ``--exact``). Every task is a process group of its own, so a
signal meant for the batch shell alone (``--signal=B:…``) never reaches it, while ``srun``
forwards the others it receives (a stop, a ``--signal`` without ``B:``). Output goes where
the step's own goes (the job's log), or to ``-o``/``-e`` files, prefixed by the task id with
``-l``. The exit code is the highest of the tasks' (128+N for a task ended by signal N), as
Slurm's. ``--overlap`` is what every step does here: steps share the job's allocation.

In a heterogeneous job (``corral.spec.hetjob``) a step runs on component 0, on the
components ``--het-group`` names, or one per `` : `` part of the line (``plan``), each task
with its component's view of the job (``group_env``) and ranks numbered across them."""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":  # run as a file: import corral from the tree this file is in
    sys.path[0] = str(Path(__file__).resolve().parents[2])

import fcntl  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
STOPS = frozenset((signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT))

# (long, short, takes a value); values are parsed in ``_step``
_OPTIONS = {
    "nodes": "N", "ntasks": "n", "ntasks-per-node": None, "nodelist": "w", "cpus-per-task": "c",
    "gpus": "G", "gpus-per-node": None, "gpus-per-task": None, "gres": None, "job-name": "J", "chdir": "D",
    "wait": "W", "export": None, "mem": None, "mem-per-cpu": None, "cpu-bind": None, "mpi": None,
    "distribution": "m", "time": "t", "kill-on-bad-exit": "K", "label": "l", "overlap": None, "exact": None,
    "unbuffered": "u", "quiet": "Q", "verbose": "v", "exclusive": None, "gpu-bind": None,
    "het-group": None, "output": "o", "error": "e", "open-mode": None, "exclude": "x",
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
        if not chosen:
            raise UsageError("--nodelist: names no node")
    else:
        chosen = [by_name[n["name"]] for n in nodes]
    if "exclude" in opts:  # --exclude: the job's nodes but these (named outside the job: nothing to leave out)
        try:
            left_out = set(expand_hostlist(opts["exclude"]))
        except Exception:
            raise UsageError(f"--exclude: {opts['exclude']!r} is not a node list") from None
        chosen = [c for c in chosen if c[1]["name"] not in left_out]
        if not chosen:
            raise UsageError(f"--exclude: leaves none of the job's nodes ({env.get('SLURM_JOB_NODELIST', '')})")
    count_nodes = _int(opts, "nodes")
    ntasks = _int(opts, "ntasks")
    per_node = _int(opts, "ntasks-per-node")
    for name, value in (("ntasks", ntasks), ("ntasks-per-node", per_node)):
        if value is not None and value < 1:
            raise UsageError(f"--{name}={value}: at least 1")
    if not chosen:
        raise UsageError("the job has no node to run a step on")
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


def _segments(argv: list[str]) -> list[list[str]]:
    """An srun line's components: ``srun OPTS0 [CMD0] : OPTS1 CMD1`` (a heterogeneous step)."""
    out: list[list[str]] = [[]]
    for word in argv:
        if word == ":":
            out.append([])
        else:
            out[-1].append(word)
    return out


def het_groups(expr: str, size: int) -> list[int]:
    """``--het-group``'s components: ``1``, ``0,1``, ``0-2``, ``1,3-5``."""
    groups: list[int] = []
    for part in expr.split(","):
        low, sep, high = part.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise UsageError(f"--het-group: {expr!r} is not a list of components like 1, 0,1 or 0-2")
        for group in range(int(low), int(high if sep else low) + 1):
            if group >= size:
                raise UsageError(f"--het-group: the job has components 0-{size - 1}, not {group}")
            if group not in groups:
                groups.append(group)
    if not groups:
        raise UsageError(f"--het-group: {expr!r} names no component")
    return groups


def group_env(env: dict[str, str], group: int) -> dict[str, str]:
    """The batch script's environment as a step on component ``group`` of a heterogeneous job
    sees its job: that component's nodes, tasks, CPUs, GPUs and partition under the usual
    names (``corral.runtime.batchenv.het_env``)."""
    from corral.runtime.batchenv import HET_VARS

    out = dict(env)
    for name in HET_VARS:
        own = env.get(f"{name}_HET_GROUP_{group}")
        if own is None:
            out.pop(name, None)
        else:
            out[name] = own
    return out


def plan(argv: list[str], env: dict[str, str]) -> list[dict]:
    """Every task of the step an srun line asks for: its node, ranks, GPUs, and the command,
    container, options and environment of its component. In a heterogeneous job a step runs on
    component 0 unless ``--het-group`` says otherwise; each `` : `` component of the line runs
    on the next component (or its own ``--het-group``), and the ranks of a step over several
    run on across them."""
    from corral.spec import pyxis

    parsed = []
    for words in _segments(argv):
        given, words = pyxis.split(words)
        opts, command = parse_args(words)
        parsed.append([opts, command, pyxis.container_of(given)])
    for index in range(len(parsed) - 2, -1, -1):  # a component without a command runs the next one's
        if not parsed[index][1]:
            parsed[index][1] = parsed[index + 1][1]
    if not parsed[-1][1]:
        raise UsageError("no command to run")
    nodes = json.loads(env.get("CORRAL_SBATCH_NODES") or "null")
    if not nodes:
        raise UsageError("not inside a batch job (no job node layout: SLURM_JOB_ID and CORRAL_SBATCH_NODES)")
    size = int(env.get("SLURM_HET_SIZE") or 0) if all("group" in n for n in nodes) else 0
    parts: list[tuple[int | None, dict[str, str], list[str], object]] = []
    for index, (opts, command, container) in enumerate(parsed):
        if "het-group" in opts:
            if not size:
                raise UsageError("--het-group expected to be used within a heterogeneous job (#SBATCH hetjob)")
            groups: list[int | None] = list(het_groups(opts["het-group"], size))
        elif size:
            if index >= size:
                raise UsageError(f"the srun line has {len(parsed)} components (' : ') but the job {size}")
            groups = [index]
        elif len(parsed) > 1:
            raise UsageError("' : ' separates the components of a heterogeneous step, and this job is not "
                             "heterogeneous (#SBATCH hetjob)")
        else:
            groups = [None]
        parts += [(group, opts, command, container) for group in groups]
    tasks: list[dict] = []
    for group, opts, command, container in parts:
        base = env if group is None else group_env(env, group)
        own = nodes if group is None else [n for n in nodes if n.get("group") == group]
        for task in plan_step(opts, own, base):
            task.update(rank=len(tasks), group=group, command=command, container=container, opts=opts, base=base)
            tasks.append(task)
    if len(parts) > 1:  # node ids across the whole step
        order = list(dict.fromkeys(t["node"] for t in tasks))
        for task in tasks:
            task["node_index"] = order.index(task["node"])
    return tasks


def srun(argv: list[str]) -> int:
    from corral.node import stepcontainer
    from corral.spec import pyxis

    env = dict(os.environ)
    try:
        tasks = plan(argv, env)
        opts = tasks[0]["opts"]
        ignored = sorted({f"--{name}" for t in tasks for name in _IGNORED if name in t["opts"]})
        if ignored and "quiet" not in opts:
            print(f"srun: warning: {', '.join(ignored)} ignored on corral's nodes", file=sys.stderr)
        wait_s = _int(opts, "wait") or 0
        kill_bad = opts.get("kill-on-bad-exit", "0") not in ("0", "")
    except (UsageError, ValueError, pyxis.PyxisError) as exc:
        print(f"srun: error: {exc}", file=sys.stderr)
        return 1
    step = _step_id(env)
    boxes: list = []  # each task's container (``stepcontainer.Box``), when the step runs in one
    try:
        return _run_step(opts, tasks, step, env, boxes, wait_s, kill_bad)
    except stepcontainer.StepContainerError as exc:
        print(f"srun: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # an --output/--error file
        print(f"srun: error: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 1
    finally:
        for box in boxes:
            box.remove()


def _output_path(pattern: str, task: dict, step: int, env: dict[str, str], cwd: str) -> str:
    """srun's ``--output``/``--error`` patterns: %j %J %s %t %n %N %x %u %%."""
    job = env.get("SLURM_JOB_ID", "0")
    values = {"j": job, "J": f"{job}.{step}", "s": str(step), "t": str(task["rank"]), "n": str(task["node_index"]),
              "N": task["node"], "x": env.get("SLURM_JOB_NAME", ""), "u": env.get("SLURM_JOB_USER", ""), "%": "%"}

    def fill(match) -> str:
        value = values.get(match.group(2), match.group(0))
        return value.zfill(int(match.group(1))) if match.group(1) and value.isdigit() else value

    path = re.sub(r"%(\d*)([jJstnNxu%])", fill, pattern)
    return path if path.startswith("/") else os.path.join(cwd, path)


def _run_step(opts: dict[str, str], tasks: list[dict], step: int, env: dict[str, str],
              boxes: list, wait_s: int, kill_bad: bool) -> int:
    from corral.node import stepagent, stepcontainer

    cwd = opts.get("chdir") or os.getcwd()
    batch_only = env.get("CORRAL_SBATCH_BATCH_SIGNAL", "")
    procs: list[subprocess.Popen] = []
    lock = threading.RLock()  # (reentrant: the signal handler runs on the thread that may hold it)
    files: dict[str, object] = {}  # --output/--error files, opened once each (shared by tasks naming one)
    # a stop signal that comes while the step's containers are made and its tasks started: the
    # tasks not started yet never start (it would reach none of them, and their grace be lost)
    stopped: list[int] = []

    def forward(signum: int, _frame) -> None:
        if batch_only and signal.Signals(signum).name == batch_only:
            return  # --signal=B:…: meant for the batch shell only
        if signum in STOPS:
            stopped.append(signum)
        with lock:
            for proc in procs:
                _deliver(proc, signum)

    def opened(pattern: str | None, task: dict, mode: str):
        if pattern is None:
            return None
        path = _output_path(pattern, task, step, env, cwd)
        if path not in files:
            files[path] = open(path, mode + "b")
        return files[path]

    for sig in FORWARDED:
        signal.signal(sig, forward)
    pumps = []
    started = []
    het = len({t["group"] for t in tasks}) > 1
    for task in tasks:  # every task's container made (and its image pulled) before any task starts
        if stopped:
            return _aborted(stopped[0])
        own = task["opts"]
        task_env = _task_env(task["base"], task, tasks, step, own)
        if het:
            task_env.update(_het_step_env(tasks))
        argv = task["command"]
        if task["container"] is not None:  # Pyxis's options: the task runs in that container (``node.stepcontainer``)
            box = stepcontainer.prepare(task["container"], stepcontainer.task_key(env, str(step), str(task["rank"])),
                                        task_env, cwd)
            boxes.append(box)
            box.ready(pull_image=len(boxes) == 1)  # one pull for the step: every task runs the same image
            argv = box.argv(argv)
        mode = "a" if own.get("open-mode", "truncate").lower().startswith("a") else "w"
        out = opened(own.get("output"), task, mode)
        err = opened(own.get("error"), task, mode) or out
        started.append((task, task_env, argv, out, err, "label" in own))
    for task, task_env, argv, out, err, label in started:
        if stopped and not procs:
            return _aborted(stopped[0])
        if stopped:  # those started have it; the rest never start
            break
        try:
            proc = stepagent.start_task(task["node"], env, argv, task_env, cwd, out, err, label)
            if proc is None:  # this node's task, or no agent to run it on its own
                proc = subprocess.Popen(argv, env=task_env, cwd=cwd, process_group=0, preexec_fn=_restore_signals,
                                        stdout=subprocess.PIPE if label else out,
                                        stderr=subprocess.STDOUT if label and err is out else err)
        except stepagent.HolderGone as exc:
            print(f"srun: error: {task['node']}: task {task['rank']}: {exc}", file=sys.stderr)
            forward(signal.SIGKILL, None)
            return 1
        except OSError as exc:
            print(f"srun: error: task {task['rank']}: {argv[0]}: {exc.strerror or exc}", file=sys.stderr)
            forward(signal.SIGKILL, None)
            return 2
        with lock:
            procs.append(proc)
            if stopped:  # it came between the check above and now: this task has it too
                _deliver(proc, stopped[-1])
        if label:
            thread = threading.Thread(target=_pump, args=(proc, task["rank"], out), daemon=True)
            thread.start()
            pumps.append(thread)
    codes = _wait_all(procs, wait_s, kill_bad, forward)
    for thread in pumps:
        thread.join(timeout=5)
    for handle in files.values():
        handle.close()
    for (task, *_), proc, code in zip(started, procs, codes):  # as Slurm's srun says which task failed, and how
        if code:
            how = f"Killed by signal {code - 128}" if 128 < code < 128 + 65 else f"Exited with exit code {code}"
            if getattr(proc, "lost", False):
                how = "Lost: its holder on that node ended under it (exit code 255)"
            print(f"srun: error: {task['node']}: task {task['rank']}: {how}", file=sys.stderr)
    return max(codes) if codes else 0


def _deliver(proc, signum: int) -> None:
    """``signum`` to a task's process group (here, or on its node through its agent)."""
    from corral.node import stepagent

    if proc.poll() is not None:
        return
    if isinstance(proc, stepagent.RemoteTask):
        proc.signal_group(signum)
        return
    try:
        os.killpg(proc.pid, signum)
    except ProcessLookupError:
        pass


def _aborted(signum: int) -> int:
    print(f"srun: error: the step was stopped ({signal.Signals(signum).name}) before its tasks started",
          file=sys.stderr)
    return 128 + signum


def _het_step_env(tasks: list[dict]) -> dict[str, str]:
    """A step over several components: their count and each one's nodes and tasks, suffixed
    with the job's component number."""
    from corral.runtime.batchenv import compressed_counts, hostlist

    groups = list(dict.fromkeys(t["group"] for t in tasks))
    env = {"SLURM_HET_SIZE": str(len(groups))}
    for group in groups:
        own = [t for t in tasks if t["group"] == group]
        nodes = list(dict.fromkeys(t["node"] for t in own))
        env.update({f"SLURM_STEP_NODELIST_HET_GROUP_{group}": hostlist(nodes),
                    f"SLURM_STEP_NUM_NODES_HET_GROUP_{group}": str(len(nodes)),
                    f"SLURM_STEP_NUM_TASKS_HET_GROUP_{group}": str(len(own)),
                    f"SLURM_STEP_TASKS_PER_NODE_HET_GROUP_{group}":
                        compressed_counts([sum(1 for t in own if t["node"] == n) for n in nodes])})
    return env


_OUT_LOCK = threading.Lock()


def _pump(proc: subprocess.Popen, rank: int, out=None) -> None:
    out = out or sys.stdout.buffer
    for line in iter(proc.stdout.readline, b""):
        with _OUT_LOCK:
            out.write(f"{rank}: ".encode() + line)
            out.flush()


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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "corral-stepd":  # a holder replica: its node's step agent (``node.stepagent``)
        from corral.node import stepagent

        return stepagent.main(argv[1:])
    if argv and argv[0] == "corral-container":  # a batch script in its own container (``node.stepcontainer``)
        from corral.node import stepcontainer

        return stepcontainer.main(argv[1:])
    if argv and argv[0] in ("slurm-srun", "task-container"):  # Slurm's own srun, Pyxis's options off Pyxis
        from corral.node import slurmstep

        return slurmstep.main(argv[1:]) if argv[0] == "slurm-srun" else slurmstep.task(argv[1:])
    if not argv or argv[0] not in ("srun", "scontrol"):
        print("usage: srun.py srun|scontrol|corral-container|slurm-srun|task-container ARGS", file=sys.stderr)
        return 2
    if argv[0] == "scontrol":
        from corral.node.scontrol import scontrol

        return scontrol(argv[1:])
    return srun(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
