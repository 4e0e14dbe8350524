"""The cache-warming planner: which caches to stage on which nodes this tick, before the replicas exist.

Pure: the inputs are the scaler's expectations, the inventory snapshot, the policy and the actions
already in flight; the output is a :class:`Plan`. The executor (Kubernetes Jobs) and the CLI act
on it; the simulator applies it with :func:`apply`.

Objective. An expectation says "workload *w* needs *k* more replicas within *H* seconds". The
extender will place them on the nodes with the lowest estimated startup among those where their
GPUs fit, so the planner minimises, in seconds,

    F_w      = sum of the K_w smallest slot values                  (the K_w replicas' startups)
    slots    : node i offers m_i = min(floor(gpus_free_i / gpus_per_replica), k) slots, each worth
               T_i(w) = r_i x the estimator's total for w on i in the state after the plan
    r_i      : node i's factor from per-node calibration (extender.core.calibration; 1 for a
               node without one), as the extender scores it: a slow node's slots are worth more
               seconds, so the plan prepares the node the extender will send the replica to
    K_w      = min(k, sum_i m_i)                                     (replicas that can land now)
    minimise   sum over expectations of F_w

subject to, for the actions planned this tick (in-flight actions count against every cap, and so
do the other warm Jobs running, compile publishes, through ``other_jobs``):

    running_n + planned_n            <= maxConcurrentPerNode          per node
    running   + planned              <= maxConcurrent                 cluster
    evictions of one action          <= MAX_EVICTIONS                 (its Job must stay under
                                                                       Kubernetes' object limits)
    sum of planned bytes             <= bytesPerTick                  (when set)
    queue_n / nic_n + bytes / bw     <= H                             the action finishes in time
    planned_nvme_n - evicted_n       <= nvme_free_n - reserve_c - in_flight_nvme_n

Action durations use the estimator's bandwidths (bytes / bytes per second): image
``image_bytes / image_pull_bps``; weights ``missing_bytes / min(nic, streams x stream_bps)``;
compile ``artifact_bytes / min(nic, stream_bps)`` (one stream, as the estimator fetches it);
snapshot ``snapshot_bytes / min(nic, streams x stream_bps)`` (assumed to be published like the
weights, in several files). ``queue_n`` is the bytes already pulling onto the node plus those of
actions planned before on it: actions on one node share its NIC, counted as a queue, as the
estimator counts other pulls.

Images are not counted against NVMe (they live in the runtime's store, which the class reserve is
there for). Weights, compile artifacts and snapshots are. A node with too little room gets
evictions, least recently used first (``NodeState.last_used``), among entries that:

* carry a last-use time (a record without usage data is never evicted from: unknown is kept);
* are not in ``in_use``, not a cache of a workload in ``pod_workloads`` (any weights version), not
  being staged or evicted by an in-flight action;
* are not a current cache of an expected or keep-warm workload (so an eviction can never raise the
  startup of a replica the plan is for, and demand does not undo keep-warm);
* were last used at least ``evictAfterIdle`` ago, and have a known size.

When even those do not make room, or only more than :data:`MAX_EVICTIONS` of them would, the
action is not planned. The cap exists because the evictions travel in the Job (its
``extender.io/warm-action`` annotation and the prepare step's arguments), and Kubernetes refuses
an object whose annotations pass 256 KiB: a node full of thousands of small adapters must not make
the warmer create a Job that cannot exist.

Keep-warm. After the expectations, remaining capacity stages the ``keepWarm`` workloads on every
fresh node of a class they may run on, whether or not it has free GPUs (a node that just joined is
the typical case), without evictions and without a deadline. Their value is one replica's startup
saved on that node.

Method: greedy by marginal gain, re-evaluated after every pick. Each step estimates, per tracked
workload and kind, every node's total with that one cache added (vectorised), turns it into the
decrease of ``F_w`` (:func:`best_k_sums_after`, exact, O(n log n) for all nodes at once), and
takes the candidate with the largest decrease that passes the constraints; candidates that fail
one are dropped for the tick, which is sound because every constraint only tightens as the plan
grows. Ties go to the node whose name sorts first, then workload, then kind (image, weights,
compile, snapshot), so the same input gives the same plan.

Why greedy and not optimal: the exact problem is a knapsack with several constraints (per-node and
cluster slots, bytes, NVMe per node) coupled through the best-K sum; it needs an integer program.
But the caps keep a tick's plan to a handful of actions (default 1 per node, 4 in the cluster),
and the plan is redone every tick from the fresh inventory, so what matters is that each tick
starts the most valuable actions first, which greedy does. Every pick strictly lowers ``F_w``
(the estimator is monotone: more cache never slows a start) and evictions never touch a tracked
workload's caches, so a plan never makes the expected startup of any expectation worse. Known
gaps of single-action greedy: the last download on a node also removes its queue wait (the pair
is worth more than its parts) and a snapshot makes weights and compile worthless (a pick can
later turn out unneeded); both are small next to the caps and corrected by the next tick.

Replicas beyond the free GPU slots are not warmed for: where they will land is unknown (a node
that frees GPUs, a node that joins, which keep-warm covers). Expectations of different workloads
do not reserve GPUs from each other. Stale and unknown nodes are never planned on: their state is
not known.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, assert_never

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field

from extender.core import caches
from extender.core.caches import (
    SPECS,
    CacheKind,
    adapter_keys,
    cache_id,
    compile_key,
    declared_sizes,
    ids_in_use,
    keeps_weights,
    nvme_entries,
    replica_ids,
    snapshot_key,
    weights_key,
    with_entries,
)
from extender.core.calibration import NO_NODE_FACTORS, NodeFactors
from extender.core.errors import InvalidValueError
from extender.core.estimate import CacheState, ClassTable, CompileCache, estimate
from extender.core.inventory import InventorySnapshot, NodeState
from extender.core.placement import on_new_node
from extender.core.policy import NodeClass, Policy, Profile
from extender.core.scaler import Decision, replicas_for

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

Kind = CacheKind
#: Kinds of warm action, in tie-break order (extender.core.caches.KINDS).
KINDS: tuple[Kind, ...] = tuple(spec.kind for spec in caches.KINDS)
Purpose = Literal["demand", "keep-warm"]
SkipReason = Literal["node-concurrency", "byte-budget", "deadline", "nvme"]

#: Gains below this many seconds are float noise, not a reason to start a Job.
_MIN_GAIN_S = 1e-6

#: Most cache entries one action may evict. Each eviction is one entry of the Job's
#: ``extender.io/warm-action`` annotation (node name, cache id, bytes, last use: at most about 800
#: bytes with the longest names the layout allows), so 100 keep it far below Kubernetes' 256 KiB
#: limit on an object's annotations.
MAX_EVICTIONS = 100


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Expectation(_Model):
    """The scaler's expectation: ``replicas`` more replicas of ``workload`` within ``within_s`` seconds."""

    workload: str = Field(min_length=1)
    replicas: int = Field(ge=0)
    within_s: float = Field(ge=0)

    @classmethod
    def from_decision(cls, decision: Decision) -> Expectation:
        """``replicas = max(desired - (ready + starting), 0)``, ``within_s`` = the decision's horizon."""
        return cls(workload=decision.inputs.workload, replicas=max(decision.desired - decision.current, 0),
                   within_s=decision.inputs.horizon.seconds)

    @classmethod
    def ahead(cls, decision: Decision, upper: float, within_s: float) -> Expectation:
        """The warmer's look-ahead from a decision and a forecast ``within_s`` ahead (:func:`look_ahead`)."""
        i = decision.inputs
        return look_ahead(i.workload, upper, capacity=i.capacity, target_utilization=i.target_utilization,
                          desired=decision.desired, current=decision.current, max_replicas=i.max_replicas,
                          within_s=within_s)


