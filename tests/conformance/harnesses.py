"""What the conformance suite needs to know of each infra to run against the real thing: how
to tell it is not available here (the suite then skips, saying why), how to bring up and
take down what it needs for the session (the Ray lab), the ``config.yaml`` of a corral home
that runs its jobs there, and how to make a replica's node or allocation die from outside.

A harness is any object with the attributes of ``Harness``. corral's own infras have theirs
below; another package's infra names its harness in ``CORRAL_CONFORMANCE_HARNESS``
(``module:attribute``, comma-separated for several): the attribute is a harness, or a
callable returning one. docs/executors.md tells how."""

from __future__ import annotations

import getpass
import importlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

HARNESS_VAR = "CORRAL_CONFORMANCE_HARNESS"
NETWORK_VAR = "CORRAL_CONFORMANCE_LOCAL_NETWORK"  # host (default) or namespace: the local harness's network
PARTITION = "conf"  # the partition every conformance job is launched into


class Harness:
    """The defaults a harness may keep; ``name`` and ``site`` it must set."""

    name = ""
    gpu_type = "H100"  # the GPU type its nodes offer (jobs ask for ``{gpu_type}:N``)
    # seconds within which an executor's report of an end reaches the store, beyond the work
    # itself: a poll interval of the engine plus a loop cycle
    report_slack = 5.0

    def why_unavailable(self) -> str | None:
        """None when the infra can be used here; else why not (the tests skip, saying so)."""
        return None

    def start(self) -> None:
        """Bring up what the infra needs for the whole session (once, before its first test)."""

    def stop(self) -> None:
        """Take down what ``start`` brought up."""

    def env(self) -> dict[str, str]:
        """Variables the corral CLI and server need to reach the infra."""
        return {}

    def site(self) -> str:
        """config.yaml of a corral home whose partition ``conf`` runs jobs on this infra."""
        raise NotImplementedError

    def lose(self, node: str, job_id: int) -> str:
        """Make ``node`` (where a replica of corral job ``job_id`` runs) or its allocation die
        from outside corral, as a machine failure or an operator would; returns a word the
        replica's recorded reason must contain (the node's name, say). ``pytest.skip`` with
        the reason if this infra cannot lose a node without losing the server."""
        raise NotImplementedError

    def recover(self) -> None:
        """Bring back what ``lose`` took (called before each module's server starts: the loss
        test comes last in its module, so the last module's loss costs nothing)."""

    def cleanup(self, home: Path) -> None:
        """After a module's server stopped: remove what its jobs left in the engine."""


class LocalHarness(Harness):
    """Processes on this machine, on two declared nodes of four GPUs each; with
    CORRAL_CONFORMANCE_LOCAL_NETWORK=namespace each replica in a network namespace of its own
    (``infra: {local: {network: namespace}}``, root only)."""

    name = "local"

    def __init__(self) -> None:
        self.network = os.environ.get(NETWORK_VAR, "host")

    def site(self) -> str:
        return f"""
nodes:
  - {{name: node, count: 2, gpus: 4, gpu_type: {self.gpu_type}, cpus: 8, memory: 32}}
partitions:
  - {{name: {PARTITION}, infra: local}}
infra: {{local: {{network: {self.network}}}}}
"""

    def lose(self, node: str, job_id: int) -> str:
        pytest.skip("local: its nodes are the server's own machine, which cannot be lost without the server")


class RayHarness(Harness):
    """The Ray lab (tests/ray_lab.py): a head and two workers of four GPUs, each worker in a
    network namespace of its own with its own IP where this machine allows it (as root)."""

    name = "ray"

    def __init__(self) -> None:
        self.lab = None
        self._lost = None

    def why_unavailable(self) -> str | None:
        try:
            import ray  # noqa: F401
        except ImportError:
            return "ray is not installed (pip install 'corral[ray]')"
        return None

    def start(self) -> None:
        from ray_lab import start_lab

        self.lab = start_lab(workers=2, gpus=4, gpu_type=self.gpu_type, cpus=4)

    def stop(self) -> None:
        if self.lab is not None:
            self.lab.stop()

    def site(self) -> str:
        return f"""
infra:
  ray: {{address: "{self.lab.address}"}}
partitions:
  - {{name: {PARTITION}, infra: ray}}
"""

    def lose(self, node: str, job_id: int) -> str:
        victim = next(w for w in self.lab.workers if w.alive() and w.is_named(node))
        self.lab.kill(victim)  # the machine dies: its Ray processes and everything in its namespace
        self._lost = victim
        return node

    def recover(self) -> None:
        if self._lost is not None:
            self.lab.revive(self._lost)
            self._lost = None


