"""The ``corral`` command. It talks only to the API (starting an embedded local server on
first use) and prints Rich tables, or JSON with ``--json`` for scripts."""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import click

from corral.cli import daemon
from corral.cli.render import Column, err, out, table
from corral.client import Client, CorralError
from corral.settings import Settings

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT")


def _client() -> Client:
    return daemon.connect(Settings.from_env())


def _fail(exc: CorralError, source: str | None = None) -> None:
    err.print(f"[red]error:[/red] {exc.message}", markup=True)
    for issue in exc.errors:
        where = f"{source or ''}:{issue['line']}: " if issue.get("line") else ""
        field = f"{issue['field']}: " if issue.get("field") else ""
        err.print(f"  {where}{issue['document']}: {field}{issue['message']}", markup=False)
    sys.exit(2 if exc.status in (400, 404, 409, 422) or exc.errors else 1)


def _age(iso: str | None, until: str | None = None) -> str:
    """Time since ``iso``; an ended job's age stops at its end."""
    if not iso:
        return "-"
    end = datetime.fromisoformat(until) if until else datetime.now(timezone.utc)
    seconds = max(0, int((end - datetime.fromisoformat(iso)).total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def _print_json(data: object) -> None:
    click.echo(json.dumps(data, indent=2))


def _tasks_summary(job: dict) -> str:
    return " ".join(f"{t['name']}:{t['num_nodes']}" for t in job["tasks"])


class _Commands(click.Group):
    """The command group; ``sim`` (which pulls in the scheduler, the spec loader and the
    simulator) is imported only when it is the command being run or listed."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), "sim"])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name == "sim":
            from corral.cli.sim import sim

            return sim
        return super().get_command(ctx, name)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="corral")
def cli() -> None:
    """corral: gang-scheduled AI job groups on this machine and beyond."""


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("-d", "--detach", is_flag=True, help="Print the job id and return at once.")
@click.option("--name", help="Override the job name.")
@click.option("--env", "envs", multiple=True, metavar="K=V", help="Add or override an environment variable of every task.")
@click.option("-p", "--partition", help="Partition to run in (default: the site's first).")
@click.option("-A", "--account", help="Account to charge (default: the first that lists you, else your user name).")
@click.option("-q", "--qos", help="Quality of service.")
@click.option("-t", "--time-limit", "time_limit", help="Time limit of the whole job, e.g. 2h or 1d12h.")
@click.option("--nice", type=int, help="Lower the job's priority by this much.")
@click.option("--dependency", help="e.g. afterok:12:13,afterany:14 or singleton.")
@click.option("--kill-on-invalid-dep", "kill_on_invalid_dep", is_flag=True, default=None,
              help="Cancel the job if its dependency can never be satisfied.")
def launch(file: Path, detach: bool, name: str | None, envs: tuple[str, ...], partition: str | None,
           account: str | None, qos: str | None, time_limit: str | None, nice: int | None, dependency: str | None,
           kill_on_invalid_dep: bool | None) -> None:
    """Submit FILE (a task or job-group YAML) and stream its logs until it ends."""
    options = {"partition": partition, "account": account, "qos": qos, "time_limit": time_limit, "nice": nice,
               "dependency": dependency, "kill_on_invalid_dep": kill_on_invalid_dep}
    scheduling = {k: v for k, v in options.items() if v is not None}
    env = {}
    for item in envs:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not K=V", param_hint="--env")
        env[key] = value
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise click.BadParameter(f"cannot read {file}: {exc.strerror}", param_hint="FILE") from None
    except UnicodeDecodeError as exc:
        line = file.read_bytes()[:exc.start].count(b"\n") + 1
        raise click.BadParameter(f"{file} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} on line {line}); "
                                 "job files are read as UTF-8", param_hint="FILE") from None
    client = _client()
    try:
        result = client.submit(text, source=str(file), base_dir=str(file.resolve().parent), name=name, env=env,
                               scheduling=scheduling)
    except CorralError as exc:
        _fail(exc, str(file))
    for warning in result["warnings"]:
        err.print(f"[yellow]warning:[/yellow] {warning}")
    job = result["job"]
    if detach:
        click.echo(job["id"])
        return
    err.print(f"Job {job['id']} ({job['name']}) submitted: {_tasks_summary(job)}. "
              f"Ctrl-C detaches; the job keeps running.")
    try:
        for chunk in client.logs(job["id"], follow=True, prefix=True):
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
        final = client.job(job["id"])
    except KeyboardInterrupt:
        err.print(f"\nDetached from job {job['id']}; it keeps running. Follow it again with: "
                  f"corral logs {job['id']} -f")
        sys.exit(130)
    except CorralError as exc:
        _fail(exc)
    style = "green" if final["state"] == "SUCCEEDED" else "red"
    extra = f" (exit code {final['exit_code']})" if final["exit_code"] not in (None, 0) else ""
    err.print(f"Job {final['id']} ({final['name']}) [{style}]{final['state']}[/{style}]{extra}"
              + (f": {final['message']}" if final.get("message") and final["state"] != "SUCCEEDED" else ""))
    sys.exit(0 if final["state"] == "SUCCEEDED" else 1)


@cli.command()
@click.option("-a", "--all", "show_all", is_flag=True, help="Include ended jobs.")
@click.option("-u", "--user", help="Only this user's jobs.")
@click.option("--priority", "by_priority", is_flag=True,
              help="Pending jobs in scheduling order with their priority factors (like sprio).")
@click.option("--json", "as_json", is_flag=True)
def queue(show_all: bool, user: str | None, by_priority: bool, as_json: bool) -> None:
    """List jobs (pending and running; ended ones with --all)."""
    try:
        jobs = _client().priority() if by_priority else _client().jobs(all=show_all, user=user)
    except CorralError as exc:
        _fail(exc)
    if by_priority and user:
        jobs = [j for j in jobs if j["user"] == user]
    if as_json:
        _print_json(jobs)
        return
    if by_priority:
        table([Column("ID", key=True), Column("NAME", min_width=10), Column("USER", min_width=6),
               Column("ACCOUNT", optional=2, min_width=7), Column("PARTITION", optional=3), Column("QOS", optional=4),
               Column("PRIORITY", right=True), Column("AGE", right=True), Column("FAIRSHARE", right=True),
               Column("JOBSIZE", right=True), Column("PART", right=True, optional=5),
               Column("QOSF", right=True, optional=6), Column("EXPANSION", right=True, optional=7),
               Column("NICE", right=True, optional=1), Column("REASON", fold=True, min_width=10)],
              [[j["id"], j["name"], j["user"], j["account"], j["partition"], j["qos"], f"{j['priority']:.0f}",
                f"{j['age']:.0f}", f"{j['fair_share']:.0f}", f"{j['job_size']:.0f}", f"{j['partition_factor']:.0f}",
                f"{j['qos_factor']:.0f}", f"{j['expansion']:.0f}", j["nice"],
                j["reason"] + (" (starving)" if j.get("starving") else "")] for j in jobs])
        return
    table([Column("ID", key=True), Column("NAME", min_width=10), Column("USER", min_width=6),
           Column("PARTITION", optional=1), Column("STATE"), Column("REASON", fold=True, min_width=10),
           Column("TASKS", fold=True, min_width=8), Column("GPUS", right=True), Column("AGE", right=True)],
          [[job["id"], job["name"], job["user"], job.get("partition") or "-", job["state"],
            "-" if job["state"] in TERMINAL or job["reason"] == "None" else job["reason"], _tasks_summary(job),
            job["gpus"], _age(job["submitted_at"], job.get("ended_at"))] for job in jobs])


@cli.command()
@click.option("--json", "as_json", is_flag=True)
def share(as_json: bool) -> None:
    """Fair share of every account and user: shares, decayed usage, factor (like sshare)."""
    try:
        rows = _client().share()
    except CorralError as exc:
        _fail(exc)
    if as_json:
        _print_json(rows)
        return
    table([Column("ACCOUNT", key=True), Column("USER"), Column("RAWSHARES", right=True),
           Column("NORMSHARES", right=True, optional=2), Column("RAWUSAGE", right=True),
           Column("EFFECTVUSAGE", right=True, optional=1), Column("FAIRSHARE", right=True)],
          [[" " * r["depth"] + (r["account"] if not r["user"] else ""), r["user"] or "", f"{r['raw_shares']:g}",
            f"{r['norm_shares']:.6f}", f"{r['raw_usage']:.0f}", f"{r['effective_usage']:.6f}",
            f"{r['fair_share']:.6f}"] for r in rows])


@cli.command()
@click.argument("job")
@click.option("--json", "as_json", is_flag=True)
def status(job: str, as_json: bool) -> None:
    """Show one job, its tasks and every replica."""
    try:
        data = _client().job(job)
    except CorralError as exc:
        _fail(exc)
    if as_json:
        _print_json(data)
        return
    exit_code = "-" if data["exit_code"] is None else data["exit_code"]
    reason = "-" if data["state"] in TERMINAL or data["reason"] == "None" else data["reason"]
    out.print(f"[bold]Job {data['id']}[/bold] {data['name']}  user={data['user']}  state={data['state']}  "
              f"reason={reason}  exit_code={exit_code}")
    if data.get("message"):
        out.print(f"  {data['message']}", markup=False)
    table([Column("REPLICA", key=True), Column("ROLE", optional=2), Column("STATE"), Column("NODE", min_width=6),
           Column("PID", optional=3), Column("GPUS"), Column("EXIT", right=True), Column("RESTARTS", right=True),
           Column("HOSTNAME", fold=True, optional=1, min_width=12)],
          [[f"{task['name']}-{r['rank']}", "primary" if task["primary"] else "auxiliary", r["state"], r["node"],
            r["pid"], ",".join(map(str, r["gpus"])) or "-", r["exit_code"], r["restarts"], r["hostname"]]
           for task in data["tasks"] for r in task["replicas"]])


@cli.command()
@click.argument("job")
@click.argument("replica", required=False)
@click.option("-f", "--follow", is_flag=True, help="Keep streaming until the job ends.")
def logs(job: str, replica: str | None, follow: bool) -> None:
    """Print the logs of a job (every replica, prefixed) or of one REPLICA (e.g. trainer-0)."""
    try:
        for chunk in _client().logs(job, replica=replica, follow=follow):
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()
    except CorralError as exc:
        _fail(exc)
    except KeyboardInterrupt:
        sys.exit(130)


@cli.command()
@click.argument("jobs", nargs=-1, required=True)
def cancel(jobs: tuple[str, ...]) -> None:
    """Cancel jobs: every replica gets SIGTERM, then SIGKILL after its grace period."""
    client = _client()
    failed = False
    for ident in jobs:
        try:
            result = client.cancel(ident)
        except CorralError as exc:
            err.print(f"[red]error:[/red] {exc.message}")
            failed = True
            continue
        verb = "cancelling" if result["cancelled"] else f"not cancelled (already {result['state']} or cancelling)"
        out.print(f"Job {result['id']}: {verb}")
    sys.exit(1 if failed else 0)


@cli.command()
@click.argument("job")
@click.argument("task")
@click.argument("replicas", type=click.IntRange(0, 4096))
def scale(job: str, task: str, replicas: int) -> None:
    """Set how many replicas TASK of JOB runs (within its num_nodes: {min, max})."""
    try:
        data = _client().scale(job, task, replicas)
    except CorralError as exc:
        _fail(exc)
    out.print(f"Job {data['id']}: scaling {task} to {replicas} replica(s); watch with: corral status {data['id']}")


@cli.command()
@click.option("--json", "as_json", is_flag=True)
def nodes(as_json: bool) -> None:
    """List the node pool and what is free on each node."""
    try:
        data = _client().nodes()
    except CorralError as exc:
        _fail(exc)
    if as_json:
        _print_json(data)
        return
    table([Column("NODE", key=True), Column("STATE"), Column("GPUS", right=True), Column("TYPE"),
           Column("FREE GPUS", fold=True, min_width=9), Column("CPUS", right=True, optional=3),
           Column("FREE CPUS", right=True), Column("MEMORY", right=True, optional=2), Column("FREE MEM", right=True),
           Column("INFRA", optional=4), Column("LABELS", fold=True, optional=1, min_width=10)],
          [[n["name"], n.get("state", "UP"), n["gpus"], n["gpu_type"] or "-",
            ",".join(map(str, n["free_gpus"])) or "-", f"{n['cpus']:g}", f"{n['free_cpus']:g}", f"{n['memory']:g}G",
            f"{n['free_memory']:g}G", n.get("infra", "local"),
            ",".join(f"{k}={v}" for k, v in n["labels"].items()) or "-"] for n in data])


@cli.command()
@click.argument("job")
@click.option("--json", "as_json", is_flag=True)
def events(job: str, as_json: bool) -> None:
    """Tell a job's story: every state transition with its time and cause."""
    try:
        data = _client().events(job)
    except CorralError as exc:
        _fail(exc)
    if as_json:
        _print_json(data)
        return
    today = datetime.now().astimezone().date()

    def when(ts: str) -> str:
        local = datetime.fromisoformat(ts).astimezone()
        return local.strftime("%H:%M:%S.%f" if local.date() == today else "%Y-%m-%d %H:%M:%S.%f")[:-3]

    table([Column("TIME", key=True), Column("SUBJECT", min_width=8), Column("TRANSITION", optional=1),
           Column("CAUSE", min_width=8), Column("MESSAGE", fold=True, min_width=16)],
          [[when(e["ts"]), e["subject"], f"{e['from_state'] or ''}→{e['to_state']}" if e["to_state"] else "",
            e["cause"], e["message"] or ""] for e in data])


@cli.group()
def server() -> None:
    """Manage the embedded local server."""


@server.command("start")
def server_start() -> None:
    """Start the local server in the background (idempotent)."""
    settings = Settings.from_env()
    try:
        info = daemon.start(settings)
    except CorralError as exc:
        _fail(exc)
    out.print(f"corral server {info['pid']} on {info['url']} (home {settings.home})")


@server.command("stop")
def server_stop() -> None:
    """Stop the local server; running replicas keep running and are adopted at the next start."""
    stopped = daemon.stop(Settings.from_env())
    out.print("corral server stopped" if stopped else "no corral server was running")


@server.command("status")
@click.option("--json", "as_json", is_flag=True)
def server_status(as_json: bool) -> None:
    """Say whether the local server runs, where, and on which database."""
    settings = Settings.from_env()
    info = daemon.running(settings)
    if as_json:
        _print_json({"running": bool(info), **(info or {}), "home": str(settings.home)})
    elif info:
        out.print(f"corral server {info['pid']} on {info['url']} (home {settings.home}, db {info['db']})")
    else:
        out.print(f"no corral server is running for {settings.home}")
    sys.exit(0 if info else 1)


def main() -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    cli()


if __name__ == "__main__":
    main()
