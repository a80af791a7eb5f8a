"""CORRAL_HOME is its owner's alone (the database holds jobs' secrets, logs may print them),
while replicas still create files as the user would, with the umask the server started with."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

from conftest import kill_leftovers, wait_for


def test_home_is_private_and_replicas_keep_the_users_umask(corral_home: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(CORRAL_HOME=str(corral_home), SERVER_ONLY_SECRET="s3cret")
    out = tmp_path / "made-by-the-job"
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: files\nrun: echo hello > {out}; echo secret=${{SERVER_ONLY_SECRET:-none}}\n")

    def corral(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "corral.cli.main", *args], env=env, capture_output=True,
                              text=True, timeout=60, preexec_fn=lambda: os.umask(0o022))

    try:
        done = corral("launch", str(spec))
        assert done.returncode == 0, done.stderr
        wait_for(lambda: out.exists())
        assert stat.S_IMODE(out.stat().st_mode) == 0o644  # the user's umask, not the server's
        assert "secret=none" in done.stdout  # the server's own environment does not reach jobs
        for path in [corral_home, corral_home / "corral.db", corral_home / "server.json", corral_home / "logs",
                     corral_home / "server.log", *corral_home.glob("logs/*/*.log")]:
            mode = stat.S_IMODE(path.stat().st_mode)
            assert mode & 0o077 == 0, f"{path} is {oct(mode)}"
    finally:
        corral("server", "stop")
        time.sleep(0.2)
        kill_leftovers(corral_home)
