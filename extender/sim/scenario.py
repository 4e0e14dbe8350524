"""The scenario file: which policy, which cluster, which demand, which SLO, which strategies.

A scenario is YAML validated like a policy (unknown fields are errors; every problem is reported at
once as ``file:line: path: message``). Paths inside it (the policy, traces) are relative to the
scenario file. Example::

    apiVersion: extender.io/v1alpha1
    kind: Scenario
    policy: fleet-policy.yaml
    seed: 7
    slo: {queueDelay: 10s}
    cluster:
      nodes:
        - nodeClass: g5.12xlarge
          count: 8
          warm: [{workload: llama3-8b, fraction: 0.25}]   # image, weights, compile on 2 of 8
    workloads:
      - name: llama3-8b                                   # a profile of the policy
        demand:
          synthetic: {duration: 2d, base: 40, daily: {amplitude: 0.5, peak: 14h}}
    strategies: [default, cache-aware, predictive, oracle]

Checks that need the policy (a node class or workload it does not define, a per-replica capacity
it does not give, a snapshot the profile does not have) run in :func:`check_against` and are
reported with the scenario's own lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, model_validator

from extender.core.caches import CacheKind
from extender.core.document import Loc, compose, format_path, line_of, validate
from extender.core.errors import DocumentError, InvalidValueError, PolicyError, Problem
from extender.core.policy import Metadata, Name, Policy, ReplicaBounds
from extender.core.schema import Float, Int, Schema, plain_number
from extender.core.units import Duration
from extender.files import load_policy, read_text
from extender.sim.errors import ScenarioError
from extender.sim.strategies import STRATEGIES
from extender.sim.truth import Truth, check_truth

API_VERSION = "extender.io/v1alpha1"

#: The strategies a scenario runs unless it lists its own, in the order reports list them
#: (extender.sim.strategies defines each; the calibrated ones run only when named).
STRATEGY_NAMES = tuple(name for name, s in STRATEGIES.items() if not s.calibrated and not s.extra)

#: The longest simulated time (a run, a synthetic demand, a history): 366 days, as a trace's span
#: (extender.sim.traces.MAX_SPAN_S); with ticks of at least :data:`MIN_TICK_S`, a run has at most
#: 31,622,400 ticks.
MAX_SPAN_S = 366 * 86400.0
#: The shortest tick and synthetic step.
MIN_TICK_S = 1.0
PositiveDuration = Annotated[Duration, Field(gt=0)]
#: A simulated span: > 0 and at most :data:`MAX_SPAN_S`.
Span = Annotated[Duration, Field(gt=0, le=MAX_SPAN_S)]
#: A step of the clock: at least :data:`MIN_TICK_S`, at most a day.
Step = Annotated[Duration, Field(ge=MIN_TICK_S, le=86400.0)]
#: The least ``capacity`` (requests/s per replica) and ``hpa.targetUtilization``: the HPA's target,
#: their product, rounds up to whole milli-units (extender.sim.hpa.to_milli), so with both at least
#: this it is at least 1 milli, never 0 (a division by zero in the HPA's replica count).
MIN_CAPACITY = 0.001
MIN_TARGET_UTILIZATION = 0.001
#: The most nodes a group, and all groups together, can hold (``count``, or ``maxCount`` for a pool):
#: each node is a row of the simulated world's arrays and of every strategy's copy of them.
MAX_NODES = 100_000
#: The most replicas a workload, and all workloads together, can have (``maxReplicas``): each is a
#: pod of the simulated world, created at once when the HPA asks (it doubles a workload's replicas
#: every tick of a scale-up); ``maxReplicas: 1e15`` made a run create pods until memory ran out.
MAX_REPLICAS = 100_000
#: Bounds of ``loadScale`` and ``timeScale`` (a trace's own rates and span are checked when it is read).
MAX_SCALE = 1e9
CacheName = CacheKind


# ---------------------------------------------------------------------------------------------
# Demand
# ---------------------------------------------------------------------------------------------


class TraceSpec(Schema):
    """A CSV trace: one row per request, or one row per interval (timestamp and rate).

    ``loadScale`` multiplies the load (requests are thinned or replicated, seeded; rates are
    multiplied). ``timeScale`` stretches the clock: a row ``d`` seconds after the first is replayed
    at ``d x timeScale``; rates are divided by it, so the number of requests is kept.
    """

    path: str = Field(min_length=1)
    format: Literal["auto", "requests", "rate"] = "auto"
    time_column: str | None = None
    rate_column: str | None = None
    load_scale: Float = Field(default=1.0, gt=0, le=MAX_SCALE)
    time_scale: Float = Field(default=1.0, ge=1 / MAX_SCALE, le=MAX_SCALE)
    #: Shown wherever the trace's results are (CC-BY data must be credited).
    credit: str = ""


class Cycle(Schema):
    """A cosine cycle: ``1 + amplitude cos(2 pi (t - peak) / period)``."""

    amplitude: Float = Field(default=0.0, ge=0, le=1)
    #: Offset of the maximum from the start of the period (a day: ``14h``; a week: ``2d``).
    peak: Duration = 0.0


class Bursts(Schema):
    """Unforecastable bursts: ``perDay`` on average (Poisson), each multiplying the rate by
    ``1 + amplitude`` for ``duration``."""

    per_day: Float = Field(default=0.0, ge=0, le=10_000)
    amplitude: Float = Field(default=1.0, ge=0, le=1000)
    duration: PositiveDuration = 600.0


class SyntheticSpec(Schema):
    """A seeded synthetic demand (extender.sim.synthetic has the formula).

    ``base`` is the mean rate in requests/s at t = 0, before cycles. ``trend`` is the relative
    change per day (0.05: +5 % a day). ``noise`` is the standard deviation of a multiplicative
    log-normal factor per ``step``. ``arrivals: poisson`` draws each bin's request count from a
    Poisson law (seeded); ``fluid`` uses the expected count.
    """

    duration: Span
    step: Step = 60.0
    base: Float = Field(gt=0, le=1e9)
    daily: Cycle = Cycle()
    weekly: Cycle = Cycle()
    trend: Float = Field(default=0.0, ge=-0.5, le=10)
    noise: Float = Field(default=0.0, ge=0, le=2)
    bursts: Bursts = Bursts()
    arrivals: Literal["poisson", "fluid"] = "poisson"


class DemandSpec(Schema):
    """Exactly one of a trace and a synthetic generator."""

    trace: TraceSpec | None = None
    synthetic: SyntheticSpec | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> DemandSpec:
        if (self.trace is None) == (self.synthetic is None):
            raise InvalidValueError("give exactly one of trace and synthetic")
        return self


class Workload(ReplicaBounds):
    """One workload: its profile (by name), its demand and its serving model.

    ``capacity``: requests/s one ready replica serves (default: the profile's
    ``capacity.perReplica`` when its unit is requests/s). ``initialReplicas``: replicas ready at
    t = 0 (default: enough for the first minute's mean demand, at least ``minReplicas``); 0 only
    with ``minReplicas: 0``, as the HPA leaves a workload at 0 replicas alone otherwise.
    ``doNotDisrupt``: Karpenter's pod annotation (below).
    """

    name: Name
    demand: DemandSpec
    capacity: Annotated[float, Field(ge=MIN_CAPACITY, allow_inf_nan=False), BeforeValidator(plain_number)] | None = None
    max_replicas: Int = Field(default=1000, ge=1, le=MAX_REPLICAS)
    initial_replicas: Annotated[int, Field(ge=0), BeforeValidator(plain_number)] | None = None
    #: Its pods carry ``karpenter.sh/do-not-disrupt: "true"``: a node holding one is never drained
    #: to consolidate it (an empty node has none, so empty nodes still go).
    do_not_disrupt: bool = False

    @model_validator(mode="after")
    def _starts_scalable(self) -> Workload:
        # reconcileAutoscaler: a scale target at 0 replicas with minReplicas != 0 is "ScalingDisabled"
        if self.initial_replicas == 0 and self.min_replicas > 0:
            raise InvalidValueError(
                f"initialReplicas 0 with minReplicas {self.min_replicas}: the HPA does not scale a workload "
                "at 0 replicas unless minReplicas is 0 (scaling disabled), so no replica would ever run; "
                "set initialReplicas >= 1, or minReplicas: 0 to scale from zero")
        return self


# ---------------------------------------------------------------------------------------------
# Cluster
# ---------------------------------------------------------------------------------------------


class WarmSpec(Schema):
    """Caches present at t = 0 on some nodes of a group: a ``fraction`` of them (the first
    ``round(fraction x count)``) or the listed ``nodes`` (0-based positions in the group)."""

    workload: Name
    caches: tuple[CacheName, ...] = ("image", "weights", "compile")
    fraction: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False), BeforeValidator(plain_number)] | None = None
    nodes: tuple[Annotated[int, Field(ge=0), BeforeValidator(plain_number)], ...] | None = None

    @model_validator(mode="after")
    def _one_selector(self) -> WarmSpec:
        if (self.fraction is None) == (self.nodes is None):
            raise InvalidValueError("give exactly one of fraction and nodes")
        return self


class NodeGroup(Schema):
    """``count`` nodes of one class, named ``<name>-<i>`` (``name`` defaults to the class name).

    With ``maxCount`` the group is an autoscaled node pool (the cluster's ``autoscaling``): it starts
    with ``count`` nodes (0 allowed), never goes below ``minCount`` (default ``count``) and grows up
    to ``maxCount`` when pods are pending.

    ``consolidationPolicy`` (a pool's, as Karpenter's NodePool ``disruption.consolidationPolicy``):
    ``WhenEmpty`` removes only nodes without pods; ``WhenEmptyOrUnderutilized`` also drains a node
    whose pods all fit on the other nodes' free GPUs (extender.sim.simulation, ``Run._underused``).
    """

    node_class: str = Field(min_length=1)
    count: Int = Field(ge=0, le=MAX_NODES)
    name: Name | None = None
    warm: tuple[WarmSpec, ...] = ()
    min_count: Annotated[int, Field(ge=0, le=MAX_NODES), BeforeValidator(plain_number)] | None = None
    max_count: Annotated[int, Field(ge=1, le=MAX_NODES), BeforeValidator(plain_number)] | None = None
    consolidation_policy: Literal["WhenEmpty", "WhenEmptyOrUnderutilized"] = "WhenEmpty"

    @model_validator(mode="after")
    def _bounds(self) -> NodeGroup:
        if self.max_count is None:
            if self.count < 1:
                raise InvalidValueError("a fixed group needs count >= 1 (or set maxCount to make it a pool)")
            if self.min_count is not None:
                raise InvalidValueError("minCount needs maxCount (an autoscaled pool)")
            if "consolidation_policy" in self.model_fields_set:
                raise InvalidValueError("consolidationPolicy needs maxCount (only an autoscaled pool is consolidated)")
            return self
        low = self.count if self.min_count is None else self.min_count
        if not low <= self.count <= self.max_count:
            raise InvalidValueError(f"need minCount <= count <= maxCount, got {low} <= {self.count} <= "
                                    f"{self.max_count}")
        return self

    @property
    def floor(self) -> int:
        """Nodes the pool never goes below."""
        return self.count if self.min_count is None else self.min_count

    @property
    def ceiling(self) -> int:
        """Nodes the group can have at most."""
        return self.count if self.max_count is None else self.max_count


class ProvisioningDelay(Schema):
    """Seconds from a node's launch to Ready: log-normal with this ``median`` and ``p90``.

    Defaults (3 min median, 5 min p90) follow published figures for GPU nodes: the cluster-autoscaler
    FAQ gives several minutes from scale-up to a schedulable node on the big clouds, and field reports
    of Karpenter on EKS give ~5 minutes for a pod that needs a new node (docs/simulator.md).
    """

    median: PositiveDuration = 180.0
    p90: PositiveDuration = 300.0

    @model_validator(mode="after")
    def _ordered(self) -> ProvisioningDelay:
        if self.p90 < self.median:
            raise InvalidValueError(f"p90 ({self.p90:g} s) is below the median ({self.median:g} s)")
        return self


class Autoscaling(Schema):
    """Node autoscaling of the groups with ``maxCount`` (as cluster-autoscaler or Karpenter do it).

    ``consolidateAfter``: an empty node above its pool's ``minCount`` is removed after this long
    (cluster-autoscaler's ``--scale-down-unneeded-time`` default, 10 min); in a pool with
    ``consolidationPolicy: WhenEmptyOrUnderutilized``, so is a node whose pods have all fitted
    elsewhere, unchanged, for this long (its pods are deleted and made again). ``provisionAhead``: the
    strategies with the warmer keep the standby placeholders the scaler publishes (pods of a
    negative priority holding free GPUs, the overprovisioning pattern of the cluster-autoscaler
    FAQ; docs/scaler.md section 5.1), so nodes exist, and are prepared, before the replicas do.
    """

    provisioning: ProvisioningDelay = ProvisioningDelay()
    consolidate_after: Duration = 600.0
    provision_ahead: bool = True


class Cluster(Schema):
    """The nodes; ``compileRegistry``: a compile-cache key built once is fetchable by every node of
    its class (the inventory's compile registry)."""

    nodes: tuple[NodeGroup, ...] = Field(min_length=1)
    compile_registry: bool = False
    autoscaling: Autoscaling = Autoscaling()


class HpaSpec(Schema):
    """The stock HPA of the ``hpa`` strategies: ``targetUtilization`` is the share of one replica's
    capacity its ``AverageValue`` target is set to (1: scale only when replicas are full)."""

    target_utilization: Float = Field(default=1.0, ge=MIN_TARGET_UTILIZATION, le=1)


class Rollout(Schema):
    """A rolling update of one workload at ``at``: a new weights ``weightsVersion`` and/or ``image``.

    Every replica then runs the new version: running ones are replaced ``maxSurge`` at a time (a
    Deployment's rolling update with ``maxSurge`` pods and ``maxUnavailable: 0``: an old replica is
    deleted when its replacement is Ready). Caches of the old version no longer count as warm.
    ``announce``: seconds before ``at`` the warmer is told the rollout is coming (0: not told); the
    strategies with the warmer then stage the new version on the nodes the replacements will land on.
    """

    workload: Name
    at: PositiveDuration
    weights_version: str | None = Field(default=None, min_length=1)
    image: str | None = Field(default=None, min_length=1)
    max_surge: Int = Field(default=1, ge=1)
    announce: Duration = 0.0

    @model_validator(mode="after")
    def _changes_something(self) -> Rollout:
        if self.weights_version is None and self.image is None:
            raise InvalidValueError("give weightsVersion, image or both")
        return self


class Slo(Schema):
    """The service-level objective: a request meets it when it waits at most ``queueDelay``."""

    queue_delay: Duration


class SchedulerSpec(Schema):
    """kube-scheduler's configuration as far as the simulation needs it.

    ``extenderWeight``: the extender's weight in ``KubeSchedulerConfiguration.extenders`` (its 0..10
    score adds ``score x weight x 10``); 2 as in the chart's scheduler configuration.
    """

    extender_weight: Int = Field(default=2, ge=1)


class Scenario(Schema):
    """A whole scenario file."""

    api_version: Literal["extender.io/v1alpha1"]
    kind: Literal["Scenario"]
    metadata: Metadata = Metadata()
    policy: str = Field(min_length=1)
    #: Seeds numpy's generators, which take whole numbers >= 0.
    seed: Int = Field(default=0, ge=0)
    #: The simulation step: the HPA's sync period and the scaler's tick.
    tick: Step = 15.0
    #: Simulated time; default: the longest demand.
    duration: Annotated[Duration, Field(gt=0, le=MAX_SPAN_S)] | None = None
    #: Demand the scaler has already seen at t = 0 (whole ticks; 0: a scaler installed at t = 0).
    #: Only its forecasts read it; nothing in it is simulated. A synthetic demand is drawn on
    #: before t = 0 (its own random draws: the simulated demand stays the same); a trace gives its
    #: first ``history`` seconds, and the simulation replays the rest.
    history: Annotated[Duration, Field(ge=0, le=MAX_SPAN_S)] = 0.0
    slo: Slo
    cluster: Cluster
    workloads: tuple[Workload, ...] = Field(min_length=1)
    strategies: tuple[str, ...] = Field(default=STRATEGY_NAMES, min_length=1)
    scheduler: SchedulerSpec = SchedulerSpec()
    hpa: HpaSpec = HpaSpec()
    rollouts: tuple[Rollout, ...] = ()
    #: How the world's startups differ from the policy's estimates (extender.sim.truth); unset: they do not.
    truth: Truth | None = None


# ---------------------------------------------------------------------------------------------
# Checks against the policy
# ---------------------------------------------------------------------------------------------


def _check_max_nodes(scenario: Scenario, policy: Policy) -> list[tuple[Loc, str]]:
    """A class's groups must not hold more nodes than the policy's ``maxNodes`` for it: the scaler
    shares a fleet of at most that many (extender.core.sharing), the simulated pools are the truth."""
    out: list[tuple[Loc, str]] = []
    for cls in policy.node_classes:
        if cls.max_nodes is None:
            continue
        groups = [(g, group) for g, group in enumerate(scenario.cluster.nodes) if group.node_class == cls.name]
        ceiling = sum(group.ceiling for _, group in groups)
        if groups and ceiling > cls.max_nodes:
            g, last = groups[-1]
            out.append((("cluster", "nodes", g, "maxCount" if last.max_count is not None else "count"),
                        f"the groups of node class {cls.name!r} can hold {ceiling} nodes, more than the policy's "
                        f"maxNodes {cls.max_nodes} for it (the scaler would share a smaller fleet than the one "
                        "simulated)"))
    return out


def _check_total_nodes(scenario: Scenario) -> list[tuple[Loc, str]]:
    """All groups together hold at most :data:`MAX_NODES`, as one does (five full groups took 2 GB),
    said at the group that goes past it."""
    total = 0
    for g, group in enumerate(scenario.cluster.nodes):
        total += group.ceiling
        if total > MAX_NODES:
            field = "maxCount" if group.max_count is not None else "count"
            return [(("cluster", "nodes", g, field),
                     f"the groups up to this one can hold {total} nodes, more than the {MAX_NODES} a scenario "
                     "may have in all")]
    return []


def _check_total_replicas(scenario: Scenario) -> list[tuple[Loc, str]]:
    """All workloads together have at most :data:`MAX_REPLICAS` replicas, said at the workload that
    goes past it."""
    total = 0
    for i, w in enumerate(scenario.workloads):
        total += w.max_replicas
        if total > MAX_REPLICAS:
            return [(("workloads", i, "maxReplicas"),
                     f"the workloads up to this one can have {total} replicas, more than the {MAX_REPLICAS} a "
                     "scenario may have in all")]
    return []


def check_against(scenario: Scenario, policy: Policy) -> list[tuple[Loc, str]]:
    """Problems that need the policy (or span fields), as ``(location, message)`` pairs."""
    out: list[tuple[Loc, str]] = []
    classes = {c.name: c for c in policy.node_classes}
    profiles = {p.name: p for p in policy.profiles}
    known_classes = ", ".join(classes) or "none"
    known_profiles = ", ".join(profiles) or "none"
    names = [w.name for w in scenario.workloads]
    for i, w in enumerate(scenario.workloads):
        if names.index(w.name) != i:
            out.append((("workloads", i, "name"), f"workload {w.name!r} is listed twice"))
        profile = profiles.get(w.name)
        if profile is None:
            out.append((("workloads", i, "name"), f"the policy has no profile {w.name!r} (known: {known_profiles})"))
            continue
        if w.capacity is None:
            if profile.capacity is None:
                out.append((("workloads", i), f"profile {w.name!r} gives no capacity.perReplica; set capacity "
                                              "(requests/s per replica) here"))
            elif profile.capacity.unit != "requests/s":
                out.append((("workloads", i), f"profile {w.name!r} gives its capacity in {profile.capacity.unit}; "
                                              "the simulator counts requests: set capacity (requests/s) here"))
            elif profile.capacity.per_replica < MIN_CAPACITY:
                out.append((("workloads", i), f"profile {w.name!r} gives a capacity.perReplica of "
                                              f"{profile.capacity.per_replica:g} requests/s, less than the "
                                              f"{MIN_CAPACITY:g} the simulator takes: set capacity here"))
    out += _check_max_nodes(scenario, policy)
    out += _check_total_nodes(scenario)
    out += _check_total_replicas(scenario)
    for g, group in enumerate(scenario.cluster.nodes):
        cls = classes.get(group.node_class)
        if cls is None:
            out.append((("cluster", "nodes", g, "nodeClass"),
                        f"the policy has no node class {group.node_class!r} (known: {known_classes})"))
        for j, warm in enumerate(group.warm):
            where: Loc = ("cluster", "nodes", g, "warm", j)
            profile = profiles.get(warm.workload)
            if profile is None:
                out.append(((*where, "workload"),
                            f"the policy has no profile {warm.workload!r} (known: {known_profiles})"))
                continue
            if cls is not None and profile.node_classes and cls.name not in profile.node_classes:
                out.append(((*where, "workload"), f"profile {warm.workload!r} does not run on node class {cls.name!r}"))
            if "snapshot" in warm.caches and profile.snapshot is None:
                out.append(((*where, "caches"), f"profile {warm.workload!r} has no snapshot"))
            if "adapter" in warm.caches and not profile.preloaded_adapters:
                out.append(((*where, "caches"), f"profile {warm.workload!r} preloads no LoRA adapters"))
            for k, n in enumerate(warm.nodes or ()):
                if n >= group.count:
                    out.append(((*where, "nodes", k), f"node {n} does not exist: the group has {group.count} "
                                                      f"(0..{group.count - 1})"))
    for r, rollout in enumerate(scenario.rollouts):
        if rollout.workload not in names:
            out.append((("rollouts", r, "workload"), f"no workload {rollout.workload!r} (known: {', '.join(names)})"))
        elif rollout.weights_version is not None and profiles.get(rollout.workload) is not None:
            current = profiles[rollout.workload].weights.version
            if rollout.weights_version == current:
                out.append((("rollouts", r, "weightsVersion"),
                            f"{current!r} is already the version of {rollout.workload!r}"))
        if rollout.announce > rollout.at:
            out.append((("rollouts", r, "announce"), f"announced {rollout.announce:g} s ahead of {rollout.at:g} s: "
                                                     "before the run starts"))
    for i, s in enumerate(scenario.strategies):
        if s not in STRATEGIES:
            out.append((("strategies", i), f"no strategy {s!r} (known: {', '.join(STRATEGIES)})"))
    if len(set(scenario.strategies)) != len(scenario.strategies):
        out.append((("strategies",), "a strategy is listed twice"))
    if scenario.truth is not None:
        out.extend(check_truth(scenario.truth, policy, [g.node_class for g in scenario.cluster.nodes]))
    group_names = [g.name or g.node_class for g in scenario.cluster.nodes]
    for g, name in enumerate(group_names):
        if group_names.index(name) != g:
            out.append((("cluster", "nodes", g), f"two node groups are named {name!r}: give one a name"))
    return out


def _compose(text: str, source: str) -> tuple[object, dict[Loc, int]]:
    try:
        data, lines = compose(text, source)
    except DocumentError as exc:
        raise ScenarioError(exc.problems) from exc
    if not isinstance(data, dict):
        raise ScenarioError([Problem(source, 1 if data is not None else None, "",
                                     "a scenario must be a mapping with apiVersion, kind, policy, slo, cluster "
                                     "and workloads")])
    return data, lines


# ---------------------------------------------------------------------------------------------
# The I/O edge: read the scenario and its policy from disk
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadedScenario:
    """A checked scenario, its policy, and the directory its relative paths start from."""

    scenario: Scenario
    policy: Policy
    source: str
    base_dir: Path

    def resolve(self, path: str) -> Path:
        """A path from the scenario, relative to the scenario file's directory."""
        p = Path(path)
        return p if p.is_absolute() else self.base_dir / p


def _exists(path: Path) -> bool:
    """Whether ``path`` names something (a directory, a FIFO): then it is not missing, only unreadable."""
    try:
        return path.exists()
    except (OSError, ValueError):  # a name the system refuses (too long, a NUL) names nothing
        return False


def load_scenario(path: str | Path) -> LoadedScenario:
    """Read a scenario and its policy and check them together; every problem is reported at once.

    Problems in the policy file are reported with the policy's own file and lines.
    """
    source = str(path)
    try:
        text = read_text(path)
    except DocumentError as exc:
        raise ScenarioError(exc.problems) from exc
    data, lines = _compose(text, source)
    scenario = validate(Scenario, data, lines, source, error=ScenarioError)
    base = Path(path).resolve().parent
    policy_path = Path(scenario.policy) if Path(scenario.policy).is_absolute() else base / scenario.policy
    if not policy_path.is_file():
        said = (f"{scenario.policy!r} is not a regular file (a directory, FIFO or device; looked in {policy_path})"
                if _exists(policy_path) else f"no policy file {scenario.policy!r} (looked in {policy_path})")
        raise ScenarioError([Problem(source, line_of(lines, ("policy",)), "policy", said)])
    try:
        policy = load_policy(policy_path)
    except PolicyError as exc:
        raise ScenarioError(exc.problems) from exc
    problems = [Problem(source, line_of(lines, loc), format_path(loc), msg)
                for loc, msg in check_against(scenario, policy)]
    for i, w in enumerate(scenario.workloads):
        trace = w.demand.trace
        if trace is not None:
            p = Path(trace.path) if Path(trace.path).is_absolute() else base / trace.path
            if not p.is_file():
                loc: Loc = ("workloads", i, "demand", "trace", "path")
                said = (f"{trace.path!r} is not a regular file (a directory, FIFO or device)" if _exists(p)
                        else f"no trace file {trace.path!r}")
                problems.append(Problem(source, line_of(lines, loc), format_path(loc), said))
    if problems:
        raise ScenarioError(sorted(problems, key=lambda p: (p.line or 0, p.path)))
    return LoadedScenario(scenario, policy, source, base)
