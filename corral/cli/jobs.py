"""The commands that change jobs: launch (and follow), logs, cancel, hold, release, requeue,
update (priority and nice) and scale. Each takes the parsed arguments; bad input raises ``Usage`` (exit 2), a refusal
from the server exits through ``fail``."""

from __future__ import annotations

import os
import re
import sys
import time
import zlib
from argparse import Namespace
from pathlib import Path

from corral import embedded as daemon
from corral.cli.render import Usage, err, fail, moment, out, states
from corral.client import TERMINAL, Client, CorralError


def _slurm_partition(client, asked: str | None) -> str:  # noqa: ANN001 - a Client
    """``--slurm``: the partition whose jobs become Slurm jobs (the one named with -p must be one)."""
    try:
        parts = client.partitions()
    except CorralError as exc:
        fail(exc)
    slurm = [p["name"] for p in parts if p.get("infra") == "slurm"]
    if asked is not None and asked not in slurm:
        raise Usage("--slurm", f"partition {asked!r} does not have infra: slurm"
                               + (f" (these do: {', '.join(slurm)})" if slurm else ""))
    if not slurm:
        raise Usage("--slurm", "this server has no partition with infra: slurm; add one to config.yaml, e.g. "
                               "partitions: [{name: slurm, infra: slurm}] (its jobs go to Slurm's default partition)")
    return asked or slurm[0]


def _pairs(option: str, items: list[str]) -> dict[str, str]:
    """``K=V`` items, or ``K`` alone for its value in this shell (SkyPilot's ``--env HF_TOKEN``)."""
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not key:
            raise Usage(option, f"{item!r} is not K=V or K")
        if not sep:
            if key not in os.environ:
                raise Usage(option, f"{key} is not set in this shell: give {option} {key}=VALUE")
            value = os.environ[key]
        pairs[key] = value
    return pairs


_TASK_OPTIONS = {"num_nodes": "num_nodes", "gpus": "accelerators", "cpus": "cpus", "memory": "memory",
                 "image_id": "image_id"}


