"""The simulation loop: demand arrives, strategies scale and place, pods start, requests queue.

One run replays every workload's demand through one strategy (extender.sim.strategies) on a fresh
copy of the cluster. Time advances in ticks of ``tick`` seconds (the HPA's sync period). At tick k,
``t = k x tick``:

1. **Events.** Pods whose startup ended by ``t`` become ready (their caches land on their nodes);
   warm actions finished by ``t`` are applied; both in time order.
2. **Observe.** Per workload: demand over the last tick (requests/s) and the queue at ``t``.
3. **Decide.** The strategy's scaler sets each workload's replicas (extender.sim.hpa for the stock
   HPA; ``extender.core.forecast`` + ``extender.core.scaler.decide`` for the predictive scaler,
   whose horizon is the estimator's startup on the node the extender would choose next).
4. **Scale.** New pods are created pending; on a scale-down, pods are deleted in the ReplicaSet
   controller's order (unscheduled, then not ready, then doubled-up on a node, then newest).
5. **Place.** Pending pods are placed one by one (extender.sim.kubescheduler, plus the extender's
   ``extender.core.scoring.evaluate`` for the extender strategies); a pod that fits nowhere stays
   pending and is retried next tick. Each placed pod's startup is ``extender.core.estimate`` on
   its node at that moment.
6. **Warm.** Strategies with warming plan with ``extender.core.warming.plan`` and start the actions.
7. **Serve.** The tick's service rate is ``ready replicas x capacity`` (pods ready by ``t``), and the
   queue (extender.sim.queueing) places the tick's arrivals.

When the scenario has a ``truth`` (extender.sim.truth), the cluster runs on the world's phase times
(step 5's startups, step 6's warm actions) while the strategy decides on its belief: the policy, or
for the calibrated strategies the policy calibrated from the starts seen so far (refitted between
steps 1 and 2). With slow nodes (``truth.nodes``) a start on one takes its factor times the world's
time, and the calibrated strategies' belief also holds per-node factors, which steps 3 to 6 apply
as the product does: ``evaluate``'s ``node_factor``, the next replica's estimate and ``plan``'s
``nodes``.

The cluster starts with each workload's initial replicas running (placed by the strategy at t = 0,
ready, not counted as starts). Everything random (placement ties) comes from a generator seeded by
the scenario seed and the strategy's name, so a run is deterministic and adding a strategy does not
change another's results.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from extender.core.caches import warm_entries
from extender.core.calibration import NO_NODE_FACTORS, NodeFactors
from extender.core.errors import Problem
from extender.core.estimate import CacheState, estimate
from extender.core.forecast import Forecast, ForecastParams, forecast
from extender.core.policy import Policy, Profile, ReplicaBounds, Scaling
from extender.core.scaler import DecisionInputs, Recommendation, horizon, prune, recommend, replicas_for
from extender.core.scoring import NodeInputs, Scale, WarmSlots, evaluate, larger_warm, scale_for
from extender.core.sharing import Claim, claim, share
from extender.core.units import format_duration
from extender.core.warming import Action, Expectation, look_ahead, plan, standby_replicas
from extender.sim import hpa as hpa_model
from extender.sim.cluster import Cluster, NodeSpec, Pod
from extender.sim.errors import ScenarioError
from extender.sim.kubescheduler import EXTENDER_SCALE, in_tree_scores, select_host
from extender.sim.queueing import Delays, FifoQueue
from extender.sim.scenario import LoadedScenario, NodeGroup, Rollout, Scenario, TraceSpec, Workload
from extender.sim.strategies import STRATEGIES, Strategy
from extender.sim.synthetic import synthetic_arrivals, synthetic_history
from extender.sim.traces import Arrivals, RequestTrace, arrivals_from, read_trace
from extender.sim.truth import Belief, in_world, slowness_at_launch, slowness_at_start, world_policy

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

#: Fluid demand is split into this many bins per tick (their arrivals join the queue spread out).
BINS_PER_TICK = 3
#: History the predictive scaler forecasts from with fixed constants and no season: their state
#: forgets faster than six hours.
SHORT_HISTORY_S = 6 * 3600.0


def rolled_policy(policy: Policy, rollout: Rollout) -> Policy:
    """``policy`` with the rollout's workload on its new weights version and/or image."""
    p = policy.profile(rollout.workload)
    update: dict[str, object] = {}
    if rollout.weights_version is not None:
        update["weights"] = p.weights.model_copy(update={"version": rollout.weights_version})
    if rollout.image is not None:
        update["image"] = p.image.model_copy(update={"reference": rollout.image})
    new = p.model_copy(update=update)
    return policy.model_copy(update={"profiles": tuple(new if q.name == p.name else q for q in policy.profiles)})


def history_span(scaling: Scaling, tick_s: float) -> float:
    """Seconds of history each forecast reads, as the scaler's history store would hold it.

    Fitted constants: the fit window before the last refit boundary plus the refit period (the fit
    data then stays the same between boundaries, so the fit is made once per period). Fixed ones:
    two daily seasons for Holt-Winters (its minimum), six hours for the others.
    """
    margin = 4 * (scaling.step or tick_s)
    if scaling.fit:
        return scaling.fit_window + scaling.refit + margin
    return 2 * scaling.season + margin if scaling.forecaster == "holt-winters" else SHORT_HISTORY_S
#: The warmer's look-ahead forecast is refreshed every this many ticks (a minute at 15 s): its
#: horizon is a whole cold start, so a minute-old forecast changes nothing it plans, and it halves
#: the forecasting work of a run.
FAR_EVERY_TICKS = 4

#: The scaler's forecast is remade when this many ticks have passed (a minute at 15 s: the forecast
#: grid of the bundled policies is 5 minutes, so it moves little in between) or when the horizon
#: moved by more than NEAR_SLACK_S; the queue and the demand of the tick still enter every decision.
#: The oracle's is remade every tick (the true demand is cheap and exact).
NEAR_EVERY_TICKS = 4
NEAR_SLACK_S = 30.0

ProgressFn = Callable[[int], None]
#: Forecasts shared by the runs of one preparation (:func:`simulate`), by (workload, tick, horizon,
#: forecaster, parameters), each with the newest sample it read. The demand a strategy observes is
#: the trace's whatever the strategy does, so two strategies that forecast the same workload at the
#: same tick and horizon get the same forecast: the second takes the first's.
ForecastMemo = dict[tuple[int, int, float, str, ForecastParams], tuple[float, Forecast]]
#: The standard normal's 90th percentile: a log-normal with median m and p90 q has sigma ln(q/m)/Z90.
Z90 = 1.2815515655446004


# ---------------------------------------------------------------------------------------------
# Preparing a scenario: demand and nodes
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadSetup:
    """A workload ready to simulate."""

    index: int
    profile: Profile
    capacity: float
    min_replicas: int
    max_replicas: int
    initial_replicas: int
    arrivals: Arrivals
    #: The demand observed at the ticks before t = 0 (requests/s, oldest first; the scenario's
    #: ``history``): tick ``j`` of ``-len(history) + 1 .. 0`` saw the requests of ``[(j - 1) dt, j dt)``.
    history: F64 = field(default_factory=lambda: np.zeros(0))

    @functools.cached_property
    def bounds(self) -> ReplicaBounds:
        """The workload's replica range, as the scaler's policy section gives it (made once)."""
        return ReplicaBounds.model_construct(min_replicas=self.min_replicas, max_replicas=self.max_replicas)


