"""The CLI as a person and a script meet it: read commands that import nothing heavy (a
person waits for every command's start-up), a closed pipe, JSON without stringly nulls,
readable SDK errors, a READY column, a quiet server log under readiness probes, and words
where the CLI used to be silent (a server started on first use, a site without GPUs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cli_for, wait_for

# What a read command must never import: each costs a large part of a command's start-up
# (pydantic and the spec validators alone ~0.2 s; http.client's email and ssl ~13 ms of a ~50 ms
# command) and none is needed to print a table from a plain-http server.
HEAVY = ("pydantic", "yaml", "sqlalchemy", "fastapi", "starlette", "uvicorn", "rich", "psutil", "httpx", "click",
         "ray", "corral.spec.loader", "corral.spec.models", "corral.scheduler", "corral.control", "lzma",
         "http.client", "email", "ssl", "h11")


@pytest.fixture
def corral(corral_home: Path):
    run = cli_for(corral_home)
    yield run
    run.stop()


def _imports_of(run, *args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run one CLI command in a fresh interpreter and list the heavy modules it imported."""
    probe = ("import atexit, sys\n"
             f"HEAVY = {HEAVY!r}\n"
             "def report():\n"
             "    seen = sorted(m for m in sys.modules if any(m == h or m.startswith(h + '.') for h in HEAVY))\n"
             "    sys.stderr.write('IMPORTED=' + ','.join(seen) + '\\n')\n"
             "atexit.register(report)\n"
             "from corral.cli.main import main\n"
             f"main({list(args)!r})\n")
    done = subprocess.run([sys.executable, "-c", probe], env=run.env, capture_output=True, text=True, timeout=120)
    line = next(x for x in done.stderr.splitlines() if x.startswith("IMPORTED="))
    return done, {m for m in line.removeprefix("IMPORTED=").split(",") if m}


def test_read_commands_import_nothing_heavy(corral, tmp_path: Path) -> None:
    # an array whose pending elements fold into one row (the fold used to load the spec package)
    blocker = tmp_path / "b.yaml"
    blocker.write_text("name: blocker\nnum_nodes: 2\nresources: {accelerators: H100:4}\nrun: sleep 60\n")
    corral("launch", "-d", str(blocker), check=True)
    script = tmp_path / "arr.sh"
    script.write_text("#!/bin/bash\n#SBATCH --array=0-5\n#SBATCH --gpus=4\nsleep 30\n")
    corral("sbatch", str(script), check=True)
    job = json.loads(corral("queue", "--json", check=True).stdout)[0]["id"]
    queue = corral("queue", check=True).stdout
    assert "_[" in queue  # the array's waiting elements are one folded row
    for command in (["queue"], ["queue", "--all"], ["queue", "--json"], ["nodes"], ["status", str(job)],
                    ["events", str(job)], ["acct"], ["whoami"], ["share"]):
        done, heavy = _imports_of(corral, *command)
        assert done.returncode == 0, (command, done.stderr)
        assert heavy == set(), f"corral {' '.join(command)} imported {sorted(heavy)}"


def test_a_closed_pipe_ends_a_command_quietly(corral) -> None:
    corral("queue", check=True)  # the server runs
    script = ("import os\n"
              "r, w = os.pipe(); os.close(r); os.dup2(w, 1)\n"  # the reader is gone, as with `| head -0`
              "from corral.cli.main import main\n"
              "main(['acct', '--format', 'csv'])\n")
    done = subprocess.run([sys.executable, "-c", script], env=corral.env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 141 and "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_json_reason_is_null_when_nothing_holds_a_job_back(corral, tmp_path: Path) -> None:
    spec = tmp_path / "t.yaml"
    spec.write_text("name: quick\nrun: echo hi\n")
    job = corral("launch", "-d", str(spec), check=True).stdout.strip()
    wait_for(lambda: json.loads(corral("status", job, "--json", check=True).stdout)["state"] == "SUCCEEDED", timeout=60)
    data = json.loads(corral("status", job, "--json", check=True).stdout)
    assert data["reason"] is None
    assert all(j["reason"] != "None" for j in json.loads(corral("queue", "--all", "--json", check=True).stdout))


def test_status_has_a_ready_column(corral, tmp_path: Path) -> None:
    spec = tmp_path / "svc.yaml"
    spec.write_text("name: svc\nnum_nodes: 2\nrun: sleep 60\n")
    job = corral("launch", "-d", str(spec), check=True).stdout.strip()
    wait_for(lambda: all(r["state"] == "RUNNING" for r in json.loads(
        corral("status", job, "--json", check=True).stdout)["tasks"][0]["replicas"]), timeout=60)
    lines = corral("status", job, check=True).stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("REPLICA\t"))
    header = lines[at].split("\t")
    rows = [line.split("\t") for line in lines[at + 1:]]
    assert header[3] == "READY" and [r[3] for r in rows] == ["yes", "yes"]
    corral("cancel", job, check=True)


