"""``corral exec`` and ``corral shell`` on every infra: the process starts in the replica's own
world (the hostname, working directory, variables and Unix account the replica itself sees),
its exit code, output streams and piped input go through; a shell is a real terminal (its
size follows the caller's, Ctrl-C interrupts the foreground command and not the shell, its
exit code is the command's); only the job's owner and operators may, and each is audited."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator

import pytest

from conformance.conftest import job_account, serving
from conformance.driver import Corral, wait_for
from conformance.harnesses import PARTITION, describe
from unix_users import ThrowawayUser, traversable_dir, unix_user

WORLD = ('echo "host=$(hostname)"; echo "cwd=$(pwd)"; echo "uid=$(id -u)"; echo "name=$CORRAL_HOSTNAME"; '
         'echo "rank=$CORRAL_REPLICA"; echo "job=$CORRAL_JOB_ID"')


@pytest.fixture(scope="module")
def corral(harness, tmp_path_factory) -> Iterator[Corral]:
    """A real server of a home other accounts may pass through (for the account test)."""
    harness.recover()
    with traversable_dir() as root, serving(harness, root / "home", open_to_accounts=True, shared_work=True) as run:
        yield run


def _values(text: str, rank: int | None = None) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if rank is not None and line.startswith("(") and f"-{rank})" not in line.split(" ", 1)[0]:
            continue
        line = line.split("| ", 1)[-1].strip()
        if "=" in line:
            key, value = line.split("=", 1)
            out[key] = value
    return out


@pytest.fixture(scope="module")
def sleeper(corral: Corral) -> int:
    """A running job of two replicas that wrote its own world into its log."""
    corral.work.chmod(0o777)
    job = corral.launch("sleeper", f"""
num_nodes: 2
run: |
  {WORLD}
  exec sleep 600