@dataclass(frozen=True)
class Prepared:
    """Everything every strategy's run shares: policy, clock, demand, nodes at t = 0."""

    scenario: Scenario
    policy: Policy
    source: str
    tick_s: float
    n_ticks: int
    workloads: tuple[WorkloadSetup, ...]
    nodes: tuple[NodeSpec, ...]
    seed: int
    #: The policy the simulated world runs on (``policy`` unless the scenario has a ``truth``).
    world: Policy | None = None
    #: Per node slot, the world's factor on every start there at t = 0 (``truth.nodes``; None without).
    slow: F64 | None = None

    @property
    def duration_s(self) -> float:
        """Simulated seconds."""
        return self.n_ticks * self.tick_s

    @property
    def history_s(self) -> float:
        """Seconds of demand the scaler had seen before t = 0 (whole ticks)."""
        return len(self.workloads[0].history) * self.tick_s


def _seed(*parts: int | str) -> list[int]:
    """A stable seed sequence from ints and names (crc32, not Python's salted hash)."""
    return [p if isinstance(p, int) else zlib.crc32(p.encode()) for p in parts]


def load_demand(loaded: LoadedScenario, workload: Workload, *, seed: int, bin_s: float,
                trace_path: str | None = None, duration_s: float | None = None,
                override: TraceSpec | None = None, history_s: float = 0.0) -> tuple[Arrivals, Arrivals]:
    """A workload's arrivals before t = 0 (``history_s`` seconds of them, on a clock from
    ``-history_s``) and from t = 0 on: its trace (or ``trace_path``, or the whole ``override`` spec,
    instead) or its synthetic demand. ``trace_path`` and ``override`` paths are taken as given
    (relative to the working directory), the scenario's relative to the scenario file."""
    rng = np.random.default_rng(_seed(seed, "demand", workload.name))
    spec = workload.demand
    if override is None and trace_path is not None:
        base = spec.trace if spec.trace is not None else TraceSpec(path=trace_path)
        override = base.model_copy(update={"path": trace_path})
    if override is not None or spec.trace is not None:
        tspec = override if override is not None else spec.trace
        assert tspec is not None
        path = loaded.resolve(tspec.path) if override is None else Path(tspec.path)
        raw = read_trace(path, tspec)
        trace = raw.scaled(tspec, rng) if isinstance(raw, RequestTrace) else raw.scaled(tspec)
        end = None if duration_s is None else duration_s + history_s
        whole = arrivals_from(trace, bin_s=bin_s, duration_s=end, description=f"trace {tspec.path}")
        if history_s and whole.span_s <= history_s:
            raise ScenarioError([Problem(loaded.source, None, "history",
                                         f"workload {workload.name!r}: its trace {tspec.path!r} lasts "
                                         f"{format_duration(whole.span_s)}, no longer than the history "
                                         f"({format_duration(history_s)}) it would give")])
        return whole.split(history_s)
    synthetic = spec.synthetic
    assert synthetic is not None
    main = synthetic_arrivals(synthetic, rng, bin_s=bin_s, duration_s=duration_s)
    if not history_s:
        return main.split(0.0)[0], main
    prior = synthetic_history(synthetic, np.random.default_rng(_seed(seed, "history", workload.name)),
                              bin_s=bin_s, span_s=history_s)
    return prior, main


def node_specs(policy: Policy, groups: Sequence[NodeGroup]) -> tuple[NodeSpec, ...]:
    """The node slots: names ``<group>-<i>`` (zero-padded) and the warm caches of each group.

    A fixed group has ``count`` nodes; an autoscaled pool (``maxCount``) has ``maxCount`` slots, the
    first ``count`` present at t = 0 and the others absent until the autoscaler launches them.
    """
    out: list[NodeSpec] = []
    for gi, g in enumerate(groups):
        cls = policy.node_class(g.node_class)
        slots = g.ceiling
        width = max(2, len(str(slots - 1)))
        prefix = g.name or g.node_class
        held: list[dict[str, int]] = [{} for _ in range(g.count)]
        for warm in g.warm:
            p = policy.profile(warm.workload)
            chosen = range(round((warm.fraction or 0.0) * g.count)) if warm.nodes is None else warm.nodes
            entries = [warm_entries(p, cls, kind) for kind in warm.caches]
            for i in chosen:
                for e in entries:
                    held[i].update(e)
        pool = gi if g.max_count is not None else -1
        out.extend(NodeSpec(f"{prefix}-{i:0{width}d}", cls.name, tuple(held[i].items()) if i < g.count else (),
                            present=i < g.count, pool=pool) for i in range(slots))
    return tuple(out)


def prepare(loaded: LoadedScenario, *, trace: str | None = None, seed: int | None = None,
            traces: Mapping[str, TraceSpec] | None = None) -> Prepared:
    """Demand, clock and nodes for a loaded scenario. ``trace`` replaces the first workload's demand;
    ``traces`` replaces the named workloads' trace specs (``extender simulate --trace WORKLOAD=FILE``)."""
    sc = loaded.scenario
    policy = loaded.policy
    s = sc.seed if seed is None else seed
    dt = float(sc.tick)
    bin_s = dt / BINS_PER_TICK
    overrides = traces or {}
    history = math.ceil(sc.history / dt - 1e-9)  # ticks
    loads = [load_demand(loaded, w, seed=s, bin_s=bin_s, trace_path=trace if i == 0 else None,
                         duration_s=sc.duration, override=overrides.get(w.name), history_s=history * dt)
             for i, w in enumerate(sc.workloads)]
    demands = [main for _, main in loads]
    if sc.duration is not None:
        n_ticks = max(1, math.ceil(sc.duration / dt - 1e-9))
    else:
        # a rate covers [0, span); the last request of a request trace arrives *at* its span
        n_ticks = max(max(1, math.ceil(d.span_s / dt - 1e-9)) if d.fluid else math.floor(d.span_s / dt) + 1
                      for d in demands)
    end = n_ticks * dt
    setups: list[WorkloadSetup] = []
    for i, (w, (prior, full)) in enumerate(zip(sc.workloads, loads, strict=True)):
        keep = full.times < end
        d = Arrivals(full.times[keep], full.weights[keep], full.fluid, full.bin_s, full.span_s, full.description,
                     full.credit)
        p = policy.profile(w.name)
        cap = w.capacity if w.capacity is not None else (p.capacity.per_replica if p.capacity else 1.0)
        initial = w.initial_replicas
        if initial is None:
            first = float(d.weights[d.times < 60.0].sum()) / min(60.0, end)
            initial = max(w.min_replicas, math.ceil(first / cap - 1e-9))
        initial = min(max(initial, 0), w.max_replicas)
        seen = np.histogram(prior.times, bins=np.arange(history + 1) * dt, weights=prior.weights)[0] / dt
        setups.append(WorkloadSetup(i, p, float(cap), w.min_replicas, w.max_replicas, initial, d, seen))
    return Prepared(sc, policy, loaded.source, dt, n_ticks, tuple(setups), node_specs(policy, sc.cluster.nodes), s,
                    world_policy(policy, sc.truth), slow_nodes(sc, s))


def slow_nodes(sc: Scenario, seed: int) -> F64 | None:
    """Per node slot (in :func:`node_specs`' order), the world's factor on its starts at t = 0:
    ``extender.sim.truth.slowness_at_start`` of each group's present nodes, drawn from the seed and
    the group's name (the same in every strategy's run), 1 for a slot not present yet; None
    without ``truth.nodes``."""
    if sc.truth is None or not sc.truth.nodes:
        return None
    parts = []
    for g in sc.cluster.nodes:
        here = slowness_at_start(sc.truth, g.node_class, g.count, _seed(seed, "slow nodes", g.name or g.node_class))
        parts.append(np.concatenate([here, np.ones(g.ceiling - g.count)]))
    return np.concatenate(parts) if parts else np.zeros(0)


