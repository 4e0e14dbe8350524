"""The scaler loop: one tick decides every autoscaled workload once, as leader, or stands by.

A tick (default every 15 s, the HPA's own sync period)::

    lease = lock.acquire()                      take / renew / stand by (extender.state.lock)
    standby -> done
    snapshot = live inventory (rebuilt only when its version moved)
    for each profile with an autoscaling section:
        pods      = list pods (profile's labels)  -> ready, starting
        obs       = signal source.observe(pods)   -> rate, queue, complete?
        placement = next replica's node + estimate -> horizon = startup + tick + hpa sync
        history   = Redis history + this sample   -> forecast(horizon) at the upper quantile
        decision  = decide(...)                   (extender.core.scaler, pure)
    capacity = fleet_capacity(fresh inventory nodes, maxNodes)    (extender.core.sharing)
    granted  = share(claims of every decided workload, capacity)  cut a decision only if it must
    for each decided workload:
        commit, fenced by the lease's token: sample, decision record, stabilisation window,
        published desired replicas and load -- all or nothing

Sharing fails open: with no inventory, or a class without ``maxNodes``, nothing is cut and the
decision's reasons say so when the inventory is missing.

An incomplete observation (some ready pods did not answer) is a lower bound of the demand: if the
decision made on it is a scale-down, it is made again as "not observed" (hold, forecast may raise),
and the record says why. A workload whose pods cannot be listed is skipped this tick (its replica
count is unknown, and a decision without it could only be wrong); the others go on. A fenced-out
commit ends the tick at once: another scaler leads, and this one must not write anything more.
The leader-tick listeners (the cache warmer) run only after the lease is renewed under the tick's
own token: what they do happens outside Redis, where no fence stops a deposed leader.

With ``calibration.mode: apply`` (and a ``calibration`` reader), each led tick first takes the
calibrated policy (:class:`extender.state.observations.CalibratedPolicy`): the placement and the
horizon are estimated with the fitted phase times and the per-node factors (the next replica's
node, as the extender scores it), and the listeners of ``on_estimator_policy``
(the cache warmer) get the policy and the factors whenever either changes.

A newly elected leader has no previous counter values for the ``scrape`` source, so its first tick
observes nothing and holds; the forecast still comes from the shared history.

A history that starts later than the store keeps (a new scaler, a new workload, a lost store), or
has a hole in it (the scalers, or Redis, down for a while), is filled from the source's past when
the source has one (:class:`PastSource`: the ``prometheus`` source's range queries, unless its
``backfill`` is off): one span of at least :data:`BACKFILL_MIN_STEPS` ticks without a sample, the
newest first (the span before the first stored sample counts as one), one point per tick on the
stored samples' cadence, written in the same fenced commit as the tick's own sample. One workload
per tick, within one tick's time (the queries must not hold a tick past its lease of three ticks),
at most one try per workload every :data:`BACKFILL_RETRY_S`, and a span is not asked again once a
fill returned all the source knows of it; a failed try is logged and the decision goes on without
it (docs/scaler.md).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from extender.core.calibration import NO_NODE_FACTORS, NodeFactors
from extender.core.errors import ExtenderError, FencedOutError, SignalError
from extender.core.forecast import Forecast, ForecastParams, forecast
from extender.core.inventory import InventorySnapshot, NodeState
from extender.core.placement import Placement, next_replica
from extender.core.policy import UNKNOWN_CLASS, Policy, Profile
from extender.core.scaler import Decision, DecisionInputs, Recommendation, decide, horizon, prune
from extender.core.sharing import apply_share, claim, fleet_capacity, share
from extender.core.units import format_duration
from extender.core.warming import Expectation, look_ahead_s, standby_replicas
from extender.files import PolicyFile
from extender.scaler.observation import Fetcher, Observation, PastSource, SignalSource, http_get
from extender.scaler.pods import PodLister, Replicas, count_replicas, label_selector, workload_pods
from extender.scaler.signals import build_source, source_inputs
from extender.state.decisions import MAX_REPLICAS, DecisionStore, Published
from extender.state.history import HistoryStore, Sample
from extender.state.lock import LeaderLock
from extender.state.observations import CalibratedPolicy

log = logging.getLogger(__name__)

#: A span without samples shorter than this many ticks is not filled from the source's past (a
#: restart's or a failover's gap of a few ticks is not worth a range query).
BACKFILL_MIN_STEPS = 20
#: After a backfill (or a failed one), the same workload is not tried again for this long.
BACKFILL_RETRY_S = 600.0
#: The leader's lease, in ticks, unless ``--lease-ttl`` fixes it: a standby leads within this many.
LEASE_TICKS = 3.0


class InventoryReader(Protocol):
    """What the loop reads from the inventory store (``extender.state.InventoryStore``)."""

    def versions(self) -> tuple[int, int]: ...

    def load_all(self) -> tuple[int, list[NodeState], frozenset[str]]: ...


@dataclass(frozen=True)
class WorkloadResult:
    """What one tick did for one workload: a decision, or the error that prevented it."""

    workload: str
    decision: Decision | None = None
    observation: Observation | None = None
    replicas: Replicas | None = None
    placement: Placement | None = None
    #: What the cache warmer should prepare for: :meth:`Expectation.ahead`, or without any history
    #: to forecast from, :meth:`Expectation.from_decision`.
    expectation: Expectation | None = None
    #: Placeholder replicas published (extender.core.warming.standby_replicas).
    standby: int = 0
    #: Samples this tick added to the history from the source's past (a backfill).
    backfilled: int = 0
    error: str = ""


@dataclass(frozen=True)
class TickReport:
    """One tick: whether this candidate led (with which token), and per workload what happened."""

    now: float
    leader: bool
    token: int
    holder: str
    results: tuple[WorkloadResult, ...] = ()
    fenced_out: bool = False
    error: str = ""
    #: Seconds the tick took (monotonic clock).
    duration_s: float = 0.0
    #: Inventory nodes of a policy node class the leader read, fresh and stale (:func:`freshness`;
    #: ``None``: no inventory was read).
    fresh_nodes: int | None = None
    stale_nodes: int = 0

    def expectations(self) -> list[Expectation]:
        """What the cache warmer should prepare for after this tick, one per decided workload."""
        return [r.expectation for r in self.results if r.expectation is not None]


def scaled_profiles(policy: Policy) -> tuple[Profile, ...]:
    """The profiles the scaler decides for: those with an ``autoscaling`` section (and so a capacity)."""
    return tuple(p for p in policy.profiles if p.autoscaling is not None and p.capacity is not None)


@dataclass
class ScaleLoop:
    """Every piece of one scaler candidate; :meth:`tick` runs one round (module docstring).

    ``tick_s`` / ``hpa_sync_s`` default to the policy's ``scaling`` section. ``sources`` may preset a
    workload's signal source (tests script demand this way); the others are built from the policy.
    """

    policy: Policy
    lock: LeaderLock
    history: HistoryStore
    decisions: DecisionStore
    pods: PodLister
    inventory: InventoryReader | None = None
    fetch: Fetcher = http_get
    sources: dict[str, SignalSource] = field(default_factory=dict)
    tick_s: float | None = None
    hpa_sync_s: float | None = None
    clock: Callable[[], float] = time.time
    #: Seconds that only go forward: how long the tick has run when a workload's pods are scraped
    #: (:meth:`draft`), so a rate spans the time between two scrapes, not between two tick starts.
    monotonic: Callable[[], float] = time.monotonic
    #: Called after every tick this candidate led to the end (e.g. the cache warmer, which acts on
    #: the leader only); an exception is logged and does not stop the loop.
    on_leader_tick: list[Callable[[TickReport], None]] = field(default_factory=list)
    #: Called with each policy :meth:`set_policy` takes (e.g. the cache warmer's, the metrics API's).
    on_policy: list[Callable[[Policy], None]] = field(default_factory=list)
    #: Reads the observed starts: with ``calibration.mode: apply`` the estimates use the fit.
    calibration: CalibratedPolicy | None = None
    #: The lock's lease in ticks, kept so when an edit changes the tick (``extender scale`` without
    #: ``--lease-ttl``: :data:`LEASE_TICKS`); ``None``: the lock keeps the lease it was made with.
    lease_ticks: float | None = None
    #: Called with the policy the estimator uses (the base policy, or its calibration) and the
    #: per-node factors of the same fit whenever either changes, before the tick that first uses
    #: them (the cache warmer plans with both, so it prepares the node the extender will pick).
    on_estimator_policy: list[Callable[[Policy, NodeFactors], None]] = field(default_factory=list)
    _snapshot: InventorySnapshot | None = field(default=None, init=False, repr=False)
    #: Per workload: what its signal source was built from (:func:`source_inputs`), and the source.
    _built: dict[str, tuple[tuple[object, object], SignalSource]] = field(default_factory=dict, init=False,
                                                                       repr=False)
    #: The store's (version, heartbeat sequence) the snapshot was read at: bare heartbeats move only the second.
    _read_at: tuple[int, int] | None = field(default=None, init=False, repr=False)
    _told: tuple[Policy, NodeFactors] | None = field(default=None, init=False, repr=False)
    _lease_token: int | None = field(default=None, init=False, repr=False)
    #: Per workload: no backfill before this time (one try per BACKFILL_RETRY_S), and the ends of the
    #: spans a fill has answered (the source knows nothing more of them: no asking again).
    _backfill_at: dict[str, float] = field(default_factory=dict, init=False, repr=False)
    _answered: dict[str, set[float]] = field(default_factory=dict, init=False, repr=False)
    #: The tick that asked a source's past (one workload per tick: a slow source cannot hold a tick long).
    _backfilled_in: float | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        # what the caller fixed stays fixed across policy reloads; the rest follows the policy
        self._fixed_tick, self._fixed_hpa_sync = self.tick_s, self.hpa_sync_s
        self._preset_sources = dict(self.sources)
        self._derive()

    def _derive(self) -> None:
        scaling = self.policy.scaling
        self.tick_s = self._fixed_tick if self._fixed_tick is not None else scaling.tick
        self.hpa_sync_s = self._fixed_hpa_sync if self._fixed_hpa_sync is not None else scaling.hpa_sync_delay
        if self.lease_ticks is not None:  # a lease shorter than a longer tick would lapse between renewals
            self.lock.set_ttl(self.lease_ticks * self.tick_s)
        self.profiles = profiles = scaled_profiles(self.policy)
        # one set per workload: each refits at its own phase of the period (forecast.refit_phase)
        base = ForecastParams.from_scaling(scaling)
        self.params = {p.name: base.for_workload(p.name) for p in self.profiles}
        #: The policy placements and horizons are estimated with (:meth:`_calibrate`).
        self.estimator_policy = self.policy
        #: The per-node factors placements are estimated with (:meth:`_calibrate`).
        self.estimator_nodes: NodeFactors = NO_NODE_FACTORS
        # a source built from the same signal and capacity is kept: a scrape source's previous
        # counters are what its next rate is measured against (a new one observes nothing for a tick)
        before, self._built = self._built, {}
        for p in profiles:
            if p.name not in self._preset_sources:
                inputs, kept = source_inputs(p), before.get(p.name)
                self._built[p.name] = (inputs, kept[1] if kept is not None and kept[0] == inputs
                                       else build_source(p, self.fetch))
        self.sources = {p.name: self._preset_sources.get(p.name) or self._built[p.name][1] for p in profiles}
        self._snapshot = None  # built for the old node classes

    def set_policy(self, policy: Policy) -> None:
        """Decide with ``policy`` from the next tick on: workloads, sources, forecaster, horizon.

        Demand history lives in Redis, so nothing learnt is lost; a workload the new policy no
        longer autoscales is simply not decided any more (its history, decisions and last published
        value stay in Redis: nothing ages out).
        """
        self.policy = policy
        self._derive()
        for callback in self.on_policy:
            callback(policy)

    @property
    def holder(self) -> str:
        return self.lock.holder

    # ---- one tick --------------------------------------------------------------------------------

    def tick(self, now: float | None = None) -> TickReport:
        """Lead or stand by for one round; never raises for a failure it can report.

        The report carries the tick's duration and, for a leader, how many inventory nodes were
        fresh and stale (for :mod:`extender.scaler.metrics`).
        """
        started = time.monotonic()
        now = self.clock() if now is None else now
        report = self._tick(now, self.monotonic())
        extra: dict[str, Any] = {"duration_s": time.monotonic() - started}
        snapshot = self._snapshot
        if report.leader and snapshot is not None and self.inventory is not None:
            fresh, stale = freshness(snapshot, now)
            extra.update(fresh_nodes=fresh, stale_nodes=stale)
        return dataclasses.replace(report, **extra)

    def _tick(self, now: float, started: float) -> TickReport:
        try:
            lease = self.lock.acquire()
        except ExtenderError as exc:
            self._lease_token = None
            return TickReport(now, False, 0, self.holder, error=f"leader election: {exc}")
        if not lease.leader:
            if self._lease_token is not None:
                log.warning("scaler %s lost the lead to %s (token %d)", self.holder, lease.holder, lease.token,
                            extra={"identity": self.holder, "leader": lease.holder, "token": lease.token})
            self._lease_token = None
            return TickReport(now, False, lease.token, lease.holder)
        if self._lease_token != lease.token:
            log.info("scaler %s leads with fencing token %d", self.holder, lease.token,
                     extra={"identity": self.holder, "leader": self.holder, "token": lease.token})
        self._lease_token = lease.token
        self._calibrate()
        snapshot = self._inventory(now)
        results: list[WorkloadResult] = []
        drafts: list[_Draft] = []
        for profile in self.profiles:
            try:
                drafts.append(self.draft(profile, now, snapshot, started=started))
            except Exception as exc:
                results.append(_failed(profile.name, exc))
        try:
            drafts = self._share(drafts, snapshot, now)
        except Exception:  # sharing can only cut; a bug there must not stop every decision
            log.exception("scaler: sharing the fleet failed; publishing the decisions uncut")
        order = {p.name: i for i, p in enumerate(self.profiles)}
        for d in drafts:
            profile = d.profile
            try:
                results.append(self.commit(d, lease.token, now))
            except FencedOutError as exc:
                log.warning("scaler %s stepping down: %s", self.holder, exc,
                            extra={"identity": self.holder, "workload": profile.name, "error": str(exc)})
                self._lease_token = None
                results.sort(key=lambda r: order[r.workload])
                return TickReport(now, True, lease.token, self.holder, tuple(results), fenced_out=True,
                                  error=str(exc))
            except Exception as exc:
                results.append(_failed(profile.name, exc))
        results.sort(key=lambda r: order[r.workload])  # in the policy's order, as before sharing
        report = TickReport(now, True, lease.token, self.holder, tuple(results))
        if self.on_leader_tick and not self._still_leading(lease.token):
            self._lease_token = None
            return dataclasses.replace(report, fenced_out=True, error="the lease changed hands before the "
                                       "leader-tick listeners ran; they wait for the next led tick")
        for listener in self.on_leader_tick:
            try:
                listener(report)
            except Exception:
                log.exception("scaler: a leader-tick listener failed")
        return report

    def _still_leading(self, token: int) -> bool:
        """Renew the lease and say whether it is still the term ``token`` (logged when not).

        The listeners act outside Redis (the cache warmer creates Jobs, taints Nodes), where no
        fence can refuse a deposed leader's call. A tick that stalled after its last commit (or made
        none: only keep-warm workloads) past its lease may meet a new leader's warmer on the same
        nodes; renewing first also gives the listeners a whole lease of time to act in.
        """
        try:
            lease = self.lock.acquire()
        except ExtenderError as exc:
            log.warning("scaler %s: cannot renew the lease before the leader-tick listeners: %s", self.holder, exc,
                        extra={"identity": self.holder, "error": str(exc)})
            return False
        if lease.leader and lease.token == token:
            return True
        log.warning("scaler %s stepping down: the lease (token %d) changed hands during the tick (now %s, token "
                    "%d); the listeners wait for the next led tick", self.holder, token, lease.holder, lease.token,
                    extra={"identity": self.holder, "leader": lease.holder, "token": lease.token})
        return False

    def step_down(self) -> None:
        """Release the lock if this candidate holds it (clean shutdown: a standby takes over next tick)."""
        token, self._lease_token = self._lease_token, None
        if token is not None:
            try:
                self.lock.release(token)
            except ExtenderError as exc:  # the lock then simply expires
                log.warning("scaler %s could not release the lock: %s", self.holder, exc,
                            extra={"identity": self.holder, "error": str(exc)})

    def _calibrate(self) -> None:
        """Take the calibrated policy and node factors when they changed, and tell the listeners (never
        raises). A refit may move the factors alone (the class fits unchanged): the listeners hear of
        that too."""
        current, nodes = ((self.policy, NO_NODE_FACTORS) if self.calibration is None
                          else self.calibration.calibration_for(self.policy))
        self.estimator_nodes = nodes
        if current is not self.estimator_policy:
            self.estimator_policy = current
            self._snapshot = None  # its per-profile tables were built with the other values
        if self._told is None or current is not self._told[0] or nodes is not self._told[1]:
            self._told = (current, nodes)
            for listener in self.on_estimator_policy:
                try:
                    listener(current, nodes)
                except Exception:
                    log.exception("scaler: an estimator-policy listener failed")

    def _inventory(self, now: float) -> InventorySnapshot | None:
        if self.inventory is None:
            return None
        try:
            current = self.inventory.versions()
            if self._snapshot is None or self._read_at != current:
                version, records, registry = self.inventory.load_all()
                self._snapshot = InventorySnapshot.build(self.estimator_policy, records, version=version,
                                                         taken_at=now, registry=registry)
                self._read_at = current
        except ExtenderError as exc:
            # with no inventory the horizon is the cold estimate: the longest, never a late start
            log.warning("scaler: inventory unavailable, assuming cold nodes: %s", exc, extra={"error": str(exc)})
            return None
        return self._snapshot

    # ---- one workload ----------------------------------------------------------------------------

    def _share(self, drafts: list[_Draft], snapshot: InventorySnapshot | None, now: float) -> list[_Draft]:
        """Cut the drafts' decisions to what the fleet holds (extender.core.sharing; fails open)."""
        if not drafts:
            return drafts
        nodes = None if snapshot is None else fresh_nodes(snapshot, now)
        capacity = fleet_capacity(self.policy, (d.profile for d in drafts), nodes)
        if capacity.gpus is None:
            if snapshot is None:
                note = f"fleet capacity {capacity.note}"
                return [dataclasses.replace(d, decision=d.decision.model_copy(
                    update={"reasons": (*d.decision.reasons, note)})) for d in drafts]
            return drafts
        claims = [claim(d.profile, minimum=d.decision.inputs.min_replicas, reactive=d.decision.reactive_replicas,
                        current=d.decision.current, desired=d.decision.desired) for d in drafts]
        granted = share(claims, capacity.gpus)
        return [dataclasses.replace(d, decision=apply_share(d.decision, c, granted[c.workload], capacity))
                for d, c in zip(drafts, claims, strict=True)]

    def draft(self, profile: Profile, now: float, snapshot: InventorySnapshot | None, *,
              started: float | None = None) -> _Draft:
        """Observe, forecast and decide for one workload (nothing written yet).

        The source observes at ``now`` plus what the tick has run so far (``monotonic() - started``,
        the tick's :attr:`monotonic` start; none given: ``now``): a slow pod list, a slow store or an
        earlier workload's silent pods put off the scrape, and a counter's rate must be divided by
        the time it really counted (``rate = (c_k - c_k-1) / (t_k - t_k-1)``, both scrape times),
        not by the tick (a 10 s stall read a steady 40 requests/s as 66.7, then 13.3). The sample
        is stored at ``now``, on the tick's grid.
        """
        auto, capacity = profile.autoscaling, profile.capacity
        assert auto is not None and capacity is not None  # scaled_profiles() keeps only these
        assert self.tick_s is not None and self.hpa_sync_s is not None
        name = profile.name
        pods = workload_pods(self.pods.list_pods(label_selector(profile), auto.namespace), profile, auto.namespace)
        replicas = count_replicas(pods)
        seen_at = now if started is None else now + max(0.0, self.monotonic() - started)
        observation = self.sources[name].observe(pods, seen_at)
        estimator = self.estimator_policy
        placement = next_replica(estimator, estimator.profile(name), snapshot, now, self.estimator_nodes)
        h = horizon(placement.startup_s, self.tick_s, self.hpa_sync_s, node=placement.node,
                    node_class=placement.node_class, cache=placement.cache)
        samples = self.history.read(name, now=now)
        past = self._backfill(name, samples, now)
        new = [Sample(now, observation.rate, observation.queue)] if observation.rate is not None else []
        seen = (sorted([*past, *samples], key=lambda s: s.t) if past else samples) + new
        series = since_last_break(seen, now, self.policy.scaling.season)
        times, rates = [s.t for s in series], [s.rate for s in series]
        fc = self._forecast(name, times, rates, h.seconds, now)
        far = horizon(look_ahead_s(estimator, estimator.profile(name)), self.tick_s, self.hpa_sync_s)
        ahead = self._forecast(name, times, rates, far.seconds, now)
        recent = tuple(Recommendation(at_s=a, replicas=n) for a, n in self.decisions.recommendations(name))
        scaling = self.policy.scaling
        inputs = DecisionInputs.for_policy(
            scaling, auto, workload=name, now_s=now, unit=capacity.unit, demand=observation.rate,
            queue=max(0.0, observation.queue) if observation.rate is not None else 0.0, capacity=capacity.per_replica,
            forecast=fc, horizon=h, ready=replicas.ready, starting=replicas.starting, recent=recent,
        )
        decision = decide(inputs)
        # a rate is a lower bound only when there is one: without, decide() already held (a
        # scale-down then comes from a lowered maxReplicas alone)
        if decision.action == "scale-down" and not observation.complete and observation.rate is not None:
            held = decide(inputs.model_copy(update={"demand": None, "queue": 0.0}))
            note = (f"observation incomplete ({observation.note or 'not every ready pod answered'}): "
                    f"{observation.rate:g} {capacity.unit} is a lower bound, so no scale-down this tick")
            decision = held.model_copy(update={"reasons": (*held.reasons, note)})
        return _Draft(profile, decision, observation, replicas, placement, (*past, *new), recent, len(pods), ahead,
                      len(past))

    def commit(self, d: _Draft, token: int, now: float) -> WorkloadResult:
        """Write one workload's decision, fenced by ``token``: all or nothing."""
        assert self.tick_s is not None
        profile, decision, observation = d.profile, d.decision, d.observation
        replicas, placement = d.replicas, d.placement
        capacity = profile.capacity
        assert capacity is not None
        name, scaling, recent, new = profile.name, self.policy.scaling, d.recent, list(d.new)
        window = prune((*recent, Recommendation(at_s=now, replicas=decision.recommendation)), now,
                       scaling.scale_down_stabilisation)
        # a cut by sharing cuts the published load too (an HPA on the load metric does the same)
        load = (decision.need if decision.unshared is None else decision.desired) * capacity.per_replica
        expectation = (Expectation.from_decision(decision) if d.ahead is None
                       else Expectation.ahead(decision, d.ahead.upper, d.ahead.horizon_s))
        standby = standby_replicas(expectation, desired=decision.desired, current=decision.current)
        # never publish a count the readers refuse (decisions.MAX_REPLICAS: Kubernetes' int32)
        published = Published(desired=min(decision.published, MAX_REPLICAS),
                              load=load if math.isfinite(load) else 0.0,
                              unit=capacity.unit, t=now, window=max(1, round(self.tick_s)), token=token,
                              standby=min(standby, MAX_REPLICAS))
        record = decision_record(decision, observation, replicas, placement, published=published,
                                 source=self.sources[name].name, holder=self.holder, token=token, pods=d.pods)
        self.lock.commit(
            token,
            self.history.stage_append(name, new, now=now),
            self.decisions.stage_record(name, record),
            self.decisions.stage_recommendations(name, [(r.at_s, r.replicas) for r in window]),
            self.decisions.stage_published(name, published),
            action=f"recording the decision for {name}",
            types={self.history.key(name): "zset", self.decisions.log_key(name): "list",
                   self.decisions.recommendations_key(name): "zset", self.decisions.published_key: "hash"},
        )
        if decision.action != "hold":
            log.info("scaler: %s", decision.explain().splitlines()[0],
                     extra={"workload": name, "decision": decision.action, "desired": decision.desired,
                            "current": decision.current, "driver": decision.driver,
                            "horizon_s": decision.inputs.horizon.seconds, "token": token})
        return WorkloadResult(name, decision, observation, replicas, placement, expectation, standby,
                              backfilled=d.backfilled)

    def _backfill(self, name: str, samples: Sequence[Sample], now: float) -> list[Sample]:
        """The source's past in one span of the stored history without samples (module docstring);
        ``[]`` when there is nothing to fill or it was tried recently."""
        source = self.sources[name]
        assert self.tick_s is not None
        step = self.tick_s
        if (not isinstance(source, PastSource) or not source.backfill or self._backfilled_in == now
                or now < self._backfill_at.get(name, -math.inf)):
            return []
        horizon = now - self.history.max_age_s
        answered = self._answered.setdefault(name, set())
        answered.intersection_update(t for t in answered if t > horizon)
        span = unfilled_span(samples, horizon, now, step, answered)
        if span is None:
            return []
        first, last = span
        self._backfill_at[name], self._backfilled_in = now + BACKFILL_RETRY_S, now
        try:
            past = source.past(first, last, step, budget_s=step)
        except SignalError as exc:
            log.warning("scaler: %s: could not fill the history from %s: %s (trying again in %s)", name,
                        source.name, exc, format_duration(BACKFILL_RETRY_S),
                        extra={"workload": name, "error": str(exc)})
            return []
        answered.add(past[0].t if past else last + step)  # the span's end, once the fill is stored
        log.info("scaler: %s: filled the history with %d samples from %s, %s of demand", name, len(past),
                 source.name, format_duration(last + step - past[0].t) if past else "no time",
                 extra={"workload": name, "samples": len(past)})
        return past

    def _forecast(self, name: str, times: list[float], rates: list[float], horizon_s: float,
                  now: float) -> Forecast | None:
        if not times:
            return None
        return forecast(self.policy.scaling.forecaster, times, rates, horizon_s, self.params[name], now_s=now)


