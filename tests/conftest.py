"""Shared fixtures and helpers: a temporary CORRAL_HOME with a declared virtual node pool,
database URLs (SQLite always; PostgreSQL too when CORRAL_TEST_DB_URL is set), an in-process
server (store + control loop + API) for API tests, the CLI against a home (``cli_for``), and
the helpers every server test uses (``submit``, ``wait_state``, ``wait_for``)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

sys.path.insert(0, str(Path(__file__).parent))

# A `corral login` saved by whoever runs the tests (~/.config/corral) would send every
# CORRAL_HOME-based command to that server instead: the tests keep a login store of their own.
import atexit  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="corral-tests-xdg-")
atexit.register(shutil.rmtree, os.environ["XDG_CONFIG_HOME"], True)

POOL = """
nodes:
  - name: gpu
    count: 2
    gpus: 4
    gpu_type: H100
    cpus: 8
    memory: 64
    labels: {switch: leaf0}
"""

def _worker_database(url: str | None) -> str | None:
    """Under pytest-xdist each worker gets a database of its own beside the given one
    (``test_gw0``, made here when missing), since every PostgreSQL test starts by wiping
    its schema; a single process uses the URL as given."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not url or not worker:
        return url
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import DBAPIError

    given = make_url(url)
    name = f"{given.database}_{worker}"
    engine = create_engine(given, isolation_level="AUTOCOMMIT")
    try:
        for attempt in range(20):  # CREATE DATABASE copies template1, one copy at a time
            try:
                with engine.connect() as conn:
                    if not conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).scalar():
                        conn.execute(text(f'CREATE DATABASE "{name}"'))
                break
            except DBAPIError:
                if attempt == 19:
                    raise
                time.sleep(0.5)
    finally:
        engine.dispose()
    return given.set(database=name).render_as_string(hide_password=False)


PG_URL = _worker_database(os.environ.get("CORRAL_TEST_DB_URL"))
DB_PARAMS = ["sqlite"] + (["postgresql"] if PG_URL else [])


