"""One server per database: two CORRAL_HOMEs pointed at one CORRAL_DB_URL must not both run
control loops over the same jobs (each would start them), so the second server refuses to
start, saying why, until the first is gone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import POOL

from corral.store.database import redacted


def cli(home: Path, db_url: str, *args: str, module: str = "corral.cli.main") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(CORRAL_HOME=str(home), CORRAL_DB_URL=db_url)
    return subprocess.run([sys.executable, "-m", module, *args], env=env, capture_output=True, text=True, timeout=60)


def test_a_second_server_on_the_same_database_refuses_to_start(db_url: str, tmp_path: Path) -> None:
    homes = [tmp_path / "a", tmp_path / "b"]
    for home in homes:
        home.mkdir()
        (home / "config.yaml").write_text(POOL)
    try:
        first = cli(homes[0], db_url, "server", "start")
        assert first.returncode == 0, first.stderr
        second = cli(homes[1], db_url, "server", "start")
        assert second.returncode != 0
        assert "another corral server already runs jobs from the database" in second.stderr
        assert not (homes[1] / "server.json").exists()
        assert cli(homes[1], db_url, "queue").returncode != 0  # nor does a command start one behind its back
        same_home = cli(homes[0], db_url, module="corral.server")
        assert same_home.returncode == 3 and "already serves" in same_home.stderr
        assert cli(homes[0], db_url, "server", "stop").returncode == 0
        again = cli(homes[1], db_url, "server", "start")  # the claim went with the first server
        assert again.returncode == 0, again.stderr
    finally:
        for home in homes:
            cli(home, db_url, "server", "stop")


def test_the_refusal_does_not_print_a_database_password() -> None:
    shown = redacted("postgresql+psycopg://corral:s3cret@db.example:5432/corral")
    assert "s3cret" not in shown and "db.example:5432/corral" in shown
