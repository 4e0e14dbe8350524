"""Which compile caches to publish to the registry, and from which node. Pure.

A replica that compiled on a node leaves ``<root>/compile/<key>/`` behind; the agent reports the
key. Once such a key has been seen for ``publishAfter`` (engines fill the directory while they
compile; publishing it half-written would hand a partial cache to every node), and it is neither
in the registry nor being published, one node holding it (the first by name, fresh, with a free
slot) uploads it with the ``publishCompile`` template, within the same caps as the warm actions (a
slot on the holder node and in the cluster, its bytes in ``bytesPerTick``). When that Job succeeds
the key goes into the registry set (:meth:`extender.state.store.InventoryStore.add_registry`),
and the estimator's "in registry" state, and with it the planner's compile fetches, become real
for every node of the class.

Only keys that some profile computes for some class are published: a key we cannot map to a
workload is nothing the planner would ever fetch.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from extender.core.caches import compile_key
from extender.core.inventory import InventorySnapshot
from extender.core.policy import Policy
from extender.warm.checks import node_class
from extender.warm.jobspec import Publish


@dataclass(frozen=True)
class Holder:
    """A fresh node holding an unpublished key, and the workload the key is for."""

    node: str
    node_class: str
    workload: str
    bytes: int


def unpublished(policy: Policy, snapshot: InventorySnapshot, now: float) -> dict[str, list[Holder]]:
    """Keys of known workloads on fresh nodes that the registry lacks, with their holders sorted by node name."""
    keys: dict[tuple[str, str], tuple[str, int]] = {}  # (class, key) -> (workload, artifact bytes)
    for profile in policy.profiles:
        for cls in policy.classes_for(profile):
            key = compile_key(profile, cls)
            if key is not None:
                keys.setdefault((cls.name, key), (profile.name, profile.compile.artifact_bytes))
    fresh = snapshot.fresh(now)
    out: dict[str, list[Holder]] = {}
    for row, record in enumerate(snapshot.nodes):
        if not fresh[row]:
            continue
        class_name = node_class(snapshot, row).name
        for key in record.compile_keys:
            found = keys.get((class_name, key))
            if found is None or key in snapshot.registry:
                continue
            size = record.cache_bytes.get(f"compile:{key}", found[1])
            out.setdefault(key, []).append(Holder(record.name, class_name, found[0], size))
    for holders in out.values():
        holders.sort(key=lambda h: h.node)
    return out


def candidates(policy: Policy, holders: Mapping[str, list[Holder]], first_seen: Mapping[str, float], now: float,
               *, busy: Collection[str], limit: int, running: Mapping[str, int] | None = None,
               budget: float | None = None) -> list[Publish]:
    """Keys to publish now: seen for ``publishAfter``, not ``busy`` (in flight or backing off), at most ``limit``.

    A publish Job is a warm Job like the others: ``running`` (warm Jobs per node, running or
    started this tick) keeps each one to a holder below ``maxConcurrentPerNode`` (the first such
    holder by name; a key none of whose holders has room waits), and the upload's bytes come out of
    ``budget`` (what ``bytesPerTick`` leaves after the tick's actions; ``None``: no limit).
    """
    per_node = policy.warming.max_concurrent_per_node
    load = dict(running or {})
    left = float("inf") if budget is None else float(budget)
    out: list[Publish] = []
    for key in sorted(holders):
        if len(out) >= limit:
            break
        seen = first_seen.get(key)
        if key in busy or seen is None or now - seen < policy.warming.publish_after:
            continue
        h = next((h for h in holders[key] if load.get(h.node, 0) < per_node), None)
        if h is None or h.bytes > left:
            continue
        load[h.node] = load.get(h.node, 0) + 1
        left -= h.bytes
        out.append(Publish(key=key, node=h.node, workload=h.workload, node_class=h.node_class, bytes=h.bytes))
    return out
