"""The embedded server (``corral server start``, or any command that starts one) imports
nothing from the directory the command runs in: started as root from a directory of someone
else's (a user's project), a ``corral/`` or ``json.py`` there would run as root."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


def test_the_embedded_server_imports_nothing_from_the_current_directory(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from corral import embedded
    from corral.settings import Settings

    started: list[list[str]] = []

    class Refused(Exception):
        pass

    def popen(argv, **kwargs):  # noqa: ANN001, ANN003
        started.append(list(argv))
        raise Refused

    (tmp_path / "cwd" / "corral").mkdir(parents=True)
    (tmp_path / "cwd" / "corral" / "__init__.py").write_text("raise SystemExit('imported from the cwd')\n")
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setattr(subprocess, "Popen", popen)
    with pytest.raises(Refused):
        embedded.start(Settings(home=tmp_path / "home", db_url=f"sqlite:///{tmp_path}/db", server_url=None))
    argv = started[0]
    probe = [*argv[:argv.index("-m")], "-c", "import corral, os; print(os.path.dirname(corral.__file__))"]
    monkeypatch.undo()
    done = subprocess.run(probe, cwd=tmp_path / "cwd", capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert os.path.realpath(done.stdout.strip()) != os.path.realpath(tmp_path / "cwd" / "corral")
