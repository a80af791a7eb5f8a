"""The Python SDK against a live server: every way to submit, waiting, typed errors carrying
the server's message, and the example script end to end on the embedded default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import kill_leftovers

from corral.client import Client, Conflict, CorralError, InvalidRequest, NotFound, Unavailable

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def sdk(corral_home: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["CORRAL_HOME"] = str(corral_home)
    cli = [sys.executable, "-m", "corral.cli.main"]
    subprocess.run(cli + ["server", "start"], env=env, check=True, capture_output=True, timeout=120)
    url = (corral_home / "server.json").read_text()
    import json

    from corral.credentials import read_local_token

    with Client(json.loads(url)["url"], read_local_token(corral_home)) as client:  # as the server's owner
        client.env = env
        yield client
    subprocess.run(cli + ["server", "stop"], env=env, capture_output=True, timeout=120)
    kill_leftovers(corral_home)


def test_submit_every_way_wait_and_typed_errors(sdk, tmp_path: Path) -> None:
    from_text = sdk.submit("name: text\nrun: echo text\n")["job"]
    path = tmp_path / "job.yaml"
    path.write_text("name: file\nworkdir: .\nrun: pwd\n")
    from_file = sdk.submit(path, cwd=str(tmp_path))["job"]
    from_dict = sdk.submit({"name": "dict", "run": "echo dict"})["job"]
    group = sdk.submit([{"name": "grp", "execution": "parallel"}, {"name": "a", "run": "true"},
                        {"name": "b", "run": "true"}])["job"]
    assert [t["name"] for t in group["tasks"]] == ["a", "b"]
    for job in (from_text, from_file, from_dict, group):
        assert sdk.wait(job["id"], timeout=30)["state"] == "SUCCEEDED"
    assert b"".join(sdk.logs(from_file["id"])).decode().strip() == str(tmp_path)  # workdir: . is the submit dir
    with pytest.raises(InvalidRequest) as bad:
        sdk.submit("name: t\nresources:\n  acelerators: H100:1\n", source="bad.yaml")
    assert bad.value.status == 422 and bad.value.errors[0]["field"] == "resources.acelerators"
    assert bad.value.errors[0]["line"] == 3
    with pytest.raises(NotFound):
        sdk.job(999999)
    long = sdk.submit("name: long\nrun: sleep 60\n")["job"]
    twin = sdk.submit("name: long\nrun: sleep 60\n")["job"]  # a namesake: it runs, under a domain of its own
    assert twin["name"] == "long" and twin["domain"] == f"long-{twin['id']}"
    sdk.cancel(twin["id"])
    assert sdk.wait(twin["id"], timeout=30)["state"] == "CANCELLED"
    with pytest.raises(Conflict):
        sdk.hold(twin["id"])  # only a pending job can be held
    with pytest.raises(TimeoutError):
        sdk.wait(long["id"], timeout=0.5)
    assert sdk.wait(long["id"], states=("RUNNING",), timeout=30)["state"] == "RUNNING"
    sdk.cancel(long["id"])
    assert sdk.wait(long["id"], timeout=30)["state"] == "CANCELLED"
    assert isinstance(bad.value, CorralError)
    with pytest.raises(Unavailable):
        Client("http://127.0.0.1:9", timeout=2).health()


def test_the_sdk_example_runs_on_the_embedded_default(corral_home: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["CORRAL_HOME"] = str(corral_home)
    try:
        done = subprocess.run([sys.executable, str(ROOT / "examples" / "sdk" / "launch_and_scale.py")], env=env,
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "through the endpoint: hello from web-0" in done.stdout
        assert "answered from: hello from web-0, hello from web-1, hello from web-2" in done.stdout
    finally:
        subprocess.run([sys.executable, "-m", "corral.cli.main", "server", "stop"], env=env, capture_output=True,
                       timeout=120)
        kill_leftovers(corral_home)
