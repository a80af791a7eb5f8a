"""The conformance suite's hands on a real corral server: a home configured for one infra,
its server (started, crashed with kill -9, started again), and the ``corral`` command and
HTTP API a user would use on it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from conformance.harnesses import PARTITION, Harness, describe

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT")


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.1, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what or predicate}")
        time.sleep(interval)


def runs(pid: int, command: str) -> bool:
    """Whether process ``pid`` still runs ``command`` (a zombie has ended; a reused pid is
    another program)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and command in " ".join(proc.cmdline())
    except psutil.Error:
        return False


class Corral:
    """A corral home on one infra, its server, and the ``corral`` command for it."""

    def __init__(self, home: Path, harness: Harness):
        self.home, self.harness = home, harness
        self.specs = home.parent / "specs"
        self.specs.mkdir(exist_ok=True)
        self.work = home.parent / "work"  # files the replicas write, on a filesystem their nodes share
        self.work.mkdir(exist_ok=True)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "SLURM_")) or k == "SLURM_CONF"}
        self.env.update(harness.env())
        self.env["CORRAL_HOME"] = str(home)
        self._client = None

    def __call__(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, "-m", "corral.cli.main", *args], env=self.env, capture_output=True,
                              text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"corral {' '.join(args)} failed ({done.returncode}): {done.stdout}{done.stderr}")
        return done

    def popen(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "corral.cli.main", *args], env=self.env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    # -- the server ------------------------------------------------------------------------------
    def server_pid(self) -> int:
        return int(json.loads((self.home / "server.json").read_text())["pid"])

    def client(self):
        """The HTTP API of the running server (polled without a process per look)."""
        from corral.client import Client
        from corral.credentials import read_local_token

        if self._client is None:
            self("server", "start")
            info = json.loads((self.home / "server.json").read_text())
            self._client = Client(info["url"], read_local_token(self.home) or "")
        return self._client

    def crash(self) -> None:
        """kill -9 the server, as a crash would, and wait until it is gone."""
        pid = self.server_pid()
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: self("server", "status", check=False).returncode == 1, timeout=20, what="server down")
        self.close_client()

    def start(self) -> None:
        self("server", "start")
        self.close_client()

    def close_client(self) -> None:
        if self._client is not None:
            self._client.close()
        self._client = None

    # -- jobs ------------------------------------------------------------------------------------
    def launch(self, name: str, spec: str) -> int:
        """Submit ``spec`` (YAML) to partition ``conf``, detached; its job id."""
        path = self.specs / f"{name}.yaml"
        path.write_text(spec)
        return int(self("launch", "-d", "-p", PARTITION, "--name", name, str(path)).stdout.strip())

    def status(self, job: int) -> dict:
        return self.client().status(job)

    def replicas(self, job: int) -> dict[str, dict]:
        return {f"{t['name']}-{r['rank']}": r for t in self.status(job)["tasks"] for r in t["replicas"]}

    def events(self, job: int) -> list[dict]:
        return self.client().events(job)

    def wait_job(self, job: int, states: tuple[str, ...] = TERMINAL, timeout: float = 60.0) -> dict:
        last: dict = {}

        def reached():
            nonlocal last
            last = self.status(job)
            return last if last["state"] in states else None

        try:
            return wait_for(reached, timeout, 0.1)
        except AssertionError:
            raise AssertionError(f"job {job} not {'/'.join(states)} within {timeout:g}s: {describe(last)}") from None

    def wait_running(self, job: int, timeout: float = 60.0) -> dict[str, dict]:
        """Once the job and every replica run; its replicas."""
        last: dict = {}

        def running():
            nonlocal last
            last = self.status(job)
            reps = [r for t in last["tasks"] for r in t["replicas"]]
            return last["state"] == "RUNNING" and all(r["state"] == "RUNNING" for r in reps)

        try:
            wait_for(running, timeout, 0.1)
        except AssertionError:
            raise AssertionError(f"job {job} not running within {timeout:g}s: {describe(last)}") from None
        return self.replicas(job)

    def log(self, job: int) -> str:
        return self("logs", str(job)).stdout

    @contextmanager
    def as_account(self, account: str, cleanup: Callable[[], None]) -> Iterator[Any]:
        """A client of this (started) server acting as ``account``; at the end, whatever
        happened, every job is cancelled, the server stopped and ``cleanup`` run."""
        from corral.client import Client

        admin = self.client()
        client = Client(admin.url, admin.create_token(account)["token"])
        try:
            yield client
        finally:
            client.close()
            try:
                self.cancel_all()
            finally:
                self.close_client()
                self("server", "stop", check=False)
                cleanup()

    def cancel_all(self) -> None:
        active = [j["id"] for j in self.client().jobs()]
        for job in active:
            self.client().cancel(job)
        for job in active:
            self.wait_job(job, timeout=90)
