"""A small RBAC authorizer: ClusterRoles, Roles and their bindings, as the API server evaluates them.

Enough of the real semantics for least-privilege tests: rules match on apiGroups, resources
(``pods``, ``nodes/status``, ``*``), verbs and resourceNames; subjects are ServiceAccounts, Users
and Groups (``system:serviceaccounts``, ``system:serviceaccounts:<ns>``, ``system:authenticated``).
Aggregated ClusterRoles and non-resource URLs are not modelled (every authenticated user may read
discovery, as with the real server's ``system:discovery`` binding).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Request:
    """One API request as the authorizer sees it (the attributes RBAC rules match on)."""

    user: str
    verb: str
    group: str
    resource: str
    subresource: str | None
    namespace: str | None
    name: str | None


@dataclass(frozen=True)
class Rule:
    """One PolicyRule."""

    api_groups: frozenset[str]
    resources: frozenset[str]
    verbs: frozenset[str]
    resource_names: frozenset[str]

    def allows(self, r: Request) -> bool:
        full = f"{r.resource}/{r.subresource}" if r.subresource else r.resource
        if not ({"*", r.verb} & self.verbs):
            return False
        if not ({"*", r.group} & self.api_groups):
            return False
        if not ({"*", full} & self.resources) and f"*/{r.subresource}" not in self.resources:
            return False
        return not self.resource_names or (r.name is not None and r.name in self.resource_names)


@dataclass(frozen=True)
class Grant:
    """Rules granted to subjects, in a namespace (``None``: cluster-wide)."""

    namespace: str | None
    rules: tuple[Rule, ...]
    subjects: tuple[Mapping[str, Any], ...]


def _rules(raw: Iterable[Mapping[str, Any]] | None) -> tuple[Rule, ...]:
    return tuple(
        Rule(
            api_groups=frozenset(r.get("apiGroups") or ()),
            resources=frozenset(r.get("resources") or ()),
            verbs=frozenset(r.get("verbs") or ()),
            resource_names=frozenset(r.get("resourceNames") or ()),
        )
        for r in raw or ()
    )


def groups_of(user: str) -> set[str]:
    """The groups the API server puts a user in."""
    groups = {"system:authenticated"}
    if user.startswith("system:serviceaccount:"):
        namespace = user.split(":")[2]
        groups |= {"system:serviceaccounts", f"system:serviceaccounts:{namespace}"}
    return groups


def _subject_matches(subject: Mapping[str, Any], binding_ns: str | None, user: str) -> bool:
    kind = subject.get("kind")
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_ns
        return user == f"system:serviceaccount:{namespace}:{subject.get('name')}"
    if kind == "User":
        return user == subject.get("name")
    if kind == "Group":
        return subject.get("name") in groups_of(user)
    return False


class Authorizer:
    """Decides requests from the RBAC objects of one or more manifests."""

    def __init__(self, documents: Iterable[Mapping[str, Any]]) -> None:
        docs = [d for d in documents if d]
        cluster_roles = {d["metadata"]["name"]: _rules(d.get("rules")) for d in docs if d.get("kind") == "ClusterRole"}
        roles = {
            (d["metadata"].get("namespace", "default"), d["metadata"]["name"]): _rules(d.get("rules"))
            for d in docs
            if d.get("kind") == "Role"
        }
        self.grants: list[Grant] = []
        for d in docs:
            kind = d.get("kind")
            if kind not in ("ClusterRoleBinding", "RoleBinding"):
                continue
            ref = d["roleRef"]
            namespace = None if kind == "ClusterRoleBinding" else d["metadata"].get("namespace", "default")
            if ref["kind"] == "ClusterRole":
                rules = cluster_roles.get(ref["name"], ())
            else:
                rules = roles.get((namespace or "default", ref["name"]), ())
            self.grants.append(Grant(namespace, rules, tuple(d.get("subjects") or ())))

    def rules_for(self, user: str) -> list[tuple[str | None, Rule]]:
        """Every (namespace scope, rule) the user holds."""
        return [
            (g.namespace, rule)
            for g in self.grants
            if any(_subject_matches(s, g.namespace, user) for s in g.subjects)
            for rule in g.rules
        ]

    def allowed(self, request: Request) -> bool:
        """Would the real authorizer allow this request?"""
        for scope, rule in self.rules_for(request.user):
            if scope is not None and scope != request.namespace:
                continue
            if rule.allows(request):
                return True
        return False
