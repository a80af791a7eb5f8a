"""Issue 31, item 1, reproduced on a real server running as root: two Unix users with
`user`-role tokens. Each one's job runs as them, cannot read the server owner's local token
(so cannot act as the admin), neither can cancel the other's job, and the audit trail names
who acted, never the server's account. Needs root (throwaway accounts); skips otherwise."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from conformance.driver import Corral
from conformance.harnesses import PARTITION, LocalHarness
from conftest import kill_leftovers, wait_for
from unix_users import need_root, traversable_dir, unix_user

import container_lab


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Corral, dict]]:
    need_root()
    from corral.client import Client

    with traversable_dir() as root, unix_user("cida") as ann, unix_user("cidb") as bob:
        home = root / "home"
        home.mkdir()
        harness = LocalHarness()
        (home / "config.yaml").write_text(harness.site() + container_lab.SITE)
        corral = Corral(home, harness)
        corral.specs.chmod(0o755)
        corral.start()
        try:
            admin = corral.client()
            people = {u.name: (u, Client(admin.url, admin.create_token(u.name)["token"])) for u in (ann, bob)}
            yield corral, people
        finally:
            try:
                corral.cancel_all()
            finally:
                corral.close_client()
                for _, client in people.values():
                    client.close()
                corral("server", "stop", check=False)
                kill_leftovers(home)


def _submit(corral: Corral, client, name: str, run: str) -> int:
    return client.submit(f"run: {run}\n", name=name, base_dir=str(corral.specs),
                         scheduling={"partition": PARTITION})["job"]["id"]


def test_the_reported_job_runs_as_its_submitter_and_cannot_read_the_admins_token(served) -> None:
    corral, people = served
    (ann, client), _ = people.values()
    token = corral.home / "local.token"
    job = _submit(corral, client, "steal", f"id; cat {token}")
    done = corral.wait_job(job, timeout=60)
    log = corral.log(job)
    assert done["state"] == "FAILED" and done["run_as"] == ann.name, (done, log)
    assert f"uid={ann.uid}({ann.name})" in log and "Permission denied" in log, log
    assert token.read_text().strip() not in log


def test_a_user_cannot_cancel_anothers_job_and_the_audit_names_who_acted(served) -> None:
    from corral.client import Forbidden

    corral, people = served
    (ann, ann_client), (bob, bob_client) = people.values()
    job = _submit(corral, bob_client, "bobs", "exec sleep 300")
    corral.wait_running(job)
    with pytest.raises(Forbidden) as refused:
        ann_client.cancel(job)
    assert str(refused.value) == (f"cancelling another user's job (job {job}, {bob.name}'s) needs the operator role "
                                  f"(you are {ann.name}, a user)")
    bob_client.cancel(job)
    assert corral.wait_job(job)["state"] == "CANCELLED"
    entries = [e for e in corral.client().audit() if e["target"] == f"job {job}"]
    seen = [(e["user"], e["action"], e["outcome"]) for e in entries]
    assert seen == [(bob.name, "submit", "ok"), (ann.name, "cancel", "refused"), (bob.name, "cancel", "ok")], entries
    assert f"as Unix account {bob.name}" in entries[0]["detail"]
    assert all(e["user"] != "root" and e["role"] == "user" for e in entries), entries


def test_a_git_workdir_is_cloned_and_entered_as_the_submitter(served) -> None:
    import subprocess

    corral, people = served
    (ann, client), _ = people.values()
    repo = corral.home.parent / "repo"
    repo.mkdir(mode=0o755)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    (repo / "version.txt").write_text("one\n")
    subprocess.run([*git, "add", "version.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    # the submitter's own repository (git refuses to clone another account's over file://, as for them)
    subprocess.run(["chown", "-R", f"{ann.uid}:{ann.gid}", str(repo)], check=True)
    job = client.submit(f"workdir: {{url: 'file://{repo}'}}\nrun: cat version.txt; touch made; stat -c 'owner=%U' . made\n",
                        name="cloned", base_dir=str(corral.specs), scheduling={"partition": PARTITION})["job"]["id"]
    done = corral.wait_job(job, timeout=60)
    log = corral.log(job)
    assert done["state"] == "SUCCEEDED", (done, log)
    assert "one" in log and log.count(f"owner={ann.name}") == 2, log
    # a repository only root may read is not cloned on root's rights
    private = corral.home.parent / "private"
    subprocess.run(["cp", "-r", str(repo), str(private)], check=True)  # root's copy
    private.chmod(0o700)
    job = client.submit(f"workdir: {{url: 'file://{private}'}}\nrun: cat version.txt\n", name="sneaky",
                        base_dir=str(corral.specs), scheduling={"partition": PARTITION})["job"]["id"]
    done = corral.wait_job(job, timeout=60)
    assert done["state"] == "FAILED" and "could not clone" in corral.log(job), (done, corral.log(job))


def test_a_server_not_running_as_root_takes_only_its_own_accounts_jobs(server) -> None:
    from conftest import bearer

    from corral.auth.accounts import Accounts, IdentityConfig

    state = server.state
    state.accounts = Accounts(IdentityConfig(), server="alice", root=False)  # as a server run by alice
    spec = {"yaml": "run: 'true'\n", "name": "mine"}
    accepted = server.post("/v1/jobs", json=spec)  # the fixture's requests are alice's
    assert accepted.status_code == 201 and accepted.json()["job"]["run_as"] == "alice", accepted.text
    refused = server.post("/v1/jobs", json={**spec, "name": "theirs"}, headers=bearer(state, "bob"))
    assert refused.status_code == 403
    assert refused.json()["detail"].startswith("this corral server runs as alice, not root, so it can start jobs "
                                               "only as alice, and bob's jobs run as the Unix account bob")
    entry = [e for e in server.get("/v1/audit", headers=bearer(state, "root", "admin")).json()
             if e["action"] == "submit"][-1]
    assert (entry["user"], entry["outcome"]) == ("bob", "refused") and "not root" in entry["detail"]


def test_a_batch_script_and_its_steps_run_as_the_submitter(served) -> None:
    from corral.spec.sbatch import load_batch

    corral, people = served
    (ann, client), _ = people.values()
    submit_dir = corral.home.parent / f"work-{ann.name}"  # the submitter's own directory: its output goes there
    submit_dir.mkdir()
    os.chown(submit_dir, ann.uid, ann.gid)
    # the srun of a batch script off Slurm is the server's Python: it runs only where the account may
    # run that (not on a machine whose Python lives in root's home, as on some test machines)
    # two nodes: the second task runs in the other node's holder, through its step agent (as ann too)
    script = ("#!/bin/bash\n#SBATCH -N 2\n#SBATCH --ntasks-per-node=1\necho batch=$(id -u)\n"
              "if srun bash -c 'echo step$SLURM_PROCID=$(id -u) in $CORRAL_TASK'; then echo steps=ran; "
              "else echo steps=no; fi\n")
    batch = load_batch(script, source="as-ann.sbatch", submit_dir=str(submit_dir), args=(), overrides={},
                       environ={}, warnings=[])
    job = client.submit(batch.documents, source="as-ann.sbatch", base_dir=str(submit_dir), name="batched",
                        scheduling={**batch.scheduling, "partition": PARTITION})["job"]["id"]
    done = corral.wait_job(job, timeout=60)
    log = corral.log(job)
    assert done["state"] == "SUCCEEDED", (done, log)
    assert f"batch={ann.uid}" in log, log
    assert "steps=no" in log or (f"step0={ann.uid} in batch" in log and f"step1={ann.uid} in node" in log), log
    if "steps=no" in log:  # and then it says why, naming the Python it could not run
        assert f"the account {ann.name} may not run: install corral where every account may read it" in log, log
    (output,) = submit_dir.glob("slurm-*.out")
    assert output.stat().st_uid == ann.uid


def test_the_jobs_variables_never_run_anything_with_the_servers_rights(served, tmp_path_factory) -> None:
    """BASH_ENV, PATH and LD_PRELOAD of the job reach the job's own shell only: before, the
    wrapper (root) started with them, so BASH_ENV ran a user's file as root, a fake setpriv on
    the job's PATH ran as root, and so did an LD_PRELOAD library."""
    corral, people = served
    (ann, client), _ = people.values()
    trap = corral.specs / "trap"
    trap.mkdir(mode=0o755, exist_ok=True)
    witness = corral.specs / "witness"
    witness.mkdir(mode=0o777, exist_ok=True)
    witness.chmod(0o777)
    (trap / "bashenv.sh").write_text(f'echo "bashenv $(id -u)" >> {witness}/seen\n')
    (trap / "setpriv").write_text(f'#!/bin/sh\necho "setpriv $(id -u)" >> {witness}/seen\nexec /usr/bin/setpriv "$@"\n')
    (trap / "setpriv").chmod(0o755)
    job = client.submit(f"run: bash -c 'echo ran'\nreadiness_probe: {{exec: 'true', period: 0.2s}}\n"
                        f"envs: {{BASH_ENV: {trap}/bashenv.sh, PATH: '{trap}:/usr/bin:/bin'}}\n", name="envtrap",
                        base_dir=str(corral.specs), scheduling={"partition": PARTITION})["job"]["id"]
    done = corral.wait_job(job, timeout=60)
    assert done["state"] == "SUCCEEDED", (done, corral.log(job))
    seen = (witness / "seen").read_text().split("\n") if (witness / "seen").exists() else []
    assert [line for line in seen if line.endswith(" 0")] == [], seen  # nothing as root
    assert f"bashenv {ann.uid}" in seen, seen  # the job's own shell did take its BASH_ENV