def standby_replicas(ahead: Expectation, *, desired: int, current: int) -> int:
    """Placeholder replicas that hold room for the look-ahead's replicas the HPA is not creating::

        standby = max(ahead.replicas - max(desired - current, 0), 0)

    ``ahead``: :func:`look_ahead`'s expectation (replicas beyond ``current = ready + starting``);
    ``desired - current``: those the HPA creates this tick, which need no placeholder. Placeholder
    pods of a negative priority (docs/scaler.md, "Standby capacity") keep that many replicas' GPUs
    on nodes: the node autoscaler launches nodes for them ahead of the demand, and a real replica
    preempts one at once instead of waiting for a new node.
    """
    return max(ahead.replicas - max(desired - current, 0), 0)


def look_ahead_s(policy: Policy, profile: Profile) -> float:
    """How far ahead the warmer looks: a fully cold start on the slowest class the profile may run
    on that can hold a replica (:meth:`Policy.classes_hosting`), plus ``scaling.provisionDelay`` (a
    new node). A replica the scaler will order within that time can still be helped by caches
    staged now; one ordered later can wait for the next plan.
    The same figure as the scaler's horizon when no node has room (:func:`on_new_node`)."""
    return on_new_node(policy, profile).startup_s


def look_ahead(workload: str, upper: float, *, capacity: float, target_utilization: float, desired: int,
               current: int, max_replicas: int, within_s: float) -> Expectation:
    """The replicas the warmer prepares nodes for: those the forecast ``within_s`` ahead needs that
    neither run nor start yet, and never fewer than the decision orders now::

        need     = min(max(ceil(upper / (capacity x targetUtilization)), desired), maxReplicas)
                                                    (the quotient at most scaler.MAX_NEED)
        replicas = max(need - current, 0)            current = ready + starting

    ``upper``: the forecast's upper quantile at ``within_s`` (:func:`look_ahead_s` and the horizon
    rule of :func:`extender.core.scaler.horizon`). The decision's own horizon is one startup on the
    best node; looking one cold start (and a node's provisioning) ahead is what gives the warmer
    time to stage before the replicas exist. The simulator's warmer uses the same function.
    """
    need = min(max(math.ceil(replicas_for(upper, capacity * target_utilization) - 1e-9), desired), max_replicas)
    return Expectation(workload=workload, replicas=max(need - current, 0), within_s=within_s)