# ---------------------------------------------------------------------------------------------
# Results of one run
# ---------------------------------------------------------------------------------------------


@dataclass
class Timeline:
    """Per tick of one workload: demand and ready capacity (requests/s), replicas, queue at tick start."""

    demand: F64
    capacity: F64
    ready: I64
    starting: I64
    pending: I64
    queue: F64
    served: F64  # requests whose service began before the tick's start (cumulative)

    @classmethod
    def empty(cls, n: int) -> Timeline:
        return cls(np.zeros(n), np.zeros(n), np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64),
                   np.zeros(n), np.zeros(n + 1))


@dataclass
class WorkloadResult:
    """One workload's outcome in one run."""

    name: str
    capacity: float
    gpus_per_replica: int
    timeline: Timeline
    delays: Delays
    arrived: float
    served: float
    queued: float
    startups: F64  # estimated startup seconds of every pod placed during the run
    cold: NDArray[np.bool_]
    gpu_seconds: float
    busy_gpu_seconds: float
    #: Per placed pod, as ``startups``: when it was placed, and the startup the strategy estimated
    #: for it (differs from ``startups`` when the scenario's truth differs from the belief).
    placed_s: F64 = field(default_factory=lambda: np.zeros(0))
    believed_s: F64 = field(default_factory=lambda: np.zeros(0))
    #: Pod created -> Ready in seconds (pending for a node included), of every pod placed during the
    #: run that became Ready before its end and was not deleted first.
    ready_waits: F64 = field(default_factory=lambda: np.zeros(0))
    #: The scaler's forecasts whose grid step around their time ended inside the run (predictive
    #: scaling), and of those, the ones whose upper quantile the mean demand over it stayed at or under.
    upper_checked: int = 0
    upper_covered: int = 0
    #: Pods deleted to drain an under-used node (``consolidationPolicy: WhenEmptyOrUnderutilized``);
    #: each was made again pending, and its new start is among ``startups``.
    disrupted: int = 0


@dataclass
class RunResult:
    """One strategy's run."""

    strategy: Strategy
    tick_s: float
    n_ticks: int
    workloads: list[WorkloadResult]
    warm_actions: int = 0
    #: With autoscaled pools: GPUs of every provisioned node (launching or Ready) x time, the fleet's
    #: cost; None on a fixed fleet (then the cost is the GPUs pods hold).
    fleet_gpu_seconds: float | None = None
    #: Per tick: GPUs of the provisioned nodes (with autoscaled pools; else empty).
    fleet_gpus: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    nodes_launched: int = 0
    #: Every node removed; of those, ``nodes_consolidated`` were under-used nodes drained of their pods.
    nodes_removed: int = 0
    nodes_consolidated: int = 0


# ---------------------------------------------------------------------------------------------
# One run
# ---------------------------------------------------------------------------------------------


def _first_fit(left: I64, allowed: NDArray[np.bool_], gpus: int, k: int) -> int:
    """Place up to ``k`` pods of ``gpus`` GPUs each on the nodes ``allowed`` with room, first fit in
    index order (``floor(left / gpus)`` on each until ``k`` are placed), taking their GPUs off
    ``left`` in place; returns how many were placed. Pod by pod first fit places the same: a node
    the first pod does not fit stays too full for the next."""
    rows = np.flatnonzero(allowed & (left >= gpus))
    if len(rows) == 0 or k <= 0:
        return 0
    room = left[rows] // gpus
    total = np.cumsum(room)
    placed = min(k, int(total[-1]))
    last = int(np.searchsorted(total, placed))  # the first node at which ``placed`` pods are placed
    taken = room[: last + 1].copy()
    taken[last] = placed - (int(total[last - 1]) if last else 0)
    left[rows[: last + 1]] -= taken * gpus
    return placed


@dataclass
class _WorkloadState:
    setup: WorkloadSetup
    queue: FifoQueue
    hpa: hpa_model.Hpa
    scale: Scale
    #: The forecaster's parameters, with the workload's own refit phase (as the production scaler's).
    params: ForecastParams
    pods: dict[int, Pod] = field(default_factory=dict)
    #: The pods of ``pods`` not placed yet (in creation order).
    waiting: dict[int, Pod] = field(default_factory=dict)
    ready: int = 0
    recent: tuple[Recommendation, ...] = ()
    #: The demand the scaler observed, per tick from ``-len(setup.history)`` (index 0, never set)
    #: to the end: tick k is at index ``k + len(setup.history)``.
    hist_t: F64 = field(default_factory=lambda: np.zeros(0))
    hist_v: F64 = field(default_factory=lambda: np.zeros(0))
    true_rate: F64 = field(default_factory=lambda: np.zeros(0))
    timeline: Timeline | None = None
    gpu_s: float = 0.0
    far: Forecast | None = None  # the warmer's look-ahead forecast, and the tick it was made
    old: set[int] = field(default_factory=set)  # pods of the version before a rollout
    links: dict[int, int] = field(default_factory=dict)  # rolling update: new pod id -> old pod id it replaces
    surge: int = 1
    near: Forecast | None = None  # the scaler's forecast at its horizon, and the tick it was made
    near_at: int = 0
    #: Per forecast of the scaler: the time its lead ends at, and its upper quantile.
    uppers: list[tuple[float, float]] = field(default_factory=list)
    far_at: int = 0
    standby: int = 0  # placeholder replicas (extender.core.warming.standby_replicas) this tick
    disrupted: int = 0  # pods deleted to drain an under-used node
    next_startup: tuple[int, float] | None = None  # (cluster version, seconds) while no pull is running


