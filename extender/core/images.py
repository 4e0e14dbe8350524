"""Container image references, normalised so that a policy's spelling matches what kubelet reports.

A policy says ``vllm/vllm-openai:v0.11.0``; kubelet's ``status.images[].names`` says
``docker.io/vllm/vllm-openai:v0.11.0`` and ``docker.io/vllm/vllm-openai@sha256:...``. Both are
the same image. :func:`normalise` gives the fully qualified form the container runtimes use:
default registry ``docker.io``, ``library/`` for single-name Docker Hub images, ``:latest`` when
neither tag nor digest is given (the same defaulting kube-scheduler's ImageLocality applies).
"""

from __future__ import annotations

from collections.abc import Iterable

DEFAULT_REGISTRY = "docker.io"


def normalise(ref: str) -> str:
    """Fully qualified image reference: ``nginx`` -> ``docker.io/library/nginx:latest``."""
    ref = ref.strip()
    name, at, digest = ref.partition("@")
    first, slash, _ = name.partition("/")
    if not slash:
        name = f"{DEFAULT_REGISTRY}/library/{name}"
    elif not ("." in first or ":" in first or first == "localhost"):
        name = f"{DEFAULT_REGISTRY}/{name}"
    if at:
        return f"{name}@{digest}"
    last = name.rsplit("/", 1)[-1]
    return name if ":" in last else f"{name}:latest"


def repository(ref: str) -> str:
    """The normalised reference without tag or digest."""
    name = normalise(ref).partition("@")[0]
    head, _, last = name.rpartition("/")
    return f"{head}/{last.partition(':')[0]}"


def names_for(reference: str, digest: str | None = None) -> frozenset[str]:
    """Every normalised name under which a node may report this image."""
    names = {normalise(reference)}
    if digest:
        names.add(f"{repository(reference)}@{digest}")
    return frozenset(names)


def normalise_all(names: Iterable[str]) -> frozenset[str]:
    """Normalise every name a node reports."""
    return frozenset(normalise(n) for n in names)
