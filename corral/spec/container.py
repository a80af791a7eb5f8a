"""A task's container image and the container options a job may set, as SkyPilot users write
them: ``resources: {image_id: docker:IMAGE}`` and ``config: {docker: {run_options: [...]}}``.

The image reference is checked here, at submit, so a typo is a sentence naming the field
and not a failed pull minutes later. A job's run options are an allowlist: a container
shares the node's network (corral's names, addresses and ports hold inside it) and runs as
the job's own account, so options that would widen what the job may do on the node
(``--privileged``, ``--user``, ``--network``, ``--volume``, devices, security options) are
refused with the reason; an operator sets node-wide options in ``config.yaml``
(``containers.run_options``) instead."""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationInfo, field_validator, model_validator

from corral.spec.base import Strict
from corral.spec.imageref import DOCKER_PREFIX, image_of, qualified  # noqa: F401 (re-exported)

# Linux capabilities a job may add: profilers, RDMA memory pinning, real-time priorities.
CAPABILITIES = frozenset({"SYS_PTRACE", "IPC_LOCK", "SYS_NICE"})
# option -> whether it takes a value
_ALLOWED = {"--shm-size": True, "--ulimit": True, "-e": True, "--env": True, "--cap-add": True, "--ipc": True,
            "--label": True, "-l": True, "--tmpfs": True, "--init": False}
# what corral sets in every replica: a run option does not override it
_OURS = re.compile(r"(CORRAL_|SKYPILOT_|SLURM_).*|MASTER_ADDR|MASTER_PORT|RANK|LOCAL_RANK|NODE_RANK|WORLD_SIZE"
                   r"|LOCAL_WORLD_SIZE|CUDA_VISIBLE_DEVICES|HOSTNAME")
_WHY = {
    "--privileged": "it gives the container the whole node",
    "--user": "a container runs as the job's own account", "-u": "a container runs as the job's own account",
    "--network": "containers share the node's network, so corral's names and ports hold inside them",
    "--net": "containers share the node's network, so corral's names and ports hold inside them",
    "--volume": "use file_mounts", "-v": "use file_mounts", "--mount": "use file_mounts",
    "--device": "a replica gets exactly its own GPUs", "--gpus": "a replica gets exactly its own GPUs",
    "--security-opt": "it would lift the node's protections", "--pid": "it would share the node's processes",
    "--userns": "a container runs as the job's own account", "--uts": "corral names the replica's host",
    "--hostname": "corral names the replica's host", "-h": "corral names the replica's host",
    "--add-host": "corral writes the job's names", "--name": "corral names each attempt's container",
    "--rm": "corral removes each attempt's container", "-d": "corral follows the container",
    "--detach": "corral follows the container", "--workdir": "the job's workdir is the container's",
    "-w": "the job's workdir is the container's",
    "--entrypoint": "setup and run are what the container runs",
}


def run_options(options: list[str]) -> tuple[str, ...]:
    """A job's ``config.docker.run_options``, each ``--flag value``, ``--flag=value`` or a
    whole line of them (SkyPilot passes each entry to ``docker run`` as written); ValueError
    naming the first one refused and why."""
    out: list[str] = []
    words: list[str] = []
    for entry in options:
        if not isinstance(entry, str):
            raise ValueError("run_options are strings like '--shm-size=16g'")
        words.extend(entry.split())
    i = 0
    while i < len(words):
        word = words[i]
        flag, eq, value = word.partition("=")
        if flag not in _ALLOWED:
            why = _WHY.get(flag)
            allowed = ", ".join(sorted(o for o in _ALLOWED if o.startswith("--")))
            raise ValueError(f"run option {word!r} is not allowed" + (f": {why}" if why else "")
                             + f" (allowed: {allowed})")
        if _ALLOWED[flag] and not eq:
            if i + 1 >= len(words):
                raise ValueError(f"run option {flag} needs a value")
            i += 1
            value = words[i]
        if _ALLOWED[flag] and (not value or value.startswith("-")):
            raise ValueError(f"run option {flag} needs a value, not {value!r}")
        _check(flag, value)
        out.extend([flag, value] if _ALLOWED[flag] else [flag])
        i += 1
    return tuple(out)


def _check(flag: str, value: str) -> None:
    if flag == "--cap-add" and value.upper().removeprefix("CAP_") not in CAPABILITIES:
        raise ValueError(f"--cap-add {value} is not allowed (allowed: {', '.join(sorted(CAPABILITIES))})")
    if flag in ("-e", "--env") and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value.split("=", 1)[0]):
        raise ValueError(f"{flag} {value.split('=', 1)[0]!r} is not a variable name (patterns would bring in the "
                         "node's own environment)")
    if flag in ("-e", "--env") and _OURS.fullmatch(value.split("=", 1)[0]):
        raise ValueError(f"{flag} {value.split('=', 1)[0]} is not allowed: corral sets it in every replica "
                         "(set your own variables in envs)")
    if flag in ("-l", "--label") and value.startswith("corral."):
        raise ValueError(f"{flag} {value.split('=', 1)[0]} is not allowed: corral's labels name each attempt's container")
    if flag == "--ipc" and value != "host":
        raise ValueError("--ipc takes only host (replicas of a node share memory as they do outside containers)")


class DockerConfig(Strict):
    """``config.docker``: extra ``run`` options for the task's container (an allowlist)."""

    run_options: tuple[str, ...] = ()

    @field_validator("run_options", mode="before")
    @classmethod
    def _allowed(cls, value: Any) -> tuple[str, ...]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ValueError("run_options is a list of options like ['--shm-size=16g']")
        return run_options(list(value))


class TaskConfig(Strict):
    """SkyPilot's per-task ``config:`` (its config.yaml overrides): corral honours
    ``docker.run_options``; the rest configures clouds and is ignored with a warning."""

    docker: DockerConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _only_docker(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict):
            return data
        for key in sorted(k for k in data if k != "docker"):
            if info.context is not None:
                info.context.setdefault("warnings", []).append(f"config.{key} is ignored on corral's infra")
        docker = data.get("docker")
        if isinstance(docker, dict):
            for key in sorted(k for k in docker if k != "run_options"):
                if info.context is not None:
                    info.context.setdefault("warnings", []).append(f"config.docker.{key} is ignored on corral's infra")
            docker = {k: v for k, v in docker.items() if k == "run_options"}
        return {"docker": docker} if "docker" in data else {}
