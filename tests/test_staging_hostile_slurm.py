"""On the slurm-lab, with a root server: a job of another account plants, in its attempt's run
directory (its own, so its step records its start and exit), a ``mounts.err`` that is a link
to a file of root's it may not read, then fails. The server reads that file to say why the
attempt's sources could not be staged: it must not show root's file as the job's reason.
Needs root (a throwaway account)."""

from __future__ import annotations

import os

import pytest

from slurm_env import slurm_env

ENV = slurm_env(keep_job_variables=False)


def _why_not() -> str | None:
    from conformance.harnesses import SlurmHarness

    if os.geteuid() != 0:
        return "a server of root's running another account's job needs root"
    return SlurmHarness().why_unavailable()


@pytest.mark.parametrize("lab", ["slurm"])
def test_a_job_cannot_make_the_server_show_a_file_of_root_s_as_its_reason(lab: str) -> None:
    why = _why_not()
    if why:
        pytest.skip(why)
    from conformance.driver import Corral
    from conformance.harnesses import PARTITION, SlurmHarness
    from unix_users import slurm_association, traversable_dir, unix_user

    with traversable_dir() as root, unix_user("chst") as ann, slurm_association(ann.name, {**ENV}):
        secret = root / "secret"
        secret.write_text("ROOT-ONLY-7f3a\n")
        secret.chmod(0o600)
        home = root / "home"
        home.mkdir()
        harness = SlurmHarness()
        (home / "config.yaml").write_text(harness.site())
        corral = Corral(home, harness)
        corral("server", "start")
        with corral.as_account(ann.name, lambda: harness.cleanup(home)) as client:
            runs = home / "runs"  # (Settings.runs_dir: an attempt's run directory is runs/KEY, CORRAL_ATTEMPT being KEY@SCOPE)
            job = client.submit(
                "resources: {accelerators: H100:1}\nrestart: {policy: never}\n"
                "run: |\n"
                f"  ln -sf {secret} \"{runs}/${{CORRAL_ATTEMPT%@*}}/mounts.err\" && echo planted\n"
                "  exit 3\n",
                cwd="/", scheduling={"partition": PARTITION})["job"]["id"]
            done = corral.wait_job(job, timeout=120)
            log = corral.log(job)
            assert "planted" in log, (done.get("state"), done.get("message"), log)
            said = done.get("message") or ""
            assert "ROOT-ONLY-7f3a" not in said, said
            assert "ROOT-ONLY-7f3a" not in log, log
