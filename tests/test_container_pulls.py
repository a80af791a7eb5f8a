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


def _replicas(server, job_id: int) -> list[dict]:
    return [r for t in server.get(f"/v1/jobs/{job_id}").json()["tasks"] for r in t["replicas"]]


def test_a_registry_s_refusal_fails_the_replica_once_not_once_per_restart(server, registry) -> None:
    """A wrong name and a missing login are the registry's lasting refusals: pulling again
    would only meet them again, so the restart policy is not asked."""
    restart = "restart: {policy: on_failure, max_restarts: 3, backoff: {initial: 0s}}\n"
    login = (f"secrets: {{SKYPILOT_DOCKER_USERNAME: {registry.user}, SKYPILOT_DOCKER_PASSWORD: {registry.password}, "
             f"SKYPILOT_DOCKER_SERVER: {registry.address}}}\n")
    cases = {"unauthorized": f"resources: {{image_id: docker:{registry.image('private/never-pulled:1')}}}\n",
             "manifest unknown": f"resources: {{image_id: docker:{registry.image('private/no-such:1')}}}\n" + login}
    for words, spec in cases.items():
        job = submit(server, "name: refused\nrun: echo never\n" + restart + spec)
        done = wait_state(server, job["id"], "FAILED", "SUCCEEDED", timeout=60)
        assert done["state"] == "FAILED" and words in done["message"].lower(), done
        assert "not restarted" in done["message"], done
        assert [r["restarts"] for r in _replicas(server, job["id"])] == [0], done
        assert _pulls(server, job["id"]) == 1


def test_a_failed_pull_is_one_failure_for_the_replicas_that_waited_for_it(server, tmp_path: Path) -> None:
    """A transient failure (here a registry that does not answer, behind an engine slow to
    pull) counts once per pull: the gang's replicas waiting on the node's pull take its words
    rather than pulling again one after the other, and each restarts once by its policy."""
    import shutil

    slow = tmp_path / "slow-podman"
    slow.write_text(f'#!/bin/sh\nif [ "$1" = pull ]; then sleep 3; fi\nexec {shutil.which("podman")} "$@"\n')
    slow.chmod(0o755)
    launcher = server.state.loop.launcher
    launcher.containers = launcher.containers.model_copy(update={"engine": str(slow)})
    # (a port: a registry, which may answer later; ``localhost/`` alone is the node's own image)
    job = submit(server, "name: unreachable\nnum_nodes: 3\nresources: {image_id: docker:localhost:1/corral-test/absent:1}\n"
                         "restart: {policy: on_failure, max_restarts: 1, backoff: {initial: 0s}}\nrun: echo never\n")
    done = wait_state(server, job["id"], "FAILED", "SUCCEEDED", timeout=120)
    assert done["state"] == "FAILED" and "connection refused" in done["message"], done
    assert "not restarted" not in done["message"], done  # transient: its policy was asked
    assert [r["restarts"] for r in _replicas(server, job["id"])] == [1, 1, 1], done
    assert _pulls(server, job["id"]) == 2, server.get(f"/v1/jobs/{job['id']}/logs").text[-3000:]  # one per round


def test_a_node_s_own_image_that_is_not_there_fails_once_and_is_not_pulled(server) -> None:
    """``localhost/NAME`` (no port) is an image built or loaded on the node: no registry serves
    it, so its absence is lasting (the engine's "connection refused" from https://localhost/
    would read as a registry that may answer later, and each restart would meet it again)."""
    restart = "restart: {policy: on_failure, max_restarts: 3, backoff: {initial: 0s}}\n"
    job = submit(server, "name: unbuilt\nresources: {image_id: docker:localhost/corral-test/never-built:1}\n"
                         "run: echo never\n" + restart)
    done = wait_state(server, job["id"], "FAILED", "SUCCEEDED", timeout=60)
    node = _replicas(server, job["id"])[0]["node"]
    assert done["state"] == "FAILED", done
    assert (f"image localhost/corral-test/never-built:1 is not on node {node}: localhost/ names an image built "
            "or loaded on the node, which no registry serves") in done["message"], done
    assert "not restarted" in done["message"] and "connection refused" not in done["message"], done
    assert [r["restarts"] for r in _replicas(server, job["id"])] == [0], done
    assert _pulls(server, job["id"]) == 0, server.get(f"/v1/jobs/{job['id']}/logs").text[-2000:]
    told = [e["message"] or "" for e in server.get(f"/v1/jobs/{job['id']}/events").json()]
    assert any("which no registry serves" in m for m in told), told
