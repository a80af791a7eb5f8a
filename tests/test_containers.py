"""Replicas in containers (``resources.image_id: docker:IMAGE``) on the node's Podman, with
real images and a real private registry (``container_lab``: no network needed):

* a job group with one task in a container and one not: the client reaches the container's
  server by its corral name and declared port, and inside, the replica has its environment,
  host name, working directory, checkpoint directory and its exec probe;
* a wrong image fails the replica with the registry's words, and leaves no container;
* cancel, and a wrapper killed with SIGKILL, leave no container (the engine's client dies
  first; the container is ended by name);
* a private image runs with the login in the job's secrets, is refused without it, also
  after another job pulled it with its login;
* a server killed with SIGKILL: the next one adopts the running container (one container,
  the same), and cancel ends it."""

from __future__ import annotations

import json
import os
import signal
import time
import socket
from pathlib import Path

import pytest

from conftest import POOL, cli_for, cli_events, cli_status, submit, wait_for, wait_state
from container_lab import IMAGE, MARKER, SITE, containers_of, ensure_image, start_registry


@pytest.fixture(scope="module", autouse=True)
def image() -> str:
    return ensure_image()


@pytest.fixture
def site_config() -> str:
    return POOL + SITE


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scope(server) -> str:
    return server.state.loop.inventory.executors["local"].runner.trees.scope


def _events(server, job_id: int) -> list[str]:
    """What the job's events said, and its log (for a failure's message)."""
    said = [f"{e['subject']}: {e['message'] or e['cause']}" for e in server.get(f"/v1/jobs/{job_id}/events").json()]
    return said + [server.get(f"/v1/jobs/{job_id}/logs").text[-2000:]]


def _slow_podman(tmp_path: Path, seconds: int, then: str = "", gate: Path | None = None) -> Path:
    """A node whose engine is slow to pull: podman behind a script that waits first (``seconds``;
    with a ``gate``, until that file exists, at most ``seconds``: a test that asks what is seen
    during the pull then does not race its end)."""
    import shutil

    slow = tmp_path / "slow-podman"
    wait = f"sleep {seconds}" if gate is None else \
        f"n=0; while [ ! -e '{gate}' ] && [ $n -lt {seconds * 20} ]; do sleep 0.05; n=$((n + 1)); done"
    slow.write_text(f'#!/bin/sh\nif [ "$1" = pull ]; then {wait}; {then or ":"}; fi\n'
                    f'exec {shutil.which("podman")} "$@"\n')
    slow.chmod(0o755)
    return slow


def _private_job(server, registry, name: str, run: str, engine: Path) -> dict:
    """A job of the registry's private image (its login in the job's secrets), on ``engine``."""
    launcher = server.state.loop.launcher
    launcher.containers = launcher.containers.model_copy(update={"engine": str(engine)})
    login = f"secrets: {{SKYPILOT_DOCKER_USERNAME: {registry.user}, SKYPILOT_DOCKER_PASSWORD: {registry.password}}}\n"
    return submit(server, f"name: {name}\nresources: {{image_id: docker:{registry.image('private/busybox:1')}}}\n"
                          f"run: {run}\n" + login)


def test_a_group_with_one_task_in_a_container_and_one_not(server, tmp_path: Path) -> None:
    port = _free_port()
    job = submit(server, f"""
name: web
execution: parallel
primary_tasks: [client]
---
name: server
resources: {{image_id: docker:{IMAGE}}}
ports: {{http: {port}}}
envs: {{GREETING: hello}}
run: |
  {{ echo "$GREETING $(id -u) $(hostname) $(pwd) $CORRAL_TASK $CORRAL_REPLICA $CORRAL_PORT_HTTP"
    test -e {MARKER} && echo inside; echo "$CORRAL_ATTEMPT $CORRAL_LAUNCH_KEY $SLURMD_NODENAME"
  }} > "$CORRAL_CHECKPOINT_DIR/seen.txt"
  exec httpd -f -p "$CORRAL_PORT_HTTP" -h /www
readiness_probe: {{exec: "test -e {MARKER}", period: 0.2s}}
---
name: client
depends_on: [{{task: server, condition: ready}}]
run: |
  test ! -e {MARKER} && curl -sf "http://server-0.web:{port}/index.html" > "$CORRAL_CHECKPOINT_DIR/got.txt"
""")
    done = wait_state(server, job["id"], "SUCCEEDED", "FAILED", timeout=60)
    assert done["state"] == "SUCCEEDED", _events(server, job["id"])
    checkpoints = Path(server.state.settings.checkpoints_dir) / str(job["id"])
    assert (checkpoints / "client" / "got.txt").read_text() == "served from a container\n"
    seen = (checkpoints / "server" / "seen.txt").read_text().split("\n")
    assert seen[0].split() == ["hello", str(os.getuid()), "server-0.web", str(Path.cwd()), "server", "0", str(port)]
    assert seen[1] == "inside"
    # its processes carry the attempt's mark (``proctree.attempt_mark``) and its node's name, as outside
    attempt, key, node = seen[2].split()
    replica = next(t for t in server.get(f"/v1/jobs/{job['id']}").json()["tasks"] if t["name"] == "server")["replicas"][0]
    assert attempt == f"{key}@{_scope(server)}" and node == replica["node"], (seen, replica)
    assert containers_of(_scope(server)) == []  # the server's container went with its job


