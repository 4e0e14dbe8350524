"""New nodes kept tainted until warm (``warming.newNodes.taintUntilWarm``).

Image pre-pullers are asked for this again and again: a node that joins is schedulable at once, so
the first replica lands on it cold, which is what warming was meant to avoid. With the knob on:

* **taint on join.** A node the warmer sees for the first time, younger than ``joinWindow``, of
  a class some keep-warm workload may run on, and not already warm, gets the taint (default
  ``extender.io/warming=true:NoSchedule``). The warmer only notices a node once the sync has
  written it, so a pod can land in between; registering nodes with the taint (kubelet
  ``--register-with-taints``) closes that window, and the warmer treats such nodes the same.
* **remove when warm.** Each tick, a tainted node is untainted once its fresh inventory record
  holds every keep-warm cache it can get (:func:`extender.warm.checks.node_warm`), or once it is
  ``maxTaint`` old whatever its state, or at once when warming is disabled: warming must never
  keep a node out of service.
* **remove what we put, whatever the policy says now.** Each tainted node is tracked with the
  taint it got, and the taint carries a marker: the node annotation
  ``extender.io/warming-taint: <key>:<effect>``, written in the same patch. A reloaded policy that
  turns ``taintUntilWarm`` off or changes the taint's key or effect therefore still removes the
  old taint (reason ``policy``), at once; so does a restarted warmer, which finds the marked nodes
  in its start-up list. A node registered with the taint carries no marker: it is recognised by
  the policy's current taint (and removed at once if ``taintUntilWarm`` is off).

Every change is a read-modify-write of ``spec.taints`` guarded by the Node's resourceVersion (a
merge patch replaces the whole list, and the node lifecycle controller edits taints on joining
nodes too): a conflict is retried on the next tick. Nodes are listed once at start (to find the
ones carrying our taint after a restart) and then read one by one only when new, so a steady
cluster costs one GET per joining node.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from extender.core.errors import KubeError
from extender.core.inventory import InventorySnapshot
from extender.core.policy import Policy, Taint
from extender.kube.client import JSON, Listing, Resource
from extender.kube.errors import KubeApiError, asked_wait_s
from extender.warm.checks import keep_warm_profiles, node_warm
from extender.warm.jobspec import parse_time
from extender.warm.metrics import WarmMetrics

log = logging.getLogger(__name__)


class NodeKube(Protocol):
    """What the tainter needs from :class:`extender.kube.client.KubeClient`."""

    def listing(self, resource: Resource, *, field_selector: str | None = None,
                label_selector: str | None = None) -> Listing: ...

    def get_node(self, name: str) -> JSON: ...

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> JSON: ...


def _taints(node: JSON) -> list[JSON]:
    return list((node.get("spec") or {}).get("taints") or [])


#: Node annotation naming the taint the warmer put (``<key>:<effect>``): the marker that lets it find
#: and remove its own taint after a policy change or a restart.
MARKER_ANNOTATION = "extender.io/warming-taint"

#: A taint as (key, effect), what identifies it on a node.
TaintId = tuple[str, str]


def retry_note(wait_s: float | None) -> str:
    """When a failed call is tried again: the next tick, or after the pause the API server asked for."""
    return "next tick" if wait_s is None else f"in {wait_s:g}s, as the API server asked"


def taint_id(taint: Taint) -> TaintId:
    return taint.key, taint.effect


def has_taint(node: JSON, taint: Taint | TaintId) -> bool:
    key, effect = taint_id(taint) if isinstance(taint, Taint) else taint
    return any(t.get("key") == key and t.get("effect") == effect for t in _taints(node))


def marked_taint(node: JSON) -> TaintId | None:
    """The taint the warmer's marker names on ``node``, or ``None``."""
    text = str(((node.get("metadata") or {}).get("annotations") or {}).get(MARKER_ANNOTATION) or "")
    key, sep, effect = text.rpartition(":")
    return (key, effect) if sep and key and effect else None


@dataclass(frozen=True)
class _Tainted:
    """A node carrying our taint: when it was created, and which taint it carries."""

    created: float
    taint: TaintId


@dataclass
class TaintChanges:
    """What one reconcile did, for the tick's report."""

    tainted: list[str] = field(default_factory=list)
    untainted: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: The wait the API server asked for with an error (``Retry-After``), if it did.
    retry_after_s: float | None = None


@dataclass
class _Pass:
    """One reconcile's inputs and results."""

    policy: Policy
    snapshot: InventorySnapshot
    now: float
    published: Collection[tuple[str, str]]
    changes: TaintChanges

    def warm(self, name: str) -> bool:
        row = self.snapshot.positions.get(name)
        return row is not None and node_warm(self.policy, self.snapshot, row, self.now, self.published)