class Eviction(_Model):
    """One cache entry to delete from a node before an action stages its own."""

    node: str
    cache: str
    bytes: int = Field(ge=0)
    last_used: float


class Action(_Model):
    """One warm step on one node.

    ``cache``: the entry it creates (:func:`extender.core.inventory.cache_id`); ``bytes``: what it
    moves; ``nvme_bytes``: what it adds to NVMe (0 for images); ``duration_s``: expected seconds
    from start to done, queue on the node included; ``deadline``: unix seconds by which it is
    useful (``None`` for keep-warm); ``saved_s``: the decrease of the expectation's summed replica
    startup seconds when it was picked (keep-warm: one replica's startup on this node).
    """

    node: str
    workload: str
    kind: Kind
    cache: str
    bytes: int = Field(ge=0)
    nvme_bytes: int = Field(ge=0)
    duration_s: float = Field(ge=0)
    deadline: float | None
    saved_s: float = Field(ge=0)
    purpose: Purpose
    evictions: tuple[Eviction, ...] = ()


class Skip(_Model):
    """A candidate with a positive gain that a constraint ruled out this tick."""

    node: str
    workload: str
    kind: Kind
    purpose: Purpose
    reason: SkipReason
    saved_s: float = Field(ge=0)


class Outlook(_Model):
    """One expectation before and after the plan: mean startup of the replicas that can land now.

    ``placeable``: of the ``replicas`` expected, how many fit in free GPUs now (``before_s`` and
    ``after_s`` are ``None`` when none do); ``nodes``: where they would land after the plan, one
    entry per replica.
    """

    workload: str
    replicas: int
    within_s: float
    placeable: int
    before_s: float | None
    after_s: float | None
    nodes: tuple[str, ...]


class Plan(_Model):
    """The actions to start now, in the order they were chosen (most valuable first)."""

    now: float
    actions: tuple[Action, ...] = ()
    outlooks: tuple[Outlook, ...] = ()
    skipped: tuple[Skip, ...] = ()
    #: Planning stopped at ``maxConcurrent`` while actions with a positive gain remained.
    cluster_full: bool = False


# ---------------------------------------------------------------------------------------------
# The best-K sum and its exact change when one node's value drops
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Slots:
    """Slot values sorted ascending (ties by position), with prefix sums over slots."""

    order: NDArray[np.intp]
    rank: NDArray[np.intp]
    values: F64  # sorted, padded with one 0
    starts: I64  # starts[p]: slots before sorted position p; starts[-1]: all slots
    prefix: F64  # prefix[p]: sum of the slots before sorted position p
    k: int

    @classmethod
    def build(cls, values: F64, slots: I64, k: int) -> _Slots:
        n = len(values)
        order = np.lexsort((np.arange(n), values))
        rank = np.empty(n, dtype=np.intp)
        rank[order] = np.arange(n)
        sv, sm = values[order], slots[order]
        starts = np.concatenate(([0], np.cumsum(sm))).astype(np.int64)
        prefix = np.concatenate(([0.0], np.cumsum(sv * sm)))
        return cls(order, rank, np.append(sv, 0.0), starts, prefix, min(k, int(starts[-1])))

    def smallest(self, r: I64) -> F64:
        """Sum of the ``r`` smallest slots (``r`` between 0 and the slot count)."""
        p = np.searchsorted(self.starts, r, side="right") - 1
        return self.prefix[p] + (r - self.starts[p]) * self.values[p]


def best_k_sum(values: F64, slots: I64, k: int) -> float:
    """Sum of the ``k`` smallest slot values, node i offering ``slots[i]`` slots worth ``values[i]``.

    With fewer than ``k`` slots in all, the sum of all of them.
    """
    s = _Slots.build(np.asarray(values, dtype=np.float64), np.asarray(slots, dtype=np.int64), k)
    return float(s.smallest(np.array([s.k]))[0])


