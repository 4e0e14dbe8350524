"""Prometheus metrics of ``extender scale``: the loop's view of each workload, its leadership and its ticks.

Made per process on the registry the scaler's ``/metrics`` serves (the warmer's families are on the
same registry, :mod:`extender.warm.metrics`); every labelled series exists from the start, so an
alert on it has a series before the first event. Per-workload gauges are written by the leader's
ticks only: a standby keeps the values of its last lead, so queries join them with
``extender_scaler_leader == 1``.

Forecast error of the last horizon, per workload: each leader tick remembers its point forecast ``f``
(demand expected ``h`` seconds ahead, ``h`` the horizon; the gauge of the forecast shows the upper
quantile the decision provisions for) with its due time ``d = t + h``. A forecast is of the mean
demand over one step ``s`` of its grid (``scaling.step``; unset, the scaler's own sampling), so it
is checked against ``o``, the mean of the observations in ``[d - s/2, d + s/2)``, at the first tick
whose next one would fall past that window (the tick itself when none is in it), which sets

    error = |f - o| / ((|f| + |o|) / 2)        (0 when both are 0; 2 at most)

the symmetric absolute percentage error, bounded where a relative error divides by a zero demand.
The same tick checks the upper quantile ``u`` that forecast provisioned for: ``covered`` when
``o <= u``, ``exceeded`` otherwise, one count per forecast that came due. Over a window,

    coverage = covered / (covered + exceeded)

is what the asked level (``scaling.quantile``, the gauge ``extender_scaler_forecast_quantile``)
promises on this workload's own traffic.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from extender.core.policy import Policy
from extender.scaler.loop import TickReport, scaled_profiles

ACTIONS = ("scale-up", "scale-down", "hold")
OUTCOMES = ("covered", "exceeded")
DRIVERS = ("reactive", "forecast", "unobserved")
FRESHNESS = ("fresh", "stale")
REPLICA_STATES = ("ready", "starting")
#: A tick reads every workload's signal and the inventory: tens of milliseconds to seconds.
TICK_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def symmetric_error(forecast: float, observed: float) -> float:
    """``|f - o| / ((|f| + |o|) / 2)``, 0 when both are 0 (module docstring)."""
    scale = (abs(forecast) + abs(observed)) / 2
    return 0.0 if scale == 0 else abs(forecast - observed) / scale


@dataclass(frozen=True)
class _Pending:
    due: float
    point: float
    upper: float
    half: float  # half the forecast's grid step: it is of the mean demand over [due - half, due + half)


class ScalerMetrics:
    """The scaler's own metric families; :meth:`observe` takes each tick's report."""

    def __init__(self, registry: CollectorRegistry, policy: Policy) -> None:
        r = self.registry = registry
        self.leader = Gauge("extender_scaler_leader", "1 while this scaler candidate holds the leader lock, else 0.",
                            registry=r)
        self.ticks = Counter("extender_scaler_ticks_total",
                             "Loop ticks, by role (leader, standby) and result (ok, error).",
                             ["role", "result"], registry=r)
        self.tick_duration = Histogram("extender_scaler_tick_duration_seconds", "Time one loop tick took.",
                                       buckets=TICK_BUCKETS, registry=r)
        self.last_tick = Gauge("extender_scaler_last_tick_timestamp_seconds",
                               "Unix time of this candidate's last completed tick.", registry=r)
        self.forecast = Gauge("extender_scaler_forecast_demand",
                              "Demand forecast one horizon ahead (upper quantile), in the profile's capacity unit.",
                              ["workload"], registry=r)
        self.observed = Gauge("extender_scaler_observed_demand",
                              "Demand observed at the last tick, in the profile's capacity unit.",
                              ["workload"], registry=r)
        self.desired = Gauge("extender_scaler_desired_replicas",
                             "Replicas the scaler publishes to the HPA (extender-desired-replicas; "
                             "before the min/maxReplicas the HPA applies).",
                             ["workload"], registry=r)
        self.standby = Gauge("extender_scaler_standby_replicas",
                             "Placeholder replicas the scaler publishes (extender-standby-replicas).",
                             ["workload"], registry=r)
        self.replicas = Gauge("extender_scaler_replicas", "Replicas of the workload, by state (ready, starting).",
                              ["workload", "state"], registry=r)
        self.horizon = Gauge("extender_scaler_horizon_seconds",
                             "How far ahead the last decision provisioned: startup + tick + HPA sync.",
                             ["workload"], registry=r)
        self.driver = Gauge("extender_scaler_decision_driver",
                            "1 for what drove the last decision (reactive, forecast, unobserved), 0 for the others.",
                            ["workload", "driver"], registry=r)
        self.decisions = Counter("extender_scaler_decisions_total", "Decisions, by action and driver.",
                                 ["workload", "action", "driver"], registry=r)
        self.forecast_error = Gauge("extender_scaler_forecast_error_ratio",
                                    "Symmetric absolute error of the forecast made one horizon ago against the "
                                    "demand observed now (0..2).", ["workload"], registry=r)
        self.upper_checks = Counter("extender_scaler_forecast_upper_checks_total",
                                    "Forecasts checked one horizon after they were made, by whether the demand "
                                    "observed then was at or below their upper quantile (covered) or above it "
                                    "(exceeded).", ["workload", "outcome"], registry=r)
        self.quantile = Gauge("extender_scaler_forecast_quantile",
                              "The quantile the forecast's upper is asked to cover (scaling.quantile).",
                              ["workload"], registry=r)
        self.backfilled = Counter("extender_scaler_history_backfilled_samples_total",
                                  "Demand history samples filled from the signal source's past (Prometheus range "
                                  "queries) because the stored history began later than the store keeps, or had "
                                  "a hole.",
                                  ["workload"], registry=r)
        self.workload_errors = Counter("extender_scaler_workload_errors_total",
                                       "Ticks in which a workload got no decision (signal, store or other error).",
                                       ["workload"], registry=r)
        self.inventory_nodes = Gauge("extender_scaler_inventory_nodes",
                                     "Nodes of a policy node class in the inventory the leader read, by freshness "
                                     "(stale: the agent's report outlived its TTL, is stamped more than its TTL "
                                     "ahead of the leader's clock, or none came).", ["freshness"], registry=r)
        self._pending: dict[str, deque[_Pending]] = {}
        #: Per workload, (tick, demand) observed since the earliest window a pending forecast reads.
        self._seen: dict[str, deque[tuple[float, float]]] = {}
        #: The workloads whose series exist: those of the policy last given to :meth:`set_policy`.
        self._workloads: frozenset[str] = frozenset()
        for freshness in FRESHNESS:
            self.inventory_nodes.labels(freshness)
        for result in ("ok", "error"):
            for role in ("leader", "standby"):
                self.ticks.labels(role, result)
        self.leader.set(0)
        self.set_policy(policy)

    def set_policy(self, policy: Policy) -> None:
        """Create every series of the workloads ``policy`` autoscales; drop the gauges of those it no longer does.

        A gauge keeps its last value until it is written again, and nothing writes the gauges of a
        workload the policy dropped: left in place, a forecast error of 0.9 would hold
        ExtenderForecastErrorHigh firing, and the dashboard would show its replicas, until the
        process restarts. Its counters stay (their rates fall to zero, and ``increase()`` over a
        window that spans the edit stays right); its pending forecast checks are forgotten, so a
        workload added back is not scored against forecasts of its previous life.
        """
        scaled = frozenset(profile.name for profile in scaled_profiles(policy))
        for w in self._workloads - scaled:
            for g in self._workload_gauges():
                g.remove(w)
            for state in REPLICA_STATES:
                self.replicas.remove(w, state)
            for driver in DRIVERS:
                self.driver.remove(w, driver)
            self._pending.pop(w, None)
            self._seen.pop(w, None)
        self._workloads = scaled
        for w in scaled:
            for g in self._workload_gauges():
                g.labels(w)
            for outcome in OUTCOMES:
                self.upper_checks.labels(w, outcome)
            self.workload_errors.labels(w)
            self.backfilled.labels(w)
            for state in REPLICA_STATES:
                self.replicas.labels(w, state)
            for driver in DRIVERS:
                self.driver.labels(w, driver)
                for action in ACTIONS:
                    self.decisions.labels(w, action, driver)

    def _workload_gauges(self) -> tuple[Gauge, ...]:
        """The gauges labelled by workload alone."""
        return (self.forecast, self.observed, self.desired, self.standby, self.horizon, self.forecast_error,
                self.quantile)

    def observe(self, report: TickReport) -> None:
        """Record one tick (called with every report, leader or standby)."""
        role = "leader" if report.leader else "standby"
        self.ticks.labels(role, "error" if report.error else "ok").inc()
        self.tick_duration.observe(report.duration_s)
        self.last_tick.set(report.now)
        self.leader.set(1 if report.leader and not report.fenced_out else 0)
        if not report.leader:
            return
        if report.fresh_nodes is not None:
            self.inventory_nodes.labels("fresh").set(report.fresh_nodes)
            self.inventory_nodes.labels("stale").set(report.stale_nodes)
        for result in report.results:
            w, decision = result.workload, result.decision
            if decision is None:
                self.workload_errors.labels(w).inc()
                continue
            inputs = decision.inputs
            self.backfilled.labels(w).inc(result.backfilled)
            self.desired.labels(w).set(decision.published)
            self.standby.labels(w).set(result.standby)
            self.horizon.labels(w).set(inputs.horizon.seconds)
            self.replicas.labels(w, "ready").set(inputs.ready)
            self.replicas.labels(w, "starting").set(inputs.starting)
            self.decisions.labels(w, decision.action, decision.driver).inc()
            for driver in DRIVERS:
                self.driver.labels(w, driver).set(1 if driver == decision.driver else 0)
            if inputs.demand is not None:
                self.observed.labels(w).set(inputs.demand)
                self._score(w, report.now, inputs.demand)
            f = inputs.forecast
            if f is not None and math.isfinite(f.upper):
                self.forecast.labels(w).set(f.upper)
                self.quantile.labels(w).set(f.level)
                pending = self._pending.setdefault(w, deque())
                pending.append(_Pending(report.now + inputs.horizon.seconds, f.point, f.upper, f.step_s / 2))

    def _score(self, workload: str, now: float, observed: float) -> None:
        seen = self._seen.setdefault(workload, deque())
        seen.append((now, observed))
        spacing = now - seen[-2][0] if len(seen) > 1 else 0.0
        pending = self._pending.get(workload)
        scored: tuple[_Pending, float] | None = None
        while pending and now + spacing >= pending[0].due + pending[0].half:
            due = pending.popleft()
            window = [o for t, o in seen if due.due - due.half <= t < due.due + due.half]
            o = sum(window) / len(window) if window else observed
            self.upper_checks.labels(workload, "exceeded" if o > due.upper else "covered").inc()
            scored = due, o
        if scored is not None and math.isfinite(scored[0].point):
            self.forecast_error.labels(workload).set(symmetric_error(scored[0].point, scored[1]))
        start = pending[0].due - pending[0].half if pending else now
        while len(seen) > 1 and seen[0][0] < start:
            seen.popleft()
