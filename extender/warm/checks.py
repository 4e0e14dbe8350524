"""What the inventory says about warm work: is an action's cache there, is an eviction still safe, is a node warm.

Pure functions over an :class:`~extender.core.inventory.InventorySnapshot` (or one node record),
with the same readings the planner and the estimator use, so the executor never disagrees with
the plan about what "present" means.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import assert_never

from extender.core.caches import KINDS, SPECS, caches_weights, held, ids_in_use, weights_key
from extender.core.errors import UnknownNameError
from extender.core.estimate import CompileCache
from extender.core.images import names_for, normalise_all
from extender.core.inventory import InventorySnapshot, NodeState
from extender.core.policy import NodeClass, Policy, Profile
from extender.core.warming import Action, Eviction
from extender.warm.steps import parse_cache_id


def _profile(policy: Policy, name: str) -> Profile | None:
    try:
        return policy.profile(name)
    except UnknownNameError:
        return None


def node_class(snapshot: InventorySnapshot, row: int) -> NodeClass:
    """The class a snapshot row is classified as."""
    return snapshot.classes[int(snapshot.class_index[row])]


def published_snapshots(policy: Policy) -> frozenset[tuple[str, str]]:
    """(workload, node class) pairs whose snapshot can be fetched: the policy's list, when a template can."""
    if policy.warming.templates.snapshot is None:
        return frozenset()
    return policy.warming.snapshot_pairs()


def present(policy: Policy, snapshot: InventorySnapshot, action: Action, now: float) -> bool | None:
    """Does the inventory show the cache ``action`` stages? ``None``: the node is unknown or its record stale.

    Weights count only when complete (the profile's bytes, as the planner counts them): a partial
    result is not the action done. Images are read from every name the node reports.
    """
    row = snapshot.positions.get(action.node)
    if row is None:
        return None
    record = snapshot.nodes[row]
    if not record.fresh(now):
        return None
    kind, name = parse_cache_id(action.cache)
    profile = _profile(policy, action.workload)
    match kind:
        case "image":
            digest = None
            if profile is not None and profile.image.reference == name and profile.compile.key is not None:
                digest = profile.compile.key.image_digest
            return not names_for(name, digest).isdisjoint(normalise_all(record.images))
        case "weights":
            have = record.weights.get(name, 0)
            if profile is not None and weights_key(profile.name, profile.weights.version) == name:
                return have >= profile.weights.bytes
            return have > 0
        case "compile" | "snapshot" | "adapter":
            return name in held(record, SPECS[kind])
        case _:
            assert_never(kind)


def unsafe_evictions(policy: Policy, record: NodeState | None, cls: NodeClass,
                     evictions: Iterable[Eviction]) -> list[str]:
    """Evictions a pod now needs (it started after the plan was made); all of them when the record is gone."""
    planned = [e.cache for e in evictions]
    if record is None:
        return planned
    needed = ids_in_use(policy, record, cls)
    return [c for c in planned if c in needed]


def keep_warm_profiles(policy: Policy, cls: NodeClass) -> list[Profile]:
    """The keep-warm workloads that may run on a class."""
    out = []
    for name in policy.warming.keep_warm:
        profile = _profile(policy, name)
        if profile is not None and cls.name in {c.name for c in policy.classes_for(profile)}:
            out.append(profile)
    return out


def node_warm(policy: Policy, snapshot: InventorySnapshot, row: int, now: float,
              published: Collection[tuple[str, str]]) -> bool:
    """Does the node hold every keep-warm cache it can get? (A stale record never counts as warm.)

    "Can get": the image; the weights and preloaded adapters when the class has NVMe and the profile
    caches weights; the compile cache when its key is in the registry; the snapshot when one is
    published for the class. A cache that cannot be had (no NVMe room, nothing published) does not hold a node back.
    """
    record = snapshot.nodes[row]
    if not record.fresh(now):
        return False
    cls = node_class(snapshot, row)
    for profile in keep_warm_profiles(policy, cls):
        state, _ = snapshot.cache_state(profile)
        for spec in KINDS:
            match spec.kind:
                case "image":
                    lacking = not state.image[row]
                case "weights":
                    lacking = caches_weights(profile, cls) and state.weights_bytes[row] < profile.weights.bytes
                case "compile":
                    lacking = state.compile[row] == CompileCache.REGISTRY
                case "snapshot":
                    lacking = (profile.snapshot is not None and (profile.name, cls.name) in published
                               and not state.snapshot[row])
                case "adapter":
                    lacking = caches_weights(profile, cls) and not state.adapters[row].all()
                case _:
                    assert_never(spec.kind)
            if lacking:
                return False
    return True