def _failed(workload: str, exc: Exception) -> WorkloadResult:
    """One workload's failed draft or commit, logged (call from the ``except`` block): an
    :class:`ExtenderError` is a stated problem; anything else is a bug, logged with its traceback, that
    must not stop the other workloads nor the loop thread."""
    if isinstance(exc, ExtenderError):
        log.warning("scaler: %s: %s", workload, exc, extra={"workload": workload, "error": str(exc)})
        return WorkloadResult(workload, error=str(exc))
    log.exception("scaler: %s: unexpected error", workload, extra={"workload": workload})
    return WorkloadResult(workload, error=f"unexpected error: {exc!r}")


@dataclass(frozen=True)
class _Draft:
    """One workload's decision before sharing and commit, with what it was made from."""

    profile: Profile
    decision: Decision
    observation: Observation
    replicas: Replicas
    placement: Placement
    new: tuple[Sample, ...]
    recent: tuple[Recommendation, ...]
    pods: int
    #: The forecast one cold start (and a node's provisioning) ahead, for the warmer.
    ahead: Forecast | None = None
    #: How many of ``new`` came from the source's past (:meth:`ScaleLoop._backfill`).
    backfilled: int = 0


def since_last_break(samples: Sequence[Sample], now: float, season_s: float) -> Sequence[Sample]:
    """The samples after the newest hole longer than a season (``season_s``), up to ``now``.

    A smoother carries its level and trend through a hole step by step: across the days a scaler
    was down (or its source silent), a history of 100 requests/s forecast 89 (upper 97) for a demand
    of 10 that had come back, 25 replicas at once, and a Holt trend ran to an upper quantile of 521.
    What came before such a hole says nothing of the level after it, and it is no season either, so
    the series restarts after it; a hole up to ``now`` leaves nothing, and the decision is then
    reactive until samples come in. Shorter holes (a restart, a silent source for hours) are left to
    the forecaster's gap rule::

        ends = t_0 .. t_n-1, now;   i = max{ i : ends_i - ends_i-1 > season }   ->   samples[i:]
    """
    ends = np.fromiter((s.t for s in samples), dtype=np.float64, count=len(samples))
    breaks = np.flatnonzero(np.diff(np.append(ends, now)) > season_s)
    return samples[int(breaks[-1]) + 1:] if len(breaks) else samples


