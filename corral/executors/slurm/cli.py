"""Slurm's own commands, as the srun executor uses them: what an allocation holds per node
(``squeue --json``), the steps running in it by name, a step's exit from accounting, node
addresses, and submitting/cancelling/signalling jobs and steps.

corral talks to Slurm only through its client commands (never its daemons' files or
sockets), so it works wherever a user's shell does: the commands find the controller
through ``SLURM_CONF`` or the node's own configuration. Hostlists are expanded and
compressed with ``python-hostlist``."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

import hostlist
import psutil

TIMEOUT_S = 20.0


class SlurmError(RuntimeError):
    """A Slurm command failed; the message is Slurm's own."""


class SlurmRefused(SlurmError):
    """Slurm answered and refused the job (bad partition, account, shape): trying again
    cannot help, unlike a controller that does not answer."""


@dataclass(frozen=True)
class NodeShare:
    """What one allocation holds on one node."""

    host: str
    cpus: int
    memory_mb: int
    gpus: int
    gpu_type: str | None
    gpu_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class JobInfo:
    slurm_id: str
    name: str
    state: str  # PENDING, RUNNING, COMPLETING, CANCELLED, TIMEOUT, ... (squeue's job_state)
    reason: str  # squeue's state_reason: Priority, Resources, None, ...
    nodes: tuple[NodeShare, ...] = ()


_GRES = re.compile(r"gpu(?::(?P<type>[^:(]+))?:(?P<count>\d+)(?:\((?P<idx>[^)]*)\))?")


TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED",
                      "BOOT_FAIL", "DEADLINE"})


def parse_gres(detail: str) -> tuple[int, str | None, tuple[int, ...]]:
    """``gpu:h100:8(IDX:0-7)`` -> (8, "h100", (0..7)); several gres joined by ',' allowed."""
    total, kind, ids = 0, None, []
    for part in re.split(r",(?=gpu)", detail or ""):
        m = _GRES.search(part)
        if not m:
            continue
        total += int(m.group("count"))
        kind = kind or m.group("type")
        idx = (m.group("idx") or "").removeprefix("IDX:")
        for piece in filter(None, idx.split(",")):
            if piece.upper() == "N/A":
                continue
            lo, _, hi = piece.partition("-")
            if lo.isdigit():
                ids.extend(range(int(lo), int(hi or lo) + 1))
    return total, kind, tuple(ids)


def expand(nodelist: str) -> list[str]:
    return hostlist.expand_hostlist(nodelist) if nodelist else []


def compress(hosts: list[str]) -> str:
    return hostlist.collect_hostlist(hosts)


def available(timeout: float | None = None) -> str | None:
    """None when Slurm's commands are on PATH and answer (within ``timeout``); else why not."""
    missing = [c for c in ("srun", "squeue", "scancel", "sbatch", "scontrol", "sacct") if shutil.which(c) is None]
    if missing:
        return f"Slurm's commands are not on PATH ({', '.join(missing)})"
    # (``squeue -j 0`` is refused before any controller is asked: ``scontrol ping`` asks it)
    try:
        done = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=timeout or TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"scontrol ping failed: {exc}"
    if done.returncode != 0 or " is UP" not in done.stdout:
        return f"the Slurm controller does not answer: {(done.stdout + done.stderr).strip()[:200]}"
    return None


