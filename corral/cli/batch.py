"""``corral sbatch [sbatch options] SCRIPT [ARGS…]`` and ``corral launch SCRIPT`` for Slurm
batch scripts (``corral.spec.sbatch`` reads them). The script is read and checked here, where
the submitting directory and environment are (``SLURM_SUBMIT_DIR``, ``--export=VAR``), and
sent as the job it maps to. Like sbatch, ``corral sbatch`` prints ``Submitted batch job N``
and returns (``--wait``: it waits and exits with the job's exit code)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from corral import embedded as daemon
from corral.cli.render import Usage, err, fail
from corral.client import TERMINAL, CorralError
from corral.spec.loader import SpecError

USAGE = """usage: corral sbatch [sbatch options] [: [sbatch options]...] SCRIPT [ARGS...]

Submit a Slurm batch script to corral's queue. Options are sbatch's (-J, -N, -n,
--ntasks-per-node, -c, --gres=gpu[:type]:N, -G, --gpus-per-node, --gpus-per-task, --mem,
--mem-per-cpu, -t, -p, -A, -q, -o, -e, --exclusive, -a/--array, -d/--dependency, --signal,
--requeue/--no-requeue, -C, -w, -D, --export, -H, --nice, -W/--wait, --parsable) and
override the script's #SBATCH directives. A lone ':' separates the components of a
heterogeneous job (as do '#SBATCH hetjob' lines in the script); they run as one job. Prints "Submitted batch job N" (or, for an
array, the array's job id) and returns; with --wait, waits and exits with the job's exit
code."""


def read_script(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise Usage("SCRIPT", f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise Usage("SCRIPT", f"{path} is not UTF-8 text") from None


def sbatch_main(argv: list[str]) -> None:
    from corral.spec.sbatch import command_line_components, parse_command_line

    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stdout if argv else sys.stderr)
        sys.exit(0 if argv else 2)
    try:
        components, rest, issues, warnings = command_line_components(argv)
        given = components[0]
        if "export" not in given and os.environ.get("SBATCH_EXPORT"):  # sbatch's input variable, under its option
            from_env, _, bad, _ = parse_command_line([f"--export={os.environ['SBATCH_EXPORT']}"])
            given.update(from_env)
            issues += bad
        if issues:
            raise SpecError(issues, "corral sbatch")
        wrapped = [c.pop("wrap").value for c in components if "wrap" in c]
        if wrapped:  # sbatch --wrap: the command as a /bin/sh script of its own, named "wrap" as in Slurm
            if rest or len(components) > 1:
                raise Usage("--wrap", "takes no script, script arguments or components: the command is the script")
            rest, path = ["wrap"], Path("wrap")
            text = f"#!/bin/sh\n# made by corral sbatch --wrap\n{wrapped[0]}\n"
        elif not rest:
            raise Usage("SCRIPT", "name the batch script to submit (or give its command with --wrap)")
        else:
            path = Path(rest[0])
            text = read_script(path)
        if not text.startswith("#!"):
            raise Usage("SCRIPT", f"{path} does not look like a batch script: its first line must be #! and "
                                  "the path of an interpreter (a job YAML goes to corral launch)")
        submit(path, text, components, tuple(rest[1:]), warnings, env={}, name=None, detach=None)
    except SpecError as exc:
        _refused(exc)
    except Usage as exc:
        print(f"corral sbatch: error: {exc.option}: {exc.message}", file=sys.stderr)
        sys.exit(2)
    except CorralError as exc:  # no server, a bad config.yaml …
        fail(exc)


def _refused(exc: SpecError) -> None:
    err.print(f"[red]error:[/red] {exc.source} was not submitted", markup=True)
    for issue in exc.issues:
        where = f"line {issue.line}: " if issue.line else ""
        field = f"{issue.field}: " if issue.field else ""
        err.print(f"  {where}{issue.document}: {field}{issue.message}", markup=False)
    sys.exit(2)


def launch_overrides(args) -> dict:
    """``corral launch`` options as sbatch options (they override the script's, like sbatch's)."""
    from corral.spec.sbatch import parse_command_line

    words: list[str] = []
    for flag, value in (("--partition", args.partition), ("--account", args.account), ("--qos", args.qos),
                        ("--time", args.time_limit), ("--dependency", args.dependency), ("--job-name", args.name),
                        ("--array", getattr(args, "array", None)), ("--chdir", getattr(args, "workdir", None)),
                        ("--export", getattr(args, "export", None)),
                        ("--nice", str(args.nice) if args.nice is not None else None)):
        if value is not None:
            words.append(f"{flag}={value}")
    if args.hold:
        words.append("--hold")
    if args.kill_on_invalid_dep:
        words.append("--kill-on-invalid-dep=yes")
    given, _, issues, _ = parse_command_line(words)
    if issues:
        raise SpecError(issues, "corral launch")
    return given


def submit(path: Path, text: str, given: dict | list[dict], script_args: tuple[str, ...], warnings: list[str], *,
           env: dict[str, str], name: str | None, detach: bool | None,
           secrets: dict[str, str] | None = None) -> None:
    """Submit the script; ``detach`` None is sbatch's behaviour (return unless --wait)."""
    from corral.cli.jobs import follow
    from corral.spec.sbatch import load_batch

    batch = load_batch(text, source=str(path), submit_dir=os.getcwd(), args=script_args, overrides=given,
                       environ=os.environ, warnings=warnings)
    chdir = next((d["workdir"] for d in batch.documents if isinstance(d.get("workdir"), str)), None)
    if chdir is not None and not os.path.isdir(chdir):  # -D/--chdir: checked where the script is submitted
        raise Usage("--chdir", f"{chdir} {'is not a directory' if os.path.exists(chdir) else 'does not exist'}")
    client = daemon.client()
    try:
        result = client.submit(batch.documents, source=str(path), env=env, name=name, scheduling=batch.scheduling,
                               array=batch.array, export=batch.export, secrets=secrets)
    except CorralError as exc:
        fail(exc, str(path))
    for warning in batch.warnings + result["warnings"]:
        err.print(f"[yellow]warning:[/yellow] {warning}", markup=True)
    job = result["job"]
    ident = job["array_job_id"] or job["id"]
    if batch.parsable or detach:  # (``corral launch -d`` prints the id, whatever the file)
        print(ident)
    elif detach is None:
        print(f"Submitted batch job {ident}" + (f" (array of {result['array_size']})" if result.get("array_size")
                                                else ""))
    if detach or (detach is None and not batch.wait):
        return
    if result.get("array_size"):
        sys.exit(wait_array(client, ident))
    if detach is False and not batch.wait:
        follow(client, job)
        return
    final = client.wait(job["id"])
    sys.exit(0 if final["state"] == "SUCCEEDED" else (final["exit_code"] or 1))


def wait_array(client, array_id: int) -> int:
    """Wait for every element of an array; 0 if all SUCCEEDED, else 1. One line per element
    as it ends."""
    seen: set[int] = set()
    failed = False
    try:
        while True:
            members = list(client.iter_jobs(all=True, array=array_id))
            for job in members:
                if job["state"] in TERMINAL and job["id"] not in seen:
                    seen.add(job["id"])
                    failed = failed or job["state"] != "SUCCEEDED"
                    err.print(f"Job {array_id}_{job['array_index']} ({job['id']}) {job['state']}", markup=False)
            if members and len(seen) == len(members):
                return 1 if failed else 0
            time.sleep(0.5)
    except KeyboardInterrupt:
        err.print(f"\nDetached from array {array_id}; it keeps running.", markup=False)
        sys.exit(130)