class NodeTainter:
    """Adds the warming taint to joining nodes and removes it when they are warm."""

    def __init__(self, kube: NodeKube, metrics: WarmMetrics) -> None:
        self.kube = kube
        self.metrics = metrics
        #: Nodes carrying our taint -> their creation time (unix seconds) and that taint.
        self.tracked: dict[str, _Tainted] = {}
        self.seen: set[str] = set()
        self._listed = False

    def reconcile(self, policy: Policy, snapshot: InventorySnapshot, now: float,
                  published: Collection[tuple[str, str]]) -> TaintChanges:
        """One pass: notice new nodes, taint the cold ones, untaint the warm or overdue ones."""
        run = _Pass(policy, snapshot, now, published, TaintChanges())
        tainting = policy.warming.new_nodes.taint_until_warm
        if not tainting and self._listed and not self.tracked:
            return run.changes  # nothing of ours on any node, nothing to put
        try:
            if not self._listed:
                self._list_nodes(run, tainting=tainting)
            for record in snapshot.nodes if tainting else ():
                if record.name not in self.seen:
                    try:
                        node = self.kube.get_node(record.name)
                    except KubeApiError as exc:
                        if exc.status == 404:
                            continue  # deleted meanwhile: the sync will drop it
                        raise
                    self._first_sight(run, node, tainting=True)
            for name, tainted in sorted(self.tracked.items()):
                self._maybe_untaint(run, name, tainted)
        except KubeError as exc:
            self.metrics.errors.labels("taint").inc()
            run.changes.errors.append(f"node taints: {exc}")
            run.changes.retry_after_s = wait = asked_wait_s(exc)
            log.warning("node taints: %s; retrying %s", exc, retry_note(wait),
                        extra={"error": str(exc), "retry_in_s": wait})
        self.metrics.tainted.set(len(self.tracked))
        return run.changes

    def _list_nodes(self, run: _Pass, *, tainting: bool) -> None:
        """The start-up list of every Node, for the taints a warmer put before (page by page: only
        names and taints are kept).

        Without ``taintUntilWarm`` the list only looks for taints left from when it was on, and a
        warmer not granted the list (the chart's ``warmer.taintNodes: false``) can have left none: a
        403 then ends the search, where retried it was a warning and an error count every tick.
        """
        try:
            for node in self.kube.listing("nodes"):
                self._first_sight(run, node, tainting=tainting)
        except KubeApiError as exc:
            if tainting or exc.status != 403:
                raise
            log.info("node taints: not allowed to list Nodes (%s); taintUntilWarm is off, so no taint of "
                     "ours is looked for", exc, extra={"error": str(exc)})
        self._listed = True

    def _first_sight(self, run: _Pass, node: JSON, *, tainting: bool) -> None:
        meta = node.get("metadata") or {}
        name = str(meta.get("name", ""))
        created = parse_time(meta.get("creationTimestamp")) or run.now
        taint = run.policy.warming.new_nodes.taint
        marked = marked_taint(node)
        if marked is not None and has_taint(node, marked):
            self.tracked[name] = _Tainted(created, marked)  # ours, whatever the policy says now
        elif has_taint(node, taint):
            # registered with it (kubelet --register-with-taints): ours too, and removed as ours
            # even with taintUntilWarm off, since only the warmer would ever take it off
            self.tracked[name] = _Tainted(created, taint_id(taint))
        elif tainting and self._wants_taint(run, node, created):
            if not self._patch(node, add=taint, remove=None):
                return  # conflict: look again next tick
            self.tracked[name] = _Tainted(created, taint_id(taint))
            run.changes.tainted.append(name)
            self.metrics.taint_changes.labels("added", "joined").inc()
            log.info("node %s joined cold: tainted %s until warm", name, taint.key,
                     extra={"node": name, "taint": taint.key})
        self.seen.add(name)

    def _wants_taint(self, run: _Pass, node: JSON, created: float) -> bool:
        policy = run.policy
        if not policy.warming.enabled or run.now - created > policy.warming.new_nodes.join_window:
            return False
        meta = node.get("metadata") or {}
        name = str(meta.get("name", ""))
        row = run.snapshot.positions.get(name)
        if row is not None:
            cls = run.snapshot.classes[int(run.snapshot.class_index[row])]
        else:
            cls = policy.classify_node(dict(meta.get("labels") or {}))
        return bool(keep_warm_profiles(policy, cls)) and not run.warm(name)

    def _maybe_untaint(self, run: _Pass, name: str, tainted: _Tainted) -> None:
        nn = run.policy.warming.new_nodes
        if not run.policy.warming.enabled:
            why = "disabled"
        elif not nn.taint_until_warm or tainted.taint != taint_id(nn.taint):
            why = "policy"  # taints turned off, or another taint now: ours must still go
        elif run.warm(name):
            why = "warm"
        elif run.now - tainted.created >= nn.max_taint:
            why = "max-taint"
        else:
            return
        try:
            node = self.kube.get_node(name)
        except KubeApiError as exc:
            if exc.status == 404:
                del self.tracked[name]
                return
            raise
        if (has_taint(node, tainted.taint) or marked_taint(node) is not None) and \
                not self._patch(node, add=None, remove=tainted.taint):
            return
        del self.tracked[name]
        run.changes.untainted.append(name)
        self.metrics.taint_changes.labels("removed", why).inc()
        log.info("node %s: warming taint removed (%s)", name, why, extra={"node": name, "reason": why})

    def _patch(self, node: JSON, *, add: Taint | None, remove: TaintId | None) -> bool:
        """Replace the node's taints and set or clear our marker, guarded by its resourceVersion;
        ``False`` on a conflict."""
        meta = node.get("metadata") or {}
        taints = _taints(node)
        marker: str | None = None  # a merge patch deletes the annotation
        if remove is not None:
            taints = [t for t in taints if (t.get("key"), t.get("effect")) != remove]
        if add is not None:
            taints.append({"key": add.key, "value": add.value, "effect": add.effect})
            marker = f"{add.key}:{add.effect}"
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"),
                              "annotations": {MARKER_ANNOTATION: marker}},
                 "spec": {"taints": taints}}
        try:
            self.kube.patch_node(str(meta.get("name")), patch)
        except KubeApiError as exc:
            if exc.status == 409:
                return False
            raise
        return True