def test_a_wrong_image_fails_the_replica_with_the_registry_s_words(server) -> None:
    job = submit(server, "name: typo\nresources: {image_id: docker:localhost/corral-test/no-such-image:1}\n"
                         "run: echo never\n")
    done = wait_state(server, job["id"], "FAILED", timeout=60)
    assert "image pull failed" in done["message"] and "no-such-image" in done["message"], done
    told = _events(server, job["id"])
    assert any("image pull failed" in m for m in told), told
    assert containers_of(_scope(server)) == []
    # the registry's last words are in the log once (the engine's own output, not again after it)
    log = server.get(f"/v1/jobs/{job['id']}/logs").text.splitlines()
    final = [line for line in log if line.split("| ", 1)[-1].startswith("Error:")]
    assert len(final) == len(set(final)), log


def test_cancel_and_a_killed_wrapper_leave_no_container(server) -> None:
    spec = f"resources: {{image_id: docker:{IMAGE}}}\nrun: echo up; exec sleep 300\n"
    first, second = submit(server, "name: first\n" + spec), submit(server, "name: second\n" + spec)
    for job in (first, second):
        wait_state(server, job["id"], "RUNNING", timeout=60)
    scope = _scope(server)
    wait_for(lambda: len(containers_of(scope)) == 2, timeout=30)
    assert server.post(f"/v1/jobs/{first['id']}/cancel").status_code == 200
    wait_state(server, first["id"], "CANCELLED", timeout=30)
    pid = server.get(f"/v1/jobs/{second['id']}").json()["tasks"][0]["replicas"][0]["pid"]
    os.kill(pid, signal.SIGKILL)  # the wrapper dies: the engine's client with it, not the container
    ended = wait_state(server, second["id"], "FAILED", timeout=30)
    assert ended["exit_code"] == 137, ended
    wait_for(lambda: containers_of(scope) == [], timeout=30)


