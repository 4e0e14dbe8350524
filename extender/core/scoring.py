"""Estimated seconds to ready -> the extender's integer scores and filter verdicts.

kube-scheduler adds ``score x weight x 10`` to each node's in-tree total (docs/kubernetes-interfaces.md 2.5), reads
scores as JSON integers and does not clamp them. So a score must be an integer in 0..10, and it
must mean the same thing on every request: if the mapping were rescaled to the candidates of one
call, a 2-second difference among cold nodes would become 0 vs 10 and override every in-tree
plugin. The mapping is therefore absolute, fixed per profile for one policy version::

    T_ref  = max over the classes the profile may run on that have the GPUs of one replica
             of the fully cold estimate                                             (seconds)
    s      = max(scoring.secondsPerPoint, T_ref / 10)                                 (seconds per point)
    points = clamp(round((T_ref - T) / s), 0, 10)
    score  = max(points - scoring.nvmePressurePenalty, 0)   if the node keeps the weights on NVMe
                                                            and its free NVMe cannot hold the
                                                            weights it still lacks
           = points                                         otherwise
    fill   = (G - F + r) / G      G the node's GPUs (its class), F its free GPUs, r the pod's GPUs
    score  = min(score + round(scoring.packingPoints x fill), 10)   when F >= r and G > 0
    lost   = sum over larger profiles Q (g_Q > r GPUs per replica) warm on the node of
             g_Q x (floor(F / g_Q) - floor((F - r) / g_Q))          GPUs of warm replica slots lost
    score  = max(score - round(scoring.protectWarmPoints x min(lost / G, 1)), 0)   when F >= r


* Comparable across node classes: ``T`` is the node's own estimate on its own class, measured
  against one reference for the profile, so a warm fast node scores at least as high as a warm slow
  one, and a warm slow node outranks a cold fast one exactly when its estimate is lower by a point
  or more.
* ``s`` is at least ``T_ref / 10`` so the slowest cold start scores 0 and an instant start 10; it
  is at least ``secondsPerPoint`` so a profile with short starts does not turn a few seconds into
  many points.
* Estimates above ``T_ref`` clamp to 0; NaN counts as cold (0). A node of no known class (no
  inventory record and no labels to classify it by, or labels no class matches) scores 0 whatever
  its estimate and its free GPUs (no packing points): its estimate rests on seed-default
  bandwidths, which may be faster than the policy's slowest class, its GPU count is unknown, and a
  node nothing is known of must not outrank a known cold one. So does a node of a class outside
  the profile's ``nodeClasses``: the scheduler asks about it only when the pod's own affinity
  allows it, and a warm node the policy says the workload does not run on (a faster class, say)
  must not draw it there; the filter still passes it (the pod's spec, not the policy, says where
  it may run).
* The packing term (``scoring.packingPoints``, default 0: off) is GPU bin-packing among nodes that
  are otherwise equal: the fuller a node would be with the pod on it, the more points. It counters
  kube-scheduler's ``LeastAllocated``, which spreads one-GPU pods over the big nodes until none keeps
  room for a TP=4 or TP=8 replica. It applies only when the caller knows the free GPUs (the
  inventory's ``gpusFree``, from a fresh record: a stale record's count may be long out of date, so
  its node counts as having none free); a node without room for the pod gets nothing (the
  scheduler filters it anyway). It can lift a colder node over a warmer one by at most
  ``packingPoints``, so keep it below the points a warm start is worth.
* The protection term (``scoring.protectWarmPoints``, default 0: off) charges a placement for the
  warm replica slots it takes from larger profiles: a one-GPU pod on a node that holds a TP=8
  model's caches with 8 GPUs free leaves no room for that model's warm start (8 GPUs lost of 8: the
  whole penalty); on a 4-GPU node warm for a TP=2 model with 4 free it costs one slot (2 of 4: half).
  "Warm" for Q means a replica of Q would download nothing there (:func:`warm_nodes`). Only larger
  profiles count, so pods of one size compete on their own warmth alone. It applies only when the
  caller knows the free GPUs (fresh records, as for packing) and passes the other profiles' warm
  nodes (``NodeInputs.others``).
* NVMe pressure applies only when the profile caches weights (``weights.cache`` is not ``none``),
  only on nodes whose class has NVMe to keep them on (:func:`caches_weights`: a class without NVMe
  streams the weights, writes nothing and evicts nothing), and only to nodes whose free space is
  known from the inventory; it can only lower a score, and more cache on a node never raises
  pressure, so more cache never lowers a score, unless ``protectWarmPoints`` is on: a node warm
  for a larger profile too (the image they share) is charged for the slots it would take from it.

Hard rules (``Profile.filter``, all off by default) reject a node only on evidence:

* ``requireNvmeFit``: the node's class cannot hold the weights even when empty -> unresolvable
  (no preemption or eviction makes a disk larger); a fresh inventory record shows too little free
  NVMe for the bytes still missing -> failed (space changes as caches are evicted and pods leave).
* ``requireStartupWithinSlo``: a fresh record's estimate on a known class exceeds ``startupSlo`` ->
  unresolvable (evicting pods does not warm a node).

A node with no record, a stale record or an unknown class passes the rules that need that record:
the extender must never be the reason a pod stays pending on data it does not have.

This module is pure (numpy only) so the server, ``extender explain`` and the simulator share it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
from numpy.typing import NDArray

from extender.core.caches import keeps_weights
from extender.core.estimate import CacheState, ClassTable, Estimate, cold_by_class, estimate
from extender.core.policy import UNKNOWN_CLASS, NodeClass, Policy, Profile

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
Mask = NDArray[np.bool_]

#: ``extenderv1.MinExtenderPriority`` / ``MaxExtenderPriority``.
MIN_SCORE = 0
MAX_SCORE = 10

#: The score every node gets when the extender has no opinion (unmatched pod, fail-open).
NEUTRAL_SCORE = 0


class Verdict(IntEnum):
    """Filter outcome for one node, ordered by severity."""

    PASS = 0
    #: ``FailedNodes``: Unschedulable, preemption may still try the node.
    FAILED = 1
    #: ``FailedAndUnresolvableNodes``: preemption skips the node.
    UNRESOLVABLE = 2


class Rule(IntEnum):
    """Which hard rule a node broke (bit flags, so a node can break several)."""

    NVME_CAPACITY = 1
    NVME_FREE = 2
    SLO = 4


@dataclass(frozen=True)
class Scale:
    """Seconds-to-points mapping of one profile, fixed for a policy version."""

    reference_s: float
    seconds_per_point: float

    def points(self, total_s: F64) -> I64:
        """``clamp(round((T_ref - T) / s), 0, 10)``; NaN counts as cold (0 points)."""
        with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN are handled just below
            raw = (self.reference_s - np.asarray(total_s, dtype=np.float64)) / self.seconds_per_point
        raw = np.where(np.isnan(raw), 0.0, raw)
        return np.clip(np.rint(raw), MIN_SCORE, MAX_SCORE).astype(np.int64)


def scale_for(policy: Policy, profile: Profile) -> Scale:
    """The profile's fixed scale: slowest fully cold start over the classes that can host a replica
    (:meth:`Policy.classes_hosting`), and seconds per point."""
    reference = float(cold_by_class(profile, policy.classes_hosting(profile)).total_s.max())
    return Scale(reference, max(float(policy.scoring.seconds_per_point), reference / MAX_SCORE))


def lacking_bytes(profile: Profile, weights_local: F64) -> F64:
    """Bytes of the profile's weights each node does not hold yet."""
    total = float(profile.weights.bytes)
    return total - np.clip(np.asarray(weights_local, dtype=np.float64), 0.0, total)


