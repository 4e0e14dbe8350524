"""The world's true startup phases, and what a strategy believes them to be.

A scenario may say that the world is not what the policy says (``truth:``): per (workload, node
class), factors on the policy's phase seconds, in calibration's own terms
(:data:`extender.core.calibration.PARAMETERS`: ``imagePull``, ``weightsRemote``, ``weightsLocal``,
``compileCold``, ``compileWarm``, ``graphCapture``, ``engineInit``, ``snapshotRestore``; ``engine`` is
both of graph capture and engine init), and a log-normal noise on each
start. Example (half the bucket bandwidth, twice the compile time, everywhere; image pulls 1.5x
slower on one class)::

    truth:
      noise: 0.05
      factors:
        - factors: {weightsRemote: 2, compileCold: 2, compileWarm: 2}
        - {nodeClass: g5.xlarge, factors: {imagePull: 1.5}}

A rule without ``workload`` or ``nodeClass`` applies to every one; factors of several matching rules
multiply. The world's policy is the policy with those factors applied by the same function that
applies a fit (:func:`extender.core.calibration.apply_calibration`), so "truth" and "calibrated"
mean the same kind of thing.

Slow nodes (``truth.nodes``): a share of the nodes of a class (or of every class) start every
replica ``factor`` times slower than their peers, whatever the workload, as a degraded disk, a
throttled NIC or a bad PCIe link would make them::

    truth:
      nodes:
        - {nodeClass: g5.12xlarge, share: 0.2, factor: 1.6}

Which nodes are slow is drawn when a node is created, from the scenario seed and the node's name
(so every strategy's run has the same slow nodes at t = 0): of each node group matching the rule,
``ceil(share x count)`` of the nodes present at t = 0, chosen without replacement; a node an
autoscaled pool launches later is slow with probability ``share`` (its own draw, by its name and
how many times its slot was launched: a relaunched slot is a new machine). Rules that match one
node multiply. The factor multiplies the world's whole startup on the node, as the product's
per-node factor multiplies the whole estimated startup (:func:`extender.core.calibration.fit_nodes`);
warm actions on the node keep the world's time: the product's model has no per-node factor on a
transfer, and a world the product cannot describe would test the model, not the strategies.

In the simulation the *cluster* runs on the world: a pod's startup is the world's estimate on its
node (times the noise), and a warm action takes the world's time. The *strategy* decides on its
:class:`Belief`: the policy, or, for the ``-calibrated`` strategies, the policy calibrated from
the starts it has seen so far (each pod that became Ready is an observation: its node's cache state
when it was placed, and its duration), refitted at most every :data:`REFIT_EVERY_S` of simulated
time. Every placed pod's believed estimate is kept beside its true startup, which is how the
estimate error of new replicas is measured over time (:func:`error_over_time`).

When the world has slow nodes, the calibrated belief also learns per-node factors with the
product's own :func:`extender.core.calibration.fit_nodes` at each refit (each start is observed
under its node's name), and the strategy scores, filters, estimates the next replica and plans
warming with them, as the extender, the scaler and the warmer do with ``calibration.mode: apply``.
Without ``truth.nodes`` the belief fits none: its world has no per-node differences, so any factor
would be the noise's (shrunk, but still moving placements at random), and runs of such scenarios
stay what they were before per-node factors were modelled.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Annotated

import numpy as np
from numpy.typing import NDArray
from pydantic import Field

from extender.core.calibration import (
    ALIASES,
    NO_NODE_FACTORS,
    PARAMETERS,
    Fit,
    NodeFactors,
    Observation,
    apply_calibration,
    fit_nodes,
    fit_pair,
    parameters_named,
    select,
)
from extender.core.document import Loc
from extender.core.estimate import CacheState, ClassTable, CompileCache, estimate
from extender.core.policy import Name, NodeClass, Policy, Profile
from extender.core.schema import Float, Schema
from extender.core.scoring import Scale, scale_for
from extender.core.warming import Action

F64 = NDArray[np.float64]

#: Simulated seconds between two refits of a calibrated strategy's belief (when starts were seen).
REFIT_EVERY_S = 900.0

Factor = Annotated[Float, Field(gt=0, le=1000)]
_WORDS = {int(CompileCache.ABSENT): "absent", int(CompileCache.REGISTRY): "registry", int(CompileCache.LOCAL): "local"}


class TruthRule(Schema):
    """Factors on the policy's phase seconds for one workload and class (either may be left out: all)."""

    workload: Name | None = None
    node_class: str | None = Field(default=None, min_length=1)
    factors: dict[str, Factor] = Field(min_length=1)