class Run:
    """The state of one strategy's run over a prepared scenario (see the module docstring)."""

    def __init__(self, prepared: Prepared, strategy: Strategy, *, forecasts: ForecastMemo | None = None) -> None:
        self.p = prepared
        self.forecasts = forecasts
        self.strategy = strategy
        self.policy = prepared.policy
        self.dt = prepared.tick_s
        self.rng = np.random.default_rng(_seed(prepared.seed, "placement", strategy.name))
        self.world = prepared.world or prepared.policy
        self.cluster = Cluster.build(self.policy, [self.world.profile(w.profile.name) for w in prepared.workloads],
                                     prepared.nodes, compile_registry=prepared.scenario.cluster.compile_registry)
        truth = prepared.scenario.truth
        #: The world's factor on each node's starts (truth.nodes), redrawn when a slot is launched again.
        self.slow = None if prepared.slow is None else prepared.slow.copy()
        self.launches = np.zeros(len(self.cluster), dtype=np.int64)  # times each slot was launched
        self.belief = Belief(self.policy, tuple(w.profile.name for w in prepared.workloads), self.cluster.classes,
                             strategy.calibrated, learn_nodes=strategy.calibrated and self.slow is not None)
        #: The belief's per-node factors by row and, for the warm planner, by the rows' record names
        #: (None and none while every factor is 1).
        self.row_factor: F64 | None = None
        self.plan_nodes: NodeFactors = NO_NODE_FACTORS
        self.noise = truth.noise if truth is not None else 0.0
        self.noise_rng = np.random.default_rng(_seed(prepared.seed, "truth", strategy.name))
        self.believed: dict[int, float] = {}  # pod id -> the strategy's estimate when it was placed
        self.weight = prepared.scenario.scheduler.extender_weight
        scaling = self.policy.scaling
        self.params = ForecastParams.from_scaling(scaling)
        self.read_span_s = history_span(scaling, self.dt)  # what each forecast reads of the history
        n = prepared.n_ticks
        self.w: list[_WorkloadState] = []
        for s in prepared.workloads:
            q = FifoQueue(s.arrivals, n, self.dt)
            true_rate = q.per_tick() / self.dt if strategy.scaling == "oracle" else None
            self.w.append(_WorkloadState(
                setup=s, queue=q, hpa=hpa_model.Hpa(s.min_replicas, s.max_replicas),
                scale=scale_for(self.policy, s.profile), params=self.params.for_workload(s.profile.name),
                hist_t=np.arange(-len(s.history), n, dtype=np.float64) * self.dt,
                hist_v=np.concatenate(([0.0], s.history, np.zeros(n - 1))),
                true_rate=true_rate if true_rate is not None else np.zeros(0), timeline=Timeline.empty(n)))
        self.next_id = 0
        self.starting: list[tuple[float, int, Pod]] = []  # heap by ready time
        self.placed: list[Pod] = []
        self.warm_actions = 0
        self._plan_key: tuple[object, ...] | None = None
        self._placed_state: dict[int, CacheState] = {}
        self.hpa_target = prepared.scenario.hpa.target_utilization
        self.names = {s.profile.name: s.index for s in prepared.workloads}
        # node autoscaling (the scenario's groups with maxCount)
        groups = prepared.scenario.cluster.nodes
        self.auto = prepared.scenario.cluster.autoscaling
        self.autoscaled = any(g.max_count is not None for g in groups)
        self.floors = [g.floor for g in groups]
        self.pool_slots = [np.flatnonzero(self.cluster.pool == gi) for gi in range(len(groups))]
        self.launching: dict[int, float] = {}  # node slot -> Ready time
        self.empty_since = np.full(len(self.cluster), np.nan)
        self.node_rng = np.random.default_rng(_seed(prepared.seed, "nodes", strategy.name))
        delay = self.auto.provisioning
        self.delay_mu = math.log(delay.median)
        self.delay_sigma = math.log(delay.p90 / delay.median) / Z90
        #: The scaler's and the warmer's belief of a new node's provisioning (the policy's, as in
        #: production); the world's delays are drawn from the scenario's distribution above.
        self.provision_s = float(prepared.policy.scaling.provision_delay)
        self.fleet_gpu_s = 0.0
        self.fleet_gpus = np.zeros(n if self.autoscaled else 0, dtype=np.int64)
        self.launched = 0
        self.removed = 0
        # consolidation of under-used nodes (pools with consolidationPolicy WhenEmptyOrUnderutilized)
        self.underused_pools = [gi for gi, g in enumerate(groups)
                                if g.max_count is not None and g.consolidation_policy == "WhenEmptyOrUnderutilized"]
        self.protected = frozenset(i for i, w in enumerate(prepared.scenario.workloads) if w.do_not_disrupt)
        self.movable_since = np.full(len(self.cluster), np.nan)  # when its pods last changed, while all fit elsewhere
        self.movable_mark = np.zeros(len(self.cluster), dtype=np.int64)  # the node's pod-change count then
        self.consolidated = 0

    # ---- placement -----------------------------------------------------------------------

    def _scores(self, w: int, now: float) -> tuple[NDArray[np.bool_], I64, F64]:
        """Feasible nodes, total scores and the extender's estimates (NaN without the extender)."""
        c = self.cluster
        profile = self.w[w].setup.profile
        state = c.state(w, now)
        feasible = c.feasible(w)
        if self.autoscaled:  # the in-tree plugins see the nodes that exist
            rows = np.flatnonzero(c.present)
            totals = np.zeros(len(c), dtype=np.int64)
            totals[rows] = in_tree_scores(c.gpus[rows], c.gpus_used[rows], profile.parallelism.gpus,
                                          state.image[rows], profile.image.size)
        else:
            totals = in_tree_scores(c.gpus, c.gpus_used, profile.parallelism.gpus, state.image, profile.image.size)
        if self.strategy.placement != "extender":
            return feasible, totals, np.full(len(c), np.nan)
        ones = np.ones(len(c), dtype=np.bool_)
        nvme_free = c.nvme_free()
        b = self.belief
        others: tuple[WarmSlots, ...] = ()
        if self.policy.scoring.protect_warm_points:
            others = larger_warm(b.profile(w), [b.profile(q) for q in range(len(self.w)) if q != w], c.classes,
                                 c.class_index, lambda q: c.state(self.names[q.name], now))
        inputs = NodeInputs(c.classes, c.class_index, state, ones, ones, nvme_free, c.gpus_free(), others)
        ev = evaluate(b.policy, b.profile(w), inputs, scale=self.w[w].scale, table=b.table(w),
                      node_factor=self.row_factor)
        feasible = feasible & (ev.judgement.verdict == 0)
        return feasible, totals + ev.score * self.weight * EXTENDER_SCALE, ev.estimate.total_s

    def node_name(self, node: int) -> str:
        """The name a node's starts are learnt under: its record's, and for a slot launched again
        (a new machine) ``<name>~<launches>``, as a new node would get a new name."""
        name = self.cluster.records[node].name
        n = int(self.launches[node])
        return name if n == 0 else f"{name}~{n}"

    def _node_factors(self) -> None:
        """:attr:`row_factor` and :attr:`plan_nodes` from the belief's per-node factors."""
        nodes = self.belief.nodes
        c = self.cluster
        found = [nodes.nodes.get(self.node_name(i)) for i in range(len(c))]
        factor = np.array([1.0 if f is None else f.factor for f in found], dtype=np.float64)
        if not (factor != 1.0).any():
            self.row_factor, self.plan_nodes = None, NO_NODE_FACTORS
            return
        self.row_factor = factor
        self.plan_nodes = NodeFactors({c.records[i].name: dataclasses.replace(f, node=c.records[i].name)
                                       for i, f in enumerate(found) if f is not None and c.present[i]})
        for s in self.w:
            s.next_startup = None

    def _place_pending(self, now: float) -> None:
        """One scheduling pass over the pending pods, oldest first.

        A workload none of whose pods found a node is not scored again until a pod is placed: until
        then the cluster, and so every score of that workload, is what it was, so its later pods
        would find no node either (and :func:`select_host` draws nothing when it finds none). The
        pass gives what scoring every pod gives, at a cost of one scoring per workload and per
        placement instead of one per pending pod: thousands of pods pending on a full cluster
        made each tick take seconds.
        """
        pending = sorted((p for s in self.w for p in s.waiting.values()), key=lambda p: (p.created_s, p.id))
        unplaceable: set[int] = set()  # workloads that found no node since the last placement
        for pod in pending:
            if pod.workload in unplaceable:
                continue
            feasible, totals, _ = self._scores(pod.workload, now)
            node = select_host(feasible, totals, self.rng)
            if node is None:
                unplaceable.add(pod.workload)
                continue
            self._place(pod, node, now)
            heapq.heappush(self.starting, (pod.ready_s, pod.id, pod))
            self.placed.append(pod)
            unplaceable.clear()

    def _place(self, pod: Pod, node: int, now: float) -> None:
        """Place a pod: the world times its start (with the truth's noise), the belief's estimate is kept."""
        c = self.cluster
        state = c.state(pod.workload, now, np.array([node], dtype=np.intp))
        self.believed[pod.id] = self.belief.estimate(pod.workload, int(c.class_index[node]), state)
        if self.row_factor is not None:
            self.believed[pod.id] *= float(self.row_factor[node])
        c.place(pod, node, now, state)  # the same state: nothing changed since it was read
        self._placed_on_node(pod)
        if self.slow is not None and self.slow[node] != 1.0:
            pod.startup_s *= float(self.slow[node])
            pod.ready_s = now + pod.startup_s
        if self.noise > 0:
            pod.startup_s *= float(np.exp(self.noise_rng.normal(0.0, self.noise)))
            pod.ready_s = now + pod.startup_s
        self._placed_state[pod.id] = state

    def _initial(self) -> None:
        """Each workload's initial replicas, running at t = 0 on the nodes the strategy picks (once
        one finds no node, the rest of that workload's find none either: :meth:`_place_pending`)."""
        for s in self.w:
            full = False
            for _ in range(s.setup.initial_replicas):
                pod = self._new_pod(s.setup.index, 0.0)
                if full:
                    continue
                feasible, totals, _ = self._scores(pod.workload, 0.0)
                node = select_host(feasible, totals, self.rng)
                if node is None:
                    full = True
                    continue  # stays pending: the cluster is too small for the initial replicas
                self.cluster.place(pod, node, 0.0)
                self._placed_on_node(pod)
                self.cluster.pulls = [p for p in self.cluster.pulls if p.owner != pod.id]
                pod.startup_s, pod.ready_s, pod.cold = 0.0, 0.0, False
                self.cluster.ready(pod)
                s.ready += 1

    def _new_pod(self, w: int, now: float) -> Pod:
        pod = Pod(self.next_id, w, now)
        self.next_id += 1
        self.w[w].pods[pod.id] = pod
        self.w[w].waiting[pod.id] = pod
        return pod

    def _placed_on_node(self, pod: Pod) -> None:
        del self.w[pod.workload].waiting[pod.id]

    # ---- events --------------------------------------------------------------------------

    def _events(self, now: float) -> None:
        """Pods ready and warm actions done by ``now``, in time order."""
        c = self.cluster
        while True:
            pod_at = self.starting[0][0] if self.starting else math.inf
            action_at = min((a for a, _ in c.in_flight), default=math.inf)
            if min(pod_at, action_at) > now:
                return
            if action_at < pod_at:
                c.finish_actions(action_at)
                continue
            _, _, pod = heapq.heappop(self.starting)
            state = self._placed_state.pop(pod.id, None)
            if math.isfinite(pod.deleted_s):
                continue  # deleted while starting
            if state is not None:
                node = self.node_name(pod.node) if self.belief.learn_nodes else "sim"
                self.belief.observe(pod.workload, int(c.class_index[pod.node]), state, pod.placed_s, pod.ready_s,
                                    node=node)
            c.ready(pod)
            self.w[pod.workload].ready += 1

    # ---- scaling -------------------------------------------------------------------------

    def _on_new_node_s(self, s: _WorkloadState) -> float:
        """``extender.core.placement.on_new_node``'s startup, from the memoised scale: the cold start on
        the slowest class (the scale's reference) plus the policy's provisioning delay. Also the
        warmer's look-ahead (``extender.core.warming.look_ahead_s``)."""
        return float(s.scale.reference_s) + self.provision_s

    def _startup_next(self, w: int, now: float) -> float:
        """The estimator's startup of the next replica, as the production scaler takes it.

        ``extender.core.placement.next_replica``: the smallest estimate among the nodes where a
        replica fits now (the node the extender scores best), or, when none has room, the cold
        estimate on the slowest class the profile may run on. Computed here on the simulator's
        columns (the tests check it against ``next_replica`` on the same cluster) and memoised while
        the cluster does not change and no pull is running (nothing the estimate reads differs then).
        """
        s = self.w[w]
        quiet = not self.cluster.pulls
        if quiet and s.next_startup is not None and s.next_startup[0] == self.cluster.version:
            return s.next_startup[1]
        c = self.cluster
        rows = np.flatnonzero(c.feasible(w)).astype(np.intp)
        if len(rows) == 0:
            value = self._on_new_node_s(s)
        else:
            b = self.belief
            est = estimate(b.profile(w), c.classes, c.class_index[rows], c.state(w, now, rows), b.table(w))
            if self.row_factor is not None:
                est = est.scaled(self.row_factor[rows])
            value = float(est.total_s.min())
        s.next_startup = (self.cluster.version, value) if quiet else None
        return value

    def _truth(self, s: _WorkloadState, k: int, ahead_s: float) -> Forecast:
        """The oracle's forecast: the largest true demand from now until ``ahead_s`` later."""
        h = max(1, math.ceil(ahead_s / self.dt))
        window = s.true_rate[k: k + h + 1]
        v = float(window.max()) if len(window) else 0.0
        # every field of the right type already: the model's validation would change nothing (a tick each)
        return Forecast.model_construct(
            point=v, upper=v, level=float(self.params.level), horizon_s=float(ahead_s), lead_s=float(ahead_s),
            requested="oracle", method="none", note="true future demand", observations=0, residuals=0,
            step_s=float(self.dt), spread=0.0, t_end=float(k * self.dt))

    def _forecast(self, s: _WorkloadState, k: int, ahead_s: float) -> Forecast:
        if self.strategy.scaling == "oracle":
            return self._truth(s, k, ahead_s)
        key = (s.setup.index, k, ahead_s, self.policy.scaling.forecaster, s.params)
        i = k + len(s.setup.history)
        newest = float(s.hist_v[i])
        shared = self.forecasts.get(key) if self.forecasts is not None else None
        if shared is not None:
            # the observed demand is the trace's in every run (ForecastMemo)
            assert shared[0] == newest, "runs of one preparation observed different demand"
            return shared[1]
        now = k * self.dt
        lo = int(np.searchsorted(s.hist_t[1:i + 1], now - self.read_span_s, side="left")) + 1
        made = forecast(self.policy.scaling.forecaster, s.hist_t[lo:i + 1], s.hist_v[lo:i + 1], ahead_s,
                        s.params, now_s=now)
        if self.forecasts is not None:
            self.forecasts[key] = (newest, made)
        return made

    def _decide(self, s: _WorkloadState, k: int, demand: float, queue: float) -> tuple[int, Expectation | None]:
        """Replicas for this tick, and the warmer's expectation (predictive scaling only)."""
        now = k * self.dt
        setup = s.setup
        current = len(s.pods)
        scaling = self.policy.scaling
        if self.strategy.scaling == "hpa":
            load = demand + queue / scaling.queue_drain
            desired = s.hpa.sync(now, current, current, load, setup.capacity * self.hpa_target)
            return desired, (self._expect(s, k, desired, current) if self.strategy.warming else None)
        h = horizon(self._startup_next(setup.index, now), self.dt, scaling.hpa_sync_delay)
        near = s.near
        if (near is None or self.strategy.scaling == "oracle" or k - s.near_at >= NEAR_EVERY_TICKS
                or abs(near.horizon_s - h.seconds) > NEAR_SLACK_S):
            near = s.near = self._forecast(s, k, h.seconds)
            s.near_at = k
            if self.strategy.scaling != "oracle":
                s.uppers.append((now + h.seconds, near.upper))
        fc = near
        ready = s.ready
        # decide()'s recommendation, desired replicas and published value, without its reasons (every tick)
        recommendation, wanted, published = recommend(DecisionInputs.for_policy(
            scaling, setup.bounds, workload=setup.profile.name, now_s=now, demand=demand, queue=queue,
            capacity=setup.capacity, forecast=fc, horizon=h, ready=ready, starting=current - ready, recent=s.recent))
        s.recent = prune((*s.recent, Recommendation(at_s=now, replicas=recommendation)), now,
                         scaling.scale_down_stabilisation)
        desired = s.hpa.sync(now, current, current, float(published), 1.0)
        return desired, (self._expect(s, k, wanted, current) if self.strategy.warming else None)

    def _expect(self, s: _WorkloadState, k: int, desired: int, current: int) -> Expectation:
        """The warmer's expectation: it looks one cold start (and a node's provisioning) further,
        at the replicas that would have to start cold to be ready then."""
        setup = s.setup
        scaling = self.policy.scaling
        far = horizon(self._on_new_node_s(s), self.dt, scaling.hpa_sync_delay)
        if s.far is None or k - s.far_at >= FAR_EVERY_TICKS:
            s.far, s.far_at = self._forecast(s, k, far.seconds), k
        return look_ahead(setup.profile.name, s.far.upper, capacity=setup.capacity,
                          target_utilization=scaling.target_utilization, desired=desired, current=current,
                          max_replicas=setup.max_replicas, within_s=far.seconds)

    def _delete(self, s: _WorkloadState, pod: Pod, now: float) -> None:
        if pod.is_ready(now):
            s.ready -= 1
        s.waiting.pop(pod.id, None)
        self.cluster.delete(pod, now)
        del s.pods[pod.id]
        s.old.discard(pod.id)
        s.links.pop(pod.id, None)
        for new, old in list(s.links.items()):
            if old == pod.id:
                del s.links[new]  # its replacement stays, as an ordinary replica

    def _rollout(self, r: Rollout, now: float) -> None:
        """Workload ``r.workload`` moves to a new weights version and/or image: the belief, the world
        and the cluster's cache columns switch to the new profile; running replicas become old, and
        each replica still starting (or pending) is replaced by a pending one of the new version."""
        w = self.names[r.workload]
        s = self.w[w]
        self.policy = rolled_policy(self.policy, r)
        self.world = self.policy if self.world is self.belief.base else rolled_policy(self.world, r)
        self.belief.base = self.policy
        self.belief._use(self.policy)
        self.cluster.set_profile(w, self.world.profile(r.workload))
        s.scale, s.next_startup, s.surge = self.belief.scale(w), None, r.max_surge
        self._plan_key = None
        for pod in list(s.pods.values()):
            if pod.is_ready(now):
                s.old.add(pod.id)
            else:
                # a start of the old version is abandoned, and the new ReplicaSet creates one in its
                # place: a rollout leaves the Deployment's replicas (what the HPA set) as they were
                self._delete(s, pod, now)
                self._new_pod(s.setup.index, now)

    def _stage(self, r: Rollout, now: float) -> None:
        """An announced rollout: the warmer plans the new version for as many replicas as run now,
        to be ready by ``at``, with the policy as it will be then (the old version's caches in use
        are protected by the planner's own rules)."""
        s = self.w[self.names[r.workload]]
        wanted = [Expectation(workload=r.workload, replicas=len(s.pods), within_s=max(r.at - now, self.dt))]
        policy = rolled_policy(self.belief.policy, r)
        result = plan(policy, self.cluster.planning_snapshot(now), wanted, now=now,
                      in_flight=self.cluster.in_flight_actions(),
                      published_snapshots=policy.warming.snapshot_pairs(), outlooks=False, nodes=self.plan_nodes)
        self._start(result.actions, now, policy)

    def _start(self, actions: Sequence[Action], now: float, belief: Policy) -> None:
        """Run planned warm actions (in the world's time when the scenario has a truth)."""
        c = self.cluster
        for action in actions:
            node_class = c.classes[int(c.class_index[c.index[action.node]])]
            run = action if self.world is self.policy else in_world(action, belief, self.world, node_class)
            c.start_action(run, now)
            self.warm_actions += 1

    def _rolling(self, s: _WorkloadState, now: float) -> None:
        """One step of the rolling update: old replicas whose replacement is Ready go; new
        replacements start while fewer than ``maxSurge`` are in progress."""
        for new, old in list(s.links.items()):
            if s.pods[new].is_ready(now):
                del s.links[new]
                if old in s.pods:
                    self._delete(s, s.pods[old], now)
        linked = set(s.links.values())
        for old in sorted(s.old - linked):
            if len(s.links) >= s.surge:
                break
            s.links[self._new_pod(s.setup.index, now).id] = old

    def _scale(self, s: _WorkloadState, desired: int, now: float) -> None:
        current = len(s.pods) - len(s.links)
        for _ in range(desired - current):
            self._new_pod(s.setup.index, now)
        if desired >= current:
            return
        on_node: dict[int, int] = {}
        for pod in s.pods.values():
            if not pod.pending:
                on_node[pod.node] = on_node.get(pod.node, 0) + 1

        def rank(pod: Pod) -> tuple[int, int, int, int, float, float, int]:
            # old-version pods first (a Deployment scales its old ReplicaSet down first), then as the
            # ReplicaSet controller deletes: unscheduled, not ready, doubled-up, newest
            ready = pod.is_ready(now)
            return (0 if pod.id in s.old else 1, 0 if pod.pending else 1, 1 if ready else 0,
                    -on_node.get(pod.node, 0), -(pod.ready_s if ready else 0.0), -pod.created_s, -pod.id)

        replacing = set(s.links)
        for pod in sorted((p for p in s.pods.values() if p.id not in replacing), key=rank)[: current - desired]:
            self._delete(s, pod, now)

    def _warm(self, expectations: list[Expectation], now: float) -> None:
        wanted = [e for e in expectations if e.replicas > 0]
        if not wanted and not self.policy.warming.keep_warm:
            return
        key = (tuple((e.workload, e.replicas, e.within_s) for e in wanted), self.cluster.version)
        if key == self._plan_key:
            return  # nothing the planner reads has changed: it would plan nothing new
        if len(self.cluster.in_flight) >= self.belief.policy.warming.max_concurrent:
            self._plan_key = key  # the cluster's cap is taken: the planner would start nothing
            return
        snapshot = self.cluster.planning_snapshot(now, self.belief.policy)
        result = plan(self.belief.policy, snapshot, wanted, now=now, in_flight=self.cluster.in_flight_actions(),
                      published_snapshots=self.belief.policy.warming.snapshot_pairs(), outlooks=False,
                      nodes=self.plan_nodes)
        # the planner's durations are the belief's; in a world that differs, it takes the world's time
        self._start(result.actions, now, self.belief.policy)
        self._plan_key = (key[0], self.cluster.version)

    def _fleet_gpus(self) -> int:
        """GPUs the workloads can have: every present node's, plus those the pools can still add."""
        c = self.cluster
        total = int(c.class_gpus[c.present].sum())
        for slots in self.pool_slots:
            if len(slots):
                total += int((~c.present[slots]).sum()) * int(c.class_gpus[slots[0]])
        return total

    # ---- node autoscaling ----------------------------------------------------------------

    def _joins(self, now: float) -> None:
        """Launched nodes whose provisioning delay has passed join the cluster, cold."""
        for slot, at in list(self.launching.items()):
            if at <= now:
                del self.launching[slot]
                self.cluster.join(slot)
                self.launches[slot] += 1
                if self.slow is not None:
                    # a new machine: its own draw, by its name and how many times the slot was launched
                    truth = self.p.scenario.truth
                    cls = self.cluster.classes[int(self.cluster.class_index[slot])].name
                    self.slow[slot] = slowness_at_launch(truth, cls, _seed(self.p.seed, "slow nodes",
                                                                           self.cluster.records[slot].name,
                                                                           int(self.launches[slot])))
                if self.belief.learn_nodes:
                    self._node_factors()  # the new machine's name has no starts yet: factor 1

    def _launch(self, w: int, gpus: int, now: float, *, standby: bool = False) -> int | None:
        """Launch a node for a pod of workload ``w`` (``standby``: a placeholder): the pool of an
        allowed class with the fewest GPUs that still fit it (the cheapest that fits, as Karpenter
        chooses), below its maximum."""
        c = self.cluster
        allowed = c.allowed(w)
        best: tuple[int, int] | None = None
        for gi, slots in enumerate(self.pool_slots):
            if len(slots) == 0 or not allowed[slots[0]] or c.class_gpus[slots[0]] < gpus:
                continue
            free = [int(i) for i in slots if not c.present[i] and int(i) not in self.launching]
            if free and (best is None or c.class_gpus[slots[0]] < c.class_gpus[best[1]]):
                best = (gi, free[0])
        if best is None:
            return None
        slot = best[1]
        self.launching[slot] = now + float(np.exp(self.node_rng.normal(self.delay_mu, self.delay_sigma)))
        self.launched += 1
        return slot

    def _autoscale(self, now: float) -> None:
        """Launch nodes for pending pods, after packing them onto the nodes already launching; with
        ``provisionAhead``, place each workload's standby placeholders (:func:`standby_replicas`)
        on free GPUs, else on launching or new nodes; remove nodes empty for ``consolidateAfter``
        down to each pool's minimum, and in pools with ``consolidationPolicy:
        WhenEmptyOrUnderutilized`` drain under-used ones too (:meth:`_underused`).

        Placeholders are the overprovisioning pattern (docs/scaler.md, "Standby capacity"): they are
        placed again every tick on the GPUs left free, which is what a replica preempting one and
        the placeholder going pending for the next node add up to; a node that holds one is not
        empty, so it is not consolidated; their GPUs count as free for the scheduler and the warmer,
        as the inventory counts them in production.
        """
        c = self.cluster
        spare = {slot: int(c.class_gpus[slot]) for slot in self.launching}

        def claim(w: int, gpus: int) -> bool:
            allowed = c.allowed(w)
            for slot, free in spare.items():
                if allowed[slot] and free >= gpus:
                    spare[slot] = free - gpus
                    return True
            return False

        for s in self.w:
            gpus = s.setup.profile.parallelism.gpus
            for _ in range(len(s.waiting)):  # every pending pod
                if not claim(s.setup.index, gpus):
                    slot = self._launch(s.setup.index, gpus, now)
                    if slot is not None:
                        spare[slot] = int(c.class_gpus[slot]) - gpus
        held = np.zeros(len(c), dtype=np.bool_)
        if self.strategy.warming and self.auto.provision_ahead:
            free = c.gpus_free().copy()
            for s in self.w:
                w = s.setup.index
                gpus = s.setup.profile.parallelism.gpus
                allowed = c.allowed(w) & c.present
                for _ in range(s.standby):
                    room = np.flatnonzero(allowed & (free >= gpus))
                    if len(room):
                        free[room[0]] -= gpus
                        held[room[0]] = True
                    elif not claim(w, gpus):
                        slot = self._launch(w, gpus, now, standby=True)
                        if slot is None:
                            break
                        spare[slot] = int(c.class_gpus[slot]) - gpus
        empty = c.present & (c.pool >= 0) & (c.gpus_used == 0) & ~held
        self.empty_since[~empty] = np.nan
        fresh = empty & np.isnan(self.empty_since)
        self.empty_since[fresh] = now
        due = np.flatnonzero(empty & (now - self.empty_since >= self.auto.consolidate_after))
        for at in due:
            i = int(at)
            gi = int(c.pool[i])
            size = int(c.present[self.pool_slots[gi]].sum()) + sum(1 for x in self.launching if c.pool[x] == gi)
            if size <= self.floors[gi] or c.warming(i):
                continue
            c.remove(i)
            self.empty_since[i] = np.nan
            self.removed += 1
        if self.underused_pools:
            self._underused(now)

    def _pending_runs(self) -> list[tuple[int, int]]:
        """The pods pending now, oldest first (the order :meth:`_place_pending` takes them in), as
        runs of one workload: ``(workload, pods)``, consecutive pods of a workload counted once."""
        runs: list[tuple[int, int]] = []
        for pod in sorted((p for s in self.w for p in s.waiting.values()), key=lambda p: (p.created_s, p.id)):
            if runs and runs[-1][0] == pod.workload:
                runs[-1] = (pod.workload, runs[-1][1] + 1)
            else:
                runs.append((pod.workload, 1))
        return runs

    def _fits_elsewhere(self, node: int, free: I64, pending: Sequence[tuple[int, int]] = ()) -> bool:
        """Whether the pods on ``node`` would all go, first fit, on the free GPUs ``free`` of the other
        present nodes (a class their profile allows, enough GPUs) once the pending pods ``pending``
        (:meth:`_pending_runs`) have taken theirs, as Karpenter's disruption simulation schedules a
        candidate's pods together with the cluster's pending pods.

        The pending pods go first, oldest first, each on the first node with room: the order the
        scheduler will give them nodes in, ahead of the pods the drain makes again (those are newer).
        A pending pod that fits on no present node is left out: it waits for a launching or a new
        node, or for nothing, and Karpenter does not let a pod that was pending before and stays
        pending block a drain. Then the node's pods, by workload, largest first; a workload's ``k``
        pods of ``g`` GPUs fill the nodes in index order, ``floor(free / g)`` each. A bound, not
        kube-scheduler's choice: the scheduler places the pods made again as any new pod (its scores
        may pick other nodes, and the extender's verdicts may refuse some)."""
        c = self.cluster
        left = free.copy()
        left[node] = 0
        full: set[int] = set()  # workloads a pending pod of which found no room (later ones find none)
        for w, k in pending:
            if w not in full and _first_fit(left, c.allowed(w), c.profiles[w].parallelism.gpus, k) < k:
                full.add(w)
        count: dict[int, int] = {}
        for pod in c.pods_on[node].values():
            count[pod.workload] = count.get(pod.workload, 0) + 1
        for w in sorted(count, key=lambda q: (-c.profiles[q].parallelism.gpus, q)):
            if _first_fit(left, c.allowed(w), c.profiles[w].parallelism.gpus, count[w]) < count[w]:
                return False
        return True

    def _underused(self, now: float) -> None:
        """Karpenter's consolidation of under-used nodes (``consolidationPolicy:
        WhenEmptyOrUnderutilized``), at most one node per pool and tick.

        A Ready node of such a pool that holds pods (starting or ready; standby placeholders are
        nothing to move), none of a ``doNotDisrupt`` workload, all of which fit elsewhere beside the
        pending pods (:meth:`_fits_elsewhere`), is a candidate; once it has been one with the same
        pods for ``consolidateAfter`` (Karpenter v1 counts its ``consolidateAfter`` from the last pod
        added to or removed from the node), its pool is above ``minCount`` and no warm action runs on
        it, it is drained: every pod on it is deleted and the ReplicaSet makes it again pending (a
        pod a rolling update pairs with another is not made again: its pair stands in for it), and
        the node is removed with its caches. Of a pool's due nodes the one with the fewest pods goes
        (Karpenter tries the cheapest disruption first). The pods made again are pending pods for the
        next pool's candidates.
        """
        c = self.cluster
        free = np.where(c.present, c.gpus_free(), 0).astype(np.int64)
        pending: list[tuple[int, int]] | None = None  # read when a node first needs it, again after a drain
        for gi in self.underused_pools:
            slots = self.pool_slots[gi]
            due: list[tuple[int, int]] = []
            for at in slots[c.present[slots]]:
                i = int(at)
                pods = c.pods_on[i]
                movable = False
                if pods and not any(p.workload in self.protected for p in pods.values()):
                    if pending is None:
                        pending = self._pending_runs()
                    movable = self._fits_elsewhere(i, free, pending)
                if not movable:
                    self.movable_since[i] = np.nan
                    continue
                changed = c.pod_changes(i)
                if np.isnan(self.movable_since[i]) or self.movable_mark[i] != changed:
                    self.movable_since[i], self.movable_mark[i] = now, changed
                if now - self.movable_since[i] >= self.auto.consolidate_after:
                    due.append((len(pods), i))
            if not due:
                continue
            size = int(c.present[slots].sum()) + sum(1 for x in self.launching if c.pool[x] == gi)
            if size <= self.floors[gi]:
                continue
            for _, i in sorted(due):
                if c.warming(i):
                    continue
                for pod in list(c.pods_on[i].values()):
                    s = self.w[pod.workload]
                    paired = pod.id in s.links or pod.id in s.links.values()
                    self._delete(s, pod, now)
                    if not paired:
                        self._new_pod(pod.workload, now)
                    s.disrupted += 1
                c.remove(i)
                free[i] = 0
                pending = None
                self.movable_since[i] = self.empty_since[i] = np.nan
                self.removed += 1
                self.consolidated += 1
                break

    # ---- the loop ------------------------------------------------------------------------

    def run(self, progress: ProgressFn | None = None) -> RunResult:
        """Simulate every tick; ``progress(ticks_done)`` is called now and then."""
        self._initial()
        n, dt = self.p.n_ticks, self.dt
        report_every = max(1, n // 200)
        rollouts = sorted(self.p.scenario.rollouts, key=lambda r: r.at)
        for k in range(n):
            now = k * dt
            while rollouts and rollouts[0].at <= now:
                self._rollout(rollouts.pop(0), now)
            if self.strategy.warming and k % FAR_EVERY_TICKS == 0:
                for r in rollouts:
                    if r.at - r.announce <= now:
                        self._stage(r, now)
            if self.launching:
                self._joins(now)
            self._events(now)
            if self.belief.refresh(now):
                for i, s in enumerate(self.w):
                    s.scale, s.next_startup = self.belief.scale(i), None
                self._plan_key = None
                if self.belief.learn_nodes:
                    self._node_factors()
            expectations: list[Expectation] = []
            claims: list[Claim] = []
            for s in self.w:
                assert s.timeline is not None
                q = s.queue
                queued = q.queued(k)
                s.timeline.queue[k] = queued
                s.timeline.served[k] = q.served(k)
                if k == 0:
                    continue  # nothing observed yet: the initial replicas hold
                demand = q.arrived_in(k - 1) / dt
                s.hist_v[k + len(s.setup.history)] = demand
                desired, expectation = self._decide(s, k, demand, queued)
                scaling = self.policy.scaling
                reactive = replicas_for(demand + queued / scaling.queue_drain,
                                        s.setup.capacity * scaling.target_utilization)
                claims.append(claim(s.setup.profile, minimum=s.setup.min_replicas, reactive=reactive,
                                    current=len(s.pods), desired=desired))
                if expectation is not None:
                    expectations.append(expectation)
            if claims:
                granted = share(claims, self._fleet_gpus()) if self.strategy.scaling != "hpa" else {}
                ahead = {e.workload: e for e in expectations}
                for cl in claims:
                    s = self.w[self.names[cl.workload]]
                    desired, current = granted.get(cl.workload, cl.desired), len(s.pods)  # as at _decide
                    self._scale(s, desired, now)
                    if s.old:
                        self._rolling(s, now)
                    e = ahead.get(cl.workload)
                    s.standby = 0 if e is None else standby_replicas(e, desired=desired, current=current)
            self._place_pending(now)
            if self.autoscaled:
                self._autoscale(now)
                c = self.cluster
                launching = sum(int(c.class_gpus[x]) for x in self.launching)
                self.fleet_gpus[k] = int(c.class_gpus[c.present].sum()) + launching
                self.fleet_gpu_s += float(self.fleet_gpus[k]) * dt
            if self.strategy.warming:
                self._warm(expectations, now)
            for s in self.w:
                assert s.timeline is not None
                tl = s.timeline
                rate = s.ready * s.setup.capacity
                s.queue.serve(k, rate)
                tl.demand[k] = s.queue.arrived_in(k) / dt
                tl.capacity[k] = rate
                tl.ready[k] = s.ready
                placed = len(s.pods) - len(s.waiting)
                tl.starting[k] = placed - s.ready
                tl.pending[k] = len(s.pods) - placed
                s.gpu_s += placed * s.setup.profile.parallelism.gpus * dt
            if progress is not None and (k + 1) % report_every == 0:
                progress(k + 1)
        if progress is not None:
            progress(n)
        return self._result()

    def _upper_checks(self, s: _WorkloadState) -> list[bool]:
        """Per forecast of the scaler whose grid step around its time ended inside the run: whether
        the mean demand observed over that step stayed at or under its upper quantile (a forecast on
        a grid of ``step`` seconds is of the mean over ``[time - step/2, time + step/2)``, as
        :func:`extender.core.forecast.resample` bins the history it reads)."""
        n, dt, o = self.p.n_ticks, self.dt, len(s.setup.history)
        half = (s.params.step_s or dt) / 2
        out = []
        for at, upper in s.uppers:
            first, end = math.ceil((at - half) / dt - 1e-9) + o, math.ceil((at + half) / dt - 1e-9) + o
            if end <= n + o:
                out.append(float(np.mean(s.hist_v[max(first, 1):max(end, first + 1)])) <= upper)
        return out

    def _result(self) -> RunResult:
        n = self.p.n_ticks
        out: list[WorkloadResult] = []
        for s in self.w:
            assert s.timeline is not None
            q = s.queue
            s.timeline.served[n] = q.served(n)
            pods = [p for p in self.placed if p.workload == s.setup.index]
            gpus = s.setup.profile.parallelism.gpus
            served = q.served(n)
            end = n * self.dt
            waits = [p.ready_s - p.created_s for p in pods if p.ready_s <= end and p.ready_s <= p.deleted_s]
            checked = self._upper_checks(s)
            out.append(WorkloadResult(
                name=s.setup.profile.name, capacity=s.setup.capacity, gpus_per_replica=gpus,
                timeline=s.timeline, delays=q.delays(), arrived=q.arrived(n) + 0.0, served=served,
                queued=q.queued(n), startups=np.array([p.startup_s for p in pods], dtype=np.float64),
                cold=np.array([p.cold for p in pods], dtype=np.bool_), gpu_seconds=s.gpu_s,
                busy_gpu_seconds=served / s.setup.capacity * gpus,
                placed_s=np.array([p.placed_s for p in pods], dtype=np.float64),
                believed_s=np.array([self.believed.get(p.id, math.nan) for p in pods], dtype=np.float64),
                ready_waits=np.array(waits, dtype=np.float64),
                upper_checked=len(checked), upper_covered=int(sum(checked)), disrupted=s.disrupted,
            ))
        return RunResult(self.strategy, self.dt, n, out, self.warm_actions,
                         self.fleet_gpu_s if self.autoscaled else None, self.fleet_gpus, self.launched, self.removed,
                         self.consolidated)


def simulate(prepared: Prepared, strategies: Sequence[str], progress: Callable[[str, int], None] | None = None,
             *, forecasts: ForecastMemo | None = None) -> list[RunResult]:
    """Run each named strategy on the prepared scenario, in the order given.

    When two or more of them forecast, they share one :data:`ForecastMemo` (``forecasts``, when
    given, is used instead: a caller timing one strategy per call passes the same one to each).
    """
    runs = [STRATEGIES[name] for name in strategies]
    if forecasts is None and sum(s.forecasts for s in runs) >= 2:
        forecasts = {}
    results: list[RunResult] = []
    for strategy in runs:
        cb: ProgressFn | None = (lambda done, _n=strategy.name: progress(_n, done)) if progress is not None else None
        results.append(Run(prepared, strategy, forecasts=forecasts).run(cb))
    return results