def best_k_sums_after(values: F64, slots: I64, k: int, lowered: F64) -> F64:
    """For every node i: the best-K sum when ``values[i]`` alone becomes ``min(lowered[i], values[i])``.

    Exact, for all nodes at once. With the others' slots sorted, ``a`` of them below the new value
    ``v`` and K = min(k, all slots), the new K smallest are those ``a`` (or K of them), then
    ``j = min(m_i, max(K - a, 0))`` copies of ``v``, then the next others::

        F_i' = j * v + O_i(K - j)
        O_i(r) = S(r)                   if r <= start_i   (node i's block starts after them)
               = S(r + m_i) - m_i * T_i otherwise          (take node i's block out)

    where ``S(r)`` is the sum of the r smallest slots of the current values and ``start_i`` the
    number of slots sorted before node i's block.
    """
    vals = np.asarray(values, dtype=np.float64)
    m = np.asarray(slots, dtype=np.int64)
    s = _Slots.build(vals, m, k)
    v = np.minimum(np.asarray(lowered, dtype=np.float64), vals)
    below = s.starts[np.searchsorted(s.values[:-1], v, side="left")]  # others strictly below v
    j = np.minimum(m, np.maximum(s.k - below, 0))
    r = s.k - j
    start = s.starts[s.rank]
    others = np.where(r <= start, s.smallest(np.minimum(r, s.starts[-1])),
                      s.smallest(np.minimum(r + m, s.starts[-1])) - m * vals)
    result: F64 = j * v + others
    return result


# ---------------------------------------------------------------------------------------------
# Applying a plan (the simulator, and the tests' end state)
# ---------------------------------------------------------------------------------------------


def apply(record: NodeState, action: Action, *, now: float) -> NodeState:
    """The node record once ``action`` has completed: its evictions gone, its cache present.

    The staged entry gets ``last_used = now`` (what the agent reports for a cache no pod used yet).
    """
    kind = caches.parse_cache_id(action.cache)[0]
    # weights record the bytes that arrived; the other kinds their size on NVMe
    added = action.bytes if SPECS[kind].sized else action.nvme_bytes
    updates = with_entries(record, add={action.cache: added}, remove=[e.cache for e in action.evictions])
    if SPECS[kind].on_nvme:
        last_used = updates["last_used"]
        assert isinstance(last_used, dict)
        last_used[action.cache] = now
    freed = sum(e.bytes for e in action.evictions)
    return record.model_copy(update={**updates, "nvme_free": max(record.nvme_free + freed - action.nvme_bytes, 0)})


# ---------------------------------------------------------------------------------------------
# The planner
# ---------------------------------------------------------------------------------------------


@dataclass
class _Node:
    """The planner's ledger for one node: what is running, queued and free as the plan grows."""

    name: str
    running: int
    queued_bytes: float
    #: NVMe bytes the warmer may still fill: free - reserve - in flight - planned + evicted.
    room: float
    evictable: list[Eviction]
    next_eviction: int = 0

    def fit(self, need: int, *, may_evict: bool) -> tuple[Eviction, ...] | None:
        """Evictions that make room for ``need`` bytes (least recently used first), or ``None``."""
        if need <= 0 or need <= self.room:
            return ()
        if not may_evict:
            return None
        short = need - self.room
        chosen: list[Eviction] = []
        for e in self.evictable[self.next_eviction:self.next_eviction + MAX_EVICTIONS]:
            chosen.append(e)
            short -= e.bytes
            if short <= 0:
                return tuple(chosen)
        return None