def test_sdk_errors_carry_their_field_messages() -> None:
    from corral.client import InvalidRequest

    exc = InvalidRequest("hello.yaml is not a valid job", 400,
                         [{"document": "task", "field": "resources.acelerators", "line": 3, "message": "unknown field"}])
    assert str(exc) == "hello.yaml is not a valid job\n  line 3: task: resources.acelerators: unknown field"
    assert str(InvalidRequest("plain", 400)) == "plain"


def test_whoami_never_starts_a_server_and_others_say_they_did(tmp_path: Path) -> None:
    home = tmp_path / "fresh"
    run = cli_for(home)
    try:
        who = run("whoami")
        assert who.returncode == 1 and "no corral server runs for" in who.stderr and "corral login" in who.stderr
        assert not (home / "server.json").exists()
        first = run("queue", check=True)
        assert "started a server for" in first.stderr and "CORRAL_SERVER" in first.stderr
        again = run("queue", check=True)
        assert "started a server" not in again.stderr  # said once, when it happened
        assert run("whoami", check=True).stdout.startswith(f"{os.environ.get('USER') or ''}")
    finally:
        run.stop()


@pytest.mark.parametrize("site_config", ["nodes:\n  - {name: box, cpus: 4, memory: 8}\n"])
def test_a_gpu_job_on_a_site_without_gpus_says_where_gpus_are_declared(corral, tmp_path: Path) -> None:
    spec = tmp_path / "hello.yaml"
    spec.write_text("name: hello\nresources: {accelerators: H100:1}\nrun: echo hi\n")
    refused = corral("launch", str(spec))
    assert refused.returncode == 2 and "this site has no GPUs" in refused.stderr and "config.yaml" in refused.stderr


def test_readiness_probes_do_not_fill_the_server_log(corral, tmp_path: Path) -> None:
    (tmp_path / "serve.py").write_text(
        "import http.server, os\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.end_headers(); self.wfile.write(b'ok')\n"
        "    def log_message(self, *a): pass\n"
        "http.server.HTTPServer((os.environ['CORRAL_ADDR'], int(os.environ['CORRAL_PORT_HTTP'])), H).serve_forever()\n")
    spec = tmp_path / "svc.yaml"
    spec.write_text(f"name: probed\nports: {{http: 8000}}\nrun: {sys.executable} {tmp_path / 'serve.py'}\n"
                    "readiness_probe: {http: {port: http, path: /}, period: 0.1s}\n")
    job = corral("launch", "-d", str(spec), check=True).stdout.strip()
    wait_for(lambda: json.loads(corral("status", job, "--json", check=True).stdout)["tasks"][0]["replicas"][0]["ready"],
             timeout=60)
    import time

    time.sleep(2)  # twenty probes more
    log = (corral.home / "server.log").read_text()
    assert "HTTP Request" not in log and "GET http" not in log
    corral("cancel", job, check=True)


def test_status_says_what_job_recovery_became(corral, tmp_path: Path) -> None:
    spec = tmp_path / "flaky.yaml"
    spec.write_text("name: flaky\nresources:\n  job_recovery: {max_restarts_on_errors: 1}\nrun: exit 7\n")
    job = corral("launch", "-d", str(spec), check=True).stdout.strip()
    wait_for(lambda: json.loads(corral("status", job, "--json", check=True).stdout)["state"] == "FAILED", timeout=60)
    data = json.loads(corral("status", job, "--json", check=True).stdout)
    assert data["tasks"][0]["restart"] == "on failure, at most 1 time"
    assert data["tasks"][0]["replicas"][0]["restarts"] == 1
    assert "task flaky: restarts on failure, at most 1 time" in corral("status", job, check=True).stdout


def test_env_and_secret_without_a_value_take_this_shells(corral_home: Path, tmp_path: Path) -> None:
    run = cli_for(corral_home, env={"HF_TOKEN": "hf-from-shell", "API_KEY": "key-from-shell"})
    try:
        out = tmp_path / "seen"
        spec = tmp_path / "t.yaml"
        spec.write_text(f"name: tok\nrun: echo \"$HF_TOKEN $API_KEY $OTHER\" > {out}\n")
        job = run("launch", "-d", "--env", "HF_TOKEN", "--secret", "API_KEY", "--secret", "OTHER=given",
                  str(spec), check=True).stdout.strip()
        wait_for(lambda: json.loads(run("status", job, "--json", check=True).stdout)["state"] == "SUCCEEDED",
                 timeout=60)
        assert out.read_text().split() == ["hf-from-shell", "key-from-shell", "given"]
        missing = run("launch", "-d", "--env", "NOT_SET_ANYWHERE", str(spec))
        assert missing.returncode == 2 and "NOT_SET_ANYWHERE is not set in this shell" in missing.stderr
    finally:
        run.stop()


