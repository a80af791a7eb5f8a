"""The commands that read: queue (with ``--priority`` like sprio and ``--start`` like squeue
--start), acct (like sacct), share (like sshare), status, nodes and events. Each prints a
table sized to the terminal (tab-separated when piped) or JSON with ``--json``. And
dashboard, which prints the web dashboard's address."""

from __future__ import annotations

import re
import sys
from argparse import Namespace
from datetime import datetime, timedelta, timezone

from corral import embedded as daemon
from corral.cli.render import Column, Usage, err, fail, moment, out, print_json, states, table
from corral.client import TERMINAL, CorralError

def _age(iso: str | None, until: str | None = None) -> str:
    """Time since ``iso`` (until ``until`` when given)."""
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


def _read(call):
    try:
        return call(daemon.client())
    except CorralError as exc:
        fail(exc)


SHOWN_PENDING = 100  # the default view lists every running job and the first pending ones (in id order)
RUNNING = ["STARTING", "RUNNING", "PREEMPTED"]


def _queue_view(client, user: str | None) -> tuple[list[dict], str | None]:  # noqa: ANN001 - a Client
    """What ``corral queue`` shows by default: every running job and the first pending ones,
    with a line saying how many more wait (like squeue, it answers at once however long the
    queue; the totals come from the server's counts, not from listing every job)."""
    totals = client.queue(user=user)
    running = list(client.iter_jobs(user=user, states=RUNNING))
    pending = client.jobs(user=user, states=["PENDING"], limit=SHOWN_PENDING) if totals["pending"] else []
    if totals["pending"] > len(pending):  # an array the page cut short is one whole folded row, as squeue shows it
        shown = {j["id"] for j in pending}
        for array in dict.fromkeys(j["array_job_id"] for j in pending if j.get("array_job_id") is not None):
            pending += [j for j in client.iter_jobs(user=user, states=["PENDING"], array=array) if j["id"] not in shown]
    jobs = sorted(running + pending, key=lambda j: j["id"])
    hidden = totals["pending"] - len(pending)
    if hidden <= 0:
        return jobs, None
    live = totals["pending"] + totals["starting"] + totals["running"] + totals["preempted"]
    return jobs, (f"{live:,} live jobs: {len(running):,} running, {totals['pending']:,} pending "
                  f"({totals['held']:,} held); the first {len(pending):,} pending shown, {hidden:,} more not "
                  "(corral queue --all lists every one; --json too, for scripts)")


def queue(args: Namespace) -> None:
    note = None
    if args.priority:
        jobs = [j for j in _read(lambda c: c.priority()) if not args.user or j["user"] == args.user]
    elif args.start:
        jobs = _read(lambda c: c.jobs(user=args.user, states=["PENDING"]))
    elif args.all:  # every live job, and the newest 1000 of the history
        def everything(c) -> list[dict]:  # noqa: ANN001 - a Client
            seen = {j["id"]: j for j in c.iter_jobs(user=args.user)}
            seen.update((j["id"], j) for j in c.jobs(all=True, user=args.user))
            return [seen[i] for i in sorted(seen)]

        jobs = _read(everything)
    elif args.json:  # scripts get every live job, a page at a time
        jobs = _read(lambda c: list(c.iter_jobs(user=args.user)))
    else:
        jobs, note = _read(lambda c: _queue_view(c, args.user))
    if args.json:
        print_json(jobs)
    elif args.start:  # RUN_TIME: the run time learned from the user's history (time limit: none shown)
        table([Column("ID", key=True), Column("NAME", min_width=10), Column("USER", min_width=6),
               Column("PARTITION", optional=1), Column("STATE"), Column("START_TIME"), Column("RUN_TIME", right=True),
               Column("REASON", fold=True, min_width=10)],
              [[j["id"], j["name"], j["user"], j["partition"], j["state"], moment(j.get("expected_start")),
                _elapsed(j.get("predicted_run_s")), j["reason"] or "-"] for j in jobs])
    elif args.priority:
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
    else:
        table([Column("ID", key=True), Column("NAME", min_width=10), Column("USER", min_width=6),
               Column("PARTITION", optional=1), Column("STATE"), Column("REASON", fold=True, min_width=10),
               Column("TASKS", fold=True, min_width=8), Column("GPUS", right=True), Column("AGE", right=True)],
              [[ident, j["name"], j["user"], j.get("partition") or "-", j["state"],
                "-" if j["state"] in TERMINAL or j["reason"] in (None, "None") else j["reason"],
                " ".join(f"{t['name']}:{t['num_nodes']}" for t in j["tasks"]), j["gpus"],
                _age(j["submitted_at"])] for ident, j in fold_arrays(jobs)])  # since submission, ended or not
        if note:  # on stderr: a pipe still reads only rows under the header
            err.print(note, markup=False)


