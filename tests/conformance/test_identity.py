"""Who a replica runs as, on every infra: a job submitted by a user with a token runs as
that user's Unix account (uid, primary and supplementary groups, HOME/USER/LOGNAME, a login's
umask 022), never as the server's; it cannot read the server's home (the owner's local
token); its log and checkpoint directory are its account's alone. An infra whose workers
all run as one account (a Ray cluster) refuses another account's job at submission, with a
sentence naming the user. Needs root (to make throwaway Unix accounts); skips otherwise."""

from __future__ import annotations

import stat
import subprocess
from collections.abc import Iterator

import pytest

from conformance.conftest import job_account, serving
from conformance.driver import Corral, wait_for
from conformance.harnesses import PARTITION, describe
from unix_users import ThrowawayUser, need_root, traversable_dir

PROBE = """run: |
  echo "uid=$(id -u) gid=$(id -g) groups=$(id -G | tr ' ' ',') umask=$(umask) home=$HOME user=$USER logname=$LOGNAME"
  if cat "{token}" >/dev/null 2>&1; then echo token=readable; else echo token=unreadable; fi
  if ls "{home}" >/dev/null 2>&1; then echo corral_home=listable; else echo corral_home=private; fi
  touch "$CORRAL_CHECKPOINT_DIR/mine" && echo ckpt=$(stat -c %U "$CORRAL_CHECKPOINT_DIR/mine")
  echo pwd=$(pwd)
"""


@pytest.fixture(scope="module")
def user(harness) -> Iterator[ThrowawayUser]:
    with job_account(harness) as made:
        yield made


@pytest.fixture(scope="module")
def corral(harness) -> Iterator[Corral]:
    """A real server of a home the job's account may pass through (pytest's temporary
    directories are root's alone), running as root."""
    need_root()
    harness.recover()
    with traversable_dir() as root, serving(harness, root / "home", open_to_accounts=True) as run:
        yield run


def _as(corral: Corral, user: ThrowawayUser):
    from corral.client import Client

    token = corral.client().create_token(user.name)["token"]
    return Client(corral.client().url, token)


def _lines(corral: Corral, job: int) -> dict[str, str]:
    text = corral("logs", str(job)).stdout
    return dict(part.split("=", 1) for line in text.splitlines() for part in line.split() if "=" in part)


def test_a_replica_runs_as_its_submitter(corral: Corral, harness, user: ThrowawayUser) -> None:
    from corral.client import Forbidden
    from corral.executors.registry import infras

    client = _as(corral, user)
    spec = PROBE.format(token=corral.home / "local.token", home=corral.home)
    if infras()[harness.name].runs_as is not None:  # its workers run as one account: refused, saying why
        with pytest.raises(Forbidden) as refused:
            client.submit(spec, name="who", base_dir=str(corral.specs), scheduling={"partition": PARTITION})
        assert user.name in str(refused.value) and "runs every job as the Unix account" in str(refused.value)
        return
    job = client.submit(spec, name="who", base_dir=str(corral.specs), scheduling={"partition": PARTITION})["job"]
    assert job["run_as"] == user.name
    done = corral.wait_job(job["id"], timeout=120)
    seen = _lines(corral, job["id"])
    assert done["state"] == "SUCCEEDED", (describe(done), seen)
    assert int(seen["uid"]) == user.uid and int(seen["gid"]) == user.gid, seen
    assert sorted(int(g) for g in seen["groups"].split(",")) == sorted(user.groups), seen
    assert seen["umask"] == "0022", seen
    assert (seen["home"], seen["user"], seen["logname"]) == (user.home, user.name, user.name), seen
    assert seen["token"] == "unreadable" and seen["corral_home"] == "private", seen
    assert seen.get("ckpt") == user.name, seen
    (log,) = (corral.home / "logs" / str(job["id"])).glob("*-0.log")
    info = log.stat()
    assert info.st_uid == user.uid and stat.S_IMODE(info.st_mode) == 0o600, (log, oct(info.st_mode))
    (ckpt,) = (corral.home / "checkpoints" / str(job["id"])).iterdir()
    assert ckpt.stat().st_uid == user.uid and stat.S_IMODE(ckpt.stat().st_mode) == 0o700


def test_on_slurm_the_allocation_and_its_steps_are_the_users(corral: Corral, harness, user: ThrowawayUser) -> None:
    if harness.name != "slurm":
        pytest.skip(f"{harness.name}: no engine-side job owner to check")
    client = _as(corral, user)
    job = client.submit("run: echo step-uid=$(id -u); exec sleep 300\n", name="owned", base_dir=str(corral.specs),
                        scheduling={"partition": PARTITION})["job"]
    corral.wait_running(job["id"], timeout=120)
    slurm_id = harness.allocation_of(job["id"], corral.home)
    shown = harness._run("scontrol", "show", "job", slurm_id).stdout
    assert f"UserId={user.name}({user.uid})" in shown, shown
    owner = harness._run("squeue", "-h", "-j", slurm_id, "-o", "%u").stdout.strip()
    assert owner == user.name
    line = wait_for(lambda: _lines(corral, job["id"]).get("step-uid"), timeout=30, what="the step's uid")
    assert int(line) == user.uid
    client.cancel(job["id"])
    corral.wait_job(job["id"], timeout=90)


def test_a_user_without_a_unix_account_is_refused_at_submission(corral: Corral) -> None:
    from corral.client import Forbidden

    client = _as(corral, ThrowawayUser("nobody-here-xq", -1, -1, (), "/"))
    with pytest.raises(Forbidden) as refused:
        client.submit("run: id\n", name="ghost", base_dir=str(corral.specs), scheduling={"partition": PARTITION})
    assert "user nobody-here-xq has no Unix account on this server" in str(refused.value)
    assert subprocess.run(["id", "nobody-here-xq"], capture_output=True).returncode != 0
