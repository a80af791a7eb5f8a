"""Starting, finding and stopping the embedded local server that the CLI uses when no
``CORRAL_SERVER`` is configured."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from corral.client import Client, CorralError
from corral.settings import Settings


def running(settings: Settings) -> dict[str, Any] | None:
    """The server.json of a live server of this CORRAL_HOME, or None."""
    try:
        info = json.loads(settings.server_file.read_text())
    except (OSError, ValueError):
        return None
    if not psutil.pid_exists(int(info.get("pid", 0))):
        return None
    try:
        httpx.get(f"{info['url']}/v1/health", timeout=2).raise_for_status()
    except httpx.HTTPError:
        return None
    return info


def start(settings: Settings, timeout: float = 20.0) -> dict[str, Any]:
    info = running(settings)
    if info:
        return info
    settings.ensure_dirs()
    env = dict(os.environ, CORRAL_HOME=str(settings.home))
    with open(settings.server_log, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "corral.server"], stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True, close_fds=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            info = running(settings)  # lost a start race to another CLI: use the winner
            if info:
                return info
            raise CorralError(f"the corral server exited with code {proc.returncode}: {_last_line(settings.server_log)}"
                              f" (log: {settings.server_log})")
        info = running(settings)
        if info and info.get("pid") == proc.pid:
            return info
        time.sleep(0.05)
    raise CorralError(f"the corral server did not come up in {timeout:.0f}s; see {settings.server_log}")


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return lines[-1] if lines else "no output"


def stop(settings: Settings, timeout: float = 15.0) -> bool:
    info = running(settings)
    if not info:
        return False
    pid = int(info["pid"])
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


def connect(settings: Settings, autostart: bool = True) -> Client:
    if settings.server_url:
        return Client(settings.server_url)
    info = start(settings) if autostart else running(settings)
    if not info:
        raise CorralError("no corral server is running; start one with `corral server start`")
    return Client(info["url"])