class SlowNodes(Schema):
    """A share of one class's nodes (or every class's) whose every start takes ``factor`` times the world's time."""

    node_class: str | None = Field(default=None, min_length=1)
    #: Of a group's nodes at t = 0, ``ceil(share x count)``; a node launched later: the chance it is slow.
    share: Float = Field(gt=0, le=1)
    factor: Factor


class Truth(Schema):
    """How the simulated world's startups differ from the policy's estimates (module docstring)."""

    #: Standard deviation of the log of each start's noise factor (0.05: about 5 %).
    noise: Float = Field(default=0.0, ge=0, le=1)
    factors: tuple[TruthRule, ...] = ()
    nodes: tuple[SlowNodes, ...] = ()


def check_truth(truth: Truth, policy: Policy, cluster_classes: Collection[str] | None = None
                ) -> list[tuple[Loc, str]]:
    """Rules naming a workload, class or parameter that does not exist, as ``(location, message)``;
    ``cluster_classes``: the classes of the scenario's node groups (a slow-node rule must match one)."""
    out: list[tuple[Loc, str]] = []
    profiles = {p.name for p in policy.profiles}
    classes = {c.name for c in policy.node_classes}
    where: Loc
    for i, rule in enumerate(truth.factors):
        where = ("truth", "factors", i)
        if rule.workload is not None and rule.workload not in profiles:
            out.append(((*where, "workload"), f"the policy has no profile {rule.workload!r}"))
        if rule.node_class is not None and rule.node_class not in classes:
            out.append(((*where, "nodeClass"), f"the policy has no node class {rule.node_class!r}"))
        for name in rule.factors:
            if not parameters_named(name):
                out.append(((*where, "factors", name), f"no parameter {name!r} (known: "
                            f"{', '.join((*PARAMETERS, *ALIASES))})"))
    for i, slow in enumerate(truth.nodes):
        where = ("truth", "nodes", i)
        if slow.node_class is not None and slow.node_class not in classes:
            out.append(((*where, "nodeClass"), f"the policy has no node class {slow.node_class!r}"))
        elif cluster_classes is not None and not any(slow.node_class in (None, c) for c in cluster_classes):
            have = ", ".join(sorted(set(cluster_classes))) or "none"
            out.append(((*where, "nodeClass"), f"no node group of cluster.nodes has class {slow.node_class!r} "
                                               f"(the groups' classes: {have}): the rule would slow no node"))
    return out


def _draws(seed: Sequence[int], rule: int) -> np.random.Generator:
    return np.random.default_rng([*seed, rule])


def slowness_at_start(truth: Truth | None, node_class: str, count: int, seed: Sequence[int]) -> F64:
    """Per node of a group present at t = 0, the world's factor on its starts (module docstring):
    each matching rule slows ``ceil(share x count)`` of them, drawn without replacement from
    ``seed`` + the rule's index; rules that pick the same node multiply."""
    f = np.ones(count)
    if truth is None:
        return f
    for i, rule in enumerate(truth.nodes):
        if rule.node_class not in (None, node_class) or count == 0:
            continue
        k = min(count, max(1, math.ceil(rule.share * count - 1e-9)))  # 0.3 x 10 is 3.0000000000000004
        f[_draws(seed, i).choice(count, size=k, replace=False)] *= rule.factor
    return f