@dataclass
class _Work:
    """One tracked workload: its nodes (fresh, of a class it may run on) and their planned state."""

    profile: Profile
    table: ClassTable
    classes: Sequence[NodeClass]
    rows: NDArray[np.intp]
    names: list[str]
    name_rank: NDArray[np.intp]
    class_index: NDArray[np.intp]
    state: CacheState
    published: NDArray[np.bool_]  # a snapshot for the node's class can be fetched
    nvme_ok: NDArray[np.bool_]  # the class has NVMe and the profile caches weights
    compile_ids: list[str | None]
    slots: I64
    expectation: Expectation | None
    dead: dict[Kind, NDArray[np.bool_]] = field(default_factory=dict)
    #: ``r_i`` per node (per-node calibration), ``None`` when every node's is 1.
    factor: F64 | None = None
    #: :meth:`totals` of ``state`` and :meth:`objective` of them, until :meth:`mark` changes the state.
    _totals: F64 | None = field(default=None, init=False, repr=False)
    _objective: float | None = field(default=None, init=False, repr=False)

    def available(self, kind: Kind) -> NDArray[np.bool_]:
        """Nodes where an action of this kind would add a cache that is missing and obtainable."""
        st = self.state
        match kind:
            case "image":
                ok = ~st.image
            case "weights":
                ok = self.nvme_ok & (st.weights_bytes < float(self.profile.weights.bytes))
            case "compile":
                ok = st.compile == CompileCache.REGISTRY
            case "snapshot":
                ok = self.published & ~st.snapshot
            case "adapter":
                ok = self.nvme_ok & ~st.adapters.all(axis=1)
            case _:
                assert_never(kind)
        return np.asarray(ok & ~self.dead[kind], dtype=np.bool_)

    def first_missing_adapter(self) -> NDArray[np.intp]:
        """Per node, the column of the first preloaded adapter it lacks (the count when none)."""
        st = self.state.adapters
        missing = ~st
        first: NDArray[np.intp] = np.where(missing.any(axis=1), np.argmax(missing, axis=1), st.shape[1]).astype(np.intp)
        return first

    def with_kind(self, kind: Kind) -> CacheState:
        """The state with one more cache of ``kind`` on every node (each candidate differs in one)."""
        st = self.state
        match kind:
            case "image":
                return replace(st, image=np.ones_like(st.image))
            case "weights":
                return replace(st, weights_bytes=np.where(self.nvme_ok, float(self.profile.weights.bytes),
                                                          st.weights_bytes))
            case "compile":
                local = np.where(st.compile == CompileCache.REGISTRY, np.int8(CompileCache.LOCAL), st.compile)
                return replace(st, compile=local.astype(np.int8))
            case "snapshot":
                return replace(st, snapshot=st.snapshot | self.published)
            case "adapter":
                adapters = st.adapters.copy()
                rows = np.flatnonzero(self.nvme_ok & ~adapters.all(axis=1))
                adapters[rows, self.first_missing_adapter()[rows]] = True
                return replace(st, adapters=adapters)
            case _:
                assert_never(kind)

    def totals(self, state: CacheState | None = None) -> F64:
        """``T_i(w)``: estimated startup seconds on each node, times its factor (of ``state``, or of the
        planned state: read-only, made once per state)."""
        if state is None and self._totals is not None:
            return self._totals
        total_s = estimate(self.profile, self.classes, self.class_index, self.state if state is None else state,
                           self.table).total_s
        if self.factor is not None:
            total_s = total_s * self.factor
        if state is None:
            total_s.flags.writeable = False
            self._totals = total_s
        return total_s

    def mark(self, i: int, kind: Kind, cache: str | None = None) -> None:
        """Node ``i`` now holds (or will hold) the cache of ``kind`` (for adapters: ``cache``, else the next)."""
        self._totals = self._objective = None
        st = self.state
        match kind:
            case "image":
                st.image[i] = True
            case "weights":
                st.weights_bytes[i] = float(self.profile.weights.bytes)
            case "compile":
                st.compile[i] = CompileCache.LOCAL
            case "snapshot":
                st.snapshot[i] = True
            case "adapter":
                keys = [cache_id("adapter", k) for k in adapter_keys(self.profile)]
                if cache in keys:
                    st.adapters[i, keys.index(cache)] = True
                elif cache is None and not st.adapters[i].all():
                    st.adapters[i, self.first_missing_adapter()[i]] = True
            case _:
                assert_never(kind)

    def cost(self, i: int, kind: Kind) -> tuple[str, int, int, float]:
        """(cache id, bytes moved, NVMe bytes added, bytes per second) of one action on node ``i``."""
        p, t, c = self.profile, self.table, int(self.class_index[i])
        one_stream = min(float(t.nic_bps[c]), float(t.stream_bps[c]))
        remote_bps = min(float(t.nic_bps[c]), p.weights.streams * float(t.stream_bps[c]))
        match kind:
            case "image":
                return cache_id("image", p.image.reference), p.image.size, 0, float(t.pull_bps[c])
            case "weights":
                missing = int(np.ceil(p.weights.bytes - self.state.weights_bytes[i]))
                return cache_id("weights", weights_key(p.name, p.weights.version)), missing, missing, remote_bps
            case "compile":
                key = self.compile_ids[i]
                assert key is not None  # only offered where the key is in the registry
                size = p.compile.artifact_bytes
                return cache_id("compile", key), size, size, one_stream
            case "snapshot":
                assert p.snapshot is not None  # only offered where a snapshot is published
                return cache_id("snapshot", snapshot_key(p)), p.snapshot.bytes, p.snapshot.bytes, remote_bps
            case "adapter":
                j = int(self.first_missing_adapter()[i])
                adapter = p.preloaded_adapters[j]  # only offered where one is missing
                return cache_id("adapter", adapter_keys(p)[j]), adapter.bytes, adapter.bytes, one_stream
            case _:
                assert_never(kind)

    def objective(self, totals: F64) -> float:
        """``F_w``: summed startup of the replicas that can land now (0 without an expectation)."""
        if self.expectation is None:
            return 0.0
        if totals is self._totals and self._objective is not None:
            return self._objective
        value = best_k_sum(totals, self.slots, self.expectation.replicas)
        if totals is self._totals:
            self._objective = value
        return value

    def outlook(self, before: float) -> Outlook:
        """The expectation's numbers before and after the plan (state is the plan's end state)."""
        assert self.expectation is not None
        e = self.expectation
        totals = self.totals()
        k = min(e.replicas, int(self.slots.sum()))
        order = np.lexsort((self.name_rank, totals))
        landing: list[str] = []
        for i in order.tolist():  # each node once per slot, until k replicas have landed
            if len(landing) >= k:
                break
            landing.extend([self.names[i]] * int(self.slots[i]))
        del landing[k:]
        after = self.objective(totals)
        return Outlook(workload=e.workload, replicas=e.replicas, within_s=e.within_s, placeable=k,
                       before_s=before / k if k else None, after_s=after / k if k else None,
                       nodes=tuple(landing))