def test_a_container_whose_wrapper_is_killed_ends_by_its_lifeline(server, monkeypatch) -> None:
    """Where the wrapper's own engine kills it (Slurm ending a step or an allocation, a Ray
    worker's death) on a node no corral reaches afterwards, nothing removes the container by
    name: it ends because its wrapper is gone (its lifeline), not later, not never."""
    from corral.node import container as engine_files

    runner = server.state.loop.inventory.executors["local"].runner

    def as_slurm_ends_a_step(key: str, pid: int | None, thorough: bool = False) -> list[int]:
        # the step's processes die (the wrapper's group: it and the engine's client); the
        # engine's monitor (conmon, its own session and cgroup) is not among them, and no
        # corral on that node removes the container by name
        if pid:
            os.killpg(pid, signal.SIGKILL)
        return []

    monkeypatch.setattr(runner, "end_tree", as_slurm_ends_a_step)
    monkeypatch.setattr(engine_files, "remove", lambda run_dir: None)
    job = submit(server, f"name: orphan\nresources: {{image_id: docker:{IMAGE}}}\nrun: echo up; exec sleep 300\n")
    wait_state(server, job["id"], "RUNNING", timeout=60)
    scope = _scope(server)
    wait_for(lambda: len(containers_of(scope)) == 1, timeout=30)
    wait_for(lambda: "up" in server.get(f"/v1/jobs/{job['id']}/logs").text, timeout=30)
    pid = server.get(f"/v1/jobs/{job['id']}").json()["tasks"][0]["replicas"][0]["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: containers_of(scope) == [], timeout=20)
    # stop signals are the replica's: a cancelled job's container still gets its grace period
    # (test_a_program_in_a_container_gets_the_stop_signal_and_its_grace)


def test_a_container_whose_monitor_was_killed_is_removed_too(server) -> None:
    """Its engine's monitor (conmon) killed, then its wrapper: the engine leaves the container
    "stopping" to a first removal; it is removed all the same, not left for good."""
    import subprocess

    job = submit(server, f"name: nomon\nresources: {{image_id: docker:{IMAGE}}}\nrun: echo up; exec sleep 300\n")
    wait_state(server, job["id"], "RUNNING", timeout=60)
    scope = _scope(server)
    (name,) = wait_for(lambda: containers_of(scope), timeout=30)
    wait_for(lambda: "up" in server.get(f"/v1/jobs/{job['id']}/logs").text, timeout=30)
    conmon = int(subprocess.run(["podman", "inspect", "--format", "{{.State.ConmonPid}}", name], capture_output=True,
                                text=True, check=True).stdout.strip())
    os.kill(conmon, signal.SIGKILL)
    time.sleep(1)
    os.kill(server.get(f"/v1/jobs/{job['id']}").json()["tasks"][0]["replicas"][0]["pid"], signal.SIGKILL)
    wait_state(server, job["id"], "FAILED", timeout=30)
    wait_for(lambda: containers_of(scope) == [], timeout=30)


@pytest.fixture(scope="module")
def registry():
    registry = start_registry()
    yield registry
    registry.stop()


def test_a_private_image_runs_with_its_login_and_only_with_it(server, registry) -> None:
    image = registry.image("private/busybox:1")
    login = (f"secrets: {{SKYPILOT_DOCKER_USERNAME: {registry.user}, SKYPILOT_DOCKER_PASSWORD: {registry.password}, "
             f"SKYPILOT_DOCKER_SERVER: {registry.address}}}\n")
    spec = f"resources: {{image_id: docker:{image}}}\nrun: test -e {MARKER}\n"
    refused = submit(server, "name: nologin\n" + spec)
    done = wait_state(server, refused["id"], "FAILED", timeout=60)
    assert "image pull failed" in done["message"] and "unauthorized" in done["message"].lower(), done
    allowed = submit(server, "name: login\n" + spec + login)
    done = wait_state(server, allowed["id"], "SUCCEEDED", "FAILED", timeout=60)
    assert done["state"] == "SUCCEEDED", _events(server, allowed["id"])
    logs = server.get(f"/v1/jobs/{allowed['id']}/logs").text
    assert registry.password not in logs  # the login went to the engine in a private file, not the log
    # the image is in this node's store now: a job without the login still may not use it
    again = submit(server, "name: nologin2\n" + spec)
    done = wait_state(server, again["id"], "FAILED", timeout=60)
    assert "unauthorized" in done["message"].lower(), done


def test_a_killed_server_s_successor_adopts_the_running_container(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(SITE)
    corral = cli_for(home, cwd=tmp_path, timeout=120)
    (tmp_path / "c.yaml").write_text(f"name: boxed\nresources: {{image_id: docker:{IMAGE}}}\nrun: exec sleep 300\n")
    from corral.executors import scope_of
    from corral.settings import Settings

    scope = scope_of(Settings(home=home, db_url="sqlite://"))  # this home's alone: other runs share the engine
    try:
        job = corral("launch", "-d", "c.yaml", check=True).stdout.strip()
        wait_for(lambda: cli_status(corral, job)["state"] == "RUNNING", timeout=60)
        before = containers_of(scope)
        mine = [n for n in before if f"-{job}.boxed.0.a1" in n]
        assert len(mine) == 1, before
        server_pid = json.loads(corral("server", "status", "--json", check=True).stdout)["pid"]
        os.kill(server_pid, signal.SIGKILL)
        wait_for(lambda: cli_status(corral, job)["state"] == "RUNNING", timeout=60)  # a new server answers
        wait_for(lambda: any(e["cause"] == "adopted" for e in cli_events(corral, job)), timeout=60)
        assert [n for n in containers_of(scope) if f"-{job}.boxed." in n] == mine  # the same one, not a second
        corral("cancel", job, check=True)
        wait_for(lambda: cli_status(corral, job)["state"] == "CANCELLED", timeout=60)
        wait_for(lambda: mine[0] not in containers_of(scope), timeout=30)
    finally:
        corral.stop()


def test_file_mounts_are_bound_into_the_container_and_nothing_is_made_on_the_node(server, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("from a directory\n")
    (tmp_path / "cfg.txt").write_text("from a file\n")
    remote = f"/corral-test-{tmp_path.name}"
    job = submit(server, f"""
name: mounted
resources: {{image_id: docker:{IMAGE}}}
file_mounts:
  {remote}: {data}
  ~/cfg.txt: {tmp_path / 'cfg.txt'}
run: cat {remote}/a.txt ~/cfg.txt > "$CORRAL_CHECKPOINT_DIR/seen.txt"; test -e {MARKER}
""")
    done = wait_state(server, job["id"], "SUCCEEDED", "FAILED", timeout=60)
    assert done["state"] == "SUCCEEDED", _events(server, job["id"])
    seen = Path(server.state.settings.checkpoints_dir) / str(job["id"]) / "mounted" / "seen.txt"
    assert seen.read_text() == "from a directory\nfrom a file\n"
    assert not os.path.lexists(remote)  # bound inside the container only: nothing made on the node


def test_a_replica_is_starting_while_its_image_is_pulled(server, registry, tmp_path: Path) -> None:
    """A pull may take minutes: the replica says STARTING and why until its container runs
    (here a node whose engine is slow to pull: a wrapper around podman)."""
    pulled = tmp_path / "pull-may-end"
    job = _private_job(server, registry, "slowpull", "sleep 1", _slow_podman(tmp_path, 60, gate=pulled))

    def replica() -> dict:
        return server.get(f"/v1/jobs/{job['id']}").json()["tasks"][0]["replicas"][0]

    wait_for(lambda: any("STARTING until its container runs" in m for m in _events(server, job["id"])), timeout=30)
    states = set()
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        states.add(replica()["state"])
        time.sleep(0.1)
    assert states == {"STARTING"}, states  # the pull is under way (held until the gate opens)
    waiting = replica()
    assert waiting["state"] == "STARTING" and waiting["reason"].startswith("pulling image 127.0.0.1:"), waiting
    pulled.touch()
    done = wait_state(server, job["id"], "SUCCEEDED", "FAILED", timeout=60)
    assert done["state"] == "SUCCEEDED", _events(server, job["id"])
    told = _events(server, job["id"])
    assert any("in container" in m for m in told), told  # confirmed when its container started
    assert replica()["reason"] is None  # the reason is the pull's alone


def test_the_image_s_entrypoint_is_set_aside_bash_runs_and_values_spanning_lines_arrive(server) -> None:
    """SkyPilot files run as written in images with an ENTRYPOINT (vLLM's) and bash scripts;
    values that span lines (SKYPILOT_NODE_IPS of a two-replica task, a PEM secret) arrive whole."""
    image = ensure_image("entrypoint")
    job = submit(server, f"""
name: multi
num_nodes: 2
resources: {{image_id: docker:{image}}}
secrets:
  PEM: |
    -----BEGIN KEY-----
    it's two lines
envs: {{GREETING: "hello 'quoted' world"}}
run: |
  printf 'bash=%s\\n' "$RAN_BY_BASH"
  printf 'ips=%s\\n' "$(echo "$SKYPILOT_NODE_IPS" | wc -l)"
  printf 'pem=%s\\n' "$(printf '%s' "$PEM" | tail -n 1)"
  printf 'greeting=%s\\n' "$GREETING"
""")
    done = wait_state(server, job["id"], "SUCCEEDED", "FAILED", timeout=60)
    assert done["state"] == "SUCCEEDED", _events(server, job["id"])
    log = server.get(f"/v1/jobs/{job['id']}/logs").text
    assert "FROM-ENTRYPOINT" not in log, log
    for replica in ("multi-0", "multi-1"):
        mine = [line.split(" | ", 1)[1] for line in log.splitlines() if line.startswith(replica + " | ")]
        assert mine == ["bash=yes", "ips=2", "pem=it's two lines", "greeting=hello 'quoted' world"], log


def test_cancel_during_a_pull_starts_nothing_and_leaves_nothing(server, registry, tmp_path: Path) -> None:
    pulled = tmp_path / "pulled"
    job = _private_job(server, registry, "pullcancel", f"touch {tmp_path / 'ran'}",
                       _slow_podman(tmp_path, 30, f"touch {pulled}"))
    wait_for(lambda: any("STARTING until its container runs" in m for m in _events(server, job["id"])), timeout=30)
    time.sleep(1)  # the pull is under way
    assert server.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200
    done = wait_state(server, job["id"], "CANCELLED", timeout=30)
    assert done["state"] == "CANCELLED"
    time.sleep(1)
    assert not (tmp_path / "ran").exists() and not pulled.exists()  # the pull was ended with its attempt
    assert containers_of(_scope(server)) == []


def test_a_replica_still_pulling_when_the_server_restarts_stays_starting(tmp_path: Path) -> None:
    """A server killed during a pull: its successor adopts the attempt as STARTING (its image
    is not there yet), and RUNNING once its container runs — never ready before it exists."""
    pulled = tmp_path / "pull-may-end"
    slow = _slow_podman(tmp_path, 60, gate=pulled)
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(SITE.replace("containers:\n", f"containers:\n  engine: {slow}\n"))
    corral = cli_for(home, cwd=tmp_path, timeout=120)
    image = "localhost:1/corral-test/not-here-yet:1"  # absent, a registry's (a port): its pull (slow) starts
    (tmp_path / "p.yaml").write_text(f"name: pulling\nresources: {{image_id: docker:{image}}}\nrun: exec sleep 300\n")
    try:
        job = corral("launch", "-d", "p.yaml", check=True).stdout.strip()
        wait_for(lambda: any(e["cause"] == "pulling" for e in cli_events(corral, job)), timeout=60)
        server_pid = json.loads(corral("server", "status", "--json", check=True).stdout)["pid"]
        os.kill(server_pid, signal.SIGKILL)
        wait_for(lambda: cli_status(corral, job)["state"] in ("STARTING", "RUNNING", "FAILED"), timeout=60)
        replica = cli_status(corral, job)["tasks"][0]["replicas"][0]
        assert replica["state"] == "STARTING", replica  # adopted while its image is still pulled
        pulled.touch()
        done = wait_for(lambda: (s := cli_status(corral, job))["state"] in ("FAILED", "RUNNING") and s, timeout=60)
        assert done["state"] == "FAILED" and "image pull failed" in (done["message"] or ""), done
    finally:
        corral.stop()


@pytest.mark.parametrize("stage", ["setup", "run"])
def test_a_program_in_a_container_gets_the_stop_signal_and_its_grace(server, tmp_path: Path, stage: str) -> None:
    """The run's shell in the container (under the engine's init) is not the program: the
    program gets the stop signal too, and its whole grace period to save its work (in setup
    as in run; a setup stopped so starts no run)."""
    out = tmp_path / "out"
    out.mkdir(mode=0o777)
    out.chmod(0o777)
    program = "trap 'echo got TERM >> /out/log; sleep 2; echo saved >> /out/log; exit 0' TERM; " \
              "echo up >> /out/log; while :; do sleep 0.1; done"
    job = submit(server, f"""
name: boxed
resources: {{image_id: "docker:{IMAGE}"}}
grace_period: 10s
file_mounts: {{/out: {out}}}
{stage}: |
  sh -c "{program}"
  echo after >> /out/log
""" + ("run: echo run >> /out/log\n" if stage == "setup" else ""))
    wait_state(server, job["id"], "RUNNING")
    wait_for(lambda: (out / "log").exists(), timeout=60)
    assert server.post(f"/v1/jobs/{job['id']}/cancel").json()["cancelled"] is True
    wait_state(server, job["id"], "CANCELLED", timeout=60)
    assert (out / "log").read_text().splitlines() == ["up", "got TERM", "saved"]


def test_path_variables_the_task_sets_itself_reach_the_container(server) -> None:
    """The submitting machine's PATH and LD_LIBRARY_PATH stay out of a container (the image has
    its own), but a task that sets one in its envs means it: it arrives (new-user trial: it was
    dropped, so ``envs: {PATH: /opt/tool/bin:…}`` found nothing of /opt/tool)."""
    job = submit(server, f"""
name: paths
resources: {{image_id: docker:{IMAGE}}}
envs: {{PATH: "/opt/mine/bin:/bin:/usr/bin", LD_LIBRARY_PATH: /opt/mine/lib}}
run: |
  printf 'path=%s\\n' "$PATH"
  printf 'ld=%s\\n' "$LD_LIBRARY_PATH"
""")
    done = wait_state(server, job["id"], "SUCCEEDED", "FAILED", timeout=60)
    assert done["state"] == "SUCCEEDED", _events(server, job["id"])
    log = server.get(f"/v1/jobs/{job['id']}/logs").text
    said = [line.split(" | ", 1)[-1] for line in log.splitlines() if line.split(" | ", 1)[-1].startswith(("path=", "ld="))]
    assert said == ["path=/opt/mine/bin:/bin:/usr/bin", "ld=/opt/mine/lib"], log
    other = submit(server, f"""
name: image-own
resources: {{image_id: docker:{IMAGE}}}
run: printf 'ld=%s\\n' "${{LD_LIBRARY_PATH:-none}}"
""")
    assert wait_state(server, other["id"], "SUCCEEDED", "FAILED", timeout=60)["state"] == "SUCCEEDED"
    assert "ld=none" in server.get(f"/v1/jobs/{other['id']}/logs").text
