"""Container image references, normalised so that a policy's spelling matches what kubelet reports.

A policy says ``vllm/vllm-openai:v0.11.0``; kubelet's ``status.images[].names`` says
``docker.io/vllm/vllm-openai:v0.11.0`` and ``docker.io/vllm/vllm-openai@sha256:...``. Both are
the same image. :func:`normalise` gives the fully qualified form the container runtimes use:
default registry ``docker.io``, ``library/`` for single-name Docker Hub images, ``:latest`` when
neither tag nor digest is given (the same defaulting kube-scheduler's ImageLocality applies). The
first component is a registry host when it holds a ``.`` or a ``:``, is ``localhost`` or has a
capital letter (path components cannot: ``splitDockerDomain`` in distribution/reference).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from extender.core.errors import InvalidValueError

DEFAULT_REGISTRY = "docker.io"

# The reference grammar of github.com/distribution/reference (reference.go, v0.5.0), which
# containerd and kubelet parse image names with:
#   reference  := name [":" tag] ["@" digest]
#   name       := [domain "/"] path-component ["/" path-component]*
#   domain     := host [":" port]        host: DNS components (any case) or "[" IPv6 "]"
#   path-component := [a-z0-9]+ ([_.] | "__" | "-"+) [a-z0-9]+ ...   (lowercase only)
#   tag        := [\w][\w.-]{0,127}
#   digest     := algorithm ":" [0-9a-fA-F]{32,}
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REFERENCE = re.compile(
    rf"(?P<name>(?:{_HOST}(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::[\w][\w.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?",
    re.ASCII,
)
#: Longest name (without tag and digest) the grammar allows.
MAX_NAME_LENGTH = 255


def check_reference(ref: str) -> str:
    """``ref`` unchanged if it is an image reference kubelet can pull; :class:`InvalidValueError` if not.

    A reference outside the grammar above leaves a pod in ``InvalidImageName`` for good: say so
    where the reference is written instead. Path components are lowercase (``vllm/Serve`` is not
    an image; ``vLLM/serve`` is, on a registry host called ``vLLM``: see :func:`normalise`).
    """
    m = _REFERENCE.fullmatch(ref) if len(ref) <= 2 * MAX_NAME_LENGTH + 256 else None
    if m is None:
        raise InvalidValueError(
            f"{ref!r} is not an image reference: [registry[:port]/]path[:tag][@digest], path in "
            "lowercase letters, digits and '.', '_', '-' separators, no spaces"
        )
    if len(m["name"]) > MAX_NAME_LENGTH:
        raise InvalidValueError(f"image name {m['name'][:40]!r}... is longer than {MAX_NAME_LENGTH} characters")
    return ref


def normalise(ref: str) -> str:
    """Fully qualified image reference: ``nginx`` -> ``docker.io/library/nginx:latest``."""
    ref = ref.strip()
    name, at, digest = ref.partition("@")
    first, slash, _ = name.partition("/")
    if not slash:
        name = f"{DEFAULT_REGISTRY}/library/{name}"
    elif not ("." in first or ":" in first or first == "localhost" or first != first.lower()):
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