def nvme_pressure(lacking: F64, usable_free: F64, free_known: Mask, keeps: Mask) -> Mask:
    """Nodes whose usable free NVMe cannot take the weights they lack without evicting something.

    Only where the node keeps the weights on NVMe (``keeps``, :func:`extender.core.caches.keeps_weights`):
    a profile that streams them (``cache: none``) or a class without NVMe writes nothing there and
    evicts nothing.
    """
    out: Mask = keeps & free_known & (lacking > 0) & (usable_free < lacking)
    return out


def packing(classes: Sequence[NodeClass], class_index: NDArray[np.intp], gpus_free: I64, request: int,
            points: int) -> I64:
    """``round(points x (G - F + r) / G)`` per node, 0 where the pod does not fit or G is 0."""
    total = np.array([c.gpu.count for c in classes], dtype=np.float64)[class_index]
    free = np.asarray(gpus_free, dtype=np.float64)
    fits = (total > 0) & (free >= request)
    fill = np.where(fits, (total - free + request) / np.maximum(total, 1.0), 0.0)
    out: I64 = np.rint(points * np.clip(fill, 0.0, 1.0)).astype(np.int64)
    return out


@dataclass(frozen=True)
class WarmSlots:
    """Another profile's replica size and the nodes where a replica of it would start warm."""

    gpus: int
    warm: Mask