""")
    corral.wait_running(job, timeout=120)
    wait_for(lambda: _values(corral("logs", str(job), "sleeper-1").stdout).get("job"), timeout=60,
             what="replica 1's world in its log")
    return job


def test_exec_runs_in_the_replicas_world(corral: Corral, sleeper: int) -> None:
    own = _values(corral("logs", str(sleeper), "sleeper-1").stdout)
    done = corral("exec", str(sleeper), "sleeper-1", "--", "sh", "-c", WORLD)
    seen = _values(done.stdout)
    assert seen == own, (seen, own)
    assert seen["rank"] == "1" and seen["name"] == "sleeper-1.sleeper", seen
    # rank 0 of the first task by default
    assert _values(corral("exec", str(sleeper), "--", "sh", "-c", WORLD).stdout)["rank"] == "0"


def test_exec_passes_exit_code_streams_and_stdin(corral: Corral, sleeper: int) -> None:
    done = corral("exec", str(sleeper), "--", "sh", "-c", "cat; echo to-err >&2; exit 7", check=False)
    assert done.returncode == 7, (done.stdout, done.stderr)
    assert done.stdout == "" and done.stderr == "to-err\n", (done.stdout, done.stderr)
    piped = subprocess.run([sys.executable, "-m", "corral.cli.main", "exec", str(sleeper), "--", "tr", "a-z", "A-Z"],
                           input="piped in\n", env=corral.env, capture_output=True, text=True, timeout=60)
    assert (piped.returncode, piped.stdout) == (0, "PIPED IN\n"), piped.stderr
    missing = corral("exec", str(sleeper), "--", "no-such-command-xq", check=False)
    assert missing.returncode == 127 and "no-such-command-xq: command not found" in missing.stderr, missing.stderr


def test_exec_refusals_say_why(corral: Corral, sleeper: int) -> None:
    unknown = corral("exec", str(sleeper), "sleeper-9", "--", "true", check=False)
    assert unknown.returncode == 2 and "has no replica 'sleeper-9'; it has sleeper-0, sleeper-1" in unknown.stderr
    ended = corral.launch("brief", "run: echo done\n")
    corral.wait_job(ended, timeout=120)
    over = corral("exec", str(ended), "--", "true", check=False)
    assert over.returncode == 2 and f"job {ended} is SUCCEEDED; a process can be started only in a running" \
        in over.stderr, over.stderr


class Terminal:
    """``corral shell`` on a pseudo-terminal of our own, as a person's terminal is."""

    def __init__(self, corral: Corral, *args: str):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the corral command on the pty
            os.chdir(str(corral.work))
            os.execve(sys.executable, [sys.executable, "-m", "corral.cli.main", *args], corral.env)
        self.seen = b""

    def size(self, rows: int, cols: int) -> None:
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        os.kill(self.pid, signal.SIGWINCH)  # as a terminal emulator's resize does

    def send(self, text: bytes) -> None:
        os.write(self.fd, text)

    def expect(self, wanted: bytes, timeout: float = 30.0) -> bytes:
        deadline = time.monotonic() + timeout
        while wanted not in self.seen:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{wanted!r} not seen within {timeout:g}s: {self.seen[-800:]!r}")
            ready, _, _ = select.select([self.fd], [], [], min(left, 0.5))
            if ready:
                try:
                    self.seen += os.read(self.fd, 65536)
                except OSError:  # EIO: the command ended
                    break
        if wanted not in self.seen:
            raise AssertionError(f"{wanted!r} not seen: the command ended; {self.seen[-800:]!r}")
        at = self.seen.index(wanted) + len(wanted)
        before, self.seen = self.seen[:at], self.seen[at:]
        return before

    def prompt(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(mark in self.seen for mark in (b"# ", b"$ ")):
            if time.monotonic() > deadline:
                raise AssertionError(f"no prompt within {timeout:g}s: {self.seen[-800:]!r}")
            if select.select([self.fd], [], [], 0.2)[0]:
                self.seen += os.read(self.fd, 65536)
        self.seen = b""

    def exit_code(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.seen += os.read(self.fd, 65536) if select.select([self.fd], [], [], 0.2)[0] else b""
            except OSError:
                pass
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
        os.kill(self.pid, signal.SIGKILL)
        raise AssertionError(f"corral shell did not end: {self.seen[-800:]!r}")


def test_shell_is_a_real_terminal(corral: Corral, sleeper: int) -> None:
    term = Terminal(corral, "shell", str(sleeper), "sleeper-1")
    term.size(31, 101)
    term.prompt()  # as a person does: what is typed before the shell reads its terminal may be dropped
    # $((…)) keeps the typed line (echoed by the terminal) apart from what the command prints
    term.send(b"stty size; echo rank-$((CORRAL_REPLICA + 100))\r")
    before = term.expect(b"rank-101")
    assert b"31 101" in before, before
    term.size(42, 123)
    # the resize travels beside the input, not in it (the client's SIGWINCH handler sends it,
    # its stdin thread the typed line): the size is asked until the new one has arrived
    deadline = time.monotonic() + 20
    while True:
        term.send(b"echo size-$((1 + 1))-$(stty size)\r")  # (the typed line, echoed, is not size-2-)
        term.expect(b"size-2-")
        size = term.expect(b"\n").strip()
        if size == b"42 123":
            break
        assert size == b"31 101" and time.monotonic() < deadline, size
        time.sleep(0.2)
    term.send(b"sleep 60; echo not-$((1 + 1))-interrupted\r")
    time.sleep(1.5)
    term.send(b"\x03")  # Ctrl-C: the sleep (and its list) ends; the shell goes on
    term.send(b"echo alive-$((2 + 3))\r")
    before = term.expect(b"alive-5")
    assert b"not-2-interrupted" not in before
    term.send(b"exit 3\r")
    assert term.exit_code() == 3


def test_a_process_ends_with_its_replica(corral: Corral) -> None:
    job = corral.launch("ending", "run: exec sleep 600\n")
    corral.wait_running(job, timeout=120)
    inside = corral.popen("exec", str(job), "--", "sh", "-c", "echo in; exec sleep 601")
    assert inside.stdout.readline() == "in\n"
    corral("cancel", str(job))
    try:
        code = inside.wait(timeout=60)  # the replica's end ends what was started in it
    except subprocess.TimeoutExpired:
        inside.kill()
        raise AssertionError("corral exec outlived the replica it ran in") from None
    assert code != 0, code
    assert corral.wait_job(job, timeout=90)["state"] == "CANCELLED"


# -- who may -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def owner(harness) -> Iterator[ThrowawayUser]:
    with job_account(harness) as made:
        yield made


def test_only_the_owner_and_operators_may_and_each_is_audited(corral: Corral, harness, owner: ThrowawayUser) -> None:
    from corral.client import Client, Forbidden
    from corral.executors.registry import infras

    if infras()[harness.name].runs_as is not None:
        pytest.skip(f"{harness.name} runs every job as one account: no job of another user's to enter")
    admin = corral.client()
    mine = Client(admin.url, admin.create_token(owner.name)["token"])
    with unix_user("cio") as other:
        theirs = Client(admin.url, admin.create_token(other.name)["token"])
        job = mine.submit("run: exec sleep 600\n", name="owned", base_dir=str(corral.specs),
                          scheduling={"partition": PARTITION})["job"]["id"]
        corral.wait_running(job, timeout=120)
        code, out, err = mine.exec(job, ["sh", "-c", "id -u; echo $HOME"])
        assert (code, out.decode().split()) == (0, [str(owner.uid), owner.home]), err
        with pytest.raises(Forbidden) as refused:
            theirs.exec(job, ["id", "-u"])
        assert f"another user's job (job {job}, {owner.name}'s) needs the operator role" in str(refused.value)
        # an operator may, and the process is still the replica's account's, never the server's
        code, out, _ = admin.exec(job, ["id", "-u"])
        assert (code, out.decode().strip()) == (0, str(owner.uid))
        entries = [(e["user"], e["action"], e["target"], e["outcome"]) for e in admin.audit(action="exec")]
        assert (owner.name, "exec", f"job {job}", "ok") in entries, entries
        assert (other.name, "exec", f"job {job}", "refused") in entries, entries
        assert (admin.whoami()["user"], "exec", f"job {job}", "ok") in entries, entries
        mine.cancel(job)
        done = corral.wait_job(job, timeout=90)
        assert done["state"] == "CANCELLED", describe(done)
