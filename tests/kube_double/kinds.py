"""The kinds the double serves and how their REST paths look.

Paths follow the real API server exactly:

    /api/v1/<resource>                                   cluster-scoped collection (nodes)
    /api/v1/<resource>/<name>[/<subresource>]
    /api/v1/namespaces/<ns>/<resource>[/<name>[/<subresource>]]
    /api/v1/<resource>                                   namespaced kind, across all namespaces
    /apis/<group>/<version>/...                          the same below a named group

Adding a kind is one row in :data:`KINDS`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    """One served resource type."""

    group: str  # "" is the core group
    version: str
    resource: str  # plural, as in URLs and RBAC rules
    kind: str
    namespaced: bool
    #: Subresources with their own write path; "status" means writes to the main resource keep the
    #: stored status and writes to /status change nothing else (the real server's split); "log" is
    #: read-only (a pod's container logs, :meth:`tests.kube_double.server.KubeDouble.set_log`).
    subresources: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"


KINDS: tuple[Kind, ...] = (
    Kind("", "v1", "nodes", "Node", namespaced=False, subresources=("status",)),
    Kind("", "v1", "pods", "Pod", namespaced=True, subresources=("status", "log")),
    Kind("", "v1", "events", "Event", namespaced=True),
    Kind("batch", "v1", "jobs", "Job", namespaced=True, subresources=("status",)),
    Kind("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True),
)


@dataclass(frozen=True)
class Route:
    """A parsed resource URL."""

    kind: Kind
    namespace: str | None  # None: cluster-scoped kind, or a namespaced kind across all namespaces
    name: str | None
    subresource: str | None


def find_kind(group: str, version: str, resource: str) -> Kind | None:
    """The kind served at ``group/version/resource``."""
    for k in KINDS:
        if (k.group, k.version, k.resource) == (group, version, resource):
            return k
    return None


def kind_of(api_version: str, kind: str) -> Kind | None:
    """The served kind with this ``apiVersion`` and ``kind``."""
    for k in KINDS:
        if (k.api_version, k.kind) == (api_version, kind):
            return k
    return None


def parse_route(path: str) -> Route | None:
    """Split a request path into kind, namespace, name and subresource; ``None`` if nothing matches."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace: str | None = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        return None
    kind = find_kind(group, version, rest[0])
    if kind is None or (namespace is not None and not kind.namespaced):
        return None
    name = rest[1] if len(rest) >= 2 else None
    sub = rest[2] if len(rest) == 3 else None
    if sub is not None and sub not in kind.subresources:
        return None
    if name is not None and kind.namespaced and namespace is None:
        return None  # a namespaced object is only addressable inside its namespace
    return Route(kind, namespace, name, sub)