def test_a_container_runs_as_its_submitter_and_binds_nothing_it_may_not_reach(served, tmp_path) -> None:
    """A job of another account in a container: inside, it is that account (the engine runs
    with the server's rights, the container with the job's), its files in the workdir are its
    own, and a directory it could not reach on the node is not bound for it."""
    corral, people = served
    (ann, client), _ = people.values()
    image = container_lab.ensure_image_for(ann.name)  # her own engine runs her containers, from her own store
    spec = (f"resources: {{image_id: docker:{image}}}\n"
            "run: head -n 1 /proc/self/uid_map > map; id -u; id -g; touch made; stat -c %u made\n")
    own = corral.specs / f"ann-{tmp_path.name}"
    own.mkdir()
    os.chown(own, ann.uid, ann.gid)
    job = client.submit(spec, name="boxed", base_dir=str(own), workdir=str(own),
                        scheduling={"partition": PARTITION})["job"]["id"]
    done = corral.wait_job(job, timeout=60)
    log = corral.log(job)
    assert done["state"] == "SUCCEEDED", (done, log)
    assert log.split()[-3:] == [str(ann.uid), str(ann.gid), str(ann.uid)], log
    assert (own / "made").stat().st_uid == ann.uid
    # in a user namespace of her own engine: a setuid program in her image is root there only
    assert "4294967295" not in (own / "map").read_text(), (own / "map").read_text()
    # a directory ann could reach when she submitted, closed before her job starts
    outer = corral.specs / f"closed-{job}"
    inner = outer / "inner"
    inner.mkdir(parents=True)
    os.chown(inner, ann.uid, ann.gid)
    outer.chmod(0o755)
    held = client.submit(spec, name="closed", base_dir=str(inner), workdir=str(inner),
                         scheduling={"partition": PARTITION, "hold": True})["job"]["id"]
    outer.chmod(0o700)  # root's alone now: ann may not pass it on this node
    client.release(held)
    done = corral.wait_job(held, timeout=60)
    log = corral.log(held)
    assert done["state"] == "FAILED" and "may not reach" in log, (done, log)
    assert not (inner / "made").exists()