class SlurmHarness(Harness):
    """The slurm-lab (a real Slurm of 4 nodes x 8 fake H100s, ``SLURM_CONF`` from the
    environment or /tmp/slurmlab/slurm.env): each corral job is one Slurm allocation, each
    replica a step in it."""

    name = "slurm"
    lab_env = Path(os.environ.get("CORRAL_SLURM_LAB", "/tmp/slurmlab")) / "slurm.env"

    def env(self) -> dict[str, str]:
        if "SLURM_CONF" in os.environ or not self.lab_env.exists():
            return {}
        for line in self.lab_env.read_text().splitlines():
            line = line.removeprefix("export ").strip()
            if line.startswith("SLURM_CONF="):
                return {"SLURM_CONF": line.split("=", 1)[1].strip("'\"")}
        return {}

    def _run(self, *argv: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env.update({k: v for k, v in os.environ.items() if k == "SLURM_CONF"})
        return subprocess.run(list(argv), capture_output=True, text=True, env={**env, **self.env()}, timeout=30)

    def why_unavailable(self) -> str | None:
        if shutil.which("squeue") is None:
            return "Slurm's commands are not on PATH"
        done = self._run("sinfo", "-h", "-o", "%D %G")
        if done.returncode != 0:
            return f"the Slurm controller does not answer: {done.stderr.strip()[:200]}"
        nodes = sum(int(line.split()[0]) for line in done.stdout.splitlines() if line.split() and "gpu" in line)
        if nodes < 2:
            return f"the Slurm lab has {nodes} GPU nodes; the suite needs 2"
        return None

    def site(self) -> str:
        return f"""
partitions:
  - {{name: {PARTITION}, infra: slurm}}
"""

    def allocation_of(self, job_id: int, home: Path) -> str:
        """The Slurm job holding corral job ``job_id`` of the server at ``home``."""
        from corral.executors import scope_of
        from corral.executors.slurm.shape import job_name
        from corral.settings import Settings

        name = job_name(scope_of(Settings(home=home, db_url="sqlite://")), job_id)
        ids = self._run("squeue", "-h", "-o", "%i", "-n", name).stdout.split()
        if len(ids) != 1:
            raise AssertionError(f"expected one Slurm job named {name}, found {ids}")
        return ids[0]

    def lose(self, node: str, job_id: int) -> str:
        # the nodes of a corral job's allocation are named s{slurm id}-{host}
        slurm_id = node[1:].split("-", 1)[0]
        done = self._run("scancel", slurm_id)  # cancelled from outside corral, as an operator would
        assert done.returncode == 0, done.stderr
        return slurm_id

    def cleanup(self, home: Path) -> None:
        from corral.executors import scope_of
        from corral.settings import Settings

        prefix = f"corral-{scope_of(Settings(home=home, db_url='sqlite://'))}-"
        out = self._run("squeue", "-h", "-o", "%i %j", "-u", getpass.getuser()).stdout
        ours = [line.split()[0] for line in out.splitlines() if len(line.split()) == 2
                and line.split()[1].startswith(prefix)]
        if ours:
            self._run("scancel", *ours)


BUILTIN = {"local": LocalHarness, "ray": RayHarness, "slurm": SlurmHarness}


def harnesses() -> dict[str, Harness | None]:
    """A harness per registered infra (None: the infra has none, and its tests say so)."""
    from corral.executors.registry import infras

    found: dict[str, Harness | None] = {name: (BUILTIN[name]() if name in BUILTIN else None) for name in infras()}
    for target in filter(None, (t.strip() for t in os.environ.get(HARNESS_VAR, "").split(","))):
        module, _, attribute = target.partition(":")
        if not attribute:
            raise ValueError(f"{HARNESS_VAR}: {target!r} is not module:attribute")
        value = getattr(importlib.import_module(module), attribute)
        harness = value if hasattr(value, "site") and not isinstance(value, type) else value()
        if harness.name not in found:
            raise ValueError(f"{HARNESS_VAR}: {target} is a harness of infra {harness.name!r}, which is not "
                             f"registered (known: {', '.join(found)})")
        found[harness.name] = harness
    return found


def describe(data: dict) -> str:
    """A job's status, short, for an assertion's message."""
    return json.dumps({k: data.get(k) for k in ("id", "state", "reason", "message", "exit_code")}) + "".join(
        f"\n  {t['name']}-{r['rank']}: {r['state']} node={r['node']} exit={r['exit_code']}"
        for t in data.get("tasks", []) for r in t["replicas"])
