"""Sharing a fleet that cannot hold every workload's desired replicas.

Each scaler decision is made per workload (extender.core.scaler.decide). When the GPUs the fleet
has, plus those its node pools can still add, are fewer than the sum of the decisions, this module
decides who gets what. Three rounds, each filled completely before the next starts::

    round 1: minReplicas                       target_1 = minimum
    round 2: the observed load's need          target_2 = max(minimum, min(observed, desired))
    round 3: the forecast's extra              target_3 = desired

Within a round, replicas are granted one at a time to the claim with the highest ``priority``
(the profile's ``priority``), then the smallest granted share of its round target
(``granted / target``), then the name; a claim whose next replica no longer fits the GPUs left
drops out of the round. So a workload's forecast (round 3) is never served before every workload's
observed need (round 2): one forecast cannot starve another workload's observed load, whatever the
priorities. When everything fits, every claim gets ``desired``.

GPUs are counted as one pool: a replica needs ``gpus`` of the total. Fragmentation (a TP=8 replica
needs eight free GPUs on one node) is the placement's concern (the packing term of
extender.core.scoring); this module only keeps the sum within what exists.

The pool (:func:`fleet_capacity`), for the workloads being shared::

    classes  = every node class one of the workloads may run on and whose nodes hold one of its
               replicas (Policy.classes_hosting: a TP=8 workload gets nothing from 1-GPU nodes)
    present  = sum of the GPUs of the nodes of those classes (the scaler: fresh inventory records)
    headroom = sum over those classes of max(0, maxNodes - nodes present of the class) x gpu.count
    gpus     = present + headroom

Not capped (``gpus`` is ``None``, every decision stands) when nothing is known about the nodes (no
inventory) or one of the classes has no ``maxNodes`` (its pool may grow without a declared bound):
sharing fails open, so a missing input never removes a replica. Workloads whose classes do not
overlap are still counted in one pool (a sum over their classes): an approximation that can only
over-state what one of them could get, never cut one below what its own classes hold.

A workload's claim (:func:`claim`) comes from its decision: ``observed = ceil(reactive need)``
(``current`` when nothing was observed: nothing is removed on missing data), ``desired`` the
decision's. The scaler loop and the simulator both build their claims there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from extender.core.policy import Policy, Profile
from extender.core.scaler import Action, Decision

#: ceil() of a need computed as 11.000000000000002 must be 11 (as in extender.core.scaler).
_CEIL_SLACK = 1e-9


@dataclass(frozen=True)
class Claim:
    """One workload's demand on the fleet: replicas wanted, in GPUs per replica."""

    workload: str
    priority: int
    gpus: int
    minimum: int
    #: Replicas the observed load needs now (without any forecast).
    observed: int
    #: Replicas the scaler decided (forecast included).
    desired: int


def share(claims: Sequence[Claim], gpus: int) -> dict[str, int]:
    """Replicas granted per workload out of ``gpus`` GPUs (the module docstring has the rule)."""
    if sum(c.desired * c.gpus for c in claims) <= gpus:
        return {c.workload: c.desired for c in claims}
    granted = {c.workload: 0 for c in claims}
    left = gpus
    rounds = (
        {c.workload: min(c.minimum, c.desired) for c in claims},
        {c.workload: max(min(c.minimum, c.desired), min(c.observed, c.desired)) for c in claims},
        {c.workload: c.desired for c in claims},
    )
    for target in rounds:
        active = [c for c in claims if granted[c.workload] < target[c.workload]]
        while active:
            active = [c for c in active if granted[c.workload] < target[c.workload] and c.gpus <= left]
            if not active:
                break
            best = min(active, key=lambda c: (-c.priority, granted[c.workload] / target[c.workload], c.workload))
            granted[best.workload] += 1
            left -= best.gpus
    return granted


def claim(profile: Profile, *, minimum: int, reactive: float | None, current: int, desired: int) -> Claim:
    """``profile``'s claim: ``observed = ceil(reactive)`` (``current`` when ``reactive`` is ``None``)."""
    observed = current if reactive is None else max(0, math.ceil(reactive - _CEIL_SLACK * max(1.0, abs(reactive))))
    return Claim(profile.name, profile.priority, profile.parallelism.gpus, minimum, observed, desired)


@dataclass(frozen=True)
class FleetCapacity:
    """GPUs the shared workloads can have (``None``: not capped) and where that number came from."""

    gpus: int | None
    note: str


def fleet_capacity(policy: Policy, profiles: Iterable[Profile],
                   nodes: Sequence[tuple[str, int]] | None) -> FleetCapacity:
    """The pool :func:`share` divides (module docstring): ``nodes`` are (class name, GPUs) of the
    nodes known to exist; ``None`` when nothing is known (no inventory)."""
    names: dict[str, None] = {}
    for p in profiles:
        names.update((c.name, None) for c in policy.classes_hosting(p))
    classes = [policy.node_class(n) for n in names]
    if nodes is None:
        return FleetCapacity(None, "not capped: no inventory, so the fleet's size is unknown")
    unbounded = [c.name for c in classes if c.max_nodes is None]
    if unbounded:
        return FleetCapacity(None, f"not capped: node class {', '.join(unbounded)} has no maxNodes")
    present = {c.name: 0 for c in classes}
    gpus = {c.name: 0 for c in classes}
    for name, n in nodes:
        if name in present:
            present[name] += 1
            gpus[name] += n
    headroom = {c.name: max(0, (c.max_nodes or 0) - present[c.name]) * c.gpu.count for c in classes}
    total = sum(gpus.values()) + sum(headroom.values())
    parts = ", ".join(f"{c.name} {gpus[c.name]} on {present[c.name]} nodes + {headroom[c.name]} to "
                      f"maxNodes {c.max_nodes}" for c in classes)
    return FleetCapacity(total, f"{total} GPUs ({parts})")


def apply_share(decision: Decision, mine: Claim, granted: int, capacity: FleetCapacity) -> Decision:
    """``decision`` with ``desired`` cut to ``granted`` by :func:`share` (unchanged when it fits).

    The cut is in the reasons (``extender scale explain``) and ``unshared`` keeps what the decision
    wanted; the stabilisation history keeps the unshared recommendation, so the workload grows back
    as soon as the fleet has room.
    """
    if granted >= decision.desired:
        return decision
    current = decision.current
    action: Action = "scale-up" if granted > current else "scale-down" if granted < current else "hold"
    why = (f"cut from {decision.desired} to {granted} by sharing the fleet ({capacity.note}): observed "
           f"needs ({mine.observed} here) come before any forecast, then priority ({mine.priority} here)")
    return decision.model_copy(update={"desired": granted, "unshared": decision.desired, "action": action,
                                       "reasons": (*decision.reasons, why)})
