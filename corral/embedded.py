"""The embedded local server: starting, finding and stopping the server of a CORRAL_HOME
that the CLI and the SDK use when no ``CORRAL_SERVER`` is configured and no ``corral login``
saved another; and which server, with which credentials, a client talks to (``locate``).
Below the CLI and the client both: neither imports the other through it."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from corral.client import Client, CorralError, InvalidRequest
from corral.credentials import Presented, SavedLogins, for_server
from corral.homelock import holder
from corral.settings import Settings


def running(settings: Settings) -> dict[str, Any] | None:
    """The server that serves this CORRAL_HOME, or None: the process holding its lock, as the
    server itself decides (``homelock``). Its server.json when it answers there; while it does
    not yet (starting: the lock is taken first) ``{"pid", "home", "answering": False}``."""
    pid = holder(settings.home)
    if pid is None:
        return None  # (a server.json left by a server that died names nobody)
    try:
        info = json.loads(settings.server_file.read_text())
    except (OSError, ValueError):
        info = {}
    if info and (pid == 0 or int(info.get("pid", 0)) == pid) and _alive(int(info.get("pid", 0))):
        try:
            with Client(info["url"], "", pinned_cert=info.get("tls_cert") or None, timeout=2) as client:
                health = client.health()
            # infras whose engine does not answer: their partitions are DOWN (``server status`` says so)
            return {**info, "answering": True, "unreachable": health.get("unreachable") or {}}
        except CorralError as exc:
            if exc.status == 503:  # up, with a failing control loop: still the server to talk to
                return {**info, "answering": True}
    return {"pid": pid or int(info.get("pid", 0)), "home": str(settings.home), "answering": False}


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)  # psutil's import alone would cost every command ~20 ms
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start(settings: Settings, timeout: float = 60.0, options: list[str] | None = None) -> dict[str, Any]:
    """This home's server, started (with ``options``: ``--host``, ``--tls-cert`` …) if none runs;
    one that holds the home but does not answer yet is waited for, never started beside."""
    info = running(settings)
    if info:
        return _answering(settings, info, timeout)
    _check_config(settings)
    settings.ensure_dirs()
    env = dict(os.environ, CORRAL_HOME=str(settings.home))
    with open(settings.server_log, "ab") as log:
        import subprocess  # only to start a server: every other command skips its import

        # -P: the directory this command runs in is not on the server's import path (as root,
        # a corral/ or json.py there would be imported in place of its own)
        proc = subprocess.Popen([sys.executable, "-P", "-m", "corral.server", *(options or [])], stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True, close_fds=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            info = running(settings)  # lost a start race to another CLI: use the winner
            if info:
                return _answering(settings, info, max(1.0, deadline - time.monotonic()))
            raise CorralError(f"the corral server exited with code {proc.returncode}: {_last_line(settings.server_log)}"
                              f" (log: {settings.server_log})")
        info = running(settings)
        if info and info.get("pid") == proc.pid and info["answering"]:
            return info
        time.sleep(0.05)
    # Said not to have come up, it must not come up later behind the user's back (nor linger
    # before it takes the home's lock, where `corral server stop` cannot see it): it is ended.
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    raise CorralError(f"the corral server did not come up in {timeout:.0f}s and was stopped; see "
                      f"{settings.server_log}")


def _answering(settings: Settings, info: dict[str, Any], timeout: float) -> dict[str, Any]:
    """The server holding the home, once it answers (it may still be starting)."""
    deadline = time.monotonic() + timeout
    while not info["answering"]:
        if time.monotonic() >= deadline:
            raise CorralError(f"corral server {info['pid']} holds {settings.home} but does not answer after "
                              f"{timeout:.0f}s; see {settings.server_log} (`corral server stop` ends it)")
        time.sleep(0.1)
        again = running(settings)
        if again is None:
            raise CorralError(f"corral server {info['pid']} of {settings.home} ended before it answered: "
                              f"{_last_line(settings.server_log)} (log: {settings.server_log})")
        info = again
    return info


def _check_config(settings: Settings) -> None:
    """Refuse to start a server on a config.yaml it would refuse: every problem with its line
    (exit 2 in the CLI), rather than a server that exits at once and the last line of its log."""
    from corral.site import load_site
    from corral.spec.loader import SpecError

    try:
        load_site(settings.config_path)
    except SpecError as exc:
        raise InvalidRequest(f"{settings.config_path} is not valid, so the corral server cannot start",
                             errors=[issue.as_dict() for issue in exc.issues]) from None


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return lines[-1] if lines else "no output"


def stop(settings: Settings, timeout: float = 15.0) -> bool:
    import psutil

    info = running(settings)
    deadline = time.monotonic() + 2
    while info and int(info["pid"]) <= 0 and time.monotonic() < deadline:  # it took the lock this instant
        time.sleep(0.05)
        info = running(settings)
    if not info:
        return False
    pid = int(info["pid"])
    if pid <= 0:
        raise CorralError(f"a process holds {settings.home}/server.lock without naming itself; see {settings.server_log}")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and psutil.pid_exists(pid):
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    if psutil.pid_exists(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return True


def client() -> Client:
    """The client every CLI command uses: CORRAL_SERVER, else this CORRAL_HOME's server
    (started on first use)."""
    return connect(Settings.from_env())


def locate(settings: Settings | None = None, autostart: bool = True) -> tuple[str, Presented]:
    """The server a client talks to and what it presents there: ``CORRAL_SERVER``, else the
    last ``corral login``, else this home's embedded server (started if ``autostart``)."""
    settings = settings or Settings.from_env()
    if settings.server_url:
        return settings.server_url, for_server(settings.server_url, settings.home)
    saved = SavedLogins().default()
    if saved is not None:
        if os.environ.get("CORRAL_HOME"):  # both given: say which wins, or a home's jobs seem to vanish
            print(f"corral: using {saved[0]} (your `corral login`), not the server of CORRAL_HOME={settings.home}; "
                  "`corral logout` or CORRAL_SERVER=URL to choose", file=sys.stderr)
        return saved[0], for_server(saved[0], settings.home)
    info = running(settings)
    if not info and autostart:
        info = start(settings)
        # A person whose first command quietly got a private, empty server of their own (a
        # second user on a shared machine, a typo in CORRAL_HOME) would wonder where the
        # shared queue went: say once what happened and how to reach another server.
        print(f"corral: started a server for {settings.home} (pid {info.get('pid')}, {info['url']}); "
              "to use another server instead: `corral login URL` or CORRAL_SERVER=URL", file=sys.stderr)
    if not info:
        raise CorralError(f"no corral server runs for {settings.home}; `corral server start` (or any "
                          "job command) starts one, `corral login URL` or CORRAL_SERVER=URL uses another")
    if not info["answering"]:  # it holds the home, still starting: waited for (never started beside)
        if not autostart:
            raise CorralError(f"corral server {info['pid']} of {settings.home} is starting and does not answer yet")
        info = _answering(settings, info, 20.0)
    return info["url"], for_server(info["url"], settings.home)


def connect(settings: Settings, autostart: bool = True) -> Client:
    url, presented = locate(settings, autostart)
    return Client(url, presented.token or "", ca_bundle=presented.ca_bundle, pinned_cert=presented.pinned_cert)