def test_a_replica_s_probes_still_run_as_its_account_after_a_server_crash(served, tmp_path) -> None:
    """The successor of a server killed with kill -9 adopts the replica with its account: its
    exec probes go on running as her, never as the server's root."""
    import time

    corral, people = served
    (ann, client), _ = people.values()
    own = corral.specs / f"probes-{tmp_path.name}"
    own.mkdir()
    os.chown(own, ann.uid, ann.gid)
    probes = own / "probes"
    spec = f"run: exec sleep 300\nliveness_probe: {{exec: 'id -u >> {probes}', period: 0.2s}}\n"
    job = client.submit(spec, name="probed", base_dir=str(own), workdir=str(own),
                        scheduling={"partition": PARTITION})["job"]["id"]
    corral.wait_running(job)

    def probed() -> bool:
        return probes.exists() and len(probes.read_text().split()) >= 2

    wait_for(probed, timeout=30)
    corral.crash()
    probes.unlink()
    corral.start()
    wait_for(probed, timeout=60)
    time.sleep(0.5)
    seen = set(probes.read_text().split())
    corral("cancel", str(job))
    assert seen == {str(ann.uid)}, seen


def test_a_working_directory_the_submitter_cannot_enter_is_refused_at_submit(served, tmp_path) -> None:
    from corral.client import Client, InvalidRequest

    corral, people = served
    (ann, _), _ = people.values()
    admin = corral.client()  # (the server may have been started again since the fixture's clients)
    client = Client(admin.url, admin.create_token(ann.name)["token"])
    closed = tmp_path / "closed"  # root's, mode 0700: the server could enter it, ann cannot
    closed.mkdir(mode=0o700)
    before = len(corral.client().jobs())
    for given in ({"base_dir": str(closed)}, {"base_dir": str(corral.specs), "workdir": str(closed)}):
        with pytest.raises(InvalidRequest) as refused:
            client.submit("run: pwd\n", name="nosy", scheduling={"partition": PARTITION}, **given)
        assert refused.value.status == 422, refused.value
        assert f"{ann.name} this job runs as cannot enter {closed}" in str(refused.value), refused.value
    assert len(corral.client().jobs()) == before  # nothing stored
    # one it may enter is taken
    job = client.submit("run: pwd\n", name="fine", base_dir=str(corral.specs),
                        scheduling={"partition": PARTITION})["job"]["id"]
    assert corral.wait_job(job, timeout=60)["state"] == "SUCCEEDED"
    client.close()