def unfilled_span(samples: Sequence[Sample], horizon: float, now: float, step: float,
                  answered: set[float]) -> tuple[float, float] | None:
    """The newest span of at least :data:`BACKFILL_MIN_STEPS` steps without a stored sample, as the
    (first, last) times of the points to ask for, or ``None``. ``samples`` are in time order and
    the store keeps from ``horizon`` on; the tick's own sample comes at ``now``. A span ends at a
    stored sample or at ``now``; one whose end is in ``answered`` was filled with all the source
    knows of it::

        before the first end e:      points e - j step, j = 1 .. floor((e - horizon) / step)
        between ends a and b:        points b - j step, j = 1 .. round((b - a) / step) - 1

    so the points keep the stored samples' cadence, and none falls on a stored sample.
    """
    need = BACKFILL_MIN_STEPS * step
    ends = np.fromiter((s.t for s in samples), dtype=np.float64, count=len(samples))
    ends = np.append(ends, now)
    holes = np.flatnonzero(np.diff(ends) >= need) + 1  # i: a hole between ends[i - 1] and ends[i]
    for i in holes[::-1]:
        a, b = float(ends[i - 1]), float(ends[i])
        if b not in answered:
            return b - (round((b - a) / step) - 1) * step, b - step
    first = float(ends[0])
    if first - horizon >= need and first not in answered:
        return first - math.floor((first - horizon) / step - 1e-9) * step, first - step
    return None