class SlurmCli:
    """Runs Slurm's client commands with the environment they need (``SLURM_CONF``), never
    the caller's SLURM_* job variables, which would change what the commands do."""

    def __init__(self, environ: dict[str, str] | None = None):
        source = dict(os.environ if environ is None else environ)
        self.env = {k: v for k, v in source.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
        # what an srun started with a replica's own environment needs to find the controller
        self.conf = {k: v for k, v in self.env.items() if k == "SLURM_CONF"}

    def run(self, *argv: str, timeout: float = TIMEOUT_S, check: bool = True) -> str:
        try:
            done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=self.env,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise SlurmError(f"{argv[0]} did not answer within {timeout:g}s") from exc
        except OSError as exc:
            raise SlurmError(f"{argv[0]}: {exc}") from exc
        if check and done.returncode != 0:
            message = (done.stderr or done.stdout).strip().splitlines()
            raise SlurmError(f"{argv[0]} failed: {message[-1] if message else f'exit code {done.returncode}'}")
        return done.stdout

    # -- jobs ------------------------------------------------------------------------------
    def jobs(self, ids: list[str]) -> dict[str, JobInfo]:
        """The jobs Slurm still knows, by id (a job it forgot, long ended, is absent)."""
        if not ids:
            return {}
        # a failed query raises: an allocation Slurm did not answer about is unknown, never gone
        out = self.run("squeue", "--json")  # (22.05 ignores -j with --json: every job comes back)
        try:
            data = json.loads(out)
        except json.JSONDecodeError as exc:
            raise SlurmError(f"squeue --json gave no JSON: {out[:200]!r}") from exc
        if data.get("errors"):
            raise SlurmError(f"squeue: {data['errors'][0]}")
        return {info.slurm_id: info for info in (_job(j) for j in data.get("jobs", []))}

    def submit(self, argv: list[str], script: str) -> str:
        """``sbatch --parsable`` with the script on stdin; the new job's id."""
        try:
            done = subprocess.run(["sbatch", "--parsable", *argv], input=script, capture_output=True, text=True,
                                  timeout=TIMEOUT_S, env=self.env)
        except (OSError, subprocess.SubprocessError) as exc:
            raise SlurmError(f"sbatch: {exc}") from exc
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines()
            message = lines[-1].removeprefix("sbatch: error: ") if lines else f"sbatch exit {done.returncode}"
            text = " ".join(lines).lower()
            unreachable = any(w in text for w in ("unable to contact", "connect failure", "timed out", "timeout",
                                                    "communication", "configuration source"))
            refused = not unreachable and ("submission failed" in text or "invalid" in text)
            raise (SlurmRefused if refused else SlurmError)(message)
        return done.stdout.strip().split(";")[0]

    def cancel(self, target: str, signal: str | None = None, batch: bool = False) -> bool:
        argv = ["scancel", "--quiet"]
        if signal:
            argv.append(f"--signal={signal}")
        if batch:
            argv.append("--batch")
        try:
            self.run(*argv, target)
            return True
        except SlurmError:
            return False

    # -- steps -----------------------------------------------------------------------------
    def steps(self, slurm_ids: list[str]) -> dict[str, str]:
        """Running steps of these jobs: step name -> step id (``123.4``). Raises when squeue
        does not answer: a step Slurm did not answer about is unknown, never gone."""
        if not slurm_ids:
            return {}
        out = self._query("squeue", "--steps", "-h", "-o", "%i %j", "-j", ",".join(slurm_ids))
        steps = {}
        for line in out.splitlines():
            parts = line.split(None, 1)
            if len(parts) == 2:
                steps[parts[1].strip()] = parts[0]
        return steps

    def _query(self, *argv: str) -> str:
        """A squeue of given jobs: "" when Slurm no longer knows them (Invalid job id)."""
        try:
            done = subprocess.run(list(argv), capture_output=True, text=True, timeout=TIMEOUT_S, env=self.env,
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as exc:
            raise SlurmError(f"{argv[0]}: {exc}") from exc
        if done.returncode != 0:
            if "Invalid job id" in done.stderr:
                return ""
            raise SlurmError(f"{argv[0]} failed: {done.stderr.strip()[-200:]}")
        return done.stdout

    def by_name(self, name: str) -> list[str]:
        """Ids of the user's jobs with this name that Slurm still runs or holds."""
        out = self.run("squeue", "-h", "-o", "%i %T", "-n", name)
        return [line.split()[0] for line in out.splitlines() if line.split()]

    def step_exit(self, slurm_id: str, name: str) -> tuple[str, int | None] | None:
        """(state, exit code) of the last step of this name in accounting; None if unknown
        (no accounting, or not recorded yet). A step killed by a signal gives 128+signal."""
        try:
            out = self.run("sacct", "-n", "-P", "-j", slurm_id, "-o", "JobID,JobName,State,ExitCode", timeout=10)
        except SlurmError:
            return None
        found = None
        for line in out.splitlines():
            parts = line.split("|")
            if len(parts) == 4 and parts[1] == name:
                found = parts
        if found is None:
            return None
        state = found[2].split()[0]
        if state not in TERMINAL:
            return None  # not final yet (sacct says RUNNING 0:0 until the step is finalised)
        code, _, sig = found[3].partition(":")
        if sig.isdigit() and int(sig):
            return state, 128 + int(sig)
        return state, int(code) if code.isdigit() else None

    # -- nodes -----------------------------------------------------------------------------
    def node_kind(self, partition: str | None, timeout: float = TIMEOUT_S):
        """The partition's node shape: the least GPUs, CPUs and memory of its nodes (so any of
        them holds what fits it). Refused when Slurm has no such partition."""
        from corral.executors.slurm.shape import NodeKind

        from corral.runtime.discovery import port_domain

        # one row per node (-N): its address too, since the port spaces of the partition's
        # nodes bound how many replicas may hold one declared port
        argv = ["sinfo", "-N", "-h", "-o", "%c|%m|%G|%o"] + (["-p", partition] if partition else [])
        rows = [line.split("|") for line in self.run(*argv, timeout=timeout).splitlines() if line.count("|") == 3]
        if not rows:
            raise SlurmRefused(f"Slurm has no nodes in partition {partition or '(its default)'}")
        shapes = [(int(c.rstrip("+")), int(m.rstrip("+")) if m.rstrip("+").isdigit() else 0, parse_gres(g))
                  for c, m, g, _ in rows]
        return NodeKind(min(s[2][0] for s in shapes), min(s[0] for s in shapes), min(s[1] for s in shapes),
                        shapes[0][2][1], tuple(sorted({s[2][1] for s in shapes if s[2][1]})),
                        len({port_domain(a.strip()) for *_, a in rows if a.strip()}))

    def node_facts(self, hosts: list[str]) -> dict[str, tuple[str, tuple[str, ...]]]:
        """Each node's address (NodeAddr, which its replicas listen on) and active features
        (the labels ``--constraint`` matches), from one ``scontrol show node``."""
        if not hosts:
            return {}
        out = self.run("scontrol", "-o", "show", "node", compress(hosts), check=False)
        facts = {}
        for line in out.splitlines():
            fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
            if "NodeName" in fields:
                active = fields.get("ActiveFeatures", "(null)")
                facts[fields["NodeName"]] = (fields.get("NodeAddr") or fields["NodeName"],
                                             () if active in ("(null)", "") else tuple(active.split(",")))
        return facts


def _job(j: dict) -> JobInfo:
    hosts = expand(j.get("nodes") or "")
    shares = []
    gres = j.get("gres_detail") or []
    allocated = {n.get("nodename"): n for n in (j.get("job_resources") or {}).get("allocated_nodes", [])}
    for i, host in enumerate(hosts):
        node = allocated.get(host, {})
        cpus = sum(len(s.get("cores", {})) for s in (node.get("sockets") or {}).values())
        gpus, kind, ids = parse_gres(gres[i] if i < len(gres) else "")
        shares.append(NodeShare(host, cpus or 1, int(node.get("memory_allocated") or 0), gpus, kind, ids))
    return JobInfo(str(j.get("job_id")), j.get("name", ""), str(j.get("job_state", "")), str(j.get("state_reason", "")),
                   tuple(shares))


def srun_clients() -> dict[str, tuple[int, float]]:
    """srun commands of this server's account alive on this machine, by the ``--job-name`` they
    were given; also those still staging a job's file_mounts before they become that srun
    (``node.staging.stage``: ``… stage … -- srun …``)."""
    found, me = {}, os.getuid()
    for proc in psutil.process_iter(["cmdline", "create_time", "name", "uids"]):
        try:
            argv = proc.info["cmdline"] or []
            # only the server's own: anyone may start a process whose arguments look like one
            if not argv or proc.info["uids"] is None or proc.info["uids"].real != me:
                continue
            at = 0 if os.path.basename(argv[0]) == "srun" else next(
                (i + 1 for i in range(1, len(argv) - 1)
                 if argv[i] == "--" and os.path.basename(argv[i + 1]) == "srun" and "stage" in argv[:i]), None)
            if at is None:
                continue
            for arg in argv[at + 1:]:
                if arg.startswith("--job-name="):
                    found[arg.split("=", 1)[1]] = (proc.pid, proc.info["create_time"])
                    break
        except (psutil.Error, OSError):
            continue
    return found


def process_alive(pid: int, started: float | None) -> bool:
    """``pid`` runs (not a zombie), and is the process that started at ``started`` (not a
    later one given the same pid)."""
    try:
        proc = psutil.Process(pid)
        if started is not None and abs(proc.create_time() - float(started)) > 0.05:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
