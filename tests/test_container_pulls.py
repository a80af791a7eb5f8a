"""How often a node pulls a job's image (``container_lab``: offline image, a real private
registry on loopback): a private image (a login in the job's secrets) is pulled once per job
on a node, however many of its replicas start there together, and again for the next job
(the registry checks each job's login); a job without the login is still refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import POOL, submit, wait_state
from container_lab import SITE, ensure_image, start_registry


@pytest.fixture(scope="module", autouse=True)
def image() -> str:
    return ensure_image()


@pytest.fixture
def db_url(tmp_path: Path) -> str:  # the store is not what these tests exercise: SQLite only
    return f"sqlite:///{tmp_path / 'corral.db'}"


@pytest.fixture
def site_config() -> str:
    return POOL + SITE


@pytest.fixture(scope="module")
def registry():
    registry = start_registry("private/pulls:1")
    yield registry
    registry.stop()


def _pulls(server, job_id: int) -> int:
    return server.get(f"/v1/jobs/{job_id}/logs").text.count("corral: pulling")


def test_a_private_image_is_pulled_once_per_job_not_once_per_replica(server, registry) -> None:
    image = registry.image("private/pulls:1")
    login = (f"secrets: {{SKYPILOT_DOCKER_USERNAME: {registry.user}, SKYPILOT_DOCKER_PASSWORD: {registry.password}, "
             f"SKYPILOT_DOCKER_SERVER: {registry.address}}}\n")
    spec = f"num_nodes: 3\nresources: {{image_id: docker:{image}}}\nrun: test -e /corral-image\n" + login
    for name in ("first", "second"):  # each job's login is checked by the registry once
        job = submit(server, f"name: {name}\n" + spec)
        done = wait_state(server, job["id"], "SUCCEEDED", "FAILED", timeout=90)
        assert done["state"] == "SUCCEEDED", server.get(f"/v1/jobs/{job['id']}/logs").text[-2000:]
        assert _pulls(server, job["id"]) == 1, server.get(f"/v1/jobs/{job['id']}/logs").text[-2000:]
    refused = submit(server, f"name: nologin\nresources: {{image_id: docker:{image}}}\nrun: echo never\n")
    done = wait_state(server, refused["id"], "FAILED", timeout=60)
    assert "unauthorized" in done["message"].lower(), done