def freshness(snapshot: InventorySnapshot, now: float) -> tuple[int, int]:
    """(fresh, stale) records among the nodes of a policy node class.

    Fresh as :meth:`InventorySnapshot.fresh` says: a heartbeat within its TTL of ``now`` either
    way, so a record stamped more than a TTL ahead (a fast clock) counts as stale.

    The sync records every node of the cluster, CPU and control-plane nodes included, and no agent
    runs there (the chart's DaemonSet selects GPU nodes), so their records never have an agent's
    heartbeat: counted as stale, they would keep ExtenderInventoryStale firing on a healthy
    cluster. A node of no policy class is also one the extender and the scaler estimate nothing
    for. A node of a class whose agent never reported is counted stale: it is cold for good.
    """
    known = np.array([c.name != UNKNOWN_CLASS.name for c in snapshot.classes])
    classified = known[snapshot.class_index[:-1]]
    fresh = snapshot.fresh(now)[:-1]
    return int((fresh & classified).sum()), int((~fresh & classified).sum())


def fresh_nodes(snapshot: InventorySnapshot, now: float) -> list[tuple[str, int]]:
    """(class name, GPUs) of every fresh inventory record (GPUs: the record's, else its class's)."""
    fresh = snapshot.fresh(now)
    out = []
    for i, node in enumerate(snapshot.nodes):
        if fresh[i]:
            cls = snapshot.classes[int(snapshot.class_index[i])]
            out.append((cls.name, node.gpus or cls.gpu.count))
    return out