def job_ident(job: dict) -> str:
    """``ID``, or ``ARRAYID_INDEX`` for an element of a job array."""
    if job.get("array_job_id") is not None and job.get("array_index") is not None:
        return f"{job['array_job_id']}_{job['array_index']}"
    return str(job["id"])


def fold_arrays(jobs: list[dict]) -> list[tuple[str, dict]]:
    """(shown id, job) rows; an array's pending elements that wait for the same reason are one
    row ``ARRAYID_[3-15%4]``, as squeue folds them."""
    rows: list[tuple[str, dict]] = []
    folded: dict[tuple, list[dict]] = {}
    for job in jobs:
        if job.get("array_job_id") is not None and job["state"] == "PENDING":
            key = (job["array_job_id"], job["reason"], job.get("hold") or "")
            if key not in folded:
                folded[key] = []
                rows.append((key, job))  # the folded row stands where its first element was; named below
            folded[key].append(job)
        else:
            rows.append((job_ident(job), job))
    out = []
    for ident, job in rows:
        if isinstance(ident, tuple):
            members = folded[ident]
            if len(members) == 1:
                ident = job_ident(job)
            else:
                # jobarray alone is light (the spec package loads its validators on first use)
                from corral.spec.jobarray import fold

                indices = [m["array_index"] for m in members]
                ident = f"{job['array_job_id']}_[{fold(indices, job.get('array_throttle'))}]"
        out.append((ident, job))
    return out


_AGO = re.compile(r"now(?:-(\d+)(s|sec|seconds?|m|min|minutes?|h|hours?|d|days?|w|weeks?))?", re.IGNORECASE)
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _when(text: str, option: str) -> datetime:
    """``now``, ``now-3d``/``now-3days``, or an ISO date or time (local unless it has a zone)."""
    match = _AGO.fullmatch(text.strip())
    if match:
        ago = int(match.group(1)) * _UNIT[match.group(2)[0].lower()] if match.group(1) else 0
        return datetime.now(timezone.utc) - timedelta(seconds=ago)
    try:
        parsed = datetime.fromisoformat(text.strip())
    except ValueError:
        raise Usage(option, f"{text!r} is not a time: use e.g. 2026-11-24, 2026-11-24T13:00, now or now-2d") from None
    return parsed if parsed.tzinfo else parsed.astimezone()  # a naive time is the local one


def _elapsed(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock}" if days else clock


ACCT_FIELDS = ("id", "name", "user", "account", "partition", "state", "exit_code", "submit", "start", "end",
               "elapsed_s", "predicted_run_s", "time_limit", "gpus", "gpu_hours", "requeues", "array_job_id",
               "array_index")
JUDGED = ("SUCCEEDED", "TIMEOUT")  # the runs predictions are learned from, and judged against


def _accounting(job: dict, now: datetime) -> dict:
    """One sacct-like row: times, elapsed (start to end, or to now while running), GPU-hours."""
    start = datetime.fromisoformat(job["started_at"]) if job["started_at"] else None
    end = datetime.fromisoformat(job["ended_at"]) if job["ended_at"] else None
    elapsed = ((end or now) - start).total_seconds() if start else None
    if start and end is None and job["state"] in TERMINAL:
        elapsed = None
    return {"id": job["id"], "name": job["name"], "user": job["user"], "account": job["account"],
            "partition": job["partition"], "state": job["state"], "exit_code": job["exit_code"],
            "submit": job["submitted_at"], "start": job["started_at"], "end": job["ended_at"],
            "elapsed_s": None if elapsed is None else round(max(0.0, elapsed), 3),
            "predicted_run_s": job.get("predicted_run_s"), "time_limit": job.get("time_limit"),
            "gpus": job["gpus"], "gpu_hours": round(job["gpus"] * max(0.0, elapsed or 0.0) / 3600, 4),
            "requeues": job["requeues"], "array_job_id": job.get("array_job_id"), "array_index": job.get("array_index")}


