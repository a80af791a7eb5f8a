"""CORRAL_HOME is its owner's alone (the database holds jobs' secrets, logs may print them),
while replicas still create files as the user would, with the umask the server started with."""

from __future__ import annotations

import stat
from pathlib import Path

from conftest import cli_for, wait_for


def test_home_is_private_and_replicas_keep_the_users_umask(corral_home: Path, tmp_path: Path) -> None:
    # the server is started from a shell holding a secret; the job is submitted from one without it
    cli_for(corral_home, {"SERVER_ONLY_SECRET": "s3cret"}, umask=0o022)("server", "start", check=True)
    corral = cli_for(corral_home, umask=0o022)
    out = tmp_path / "made-by-the-job"
    spec = tmp_path / "job.yaml"
    spec.write_text(f"name: files\nrun: echo hello > {out}; echo secret=${{SERVER_ONLY_SECRET:-none}}\n")

    try:
        done = corral("launch", str(spec))
        assert done.returncode == 0, done.stderr
        wait_for(lambda: out.exists())
        assert stat.S_IMODE(out.stat().st_mode) == 0o644  # the user's umask, not the server's
        assert "secret=none" in done.stdout  # the server's own environment does not reach jobs
        for path in [corral_home, corral_home / "corral.db", corral_home / "server.json", corral_home / "logs",
                     corral_home / "server.log", *corral_home.glob("logs/*/*.log")]:
            mode = stat.S_IMODE(path.stat().st_mode)
            # a root server's directories may be passed through (0711) by its jobs' accounts, never read
            assert mode & (0o066 if path.is_dir() else 0o077) == 0, f"{path} is {oct(mode)}"
    finally:
        corral.stop()