def launch(args: Namespace) -> None:
    file = Path(args.file)
    env, secrets = _pairs("--env", args.env), _pairs("--secret", args.secret)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise Usage("FILE", f"cannot read {file}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        line = file.read_bytes()[:exc.start].count(b"\n") + 1
        raise Usage("FILE", f"{file} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} on line {line}); "
                            "job files are read as UTF-8") from None
    from corral.spec.sbatch import is_batch_script
    from corral.spec.world import parse_export

    if args.export is not None:
        try:
            parse_export(args.export)
        except ValueError as exc:
            raise Usage("--export", str(exc)) from None
    if getattr(args, "slurm", False):
        args.partition = _slurm_partition(daemon.client(), args.partition)
    # sky launch's overrides (argparse's dest -> the task field they set)
    task = {field: getattr(args, dest, None) for dest, field in _TASK_OPTIONS.items()}
    task = {k: v for k, v in task.items() if v is not None}
    if is_batch_script(text):  # a Slurm batch script: its directives, then these options over them
        if task:
            raise Usage("--num-nodes/--gpus/--cpus/--memory/--image-id", "they set a task YAML's fields; a batch "
                        "script takes sbatch's options (corral sbatch -N 2 --gpus-per-node=8 "
                        "--container-image=… script.sh) or its #SBATCH directives")
        from corral.cli import batch
        from corral.spec.loader import SpecError

        try:
            batch.submit(file, text, batch.launch_overrides(args), (), [], env=env, name=None, detach=args.detach,
                         secrets=secrets)
        except SpecError as exc:
            batch._refused(exc)
        return
    limit = args.time_limit
    if limit is not None and limit.strip().isdigit():  # sbatch -t 30 means minutes
        limit = f"{limit.strip()}m"
    options = {"partition": args.partition, "account": args.account, "qos": args.qos, "time_limit": limit,
               "nice": args.nice, "dependency": args.dependency, "kill_on_invalid_dep": args.kill_on_invalid_dep or None,
               "hold": args.hold or None}
    scheduling = {k: v for k, v in options.items() if v is not None}
    client = daemon.client()
    try:
        result = client.submit(text, source=str(file), name=args.name, env=env, scheduling=scheduling,
                               array=args.array, workdir=args.workdir, export=args.export, secrets=secrets,
                               task=task or None)
    except CorralError as exc:
        fail(exc, str(file))
    for warning in result["warnings"]:
        err.print(f"[yellow]warning:[/yellow] {warning}")
    job = result["job"]
    if result.get("array_size"):
        from corral.cli.batch import wait_array

        print(job["array_job_id"])
        if not args.detach:
            err.print(f"Array {job['array_job_id']} submitted: {result['array_size']} elements. Ctrl-C detaches.")
            sys.exit(wait_array(client, job["array_job_id"]))
        return
    if args.detach:
        print(job["id"])
        return
    follow(client, job)


def follow(client: Client, job: dict) -> None:
    """Stream a submitted job's logs until it ends; exit 0 only if it SUCCEEDED."""
    summary = " ".join(f"{t['name']}:{t['num_nodes']}" for t in job["tasks"])
    err.print(f"Job {job['id']} ({job['name']}) submitted: {summary}. Ctrl-C detaches; the job keeps running.")
    try:
        _while_pending(client, job)
        _stream(client.logs(job["id"], follow=True, prefix=True))
        final = client.job(job["id"])
    except KeyboardInterrupt:
        err.print(f"\nDetached from job {job['id']}; it keeps running. Follow it again with: "
                  f"corral logs {job['id']} -f")
        sys.exit(130)
    except CorralError as exc:
        fail(exc)
    style = "green" if final["state"] == "SUCCEEDED" else "red"
    extra = f" (exit code {final['exit_code']})" if final["exit_code"] not in (None, 0) else ""
    err.print(f"Job {final['id']} ({final['name']}) [{style}]{final['state']}[/{style}]{extra}"
              + (f": {final['message']}" if final.get("message") and final["state"] != "SUCCEEDED" else ""))
    sys.exit(0 if final["state"] == "SUCCEEDED" else 1)


def logs(args: Namespace) -> None:
    client = daemon.client()
    try:
        data = client.job(args.job)
        if data["state"] == "PENDING" and not data["started_at"]:
            reason = "" if data["reason"] in (None, "None") else f" ({data['reason']})"
            err.print(f"Job {data['id']} is pending{reason}; "
                      + ("its logs follow once it starts." if args.follow else "it has no logs yet."))
        _stream(client.logs(args.job, replica=args.replica, follow=args.follow, tail=args.tail))
    except CorralError as exc:
        fail(exc)
    except KeyboardInterrupt:
        sys.exit(130)


def _while_pending(client: Client, job: dict) -> None:
    """While the job waits, say why and when it is expected to start: one line kept current on
    a terminal, a new line at each change otherwise."""
    tty = sys.stderr.isatty()
    shown, waited, first, tag = "", False, True, None
    while job["state"] == "PENDING":
        reason = "" if job["reason"] in (None, "None") else f" ({job['reason']})"
        start = f", expected start {moment(job['expected_start'])}" if job.get("expected_start") else ""
        line = f"Job {job['id']} pending{reason}{start}"
        if line != shown and not first:  # a job that starts at once never shows the line
            sys.stderr.write(("\r\x1b[2K" + line) if tty else line + "\n")
            sys.stderr.flush()
            shown, waited = line, True
        if tag is None:  # the first look (or a server that cannot wait for a change)
            time.sleep(0.2 if first else 1.0)
        first = False
        job, tag = client.job_change(job["id"], tag, 10.0)  # answers as soon as the job changes
    if waited and tty:
        sys.stderr.write("\r\x1b[2K")
        sys.stderr.flush()


_PREFIX = re.compile(rb"^([A-Za-z0-9][A-Za-z0-9_.-]{0,80}-[0-9]+) +\| ", re.MULTILINE)  # "trainer-0   | "
_COLOURS = (b"36", b"33", b"35", b"32", b"34", b"91", b"96", b"93", b"95", b"92")


def _stream(chunks) -> None:
    """Copy a log stream to stdout; on a colour terminal each replica's prefix gets a colour
    of its own (the same one on every run)."""
    colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    for chunk in chunks:
        if colour:
            chunk = _PREFIX.sub(lambda m: b"\x1b[" + _COLOURS[zlib.crc32(m.group(1)) % len(_COLOURS)] + b"m"
                                + m.group(0)[:-2] + b"\x1b[0m| ", chunk)
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()


def cancel(args: Namespace) -> None:
    client = daemon.client()
    jobs = tuple(args.jobs)
    wanted_states = states(args.state, "--state", ("PENDING", "STARTING", "RUNNING"))
    if args.user or wanted_states or args.name or args.partition:
        # like scancel for a user: filters reach your own jobs unless -u names someone (an operator's right)
        owner = args.user or _me(client)
        try:
            found = list(client.iter_jobs(user=owner, name=args.name, states=wanted_states or None))
        except CorralError as exc:
            fail(exc)
        wanted = set(jobs)
        jobs = tuple(str(j["id"]) for j in found if j["state"] not in TERMINAL
                     and (args.partition is None or j.get("partition") == args.partition)
                     and (not wanted or str(j["id"]) in wanted or j["name"] in wanted))
        if not jobs:
            err.print("no active job matches")
            return
    elif not jobs:
        raise Usage("JOB", "name the jobs to cancel, or filter them with -u/-t/-n/-p")
    failed = 0
    for ident in jobs:
        try:
            result = client.cancel(ident, force=args.force)
        except CorralError as exc:
            err.print(f"[red]error:[/red] {exc.message}")
            failed = max(failed, _code(exc))
            continue
        verb = "cancelling" if result["cancelled"] else f"not cancelled (already {result['state']} or cancelling)"
        if args.force and result["cancelled"]:
            verb = "killed (SIGKILL, no grace period)"
        if result.get("elements"):  # a whole array: say how many of its elements stop
            verb += f" ({result['elements']} array element{'s' if result['elements'] != 1 else ''})"
        # as named (an array element as ARRAY_INDEX, as scancel and squeue show it)
        out.print(f"Job {ident if '_' in str(ident) else result['id']}: {verb}")
    sys.exit(failed)


def _me(client: Client) -> str:
    try:
        return client.whoami()["user"]
    except CorralError as exc:
        fail(exc)
        raise  # fail exits


def _code(exc: CorralError) -> int:
    """2 for a job that does not exist or a request that is invalid, 1 for a refusal."""
    return 2 if exc.status in (400, 404, 422) else 1


def each(args: Namespace) -> None:
    """hold, release or requeue every job named; exit 1 if any was refused."""
    client = daemon.client()
    failed = 0
    for ident in args.jobs:
        try:
            call = getattr(client, args.action)
            result = call(ident, hold=True) if args.hold else call(ident)
        except CorralError as exc:
            err.print(f"[red]error:[/red] {exc.message}", markup=True)
            failed = max(failed, _code(exc))
            continue
        out.print(result["message"][0].upper() + result["message"][1:], markup=False)
    sys.exit(failed)


def update(args: Namespace) -> None:
    """Change pending jobs' priority or nice (``scontrol update``); exit 1 if any was refused."""
    changes: dict[str, float | int | None] = {}
    if args.priority is not None:
        text = args.priority.strip().lower()
        try:
            changes["priority"] = None if text == "formula" else float(text)
        except ValueError:
            raise Usage("--priority", f"{args.priority!r} is not a number (or 'formula')") from None
    if args.nice is not None:
        changes["nice"] = args.nice
    if not changes:
        raise Usage("--priority", "give --priority and/or --nice")
    client = daemon.client()
    failed = 0
    for ident in args.jobs:
        try:
            job = client.set_priority(ident, **changes)
        except CorralError as exc:
            err.print(f"[red]error:[/red] {exc.message}")
            failed = max(failed, _code(exc))
            continue
        shown = ", ".join(f"{k} {'from the formula' if v is None else v}" for k, v in changes.items())
        out.print(f"Job {job['id']}: {shown}")
    sys.exit(failed)


def scale(args: Namespace) -> None:
    if args.replicas is None and args.min_nodes is None and args.max_nodes is None:
        raise Usage("REPLICAS", "give a replica count, --min N and/or --max N")
    if args.max_nodes == 0:
        raise Usage("--max", "--max is at least 1 (to stop the task, cancel its job)")
    try:
        data = daemon.client().scale(args.job, args.task, args.replicas, args.min_nodes, args.max_nodes)
    except CorralError as exc:
        # the API names its body's fields; a CLI user gave options and an argument
        for field, option in (("body.min_nodes: ", "--min: "), ("body.max_nodes: ", "--max: "),
                              ("body.replicas: ", "REPLICAS: ")):
            exc.message = exc.message.replace(field, option)
        fail(exc)
    task = next((t for t in data.get("tasks", []) if t["name"] == args.task), {})
    low, high = task.get("min_nodes"), task.get("max_nodes")
    bounds = f" (bounds {low}..{high})" if low is not None and high is not None else ""
    if args.min_nodes is None and args.max_nodes is None and task.get("autoscaled"):
        out.print(f"Job {data['id']}: {args.task} is autoscaled, so the count pins it: min = max = {args.replicas}; "
                  f"the autoscaler holds it there until corral scale {data['id']} {args.task} --min N --max M; "
                  f"watch with: corral status {data['id']}")
        return
    count = task.get("num_nodes", args.replicas)
    if args.replicas is None:  # new bounds only: the count stays until something moves it within them
        out.print(f"Job {data['id']}: {args.task} now within bounds {low}..{high}, at {count} replica(s) now; "
                  f"watch with: corral status {data['id']}")
        return
    out.print(f"Job {data['id']}: scaling {args.task} to {count} replica(s){bounds}; "
              f"watch with: corral status {data['id']}")