def decision_record(decision: Decision, observation: Observation, replicas: Replicas, placement: Placement, *,
                    published: Published, source: str, holder: str, token: int, pods: int) -> dict[str, Any]:
    """The JSON stored for ``extender scale explain``: the decision with its inputs, and how they were got."""
    return {
        "t": decision.inputs.now_s,
        "workload": decision.inputs.workload,
        "holder": holder,
        "token": token,
        "signal": {"source": source, "rate": observation.rate, "queue": observation.queue,
                   "complete": observation.complete, "expected": observation.expected,
                   "answered": observation.answered, "note": observation.note},
        "pods": {"listed": pods, "ready": replicas.ready, "starting": replicas.starting},
        "placement": {"node": placement.node, "nodeClass": placement.node_class, "cache": placement.cache,
                      "startupSeconds": placement.startup_s},
        "published": {"desired": published.desired, "load": published.load, "unit": published.unit,
                      "standby": published.standby, "unshared": decision.unshared},
        "decision": decision.model_dump(mode="json"),
    }


class LoopThread:
    """Runs :meth:`ScaleLoop.tick` every ``tick_s`` until stopped; releases the lock on the way out.

    Used in the foreground (``run``) by ``extender scale --no-metrics-api`` and as a thread (``start`` /
    ``stop``) next to the External Metrics API. Ticks keep their cadence: the wait after a tick is
    the tick period minus the time the tick took.
    """

    def __init__(self, loop: ScaleLoop, *, on_report: Callable[[TickReport], None] | None = None,
                 max_ticks: int | None = None, policy_file: PolicyFile | None = None) -> None:
        self.loop = loop
        self.policy_file = policy_file
        self.on_report = on_report
        self.max_ticks = max_ticks
        self.ticks = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run(self) -> None:
        """Tick until :meth:`stop` (or ``max_ticks``); always steps down at the end."""
        period = self.loop.tick_s or 15.0
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                reloaded = self.policy_file.poll().policy if self.policy_file is not None else None
                if reloaded is not None:
                    self.loop.set_policy(reloaded)
                    period = self.loop.tick_s or 15.0
                report = self.loop.tick()
                self.ticks += 1
                if report.error and not report.fenced_out:
                    log.warning("scaler tick: %s", report.error, extra={"error": report.error})
                if self.on_report is not None:
                    self.on_report(report)
                if self.max_ticks is not None and self.ticks >= self.max_ticks:
                    break
                self._stop.wait(max(0.0, period - (time.monotonic() - started)))
        finally:
            self.loop.step_down()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="scaler-loop", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float | None = 30.0) -> None:
        """Ask the loop to end and wait for the current tick to finish (``run`` then releases the lock)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

