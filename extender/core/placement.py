"""Where the next replica of a workload would land, and how long it would take to start there.

The scaler's horizon is the startup of the *next* replica (:func:`extender.core.scaler.horizon`),
and that depends on the node it gets: on a node that already holds the image, the weights and the
compile cache it starts in seconds, on a cold one in minutes. The extender scores nodes by the
same estimate and kube-scheduler takes the best score, so the next replica lands on::

    argmin over rows r of r_n x estimate(profile, r).total_s     r_n: the node's factor (per-node
                                                                  calibration; 1 for most nodes)
    where r is fresh (its agent reported within its TTL),
          has gpus_free >= tensor x pipeline of the profile,
          and is of a node class the profile may run on

When no such node exists the replica waits for one that has nothing cached (a node being
provisioned, or one freed later): the horizon is then the *cold* estimate on the slowest class
the profile may run on whose nodes have the GPUs of a replica (a class with fewer never gets it),
plus ``scaling.provisionDelay`` (the node autoscaler's time to a Ready node; 0 on a fixed fleet).
Slowest, because a longer horizon only lets the forecast raise the
decision earlier (it is a floor, never a cut), while a too-short one would start replicas late.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from extender.core.calibration import NO_NODE_FACTORS, NodeFactors
from extender.core.estimate import CacheState, CompileCache, cold_by_class, estimate
from extender.core.inventory import InventorySnapshot
from extender.core.policy import Policy, Profile


@dataclass(frozen=True)
class Placement:
    """The next replica's estimated startup, the node and class it assumed, and its cache in words."""

    startup_s: float
    node: str | None
    node_class: str | None
    cache: str


def _cache_words(state: CacheState, i: int, profile: Profile) -> str:
    """What node ``i`` holds, e.g. ``image, weights 40% local; compile cache in the registry``."""
    parts: list[str] = []
    if state.image[i]:
        parts.append("image")
    have = float(state.weights_bytes[i])
    if have >= profile.weights.bytes:
        parts.append("weights")
    elif have > 0:
        parts.append(f"weights {100 * have / profile.weights.bytes:.0f}%")
    compile_state = int(state.compile[i])
    if compile_state == CompileCache.LOCAL:
        parts.append("compile cache")
    if state.snapshot[i]:
        parts.append("snapshot")
    words = [", ".join(parts) + " local"] if parts else []
    if compile_state == CompileCache.REGISTRY:
        words.append("compile cache in the registry")
    return "; ".join(words) or "cold"


def next_replica(policy: Policy, profile: Profile, snapshot: InventorySnapshot | None, now: float,
                 nodes: NodeFactors = NO_NODE_FACTORS) -> Placement:
    """Placement and startup estimate of the workload's next replica (rules in the module docstring);
    ``nodes``: the per-node factors, as the extender scores with them."""
    classes = policy.classes_for(profile)
    gpus = profile.parallelism.gpus
    if snapshot is not None and len(snapshot):
        n = len(snapshot)
        names = {c.name for c in classes}
        allowed = np.array([c.name in names for c in snapshot.classes], dtype=np.bool_)
        ok = snapshot.fresh(now)[:n] & (snapshot.gpus_free[:n] >= gpus) & allowed[snapshot.class_index[:n]]
        rows = np.flatnonzero(ok).astype(np.intp)
        if rows.size:
            state, table = snapshot.state_for(profile, rows, now)
            est = estimate(profile, snapshot.classes, snapshot.class_index[rows], state, table)
            if nodes:
                est = est.scaled(nodes.rows(snapshot)[rows])
            best = int(np.argmin(est.total_s))
            row = int(rows[best])
            return Placement(
                startup_s=float(est.total_s[best]),
                node=snapshot.nodes[row].name,
                node_class=snapshot.classes[int(snapshot.class_index[row])].name,
                cache=_cache_words(state, best, profile),
            )
    return on_new_node(policy, profile)


def on_new_node(policy: Policy, profile: Profile) -> Placement:
    """The next replica when no node has room for it: a cold start on the slowest class the profile
    may run on that has the GPUs of a replica, plus ``scaling.provisionDelay`` for the node (module
    docstring)."""
    classes = policy.classes_hosting(profile)
    cold = cold_by_class(profile, classes)
    worst = int(np.argmax(cold.total_s))
    delay = float(policy.scaling.provision_delay)
    new_node = f" on a new node (+{delay:g}s provisioning)" if delay else ""
    return Placement(
        startup_s=float(cold.total_s[worst]) + delay,
        node=None,
        node_class=classes[worst].name,
        cache=f"cold: no fresh node with {profile.parallelism.gpus} free GPU(s), assuming the slowest class{new_node}",
    )
