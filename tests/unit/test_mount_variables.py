"""SkyPilot's ``${VAR}`` in ``file_mounts`` and ``workdir``: filled when the file is read from
the task's ``envs``, ``--env`` winning, as ``sky launch`` does (``corral.spec.mounts.fill_variables``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.spec import SpecError, load_job

TEXT = """name: t
envs: {SRC: ./data, SIZE: 13b, N: 13, KEY: null}
secrets: {TOKEN: ./data}
workdir: ./${SIZE}
file_mounts:
  /ckpt/${SIZE}: ${SRC}/$SIZE
  /n/$N: ./data
run: ls
"""


@pytest.fixture
def base(tmp_path: Path) -> Path:
    (tmp_path / "data" / "13b").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    (tmp_path / "13b").mkdir()
    (tmp_path / "7b").mkdir()
    return tmp_path


def test_envs_fill_remote_paths_sources_and_the_workdir(base: Path) -> None:
    task = load_job(TEXT, base_dir=str(base), env={"KEY": "k"}).spec.tasks[0]
    assert task.file_mounts == {"/ckpt/13b": str(base / "data" / "13b"), "/n/13": str(base / "data")}
    assert task.workdir == str(base / "13b")


def test_env_given_at_launch_wins(base: Path) -> None:
    (base / "other" / "7b").mkdir()
    task = load_job(TEXT, base_dir=str(base), env={"KEY": "k", "SIZE": "7b", "SRC": str(base / "other")}).spec.tasks[0]
    assert task.file_mounts["/ckpt/7b"] == str(base / "other" / "7b") and task.workdir == str(base / "7b")


def test_a_name_nothing_sets_stays_and_its_error_names_the_field_and_line(base: Path) -> None:
    text = TEXT.replace("${SRC}/$SIZE", "${TOKEN}/$NOPE")  # a secret never fills a path
    with pytest.raises(SpecError) as caught:
        load_job(text, base_dir=str(base), env={"KEY": "k"}, source="f.yaml")
    said = str(caught.value)
    assert "f.yaml:6: task 't': file_mounts./ckpt/13b:" in said and "${TOKEN}/$NOPE" in said, said


def test_a_group_s_tasks_fill_from_their_own_envs(base: Path) -> None:
    text = """name: g
execution: parallel
---
name: a
envs: {D: data}
file_mounts: {/in: ./$D}
run: ls
---
name: b
envs: {D: other}
file_mounts: {/in: ./$D}
run: ls
"""
    tasks = {t.name: t for t in load_job(text, base_dir=str(base)).spec.tasks}
    assert tasks["a"].file_mounts == {"/in": str(base / "data")}
    assert tasks["b"].file_mounts == {"/in": str(base / "other")}
