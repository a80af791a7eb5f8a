"""Container image references as corral reads them (``docker:REPOSITORY[:TAG]``, Docker's
names): kept apart from the YAML models so the commands a step runs (``corral.spec.pyxis``)
read them without loading those."""

from __future__ import annotations

import re

DOCKER_PREFIX = "docker:"
# [registry[:port]/]path[:tag][@digest], lowercase path components as the distribution spec has them
_IMAGE = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9.-]*(?::[0-9]{1,5})?/)?[a-z0-9]+(?:[._-]+[a-z0-9]+)*"
                    r"(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
                    r"(?:@sha256:[a-f0-9]{64})?")


def image_of(value: str) -> str:
    """The image of an ``image_id`` written ``docker:IMAGE``; ValueError with the reason."""
    image = value[len(DOCKER_PREFIX):].strip()
    if not image:
        raise ValueError("image_id docker: names no image (write docker:REPOSITORY[:TAG])")
    first, _, rest = image.partition("/")
    # a first component that is not a registry (``_is_registry``) is a repository path, and those
    # are lowercase (LOCALHOST/x would be Docker Hub's "LOCALHOST/x", refused by every registry)
    path_first = rest and not _is_registry(first)
    if len(image) > 255 or not _IMAGE.fullmatch(image) or (path_first and first != first.lower()):
        raise ValueError(f"image_id {value!r} is not an image reference like docker:nvcr.io/nvidia/pytorch:24.05-py3 "
                         "(repository names are lowercase)")
    return image


def qualified(image: str) -> str:
    """The image's full reference, as the node's engine is asked for it: a name without a
    registry is Docker Hub's (``python:3.11`` → ``docker.io/library/python:3.11``), as Docker
    reads it, never a short name the engine resolves on its own (against whatever images
    other jobs left on the node, or a search list of registries)."""
    first, _, rest = image.partition("/")
    if rest and _is_registry(first):
        return image
    return f"docker.io/{image}" if rest else f"docker.io/library/{image}"


def _is_registry(first: str) -> bool:
    """Whether an image's first component names its registry: with a dot, a port, or as
    "localhost" (Docker's rule); otherwise it is the first part of a Docker Hub path."""
    return "." in first or ":" in first or first == "localhost"