def slowness_at_launch(truth: Truth | None, node_class: str, seed: Sequence[int]) -> float:
    """The world's factor on the starts of a node an autoscaled pool launches: each matching rule
    slows it with probability ``share`` (drawn from ``seed`` + the rule's index); factors multiply."""
    f = 1.0
    if truth is None:
        return f
    for i, rule in enumerate(truth.nodes):
        if rule.node_class in (None, node_class) and float(_draws(seed, i).random()) < rule.share:
            f *= rule.factor
    return f


def true_factors(truth: Truth, workload: str, node_class: str) -> tuple[float, ...]:
    """The product of every matching rule's factors, per parameter."""
    f = np.ones(len(PARAMETERS))
    for rule in truth.factors:
        if rule.workload not in (None, workload) or rule.node_class not in (None, node_class):
            continue
        for name, value in rule.factors.items():
            f[list(parameters_named(name))] *= value
    return tuple(float(v) for v in f)


def world_policy(policy: Policy, truth: Truth | None) -> Policy:
    """The policy the simulated world runs on: ``policy`` with the truth's factors applied."""
    if truth is None or not truth.factors:
        return policy
    fits = []
    for p in policy.profiles:
        for c in policy.classes_for(p):
            f = true_factors(truth, p.name, c.name)
            if any(v != 1.0 for v in f):
                zeros = (0.0,) * len(PARAMETERS)
                fits.append(Fit(p.name, c.name, 0, f, zeros, zeros, (math.inf,) * len(PARAMETERS),
                                0.0, 0.0, 0.0, 0, True))
    return apply_calibration(policy, fits)


def _transfer_bps(policy: Policy, action: Action, node_class: NodeClass) -> float:
    """The rate the warm planner assumes for an action's bytes (extender.core.warming)."""
    p = policy.profile(action.workload)
    t = ClassTable.build(p, [node_class])
    nic, stream, pull = float(t.nic_bps[0]), float(t.stream_bps[0]), float(t.pull_bps[0])
    return {"image": pull, "compile": min(nic, stream)}.get(action.kind, min(nic, p.weights.streams * stream))


def in_world(action: Action, belief: Policy, world: Policy, node_class: NodeClass) -> Action:
    """The action with the duration the world gives it: the planner's queue wait, then its bytes at the world's rate."""
    believed_transfer = action.bytes / _transfer_bps(belief, action, node_class)
    queue_s = max(action.duration_s - believed_transfer, 0.0)
    return action.model_copy(update={"duration_s": queue_s + action.bytes / _transfer_bps(world, action, node_class)})


# ---------------------------------------------------------------------------------------------
# A strategy's belief
# ---------------------------------------------------------------------------------------------