def acct(args: Namespace) -> None:
    start = _when(args.starttime, "--starttime") if args.starttime else \
        datetime.now().astimezone().replace(hour=0, minute=0, second=0, microsecond=0)
    end = _when(args.endtime, "--endtime")
    if end < start:
        raise Usage("--endtime", f"ends ({end.isoformat(timespec='seconds')}) before --starttime "
                                 f"({start.isoformat(timespec='seconds')})")
    jobs = _read(lambda c: c.jobs(all=True, user=args.user, account=args.account, partition=args.partition,
                                  limit=10000, states=states(args.state, "--state") or None,
                                  since=start.isoformat(), until=end.isoformat()))
    now = datetime.now(timezone.utc)
    rows = [_accounting(j, now) for j in jobs]
    fmt = "json" if args.json else args.format
    summary = prediction_summary(rows)
    # a person reads the summary under the table; a pipe, CSV or JSON gets only rows on stdout
    said = out if fmt == "table" and sys.stdout.isatty() else err
    if fmt == "json":
        print_json(rows)
    elif fmt == "csv":
        import csv

        writer = csv.DictWriter(sys.stdout, fieldnames=ACCT_FIELDS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    else:
        _acct_table(rows)
    if summary:
        said.print(summary, markup=False)


def prediction_summary(rows: list[dict]) -> str | None:
    """One line saying how good the run times predicted at start were, over the runs that
    SUCCEEDED or met their time limit (what predictions learn from), beside how good the time
    limits would have been; None when no such run had a prediction."""
    judged = [(r["predicted_run_s"], r["elapsed_s"], r["time_limit"]) for r in rows
              if r["state"] in JUDGED and r["predicted_run_s"] and r["elapsed_s"]]
    if not judged:
        return None
    from corral.scheduler.durations import accuracy

    score = accuracy(judged)
    line = (f"predicted run times: {score.jobs} job(s) judged, {score.within_2x:.0%} within 2x of the real run time, "
            f"median predicted/real {score.median_ratio:.2f}")
    if score.limit_median_ratio:
        line += (f" (time limits: {score.limit_within_2x:.0%} within 2x, "
                 f"median limit/real {score.limit_median_ratio:.2f})")
    return line


def _acct_table(rows: list[dict]) -> None:
    def stamp(iso: str | None) -> str:
        return datetime.fromisoformat(iso).astimezone().strftime("%Y-%m-%dT%H:%M:%S") if iso else "-"

    table([Column("ID", key=True), Column("NAME", min_width=8), Column("USER", min_width=6),
           Column("ACCOUNT", optional=3), Column("PARTITION", optional=4), Column("STATE"),
           Column("EXIT", right=True), Column("SUBMIT", optional=2), Column("START", optional=5),
           Column("END", optional=1), Column("ELAPSED", right=True), Column("PREDICTED", right=True, optional=7),
           Column("GPUS", right=True, optional=6), Column("GPU-HOURS", right=True)],
          [[job_ident(r), r["name"], r["user"], r["account"], r["partition"], r["state"], r["exit_code"], stamp(r["submit"]),
            stamp(r["start"]), stamp(r["end"]), _elapsed(r["elapsed_s"]), _elapsed(r["predicted_run_s"]), r["gpus"],
            f"{r['gpu_hours']:.2f}"] for r in rows])


def share(args: Namespace) -> None:
    rows = _read(lambda c: c.share())
    if args.json:
        print_json(rows)
        return
    table([Column("ACCOUNT", key=True), Column("USER"), Column("RAWSHARES", right=True),
           Column("NORMSHARES", right=True, optional=2), Column("RAWUSAGE", right=True),
           Column("EFFECTVUSAGE", right=True, optional=1), Column("FAIRSHARE", right=True)],
          [[" " * r["depth"] + (r["account"] if not r["user"] else ""), r["user"] or "", f"{r['raw_shares']:g}",
            f"{r['norm_shares']:.6f}", f"{r['raw_usage']:.0f}", f"{r['effective_usage']:.6f}",
            f"{r['fair_share']:.6f}"] for r in rows])


def _readiness(replica: dict) -> str:
    """READY as kubectl shows it: whether a running replica passes its readiness probe (one
    without a probe is ready once it runs); "-" for a replica that does not run."""
    if replica["state"] != "RUNNING":
        return "-"
    return "yes" if replica["ready"] else "no"


def status(args: Namespace) -> None:
    data = _read(lambda c: c.job(args.job))
    if args.json:
        print_json(data)
        return
    exit_code = "-" if data["exit_code"] is None else data["exit_code"]
    reason = "-" if data["state"] in TERMINAL or data["reason"] in (None, "None") else data["reason"]
    shown = job_ident(data) + (f" ({data['id']})" if data.get("array_job_id") is not None else "")
    out.print(f"[bold]Job {shown}[/bold] {data['name']}  user={data['user']}  state={data['state']}  "
              f"reason={reason}  exit_code={exit_code}")
    if data.get("domain") and data["domain"] != data["name"]:  # a namesake held the name's domain
        out.print(f"  replicas are named TASK-RANK.{data['domain']} (another active job of {data['user']} was "
                  f"named {data['name']} when it was submitted)", markup=False)
    if data.get("run_as") and data["run_as"] != data["user"]:  # config.yaml identity maps the user
        out.print(f"  runs as Unix account {data['run_as']}", markup=False)
    if data.get("message"):
        out.print(f"  {data['message']}", markup=False)
    if data.get("export") is not None:
        carried = f" ({data['exported']} variables carried)" if data["export"] != "NONE" else ""
        out.print(f"  submitted from {data.get('cwd') or '-'}; environment: --export={data['export']}{carried}",
                  markup=False)
    dirs = {t.get("workdir") for t in data["tasks"]}
    for task in data["tasks"]:
        if task.get("workdir") != data.get("cwd") or len(dirs) > 1:
            out.print(f"  task {task['name']}: runs in {task.get('workdir') or 'its user’s home'}", markup=False)
        if task.get("endpoint"):
            gang = task.get("gang_size") or 1  # a gang is one service replica, ready when its head is
            ready = sum(r["ready"] and r["state"] == "RUNNING" and r["rank"] % gang == 0 and r["rank"] < task["num_nodes"]
                        for r in task["replicas"])
            # of the replicas it has now (those a scale-down retired are still listed below)
            out.print(f"  task {task['name']}: endpoint {task['endpoint']} ({ready} of {task['num_nodes'] // gang} "
                      f"{'service ' if gang > 1 else ''}replicas ready)", markup=False)
        if task.get("scale"):
            out.print(f"  task {task['name']}: {task['scale']}", markup=False)
        if task.get("restart"):
            out.print(f"  task {task['name']}: restarts {task['restart']}", markup=False)
        if task.get("alternatives", 1) > 1:
            what = f"{task['gpu_type']}:{task['gpus']}" if task["gpu_type"] else f"{task['gpus']} GPU(s)"
            which = (f"runs on {what}, alternative {task['alternative']} of {task['alternatives']}"
                     if task.get("alternative") else f"{task['alternatives']} resource alternatives, none chosen yet")
            out.print(f"  task {task['name']}: {which}", markup=False)
    table([Column("REPLICA", key=True), Column("ROLE", optional=2), Column("STATE"), Column("READY"),
           Column("NODE", min_width=6),
           Column("PID", optional=3), Column("GPU IDS"), Column("EXIT", right=True), Column("RESTARTS", right=True),
           Column("HOSTNAME", fold=True, optional=1, min_width=12)],
          [[f"{task['name']}-{r['rank']}", "primary" if task["primary"] else "auxiliary",
            "PULLING" if (r.get("reason") or "").startswith("pulling") else r["state"],
            _readiness(r), r["node"],
            r["pid"], ",".join(map(str, r["gpus"])) or "-", r["exit_code"], r["restarts"], r["hostname"]]
           for task in data["tasks"] for r in task["replicas"]])
    for task in data["tasks"]:
        for r in task["replicas"]:
            if r.get("reason"):
                out.print(f"  {task['name']}-{r['rank']}: {r['reason']}", markup=False)


def nodes(args: Namespace) -> None:
    data, partitions = _read(lambda c: (c.nodes(), c.partitions()))
    down = [p for p in partitions if p.get("state") == "DOWN"]
    if args.json:
        print_json(data)
        return
    table([Column("NODE", key=True), Column("STATE"), Column("GPUS", right=True), Column("TYPE"),
           Column("FREE GPUS", fold=True, min_width=9), Column("CPUS", right=True, optional=3),
           Column("FREE CPUS", right=True), Column("MEMORY", right=True, optional=2), Column("FREE MEM", right=True),
           Column("INFRA", optional=4), Column("LABELS", fold=True, optional=1, min_width=10)],
          [[n["name"], n.get("state", "UP"), n["gpus"], n["gpu_type"] or "-",
            ",".join(map(str, n["free_gpus"])) or "-", f"{n['cpus']:g}", f"{n['free_cpus']:g}", f"{n['memory']:g}G",
            f"{n['free_memory']:g}G", n.get("infra", "local"),
            ",".join(f"{k}={v}" for k, v in n["labels"].items()) or "-"] for n in data])
    for p in down:  # on stderr, as the queue's note: a pipe still reads only rows under the header
        err.print(f"partition {p['name']} ({p.get('infra') or 'any infra'}) is DOWN: {p['reason']}; its jobs wait "
                  "and it comes back when the engine answers", markup=False)


def events(args: Namespace) -> None:
    data = _read(lambda c: c.events(args.job))
    if args.json:
        print_json(data)
        return
    today = datetime.now().astimezone().date()

    def when(ts: str) -> str:
        local = datetime.fromisoformat(ts).astimezone()
        return local.strftime("%H:%M:%S.%f" if local.date() == today else "%Y-%m-%d %H:%M:%S.%f")[:-3]

    table([Column("TIME", key=True), Column("SUBJECT", min_width=8), Column("TRANSITION", optional=1),
           Column("CAUSE", min_width=8), Column("MESSAGE", fold=True, min_width=16)],
          [[when(e["ts"]), e["subject"], f"{e['from_state'] or ''}→{e['to_state']}" if e["to_state"] else "",
            e["cause"], e["message"] or ""] for e in data])