class _Planner:
    """One tick's planning state: the node ledgers, what is left of the caps, and the result."""

    def __init__(self, policy: Policy, snapshot: InventorySnapshot, now: float,
                 in_flight: Sequence[Action], tracked: Collection[str], *, other_jobs: Sequence[str] = (),
                 nodes: NodeFactors = NO_NODE_FACTORS) -> None:
        self.policy = policy
        self.snap = snapshot
        #: ``r`` per snapshot row (its cold sentinel included), ``None`` when every factor is 1.
        self.factor = nodes.rows(snapshot) if nodes else None
        self.now = now
        self.warming = policy.warming
        self.fresh = snapshot.fresh(now)
        self.in_flight = in_flight
        #: Nodes of the other warm Jobs running (one entry per Job): a slot each, on the node and in the cluster.
        self.other_jobs = list(other_jobs)
        #: Workloads planned for this tick (expected or keep-warm): their current caches are never evicted.
        self.tracked = frozenset(tracked)
        # rows in name order, so every tie in the plan goes to the node whose name sorts first
        names = [node.name for node in snapshot.nodes]
        self.by_name = sorted(range(len(names)), key=names.__getitem__)
        self.rank = np.empty(len(names), dtype=np.intp)  # row -> its position in name order
        self.rank[np.asarray(self.by_name, dtype=np.intp)] = np.arange(len(names), dtype=np.intp)
        self._keys: dict[tuple[str, str], str | None] = {}
        self._sizes: dict[str, dict[str, int]] = {}
        self.cluster_left = self.warming.max_concurrent - len(in_flight) - len(self.other_jobs)
        self.budget_left = float("inf") if self.warming.bytes_per_tick is None else float(self.warming.bytes_per_tick)
        self.nodes: dict[int, _Node] = {}
        self.actions: list[Action] = []
        self.skipped: list[Skip] = []
        self.cluster_full = False

    # -- ledgers ----------------------------------------------------------------------------

    def compile_key(self, profile: Profile, node_class: NodeClass) -> str | None:
        """:func:`extender.core.caches.compile_key`, memoised (a key is a SHA-256 over canonical JSON)."""
        pair = (profile.name, node_class.name)
        if pair not in self._keys:
            self._keys[pair] = compile_key(profile, node_class)
        return self._keys[pair]

    def node(self, row: int) -> _Node:
        """The ledger of snapshot row ``row``, built on first use."""
        got = self.nodes.get(row)
        if got is not None:
            return got
        record = self.snap.nodes[row]
        cls = self.snap.classes[int(self.snap.class_index[row])]
        mine = [a for a in self.in_flight if a.node == record.name]
        protected = ids_in_use(self.policy, record, cls) | {a.cache for a in mine}
        protected |= {e.cache for a in mine for e in a.evictions}
        for p in self.policy.profiles:
            if p.name in self.tracked:
                protected |= replica_ids(p, cls)
        sizes = self._policy_sizes(cls)
        entries: list[Eviction] = []
        for ident, size in nvme_entries(record).items():
            known = size if size is not None else sizes.get(ident)
            used = record.last_used.get(ident)
            if (known is None or known <= 0 or used is None or ident in protected
                    or self.now - used < self.warming.evict_after_idle):
                continue
            entries.append(Eviction(node=record.name, cache=ident, bytes=known, last_used=used))
        entries.sort(key=lambda e: (e.last_used, e.cache))
        room = record.nvme_free - cls.nvme.reserve - sum(a.nvme_bytes for a in mine)
        ledger = _Node(name=record.name, running=len(mine) + self.other_jobs.count(record.name),
                       queued_bytes=float(record.pulling_bytes), room=float(room), evictable=entries)
        self.nodes[row] = ledger
        return ledger

    def _policy_sizes(self, cls: NodeClass) -> dict[str, int]:
        """:func:`extender.core.caches.declared_sizes` of one class, memoised."""
        if cls.name not in self._sizes:
            self._sizes[cls.name] = declared_sizes(self.policy, cls)
        return self._sizes[cls.name]

    # -- workloads ---------------------------------------------------------------------------

    def work(self, profile: Profile, expectation: Expectation | None,
             published: Collection[tuple[str, str]]) -> _Work:
        """The workload's nodes and their state, with in-flight actions taken as done."""
        snap = self.snap
        allowed = {c.name for c in self.policy.classes_for(profile)}
        classes = snap.classes
        # per class, then gathered per row (the same values as asking each row's class)
        class_ok = np.array([c.name in allowed for c in classes], dtype=np.bool_)
        by_name = np.asarray(self.by_name, dtype=np.intp)
        rows = by_name[self.fresh[by_name] & class_ok[snap.class_index[by_name]]].astype(np.intp)
        full, table = snap.cache_state(profile)
        state = full.take(rows)
        row_class = snap.class_index[rows]
        rows_list, classes_list = rows.tolist(), row_class.tolist()
        gpus = profile.parallelism.gpus
        k = expectation.replicas if expectation is not None else 0
        # min((free GPUs, or the class's count for a record that reports none) // gpus, k) per row
        reported = np.fromiter((snap.nodes[r].gpus for r in rows_list), dtype=np.int64, count=len(rows_list))
        class_gpus = np.array([c.gpu.count for c in classes], dtype=np.int64)
        free = np.where(reported != 0, snap.gpus_free[rows], class_gpus[row_class])
        slots = np.minimum(free // gpus, k).astype(np.int64).reshape(len(rows))
        class_published = np.array([profile.snapshot is not None and (profile.name, c.name) in published
                                    for c in classes], dtype=np.bool_)
        class_compile = [self.compile_key(profile, c) for c in classes]
        w = _Work(
            profile=profile, table=table, classes=classes, rows=rows,
            names=[snap.nodes[r].name for r in rows_list],
            name_rank=self.rank[rows].reshape(len(rows)),
            class_index=snap.class_index[rows], state=state,
            published=class_published[row_class].reshape(len(rows)),
            nvme_ok=keeps_weights(profile, classes, row_class).reshape(len(rows)),
            compile_ids=[class_compile[c] for c in classes_list],
            slots=slots, expectation=expectation,
            dead={kind: np.zeros(len(rows), dtype=np.bool_) for kind in KINDS},
            factor=None if self.factor is None else self.factor[rows],
        )
        position = {int(r): i for i, r in enumerate(rows)}
        for a in self.in_flight:
            i = position.get(self.snap.positions.get(a.node, -1))
            if a.workload == profile.name and i is not None:
                w.mark(i, a.kind, a.cache)
        return w

    # -- the greedy ----------------------------------------------------------------------------

    def greedy(self, works: list[_Work], purpose: Purpose) -> None:
        """Pick actions for ``works`` until no candidate has a positive gain or the cluster is full."""
        while True:
            gains, wi, pos, ki = self._candidates(works, purpose)
            if len(gains) == 0:
                return
            if self.cluster_left <= 0:
                self.cluster_full = True
                return
            ranks = np.array([works[w].name_rank[p] for w, p in zip(wi, pos, strict=True)], dtype=np.intp)
            picked = False
            # gains rounded to a microsecond: equal values reached by different float paths must tie,
            # so that the tie goes to the node name and not to rounding noise
            for c in np.lexsort((ki, wi, ranks, -np.round(gains, 6))):
                if self._try(works[int(wi[c])], int(pos[c]), KINDS[int(ki[c])], float(gains[c]), purpose):
                    picked = True
                    break
            if not picked:
                return

    def _candidates(self, works: list[_Work], purpose: Purpose) -> tuple[F64, I64, I64, I64]:
        """Every live candidate with a positive gain: (gain seconds, work, node position, kind)."""
        gains: list[F64] = []
        wis: list[I64] = []
        poss: list[I64] = []
        kis: list[I64] = []
        for w_i, w in enumerate(works):
            if len(w.rows) == 0:
                continue
            totals = w.totals()
            base = w.objective(totals)
            for k_i, kind in enumerate(KINDS):
                ok = w.available(kind)
                if not ok.any():
                    continue
                lowered = np.minimum(w.totals(w.with_kind(kind)), totals)
                if purpose == "demand":
                    assert w.expectation is not None
                    gain = base - best_k_sums_after(totals, w.slots, w.expectation.replicas, lowered)
                else:
                    gain = totals - lowered
                idx = np.flatnonzero(ok & (gain > _MIN_GAIN_S))
                gains.append(gain[idx])
                wis.append(np.full(len(idx), w_i, dtype=np.int64))
                poss.append(idx.astype(np.int64))
                kis.append(np.full(len(idx), k_i, dtype=np.int64))
        if not gains:
            return np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(gains), np.concatenate(wis), np.concatenate(poss), np.concatenate(kis)

    def _try(self, w: _Work, i: int, kind: Kind, gain: float, purpose: Purpose) -> bool:
        """Plan the candidate if every constraint allows it; otherwise drop it for the tick."""
        node = self.node(int(w.rows[i]))
        ident, moved, nvme, bps = w.cost(i, kind)
        nic = float(w.table.nic_bps[int(w.class_index[i])])
        duration = node.queued_bytes / nic + moved / bps
        reason: SkipReason | None = None
        evictions: tuple[Eviction, ...] | None = ()
        if node.running >= self.warming.max_concurrent_per_node:
            reason = "node-concurrency"
        elif moved > self.budget_left:
            reason = "byte-budget"
        elif purpose == "demand" and w.expectation is not None and duration > w.expectation.within_s:
            reason = "deadline"
        else:
            # keep-warm is speculative: it may use free room, never take it from another cache
            evictions = node.fit(nvme, may_evict=purpose == "demand")
            if evictions is None:
                reason = "nvme"
        if reason is not None or evictions is None:
            w.dead[kind][i] = True
            self.skipped.append(Skip(node=node.name, workload=w.profile.name, kind=kind, purpose=purpose,
                                     reason=reason or "nvme", saved_s=gain))
            return False
        node.running += 1
        node.queued_bytes += moved
        node.room += sum(e.bytes for e in evictions) - nvme
        node.next_eviction += len(evictions)
        self.cluster_left -= 1
        self.budget_left -= moved
        w.mark(i, kind)
        deadline = self.now + w.expectation.within_s if purpose == "demand" and w.expectation else None
        self.actions.append(Action(node=node.name, workload=w.profile.name, kind=kind, cache=ident, bytes=moved,
                                   nvme_bytes=nvme, duration_s=duration, deadline=deadline, saved_s=gain,
                                   purpose=purpose, evictions=evictions))
        return True

    # -- entry ----------------------------------------------------------------------------------

    def run(self, wanted: dict[str, Expectation], published: Collection[tuple[str, str]],
            outlooks: bool = True) -> Plan:
        """Demand first, then keep-warm with what the caps leave."""
        keep = set(self.warming.keep_warm)
        works = {name: self.work(self.policy.profile(name), wanted.get(name), published)
                 for name in sorted(self.tracked)}
        demand = [works[n] for n in sorted(wanted)]
        before = {w.profile.name: w.objective(w.totals()) for w in demand} if outlooks else {}
        self.greedy(demand, "demand")
        self.greedy([works[n] for n in sorted(keep)], "keep-warm")
        return Plan(now=self.now, actions=tuple(self.actions),
                    outlooks=tuple(w.outlook(before[w.profile.name]) for w in demand) if outlooks else (),
                    skipped=tuple(self.skipped), cluster_full=self.cluster_full)


def plan(
    policy: Policy,
    snapshot: InventorySnapshot,
    expectations: Iterable[Expectation],
    *,
    now: float,
    in_flight: Sequence[Action] = (),
    published_snapshots: Collection[tuple[str, str]] = (),
    outlooks: bool = True,
    other_jobs: Sequence[str] = (),
    nodes: NodeFactors = NO_NODE_FACTORS,
) -> Plan:
    """Plan this tick's warm actions (objective, constraints and method in the module docstring).

    ``expectations``: at most one per workload (a workload named twice is a caller bug and raises
    ``ValueError``; an unknown one raises ``UnknownNameError``); ``in_flight``: actions started on
    earlier ticks and not finished, which count against every cap and whose caches count as
    present; ``published_snapshots``: (workload, node class) pairs whose process snapshot can be
    fetched (the inventory does not record a snapshot registry), the only snapshots planned.
    ``outlooks=False``: leave :attr:`Plan.outlooks` empty (a caller that only starts the actions,
    such as the simulator every tick, saves their estimates); the actions are the same.
    ``other_jobs``: the node of each other warm Job running (compile publishes), one entry per Job:
    each takes a slot on its node and in the cluster, as an in-flight action does.
    ``nodes``: the per-node factors the extender scores with (``r_i`` in the module docstring): the
    plan's seconds, gains and outlooks are the extender's, a slow node's included.
    """
    listed = list(expectations)
    names = [e.workload for e in listed]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise InvalidValueError(f"one expectation per workload, got several for {', '.join(twice)}")
    wanted = {e.workload: e for e in listed if e.replicas > 0}
    tracked = set(wanted) | set(policy.warming.keep_warm)
    planner = _Planner(policy, snapshot, now, in_flight, tracked, other_jobs=other_jobs, nodes=nodes)
    return planner.run(wanted, published_snapshots, outlooks)
