"""Container image references, normalised so that a policy's spelling matches what kubelet reports.

A policy says ``vllm/vllm-openai:v0.11.0``; kubelet's ``status.images[].names`` says
``docker.io/vllm/vllm-openai:v0.11.0`` and ``docker.io/vllm/vllm-openai@sha256:...``. Both are
the same image. :func:`normalise` gives the fully qualified form the container runtimes use, as
the ``ParseDockerRef`` of distribution/reference (which containerd names pulled images by) does:

* the first path element is a registry when it holds a ``.`` or a ``:``, is ``localhost`` or has
  a capital letter (a path element cannot: ``splitDockerDomain``); otherwise the registry is
  ``docker.io``, and ``index.docker.io`` is spelled ``docker.io``;
* a Docker Hub image of one path element is under ``library/`` (``docker.io/nginx`` is
  ``docker.io/library/nginx``);
* with a digest, a tag is dropped (``nginx:1.25@sha256:...`` is stored and reported as
  ``docker.io/library/nginx@sha256:...``); with neither, the tag is ``:latest``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from extender.core.errors import InvalidValueError

DEFAULT_REGISTRY = "docker.io"
#: Docker Hub's old registry name, which distribution/reference spells as :data:`DEFAULT_REGISTRY`.
LEGACY_DEFAULT_REGISTRY = "index.docker.io"

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
    """Fully qualified image reference (module docstring): ``nginx`` -> ``docker.io/library/nginx:latest``."""
    name, at, digest = ref.strip().partition("@")
    first, slash, rest = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost" or first != first.lower()):
        registry, path = first, rest
    else:
        registry, path = DEFAULT_REGISTRY, name
    if registry == LEGACY_DEFAULT_REGISTRY:
        registry = DEFAULT_REGISTRY
    if registry == DEFAULT_REGISTRY and "/" not in path:
        path = f"library/{path}"
    head, _, last = path.rpartition("/")
    repo, colon, _ = last.partition(":")
    if at:
        return f"{registry}/{head}/{repo}@{digest}" if head else f"{registry}/{repo}@{digest}"
    return f"{registry}/{path}" if colon else f"{registry}/{path}:latest"


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
