"""Spec parsing over a corpus of valid and invalid files: every invalid file states, in its
first line, the field and line its error must name (``# error: FIELD @ LINE ~ TEXT``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from corral.spec import SpecError, load_job
from corral.spec.quantity import parse_accelerators, parse_cpus, parse_duration, parse_memory

SPECS = Path(__file__).parents[1] / "specs"
EXPECT = re.compile(r"# error: (?P<field>\S*) @ (?P<line>\d+) ~ (?P<text>.+)")


@pytest.mark.parametrize("path", sorted((SPECS / "invalid").glob("*.yaml")), ids=lambda p: p.stem)
def test_invalid_spec_names_field_and_line(path: Path) -> None:
    text = path.read_text()
    expect = EXPECT.match(text.splitlines()[0])
    assert expect, f"{path.name} lacks an '# error:' header"
    with pytest.raises(SpecError) as info:
        load_job(text, source=path.name)
    issues = info.value.issues
    match = [i for i in issues if i.field == expect["field"] and i.line == int(expect["line"])]
    assert match, f"no issue at {expect['field']}@{expect['line']}: {[str(i) for i in issues]}"
    assert expect["text"].strip() in match[0].message, match[0].message
    assert f"{path.name}:{expect['line']}:" in str(info.value)


@pytest.mark.parametrize("path", sorted((SPECS / "valid").glob("*.yaml")), ids=lambda p: p.stem)
def test_valid_spec_loads(path: Path) -> None:
    loaded = load_job(path.read_text(), source=path.name, default_name=path.stem)
    assert loaded.spec.tasks
    assert all(t.name for t in loaded.spec.tasks)


def test_single_task_fields() -> None:
    spec = load_job((SPECS / "valid/single-task.yaml").read_text(), default_name="single-task").spec
    (task,) = spec.tasks
    assert spec.name == task.name == "single-task"
    assert not spec.group and spec.primary_tasks == ("single-task",)
    assert task.num_nodes == 2
    assert (task.resources.gpu_type, task.resources.gpus) == ("H100", 8)
    assert task.resources.cpus == 4 and task.resources.memory == 32
    assert task.envs == {"LR": "0.001", "DEBUG": "true"}


def test_group_fields_and_warnings() -> None:
    loaded = load_job((SPECS / "valid/group.yaml").read_text())
    spec = loaded.spec
    assert spec.group and spec.name == "rl-job"
    assert [t.name for t in spec.tasks] == ["trainer", "rollout", "replay"]
    assert spec.primary_tasks == ("trainer",)
    assert spec.termination_delay == {"trainer": 10.0, "rollout": 10.0, "replay": 60.0}
    assert spec.task("trainer").resources.gpus == 4
    assert spec.task("rollout").resources.accelerators == ("H100", 1)
    assert spec.task("replay").resources.memory == pytest.approx(0.5)
    assert any("use_spot is ignored" in w for w in loaded.warnings)


def test_header_unknown_key_only_warns_and_all_tasks_primary() -> None:
    loaded = load_job((SPECS / "valid/group-all-primary.yaml").read_text())
    assert loaded.spec.primary_tasks == ("a", "b")
    assert loaded.spec.termination_delay == {"a": 30.0, "b": 30.0}
    assert any("extra_header_key" in w for w in loaded.warnings)


def test_name_and_env_overrides() -> None:
    text = "name: t\nenvs: {A: '1', TOKEN: null}\nrun: echo\n"
    spec = load_job(text, name="renamed", env={"TOKEN": "s3cret", "B": "2"}).spec
    assert spec.name == "renamed"
    assert spec.tasks[0].envs == {"A": "1", "TOKEN": "s3cret", "B": "2"}


def test_null_secrets_behave_like_null_envs() -> None:
    text = "name: t\nsecrets: {HF_TOKEN: null}\nrun: echo\n"
    with pytest.raises(SpecError) as info:
        load_job(text)
    assert info.value.issues[0].field == "secrets.HF_TOKEN" and info.value.issues[0].line == 2
    task = load_job(text, env={"HF_TOKEN": "s3cret", "B": "2"}).spec.tasks[0]
    assert task.secrets == {"HF_TOKEN": "s3cret"} and task.envs == {"B": "2"}  # a secret stays a secret


def test_workdir_is_resolved_and_must_exist(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    spec = load_job("workdir: code\nrun: ls\n", base_dir=str(tmp_path)).spec
    assert spec.tasks[0].workdir == str(tmp_path / "code")
    with pytest.raises(SpecError) as info:
        load_job("name: t\nworkdir: missing\n", base_dir=str(tmp_path))
    assert info.value.issues[0].field == "workdir" and info.value.issues[0].line == 2


def test_alias_bomb_and_size_limits() -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(8))
    with pytest.raises(SpecError, match="YAML nodes"):
        load_job(bomb)
    with pytest.raises(SpecError, match="larger than"):
        load_job("run: '" + "x" * (1 << 20) + "'\n")
    with pytest.raises(SpecError, match="deeper"):
        load_job("a: " + "[" * 40 + "]" * 40 + "\n")


def test_unsafe_yaml_tags_are_refused() -> None:
    with pytest.raises(SpecError):
        load_job("run: !!python/object/apply:os.system ['echo pwned']\n")


@pytest.mark.parametrize("text,seconds", [("30s", 30), ("5m", 300), ("1h30m", 5400), ("2d", 172800),
                                          (45, 45), ("01:02:03", 3723), ("1-00:00:00", 86400), ("10:30", 630)])
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["soon", "", "5x", -1, True, "1h 5q"])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_quantities() -> None:
    assert parse_accelerators("H100:8") == ("H100", 8)
    assert parse_accelerators("H100") == ("H100", 1)
    assert parse_accelerators({"A100": 2}) == ("A100", 2)
    assert parse_accelerators(4) == (None, 4)
    assert parse_cpus("4+") == 4 and parse_cpus(0.5) == 0.5
    assert parse_memory("32GB") == 32 and parse_memory("512MB") == 0.5 and parse_memory("1TB") == 1024
    for bad in ("H100:x", ["H100", "A100"], {"H100": 1, "A100": 1}, "H100:-1"):
        with pytest.raises(ValueError):
            parse_accelerators(bad)


def test_renamed_plain_job_keeps_its_task_primary() -> None:
    spec = load_job("name: orig\nrun: echo\n", name="renamed").spec
    assert spec.name == "renamed" and spec.tasks[0].name == "orig" and spec.primary_tasks == ("orig",)


def test_a_duplicate_key_is_an_error_with_both_lines() -> None:
    with pytest.raises(SpecError) as info:
        load_job("name: t\nrun: echo one\nresources: {cpus: 1}\nrun: echo two\n", source="dup.yaml")
    assert info.value.issues[0].line == 4 and "line 2" in info.value.issues[0].message
    assert "'run'" in info.value.issues[0].message


def test_a_container_task_keeps_its_image_and_options_through_storage() -> None:
    loaded = load_job((SPECS / "valid/container.yaml").read_text(), source="container.yaml")
    (task,) = loaded.spec.tasks
    assert task.resources.image == "nvcr.io/nvidia/pytorch:24.05-py3"
    assert [a.accelerators for a in task.resources.alternatives] == [("H100", 1), ("A100", 1)]
    assert task.config.docker.run_options == ("--shm-size", "16g", "--cap-add", "SYS_PTRACE",
                                              "--ulimit", "memlock=-1:-1")
    assert any("config.kubernetes is ignored" in w for w in loaded.warnings), loaded.warnings
    stored = loaded.spec.model_dump(mode="json")
    again = type(loaded.spec).model_validate(stored, context={})
    assert again.model_dump(mode="json") == stored
    # a cloud machine image is not a container: said, and dropped
    cloud = load_job("name: t\nresources: {image_id: ami-0123456789abcdef0}\nrun: echo\n", source="t.yaml")
    assert cloud.spec.tasks[0].resources.image is None
    assert any("cloud machine image" in w for w in cloud.warnings), cloud.warnings


def test_grow_into_idle_gpus_is_opt_in_and_validated() -> None:
    task = load_job("num_nodes: {min: 1, max: 8, initial: 2, grow: true}\nrun: x\n").spec.tasks[0]
    assert (task.num_nodes, task.min_nodes, task.max_nodes, task.grow) == (2, 1, 8, True)
    assert load_job("num_nodes: {min: 1, max: 8}\nrun: x\n").spec.tasks[0].grow is False
    refused = {
        "num_nodes: {min: 2, max: 2, grow: true}\nrun: x\n": "only between an elastic min and max",
        "num_nodes: {min: 1, max: 4, initial: 4, grow: true}\nrun: x\n": "starts at its max",
        "num_nodes: {min: 1, max: 4, grow: idle}\nrun: x\n": "grow: true or false",
        "num_nodes: {min: 1, max: 4, grow: true}\ngang_size: 2\nrun: x\n": "gangs",
    }
    for text, words in refused.items():
        with pytest.raises(SpecError, match="grow") as caught:
            load_job(text)
        assert words in str(caught.value)
    # a grow that leaves out max is told which bound is missing, on num_nodes' line
    with pytest.raises(SpecError, match=r"<spec>:2: .*num_nodes: .*max missing"):
        load_job("run: x\nnum_nodes: {min: 1, grow: true}\n")
    with pytest.raises(SpecError, match=r"<spec>:2: .*num_nodes: a whole number of replicas, or \{min: N, max: M\}"):
        load_job("run: x\nnum_nodes: two\n")
    with pytest.raises(SpecError, match=r"'intial': did you mean 'initial'\?"):
        load_job("run: x\nnum_nodes: {min: 1, max: 4, intial: 2}\n")


def test_a_grace_period_is_at_most_a_day() -> None:
    """A program that ignores its stop signal holds its GPUs for the whole grace period."""
    assert load_job("run: x\ngrace_period: 1d\n").spec.tasks[0].grace_period == 86400
    with pytest.raises(SpecError, match=r"<spec>:2: .*grace_period: .*less than or equal to 86400"):
        load_job("run: x\ngrace_period: 100000d\n")
