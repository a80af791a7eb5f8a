"""A corpus of hostile job files sent to a real server: YAML bombs, deep nesting, huge and
binary files, Unicode, absurd resources, path tricks, shell metacharacters, NUL bytes,
duplicate keys. Each must get a clear 422 naming the field (and line where there is one),
quickly and briefly; nothing may be stored; the server must stay up and keep scheduling.
Some look hostile but are legitimate (a shell pipeline in ``run``, Unicode output): those run."""

from __future__ import annotations

from conftest import submit, wait_state
import time

import pytest



def _bomb(levels: int = 9) -> str:
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\nrun: echo\n"


# (case id, YAML text, field the error names ("" for the file as a whole), a word of the message, line or None)
REFUSED = [
    ("billion-laughs", _bomb(), "", "YAML nodes", None),
    ("recursive-alias", "a: &a [*a]\nrun: echo\n", "", "", None),
    ("deep-lists", "run: echo\nx: " + "[" * 5000 + "]" * 5000 + "\n", "", "nests deeper", 2),
    ("deep-maps", "run: echo\nx: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n", "", "nests deeper", 2),
    ("huge-file", "run: echo\n# " + "x" * (2 << 20) + "\n", "", "larger than", None),
    ("binary", bytes(range(256)).decode("latin-1"), "", "invalid YAML", None),
    ("control-chars", "run: echo\x07\x1b[31m\n", "", "invalid YAML", None),
    ("tabs", "run: echo\nresources:\n\tcpus: 1\n", "", "invalid YAML", 3),
    ("python-tag", "run: !!python/object/apply:os.system ['touch /tmp/pwned']\n", "", "constructor", 1),
    ("not-a-mapping", "- run: echo\n", "", "mapping", 1),
    ("empty", "# nothing here\n", "", "no task", None),
    ("duplicate-key", "name: a\nrun: echo\nname: b\n", "", "line 1 and again on line 3", 3),
    ("nested-duplicate", "run: echo\nresources:\n  cpus: 1\n  cpus: 2\n", "", "duplicate key 'cpus'", 4),
    ("non-string-key", "1: x\nrun: echo\n", "[1]", "", 1),
    ("unhashable-key", "? [a, b]\n: c\nrun: echo\n", "", "unhashable", None),
    ("unicode-name", "name: 训练\nrun: echo\n", "name", "letters, digits", 1),
    ("shell-name", "name: 'a;rm -rf ~'\nrun: echo\n", "name", "letters, digits", 1),
    ("path-name", "name: ../../etc/passwd\nrun: echo\n", "name", "letters, digits", 1),
    ("long-name", "name: " + "n" * 10_000 + "\nrun: echo\n", "name", "at most 63", 1),
    ("shell-env-key", "envs: {'A;B': x}\nrun: echo\n", "envs", "environment variable", 1),
    ("nul-run", 'run: "echo \\0 hi"\n', "run", "NUL", 1),
    ("nul-env", 'envs: {A: "x\\0y"}\nrun: echo\n', "envs.A", "NUL", 1),
    ("nul-key", 'envs: {"A\\0": x}\nrun: echo\n', "envs.A\\0", "NUL", 1),
    ("run-boolean", "run: true\n", "run", "quote it", 1),
    ("run-date", "run: 2024-01-01\n", "run", "quote it", 1),
    ("gpus-infinite", "resources: {accelerators: 'H100:1e309'}\nrun: echo\n", "resources.accelerators", "finite", 1),
    ("gpus-nan", "resources: {accelerators: {H100: .nan}}\nrun: echo\n", "resources.accelerators", "finite", 1),
    ("gpus-fraction", "resources: {accelerators: H100:0.5}\nrun: echo\n", "resources.accelerators", "fractional", 1),
    ("gpus-absurd", "resources: {accelerators: H100:1000000}\nrun: echo\n", "resources", "", None),
    ("memory-infinite", "resources: {memory: .inf}\nrun: echo\n", "resources.memory", ">= 0", 1),
    ("cpus-negative", "resources: {cpus: -4}\nrun: echo\n", "resources.cpus", "> 0", 1),
    ("nodes-absurd", "num_nodes: 99999999999999999999999\nrun: echo\n", "num_nodes", "4096", 1),
    ("port-out-of-range", "ports: {http: 99999}\nrun: echo\n", "ports", "1..65535", 1),
    ("grace-negative", "grace_period: -5\nrun: echo\n", "grace_period", ">= 0", 1),
    ("workdir-escape", "workdir: ../../../../../../../nonexistent-dir\nrun: echo\n", "workdir", "not a directory", 1),
    ("many-documents", "execution: parallel\n" + "---\nrun: x\n" * 5000, "name", "needs a name", None),
]

ACCEPTED = [
    ("shell-pipeline", "name: pipe\nrun: |\n  echo \"$HOME\" | tr a-z A-Z > /dev/null; echo 'a;b' && (exit 0)\n", "a;b"),
    ("unicode-output", "name: uni\nenvs: {GREETING: 'héllo 训练 🚀'}\nrun: echo \"$GREETING\"\n", "héllo 训练 🚀"),
    ("quoted-true", "name: quoted\nrun: 'true'\n", ""),
]


def test_hostile_files_get_a_clear_error_and_nothing_is_stored(server, tmp_path) -> None:
    problems = []
    for case, text, field, words, line in REFUSED:
        t0 = time.monotonic()
        response = server.post("/v1/jobs", json={"yaml": text, "source": f"{case}.yaml", "base_dir": str(tmp_path)})
        took = time.monotonic() - t0
        if response.status_code != 422:
            problems.append(f"{case}: {response.status_code} {response.text[:200]}")
            continue
        errors = response.json()["detail"]["errors"]
        first = errors[0]
        if not any(e["field"] == field and words in e["message"] for e in errors):
            problems.append(f"{case}: no error on {field!r} saying {words!r}: {errors[:2]}")
        if line is not None and not any(e["line"] == line for e in errors):
            problems.append(f"{case}: line {line} not named: {first}")
        if len(response.content) > 20_000 or took > 5:
            problems.append(f"{case}: {len(response.content)} bytes in {took:.1f}s")
    assert not problems, "\n".join(problems)
    assert server.get("/v1/jobs", params={"all": True}).json() == []
    assert server.get("/v1/health").json()["status"] == "ok"


@pytest.mark.parametrize("case,text,output", ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_hostile_looking_but_legitimate_files_run(server, case: str, text: str, output: str) -> None:
    job = submit(server, text)
    done = wait_state(server, job["id"], "SUCCEEDED", "FAILED")
    assert done["state"] == "SUCCEEDED", done
    assert output in server.get(f"/v1/jobs/{job['id']}/logs").content.decode()