def warm_nodes(profile: Profile, classes: Sequence[NodeClass], class_index: NDArray[np.intp],
               state: CacheState) -> Mask:
    """Nodes where a replica of ``profile`` downloads nothing: the image is there, and the whole
    weights too where its class keeps them on NVMe."""
    keeps = keeps_weights(profile, classes, class_index)
    whole = np.asarray(state.weights_bytes, dtype=np.float64) >= float(profile.weights.bytes)
    out: Mask = np.asarray(state.image, dtype=np.bool_) & (whole | ~keeps)
    return out


def larger_warm(profile: Profile, profiles: Sequence[Profile], classes: Sequence[NodeClass],
                class_index: NDArray[np.intp], state_of: Callable[[Profile], CacheState]) -> tuple[WarmSlots, ...]:
    """The :class:`WarmSlots` of every profile with more GPUs per replica than ``profile`` (the ones the
    protection term guards); ``state_of`` gives a profile's cache state on the scored nodes."""
    r = profile.parallelism.gpus
    return tuple(WarmSlots(q.parallelism.gpus, warm_nodes(q, classes, class_index, state_of(q)))
                 for q in profiles if q.parallelism.gpus > r)


def protection(classes: Sequence[NodeClass], class_index: NDArray[np.intp], gpus_free: I64, request: int,
               others: Sequence[WarmSlots], *, points: int) -> I64:
    """``round(points x min(lost / G, 1))`` per node (formula in the module docstring); 0 where the
    pod does not fit, G is 0, or no larger profile is warm."""
    total = np.array([c.gpu.count for c in classes], dtype=np.float64)[class_index]
    free = np.asarray(gpus_free, dtype=np.int64)
    after = np.maximum(free - request, 0)
    lost = np.zeros(len(free), dtype=np.float64)
    for q in others:
        if q.gpus <= request:
            continue
        lost += np.where(q.warm, q.gpus * (free // q.gpus - after // q.gpus), 0)
    fits = (total > 0) & (free >= request)
    share = np.where(fits, lost / np.maximum(total, 1.0), 0.0)
    out: I64 = np.rint(points * np.clip(share, 0.0, 1.0)).astype(np.int64)
    return out


def scores(scale: Scale, total_s: F64, pressure: Mask, penalty: int) -> I64:
    """Integer scores 0..10: points from seconds, minus the NVMe-pressure penalty where it applies."""
    pts = scale.points(total_s)
    return np.maximum(pts - np.where(pressure, penalty, 0), MIN_SCORE).astype(np.int64)


@dataclass(frozen=True)
class Judgement:
    """Filter verdicts of n nodes: severity per node and the rules each node broke (bit flags)."""

    verdict: NDArray[np.int8]
    rules: NDArray[np.int8]


def judge(
    profile: Profile,
    *,
    total_s: F64,
    lacking: F64,
    usable_free: F64,
    usable_capacity: F64,
    fresh: Mask,
) -> Judgement:
    """Apply the profile's opt-in hard rules.

    ``usable_capacity`` is the class's NVMe capacity minus its reserve (NaN when the class is
    unknown); ``usable_free`` the record's free NVMe minus the reserve; ``fresh`` whether the node
    has a record younger than its TTL.
    """
    n = len(total_s)
    rules = np.zeros(n, dtype=np.int8)
    verdict = np.zeros(n, dtype=np.int8)
    rule = profile.filter
    if rule.require_nvme_fit:
        weights = float(profile.weights.bytes)
        # NaN (unknown class) compares False: no evidence, no rejection.
        too_small = usable_capacity < weights
        no_room = fresh & ~too_small & (lacking > 0) & (usable_free < lacking)
        rules |= np.where(too_small, np.int8(Rule.NVME_CAPACITY), np.int8(0))
        rules |= np.where(no_room, np.int8(Rule.NVME_FREE), np.int8(0))
        verdict = np.maximum(verdict, np.where(too_small, np.int8(Verdict.UNRESOLVABLE), np.int8(0)))
        verdict = np.maximum(verdict, np.where(no_room, np.int8(Verdict.FAILED), np.int8(0)))
    if rule.require_startup_within_slo and profile.startup_slo is not None:
        # an unknown class's estimate rests on seed-default bandwidths: no evidence either
        slow = fresh & ~np.isnan(usable_capacity) & (total_s > float(profile.startup_slo))
        rules |= np.where(slow, np.int8(Rule.SLO), np.int8(0))
        verdict = np.maximum(verdict, np.where(slow, np.int8(Verdict.UNRESOLVABLE), np.int8(0)))
    return Judgement(verdict=verdict.astype(np.int8), rules=rules.astype(np.int8))


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB"


_PHASE_WORDS = {
    "queue_s": "waiting for other pulls",
    "image_s": "image pull",
    "weights_s": "weights load",
    "compile_s": "torch.compile",
    "graph_s": "CUDA graph capture",
    "init_s": "engine init",
    "restore_s": "snapshot restore",
    "adapters_s": "LoRA adapters",
}


def reason(
    profile: Profile,
    rules: int,
    *,
    node_class: str,
    total_s: float,
    lacking: float,
    usable_free: float,
    usable_capacity: float,
    phases: dict[str, float] | None = None,
) -> str:
    """The text a person reads in the pod's events for a node that failed hard rules.

    It names the rule, the numbers behind it and what would change the outcome.
    """
    parts: list[str] = []
    if rules & Rule.NVME_CAPACITY:
        parts.append(
            f"node class {node_class} has {_gb(usable_capacity)} of usable NVMe, less than the "
            f"{_gb(profile.weights.bytes)} of weights profile {profile.name} requires on local disk "
            "(filter.requireNvmeFit); run it on a class with larger NVMe"
        )
    if rules & Rule.NVME_FREE:
        parts.append(
            f"free NVMe {_gb(usable_free)} (after the class reserve) cannot hold the {_gb(lacking)} of "
            f"{profile.name} weights not yet on the node (filter.requireNvmeFit); evict unused caches "
            "or warm another node"
        )
    if rules & Rule.SLO and profile.startup_slo is not None:
        slowest = ""
        if phases:
            top = sorted(((v, k) for k, v in phases.items() if k in _PHASE_WORDS and v > 0), reverse=True)[:2]
            slowest = " (mostly " + ", ".join(f"{_PHASE_WORDS[k]} {v:.0f} s" for v, k in top) + ")"
        parts.append(
            f"estimated startup {total_s:.0f} s{slowest} exceeds the {profile.startup_slo:.0f} s startup SLO of "
            f"{profile.name} (filter.requireStartupWithinSlo); warm this node or relax startupSlo"
        )
    return "; ".join(parts)


@dataclass(frozen=True)
class NodeInputs:
    """Everything the scorer needs about n nodes, already gathered for one profile.

    ``class_index`` points into ``classes``; ``state`` has stale and unknown nodes made cold;
    ``fresh`` says which nodes have a record younger than its TTL; ``free_known`` which have a
    record at all (stale records keep their free space: it changes slowly); ``nvme_free`` is raw
    free bytes from the record.
    """

    classes: Sequence[NodeClass]
    class_index: NDArray[np.intp]
    state: CacheState
    fresh: Mask
    free_known: Mask
    nvme_free: F64
    #: Free GPUs per node when known (the packing and protection terms need them); None: neither.
    gpus_free: I64 | None = None
    #: Larger profiles and where they are warm (:func:`larger_warm`), for the protection term.
    others: Sequence[WarmSlots] = ()


@dataclass(frozen=True)
class Evaluation:
    """Per-node estimate, score and verdict for one profile."""

    estimate: Estimate
    score: I64
    pressure: Mask
    judgement: Judgement
    lacking: F64
    usable_free: F64
    usable_capacity: F64

    def reason(self, profile: Profile, i: int, classes: Sequence[NodeClass], class_index: NDArray[np.intp]) -> str:
        """Why node ``i`` failed the filter (empty when it passed)."""
        rules = int(self.judgement.rules[i])
        if not rules:
            return ""
        return reason(
            profile,
            rules,
            node_class=classes[int(class_index[i])].name,
            total_s=float(self.estimate.total_s[i]),
            lacking=float(self.lacking[i]),
            usable_free=float(self.usable_free[i]),
            usable_capacity=float(self.usable_capacity[i]),
            phases=self.estimate.row(i),
        )


def barred_because(profile: Profile, node_class: NodeClass, hosts: Sequence[NodeClass]) -> str:
    """Why ``profile`` scores 0 on a node of ``node_class`` whatever its estimate and free GPUs
    (module docstring); empty when it does not. ``hosts``: :meth:`Policy.classes_for` the profile.
    The unknown class (whose one-GPU stand-in would also make any free count look like a full node
    to the packing term), and a class outside the profile's ``nodeClasses``."""
    if node_class.name == UNKNOWN_CLASS.name:
        return "no known node class (no inventory record, or labels no class matches): scored 0"
    if node_class.name not in {c.name for c in hosts}:
        return (f"class {node_class.name} is not among the node classes {profile.name} runs on "
                f"({', '.join(c.name for c in hosts)}): scored 0")
    return ""


def barred(policy: Policy, profile: Profile, classes: Sequence[NodeClass]) -> Mask:
    """Per class: True where :func:`barred_because` gives a reason."""
    hosts = policy.classes_for(profile)
    return np.array([bool(barred_because(profile, c, hosts)) for c in classes], dtype=np.bool_)


def class_nvme(classes: Sequence[NodeClass]) -> tuple[F64, F64]:
    """Per class: usable NVMe capacity (capacity - reserve; NaN for the unknown class) and reserve."""
    capacity = np.array(
        [np.nan if c.name == UNKNOWN_CLASS.name else float(c.nvme.capacity - c.nvme.reserve) for c in classes],
        dtype=np.float64,
    )
    reserve = np.array([float(c.nvme.reserve) for c in classes], dtype=np.float64)
    return capacity, reserve


def evaluate(
    policy: Policy,
    profile: Profile,
    nodes: NodeInputs,
    *,
    scale: Scale | None = None,
    table: ClassTable | None = None,
    node_factor: F64 | None = None,
) -> Evaluation:
    """Estimate, score and judge n nodes for ``profile`` in one pass of vector arithmetic.

    ``node_factor``: per node, ``r_n`` on its whole estimate (per-node calibration); ``None``: 1 everywhere.
    The scale stays the profile's (class-level cold starts): a slow node's estimate is measured
    against the same reference as its peers'.
    """
    sc = scale if scale is not None else scale_for(policy, profile)
    est = estimate(profile, nodes.classes, nodes.class_index, nodes.state, table)
    if node_factor is not None:
        est = est.scaled(node_factor)
    capacity, reserve = class_nvme(nodes.classes)
    idx = nodes.class_index
    usable_capacity = capacity[idx]
    usable_free = np.maximum(np.asarray(nodes.nvme_free, dtype=np.float64) - reserve[idx], 0.0)
    lacking = lacking_bytes(profile, nodes.state.weights_bytes)
    pressure = nvme_pressure(lacking, usable_free, nodes.free_known, keeps_weights(profile, nodes.classes, idx))
    score = scores(sc, est.total_s, pressure, policy.scoring.nvme_pressure_penalty)
    # Free GPUs of a stale record are old news: none free, so neither term below applies there.
    gpus_free = None if nodes.gpus_free is None else np.where(nodes.fresh, nodes.gpus_free, 0)
    points = policy.scoring.packing_points
    if points and gpus_free is not None:
        bonus = packing(nodes.classes, idx, gpus_free, profile.parallelism.gpus, points)
        score = np.minimum(score + bonus, MAX_SCORE).astype(np.int64)
    guard = policy.scoring.protect_warm_points
    if guard and gpus_free is not None and nodes.others:
        charge = protection(nodes.classes, idx, gpus_free, profile.parallelism.gpus, nodes.others,
                            points=guard)
        score = np.maximum(score - charge, MIN_SCORE).astype(np.int64)
    score = np.where(barred(policy, profile, nodes.classes)[idx], MIN_SCORE, score).astype(np.int64)
    judgement = judge(
        profile,
        total_s=est.total_s,
        lacking=lacking,
        usable_free=usable_free,
        usable_capacity=usable_capacity,
        fresh=nodes.fresh,
    )
    return Evaluation(est, score, pressure, judgement, lacking, usable_free, usable_capacity)