def test_a_server_said_not_to_have_come_up_does_not_come_up_later(tmp_path: Path) -> None:
    import psutil

    from corral import embedded
    from corral.client import CorralError
    from corral.settings import Settings

    home = tmp_path / "slow"
    home.mkdir()
    settings = Settings(home=home, db_url=f"sqlite:///{home / 'corral.db'}")
    with pytest.raises(CorralError) as refused:
        embedded.start(settings, timeout=0.05)  # no server imports its libraries that fast
    assert "did not come up" in str(refused.value) and "was stopped" in str(refused.value)

    def servers_of_home() -> list[int]:
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            try:
                if "corral.server" in " ".join(proc.info["cmdline"] or []) and \
                        proc.environ().get("CORRAL_HOME") == str(home):
                    found.append(proc.pid)
            except psutil.Error:
                continue
        return found

    assert servers_of_home() == []
    import time

    time.sleep(3)  # it would have taken the home by now
    assert servers_of_home() == [] and embedded.running(settings) is None


def test_a_long_array_is_one_row_however_long(corral, tmp_path: Path) -> None:
    """The default queue lists the first 100 pending jobs; an array longer than that was folded
    from what the page held (``7_[0-99]``), not the array (``7_[0-149]``)."""
    spec = tmp_path / "a.yaml"
    spec.write_text("name: sweep\nrun: 'true'\n")
    corral("launch", "-d", "-H", "--array", "0-149", str(spec), check=True)
    rows = corral("queue", check=True).stdout.splitlines()
    sweep = [r for r in rows if "sweep" in r]
    assert len(sweep) == 1 and "_[0-149]" in sweep[0], rows


def test_array_elements_are_named_array_index_everywhere(corral, tmp_path: Path) -> None:
    spec = tmp_path / "e.yaml"
    spec.write_text("name: elems\nrun: 'true'\n")
    corral("launch", "-d", "-H", "--array", "0-2", str(spec), check=True)
    rows = json.loads(corral("queue", "--json", check=True).stdout)
    first = next(r for r in rows if r["name"] == "elems")
    array, second = first["array_job_id"], next(r for r in rows if r["name"] == "elems" and r["array_index"] == 1)
    assert f"Job {array}_1 ({second['id']})" in corral("status", f"{array}_1", check=True).stdout
    assert corral("cancel", f"{array}_2", check=True).stdout.strip() == f"Job {array}_2: cancelling"
    acct = corral("acct", check=True).stdout
    assert [line.split()[0] for line in acct.splitlines()[1:]] == [f"{array}_0", f"{array}_1", f"{array}_2"], acct
    data = json.loads(corral("acct", "--json", check=True).stdout)
    assert {(r["array_job_id"], r["array_index"]) for r in data if r["name"] == "elems"} == {(array, 0), (array, 1),
                                                                                             (array, 2)}


def test_an_answer_of_another_shape_is_one_line_never_a_traceback(tmp_path: Path) -> None:
    """Another program on the server's port answering JSON corral's server never gives: every
    command says so in a line and exits 1 (CORRAL_DEBUG=1 shows the traceback)."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    bodies = [b'{"jobs": 5}', b'[1, 2]', b'{"state": null}', b"[" * 50000 + b"]" * 50000]

    def serve() -> None:
        n = 0
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                body = bodies[n % len(bodies)]
                n += 1
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                             b"content-length: %d\r\n\r\n" % len(body) + body)

    threading.Thread(target=serve, daemon=True).start()
    env = {**os.environ, "CORRAL_SERVER": f"http://127.0.0.1:{server.getsockname()[1]}", "CORRAL_TOKEN": "t",
           "XDG_CONFIG_HOME": str(tmp_path), "CORRAL_HOME": str(tmp_path / "home")}
    env.pop("CORRAL_DEBUG", None)
    try:
        for args in (["queue"], ["status", "1"], ["acct"], ["nodes"], ["status", "2"], ["whoami"]):
            done = subprocess.run([sys.executable, "-m", "corral.cli.main", *args], env=env, capture_output=True,
                                  text=True, timeout=60)
            assert done.returncode == 1 and "Traceback" not in done.stderr, (args, done.stderr)
            assert len(done.stderr.strip().splitlines()) == 1, (args, done.stderr)
    finally:
        server.close()