@dataclass
class Belief:
    """The policy a strategy estimates with, and the starts it has seen (module docstring).

    ``profiles`` are the run's workloads in order; ``classes`` the cluster's (with the unknown one).
    """

    base: Policy
    profiles: tuple[str, ...]
    classes: tuple[NodeClass, ...]
    calibrate: bool
    #: Also fit per-node factors at each refit (a calibrated strategy in a world with slow nodes).
    learn_nodes: bool = False
    policy: Policy = field(init=False)
    #: The per-node factors of the last refit, by the names :meth:`observe` was given.
    nodes: NodeFactors = NO_NODE_FACTORS
    version: int = 0
    observations: list[Observation] = field(default_factory=list)
    _tables: list[ClassTable] = field(default_factory=list, repr=False)
    _scales: list[Scale] = field(default_factory=list, repr=False)
    _fits: dict[tuple[str, str], Fit] = field(default_factory=dict, repr=False)
    _dirty: set[tuple[str, str]] = field(default_factory=set, repr=False)
    _refit_at: float = -math.inf

    def __post_init__(self) -> None:
        self._use(self.base)

    def _use(self, policy: Policy) -> None:
        self.policy = policy
        self._tables = [ClassTable.build(policy.profile(n), self.classes) for n in self.profiles]
        self._scales = [scale_for(policy, policy.profile(n)) for n in self.profiles]
        self.version += 1

    def profile(self, w: int) -> Profile:
        return self.policy.profile(self.profiles[w])

    def table(self, w: int) -> ClassTable:
        return self._tables[w]

    def scale(self, w: int) -> Scale:
        return self._scales[w]

    def estimate(self, w: int, class_index: int, state: CacheState) -> float:
        """Believed seconds of one start (``state`` of one node)."""
        est = estimate(self.profile(w), self.classes, np.array([class_index], dtype=np.intp), state, self._tables[w])
        return float(est.total_s[0])

    def observe(self, w: int, class_index: int, state: CacheState, placed_s: float, ready_s: float, *,
                node: str = "sim") -> None:
        """A start that became Ready: what its node held when it was placed, and when it was ready
        (``node``: the name its per-node factor is learnt under)."""
        node_class = self.classes[class_index]
        if not self.calibrate or node_class.name not in {c.name for c in self.base.node_classes}:
            return
        p = self.base.profile(self.profiles[w])
        compile_state = int(state.compile[0])
        self.observations.append(Observation(
            pod=f"sim/{p.name}-{len(self.observations)}", workload=p.name, node=node, node_class=node_class.name,
            image_reference=p.image.reference, weights_version=p.weights.version, image=bool(state.image[0]),
            weights_bytes=float(state.weights_bytes[0]), compile=_WORDS[compile_state],
            snapshot=bool(state.snapshot[0]), queued_bytes=float(state.queued_bytes[0]),
            adapters=tuple(bool(a) for a in state.adapters[0]), scheduled_at=placed_s,
            ready_at=ready_s))
        self._dirty.add((p.name, node_class.name))

    def refresh(self, now: float) -> bool:
        """Refit the pairs with new starts (at most every :data:`REFIT_EVERY_S`); True when the belief changed."""
        if not self._dirty or now - self._refit_at < REFIT_EVERY_S:
            return False
        self._refit_at = now
        groups, _ = select(self.base, self.observations, now=now)
        for pair in self._dirty:
            group = groups.get(pair)
            if group:
                self._fits[pair] = fit_pair(self.base, self.base.profile(pair[0]), self.base.node_class(pair[1]),
                                            group)
        self._dirty.clear()
        self._use(apply_calibration(self.base, self._fits.values()))
        if self.learn_nodes:
            # the product's own per-node fit, against the policy just calibrated (as calibrate() does)
            self.nodes = fit_nodes(self.base, self.policy, groups)
        return True


# ---------------------------------------------------------------------------------------------
# The estimate error of new replicas, over time
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ErrorBin:
    """Pods placed in ``[start_s, end_s)``: how many, and the mean and 90th percentile of |believed - true| / true."""

    start_s: float
    end_s: float
    pods: int
    mean: float
    p90: float


def error_over_time(placed_s: F64, believed_s: F64, true_s: F64, duration_s: float, bins: int) -> list[ErrorBin]:
    """The estimate error of the pods placed in each of ``bins`` equal spans of the run."""
    edges = np.linspace(0.0, duration_s, bins + 1)
    rel = np.abs(believed_s - true_s) / np.maximum(true_s, 1e-9)
    out = []
    for a, b in itertools.pairwise(edges):
        chosen = rel[(placed_s >= a) & (placed_s < b)]
        out.append(ErrorBin(float(a), float(b), len(chosen), float(chosen.mean()) if len(chosen) else math.nan,
                            float(np.quantile(chosen, 0.9)) if len(chosen) else math.nan))
    return out


def error_table(rows: Sequence[tuple[str, list[ErrorBin]]]) -> str:
    """One line per strategy: mean estimate error (and pods placed) in each span of the run."""
    if not rows:
        return ""
    spans = rows[0][1]
    head = f"{'strategy':<24}" + "".join(f"{f'{b.start_s / 3600:.0f}-{b.end_s / 3600:.0f} h':>14}" for b in spans)
    lines = ["estimate error of new replicas, |believed - true| / true: mean (pods placed)", "", head, "-" * len(head)]
    for name, bins in rows:
        cells = "".join(f"{('-' if b.pods == 0 else f'{100 * b.mean:.1f}% ({b.pods})'):>14}" for b in bins)
        lines.append(f"{name:<24}{cells}")
    return "\n".join(lines)