def reset_postgres(url: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()


# Tests that share one thing of the machine's run one after another, in one pytest-xdist
# worker: the slurm-lab (its tests cancel every corral Slurm job they find, and size their jobs
# to its free nodes), with the tests whose containers or ports could be mistaken for theirs
# (the same job ids and task names in another home); the Ray tests, so that one Ray cluster
# at a time takes the two cores; the network-namespace tests (the machine's IP forwarding).
_SERIAL = {
    "slurm": {"test_slurm.py", "test_slurm_fidelity.py", "test_degrade.py", "test_hetjob_slurm.py", "test_slurm_containers.py",
              "test_containers.py", "test_container_pulls.py", "test_pyxis.py", "test_ports.py"},
    "ray": {"test_ray.py", "test_ray_faults.py", "test_ray_containers.py"},
    "netns": {"test_netns.py"},
}


def _group_of(nodeid: str) -> str | None:
    """The group a test runs in (one worker, one test after another), from its id: its file's,
    or its conformance harness's (``[ray]``, ``[slurm]`` among its parameters)."""
    path, _, rest = nodeid.partition("::")
    params = rest[rest.index("[") + 1:-1].split("-") if rest.endswith("]") and "[" in rest else []
    harness = next((p for p in params if p in ("ray", "slurm")), None)
    if harness is not None:
        return harness
    name = path.rsplit("/", 1)[-1]
    return next((group for group, files in _SERIAL.items() if name in files), None)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: no error where xdist is not loaded
def pytest_xdist_make_scheduler(config, log):  # noqa: ANN001, ANN201 - xdist's Config, Producer, scheduler
    """``--dist loadgroup`` by the groups above, read from the test ids on the controller:
    xdist's own loadgroup reads ``xdist_group`` marks by renaming each item's node id on the
    worker (``item._nodeid``), which pytest 9 no longer reads, so every test was scheduled on
    its own and the groups' tests ran in several workers at once (the slurm-lab's -N4 blocker
    waited for nodes another worker's test held; two Ray clusters shared the two cores)."""
    from xdist.scheduler import LoadScopeScheduling

    class Grouped(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group_of(nodeid) or nodeid

    return Grouped(config, log)


def pytest_generate_tests(metafunc) -> None:  # noqa: ANN001 - pytest's Metafunc
    """Tests of what the store keeps (a module that sets ``ON_POSTGRESQL = True``: the store,
    the API, claims, requeues, tokens, audit, usage) run on SQLite and on PostgreSQL where
    ``CORRAL_TEST_DB_URL`` is set; tests of behaviour above the store run on SQLite."""
    if "db_url" in metafunc.fixturenames:
        both = getattr(metafunc.module, "ON_POSTGRESQL", False)
        metafunc.parametrize("db_url", DB_PARAMS if both else ["sqlite"], indirect=True)


@pytest.fixture
def db_url(request, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'corral.db'}"
    reset_postgres(PG_URL)
    return PG_URL


@pytest.fixture
def site_config() -> str:
    """The config.yaml of the test's CORRAL_HOME; a test module overrides it to declare
    partitions, accounts, QOS …"""
    return POOL


@pytest.fixture
def corral_home(tmp_path: Path, site_config: str) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "config.yaml").write_text(site_config + shared_account(site_config))
    return home


def shared_account(site_config: str) -> str:
    """The tests' fictional users (alice, bob …) have no Unix accounts here: unless a test says
    otherwise, their jobs run as the server's own, its account declared a shared service
    account (tests/test_identity.py checks jobs run as their submitters')."""
    if "identity:" in site_config:
        return ""
    from corral.auth.accounts import server_account

    return f"\nidentity: {{service_account: {server_account()}}}\n"


@pytest.fixture
def private(tmp_path: Path) -> Iterator[Path]:
    """A directory on a tmpfs (/dev/shm), a device other than ``tmp_path``'s (where a job's
    record is made): a ``file_mounts`` source Slurm's nodes are taken not to see, so it is
    staged (``corral.node.staging``)."""
    import shutil
    import uuid

    if not os.path.isdir("/dev/shm") or os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm, a tmpfs, on a device of its own")
    path = Path("/dev/shm") / f"corral-test-private-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def server(corral_home: Path, db_url: str) -> Iterator:
    """An in-process server with a real control loop and local executor."""
    from fastapi.testclient import TestClient

    from corral.api.app import create_app
    from corral.server import build_state
    from corral.settings import Settings

    settings = Settings(home=corral_home, db_url=db_url, poll_interval_s=0.2)
    state = build_state(settings)
    app = create_app(state)
    with TestClient(app, headers=bearer(state, "alice")) as client:
        client.state = state
        yield client
    kill_leftovers(corral_home)


def bearer(state, user: str, role: str | None = None) -> dict[str, str]:
    """Headers acting as ``user`` on an in-process server: a new token of theirs (``role``: none
    means the one config.yaml gives them)."""
    _, token = state.tokens.create(user, role, None, None, "test")
    return {"Authorization": f"Bearer {token}"}


def kill_leftovers(home: Path) -> None:
    """Kill replica processes a failed test may have left behind (by their launch key)."""
    import psutil

    for proc in psutil.process_iter():
        try:
            if str(home) in proc.environ().get("CORRAL_CHECKPOINT_DIR", ""):
                proc.kill()
        except (psutil.Error, OSError):
            continue


def wait_for(predicate, timeout: float = 15.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def submit(client, text: str, **extra) -> dict:
    """Submit a job through an HTTP client (in-process or real) as the SDK does, from this
    process's directory and environment; its stored record."""
    from corral.spec.world import submitter_environment

    world = {"cwd": os.getcwd(), "environment": submitter_environment(os.environ, None)}
    response = client.post("/v1/jobs", json={"yaml": text, **world, **extra})
    assert response.status_code == 201, response.text
    return response.json()["job"]


def wait_state(client, job_id: int, *states: str, timeout: float = 20.0) -> dict:
    def check():
        job = client.get(f"/v1/jobs/{job_id}").json()
        return job if job["state"] in states else None

    return wait_for(check, timeout)


def cli_for(home: Path, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 60,
            umask: int | None = None):
    """``corral`` commands against ``home`` as a new user would run them: a clean environment
    (no CORRAL_* of this process), ``env`` on top. ``run(*args, check=True)`` asserts
    success; ``run.stop()`` stops the home's server and kills what a failed test left."""
    import subprocess

    base = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    base.update(env or {})
    base["CORRAL_HOME"] = str(home)

    def run(*args: str, check: bool | None = None, timeout: float = timeout) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-m", "corral.cli.main", *args], env=base, cwd=cwd,
                              capture_output=True, text=True, timeout=timeout,
                              preexec_fn=(lambda: os.umask(umask)) if umask is not None else None)
        if check:
            assert proc.returncode == 0, f"corral {' '.join(args)}: {proc.stderr}{proc.stdout}"
        return proc

    def stop() -> None:
        run("server", "stop", timeout=120)
        kill_leftovers(home)

    run.env, run.home, run.work, run.stop = base, home, cwd, stop
    return run


def cli_status(corral, job: str) -> dict:
    """``corral status JOB --json`` through a ``cli_for`` runner."""
    import json

    return json.loads(corral("status", str(job), "--json", check=True).stdout)


def cli_events(corral, job: str) -> list[dict]:
    """``corral events JOB --json`` through a ``cli_for`` runner."""
    import json

    return json.loads(corral("events", str(job), "--json", check=True).stdout)


def replicas_by_label(data: dict) -> dict[str, dict]:
    """A job's replicas (``status --json``) by their ``task-rank`` label."""
    return {f"{t['name']}-{r['rank']}": r for t in data["tasks"] for r in t["replicas"]}
