"""Fixtures of the executor conformance suite: ``harness``, one per registered infra for the
whole session (its lab brought up once; an infra that is not available here, or has no
harness, skips with the reason), and ``corral``, a real corral server of a home configured
for that infra, one per infra per test module, driven through the ``corral`` command and
its HTTP API as a user would."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from conformance.driver import Corral
from conformance.harnesses import Harness, harnesses
from conftest import kill_leftovers

_HARNESSES = harnesses()


@pytest.fixture(scope="session", params=sorted(_HARNESSES))
def harness(request) -> Iterator[Harness]:
    found = _HARNESSES[request.param]
    if found is None:
        pytest.skip(f"infra {request.param!r} has no conformance harness: name one in CORRAL_CONFORMANCE_HARNESS "
                    "(docs/executors.md)")
    why = found.why_unavailable()
    if why is not None:
        pytest.skip(f"{request.param}: {why}")
    started = time.monotonic()
    found.start()
    print(f"\n{found.name}: ready in {time.monotonic() - started:.1f}s")
    yield found
    found.stop()


@contextmanager
def serving(harness: Harness, home: Path, open_to_accounts: bool = False,
            shared_work: bool = False) -> Iterator[Corral]:
    """A real server of ``home`` (made here) on ``harness``'s site; at the end every job is
    cancelled, the server stopped and whatever it ran killed. ``open_to_accounts``: the specs
    are readable by the throwaway accounts whose jobs the test runs; ``shared_work``: so is
    the work directory, and writable."""
    home.mkdir()
    (home / "config.yaml").write_text(harness.site())
    run = Corral(home, harness)
    if open_to_accounts:
        run.specs.chmod(0o755)
    if shared_work:
        run.work.chmod(0o777)
    run.start()
    try:
        yield run
    finally:
        try:
            run.cancel_all()
        finally:
            run.close_client()
            run("server", "stop", check=False)
            kill_leftovers(home)
            harness.cleanup(home)


@pytest.fixture(scope="module")
def corral(harness: Harness, tmp_path_factory) -> Iterator[Corral]:
    harness.recover()  # what an earlier module's loss test took
    with serving(harness, tmp_path_factory.mktemp(f"conformance-{harness.name}") / "home") as run:
        yield run


@pytest.fixture
def work(corral: Corral, request) -> Path:
    """A directory of this test's own for the files its replicas write."""
    path = corral.work / request.node.name.replace("[", "-").replace("]", "")
    path.mkdir()
    return path


@contextmanager
def job_account(harness: Harness) -> Iterator:
    """A throwaway Unix account for jobs of another user (root only), with a Slurm association
    where the harness is Slurm's, so its jobs may run there."""
    import os

    from unix_users import need_root, slurm_association, unix_user

    need_root()
    with unix_user() as made:
        if harness.name == "slurm":
            with slurm_association(made.name, {**os.environ, **harness.env()}):
                yield made
        else:
            yield made

