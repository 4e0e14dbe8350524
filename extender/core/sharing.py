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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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
