"""The scaling decision: single decisions by hand, properties, and scripted demand run tick by tick.

The scripted runs use a simple replica model: a replica ordered at tick t becomes ready at
``t + hpa_sync + startup`` (the HPA picks the metric up within one sync period, then the pod
starts). The horizon adds one tick on top (extender.core.scaler.horizon) because the next decision,
and so the next order, comes one tick later.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.core.errors import PolicyError
from extender.core.forecast import Forecast, ForecastParams, forecast
from extender.core.policy import ReplicaBounds, parse_policy
from extender.core.scaler import (
    Decision,
    DecisionInputs,
    Horizon,
    Recommendation,
    decide,
    horizon,
    prune,
    recommend,
)
from extender.sim.hpa import Hpa

NOW = 10_000.0
H = horizon(180.0, 15.0, 15.0, node="gpu-7", node_class="p5.48xlarge", cache="cold")


def fc(point: float, upper: float | None = None, horizon_s: float = H.seconds) -> Forecast:
    """A forecast as the forecaster would return it, for decisions tested on their own."""
    up = point if upper is None else upper
    return Forecast(point=point, upper=up, level=0.95, horizon_s=horizon_s, lead_s=horizon_s, requested="holt",
                    method="holt", observations=100, residuals=99, step_s=15.0, spread=up - point, t_end=NOW)


def inputs(**overrides: Any) -> DecisionInputs:
    """Capacity 10 req/s per replica, 2 ready, min 1, max 20; everything else at its default."""
    base: dict[str, Any] = {"workload": "chat", "now_s": NOW, "demand": 20.0, "capacity": 10.0, "horizon": H,
                            "ready": 2, "max_replicas": 20}
    return DecisionInputs(**(base | overrides))


def covered(replicas: int = 0, *more: tuple[float, int]) -> tuple[Recommendation, ...]:
    """Recommendations that cover the 300 s window: one at its start, plus ``(seconds ago, replicas)``."""
    return (Recommendation(at_s=NOW - 300, replicas=replicas),
            *(Recommendation(at_s=NOW - ago, replicas=r) for ago, r in more))


# ---------------------------------------------------------------------------------------------
# The horizon
# ---------------------------------------------------------------------------------------------


def test_horizon_adds_tick_and_hpa_sync() -> None:
    # warm: 16 s startup (EKS model-loading report: compile cache on the node) + 15 s tick + 15 s sync = 46 s
    warm = horizon(16.0, 15.0, 15.0, node="gpu-1", node_class="p5.48xlarge", cache="image, compile local")
    # cold: 82 s + 15 + 15 = 112 s
    cold = horizon(82.0, 15.0, 15.0, node="gpu-2", node_class="p5.48xlarge", cache="cold")
    assert (warm.seconds, cold.seconds) == (46.0, 112.0)
    assert (warm.node, warm.cache) == ("gpu-1", "image, compile local")


# ---------------------------------------------------------------------------------------------
# Single decisions, by hand
# ---------------------------------------------------------------------------------------------


class Row(NamedTuple):
    id: str
    overrides: dict[str, Any]
    desired: int
    action: str


ROWS = [
    # demand 20 / 10 per replica = 2 = current: nothing to do
    Row("steady", {}, 2, "hold"),
    # 25 / 10 = 2.5 -> 3
    Row("reactive-up", {"demand": 25.0}, 3, "scale-up"),
    # exactly 3.0 -> 3, not 4 (no float ceil surprise: 1.1 / 0.1 would be 11.000000000000002)
    Row("exact-need", {"demand": 1.1, "capacity": 0.1, "ready": 5}, 11, "scale-up"),
    # (20 + queue 600 / 60 s) / 10 = (20 + 10) / 10 = 3
    Row("queue-drain", {"queue": 600.0}, 3, "scale-up"),
    # same queue with 120 s to drain it: (20 + 5) / 10 = 2.5 -> 3
    Row("queue-drain-slower", {"queue": 600.0, "queue_drain_s": 120.0}, 3, "scale-up"),
    # forecast upper 45 at the horizon: 4.5 -> 5, above the reactive 2
    Row("forecast-up", {"forecast": fc(38.0, 45.0)}, 5, "scale-up"),
    # point 38 alone would be 4: the upper quantile is what counts
    Row("upper-not-point", {"forecast": fc(38.0, 38.0)}, 4, "scale-up"),
    # 2 ready + 3 starting = 5 already covers 45 / 10 = 4.5 -> 5: no more
    Row("starting-counted", {"forecast": fc(45.0), "starting": 3}, 5, "hold"),
    # 2 + 3 starting, need 60 / 10 = 6: one more, not six more
    Row("starting-plus-one", {"demand": 60.0, "starting": 3}, 6, "scale-up"),
    # observed 50 -> 5 needed; forecast says 0: no scale-down on a forecast
    Row("no-down-on-forecast", {"demand": 50.0, "ready": 5, "forecast": fc(0.0), "recent": covered(5)}, 5, "hold"),
    # observed need 2 < 5 current, window covered, nothing higher in it: down to 2
    Row("down-observed", {"ready": 5, "recent": covered(5)}, 2, "scale-down"),
    # ... a 4 recommended 100 s ago is inside the 300 s window: down to 4 only
    Row("down-window-max", {"ready": 5, "recent": covered(5, (100.0, 4))}, 4, "scale-down"),
    # ... a 5 recommended 10 s ago: hold
    Row("down-window-holds", {"ready": 5, "recent": covered(5, (100.0, 4), (10.0, 5))}, 5, "hold"),
    # recommendations younger than the window only (just restarted): no evidence yet, hold
    Row("down-window-not-covered", {"ready": 5, "recent": (Recommendation(at_s=NOW - 200, replicas=2),)}, 5, "hold"),
    # no history at all: same
    Row("down-no-history", {"ready": 5}, 5, "hold"),
    # a zero-length window: scale down at once
    Row("down-no-window", {"ready": 5, "stabilisation_s": 0.0}, 2, "scale-down"),
    # a recommendation exactly at now - 300 is outside the window (the HPA's "after cutoff")
    Row("down-window-edge", {"ready": 5, "recent": covered(9)}, 2, "scale-down"),
    # scale-ups are never stabilised: a lower window does not hold them back
    Row("up-ignores-window", {"demand": 70.0, "recent": covered(2, (10.0, 2))}, 7, "scale-up"),
    # 0 demand -> 0, clamped to minReplicas 1
    Row("min-clamp", {"demand": 0.0, "ready": 1}, 1, "hold"),
    # 500 / 10 = 50 -> maxReplicas 20
    Row("max-clamp", {"demand": 500.0}, 20, "scale-up"),
    # max clamp on a forecast as well
    Row("max-clamp-forecast", {"forecast": fc(400.0)}, 20, "scale-up"),
    # 20 current, need 20.5 -> 21: 21 / 20 = 1.05, |1 - 1.05| = 0.05 <= 0.1: the HPA would not act
    Row("within-tolerance-up", {"demand": 205.0, "ready": 20, "max_replicas": 40}, 20, "hold"),
    # 20 current, need 18.5 -> 19: |1 - 0.95| <= 0.1: hold (no scale-down either)
    Row("within-tolerance-down", {"demand": 185.0, "ready": 20, "max_replicas": 40, "recent": covered()}, 20, "hold"),
    # 10 current, need 11: 1 - 11/10 in floating point is -0.10000000000000009, just over 0.1, so the
    # HPA's test (|1 - ratio| > tolerance) acts; so do we
    Row("tolerance-boundary", {"demand": 105.0, "ready": 10}, 11, "scale-up"),
    # tolerance 0: every change counts
    Row("no-tolerance", {"demand": 205.0, "ready": 20, "max_replicas": 40, "tolerance": 0.0}, 21, "scale-up"),
    # no observation this tick: hold 5, never remove on missing data ...
    Row("unobserved-holds", {"demand": None, "ready": 5, "recent": covered(1)}, 5, "hold"),
    # ... but a forecast may still raise: 72 / 10 -> 8
    Row("unobserved-forecast-raises", {"demand": None, "ready": 5, "forecast": fc(60.0, 72.0)}, 8, "scale-up"),
    # target utilisation 0.8: 20 / (10 x 0.8) = 2.5 -> 3 (at 1 it is exactly 2: "steady")
    Row("target-utilization-headroom", {"target_utilization": 0.8}, 3, "scale-up"),
    # ... the forecast need too: 45 / (10 x 0.9) = 5 exactly, not 6
    Row("target-utilization-forecast", {"forecast": fc(38.0, 45.0), "target_utilization": 0.9}, 5, "scale-up"),
    # ... and the drain term: (20 + 600 / 60) / (10 x 0.75) = 4
    Row("target-utilization-queue", {"queue": 600.0, "target_utilization": 0.75}, 4, "scale-up"),
    # from zero (min 0): 3 / 10 -> 1, no tolerance test against 0 current
    Row("from-zero", {"demand": 3.0, "ready": 0, "min_replicas": 0}, 1, "scale-up"),
    # to zero with min 0, after the window
    Row("to-zero", {"demand": 0.0, "ready": 1, "min_replicas": 0, "recent": covered(1)}, 0, "scale-down"),
    # needs past what a float holds are the most replicas (MAX_NEED), then maxReplicas: they were a
    # ZeroDivisionError (capacity x targetUtilization underflowed to 0) or a ValueError (ceil of inf - inf)
    Row("usable-capacity-underflows", {"capacity": 1e-200, "target_utilization": 1e-200}, 20, "scale-up"),
    Row("usable-capacity-underflows-no-demand",
        {"demand": 0.0, "ready": 1, "capacity": 1e-200, "target_utilization": 1e-200}, 1, "hold"),
    Row("reactive-need-overflows", {"demand": 1e300, "capacity": 1e-10}, 20, "scale-up"),
    Row("queue-drain-overflows", {"queue": 1e300, "queue_drain_s": 1e-10}, 20, "scale-up"),
    Row("forecast-need-overflows", {"forecast": fc(1e300), "capacity": 1e-10}, 20, "scale-up"),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_decision(row: Row) -> None:
    d = decide(inputs(**row.overrides))
    assert (d.desired, d.action) == (row.desired, row.action)


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_recommend_gives_the_decisions_numbers(row: Row) -> None:
    d = decide(inputs(**row.overrides))
    assert recommend(inputs(**row.overrides)) == (d.recommendation, d.desired, d.published)


def test_decision_records_its_inputs_and_steps() -> None:
    i = inputs(demand=30.0, queue=300.0, forecast=fc(50.0, 62.0), starting=1)
    d = decide(i)
    assert d.inputs == i
    # reactive (30 + 300 / 60) / 10 = 3.5; forecast 62 / 10 = 6.2 (point 5.0); need 6.2 -> 7
    assert (d.reactive_replicas, d.forecast_replicas, d.forecast_point_replicas) == (3.5, 6.2, 5.0)
    assert (d.need, d.driver, d.candidate, d.current, d.desired) == (6.2, "forecast", 7, 3, 7)
    text = d.explain()
    for words in ("chat: scale-up to 7", "2 ready + 1 starting", "startup 180s", "node gpu-7",
                  "class p5.48xlarge", "cache: cold", "p95 62", "forecast need 6.2"):
        assert words in text
    # a decision is a value: it survives JSON (what `scale explain` reads back)
    assert Decision.model_validate_json(d.model_dump_json()) == d


@pytest.mark.parametrize(("shift", "says"), [(0.0, None), (-1.5, "point 48.5 (median, shifted -1.5), p95 62")],
                         ids=["raw point", "median point"])
def test_explain_says_when_the_point_is_a_median(shift: float, says: str | None) -> None:
    f = fc(50.0 + shift, 62.0).model_copy(update={"median_shift": shift})
    text = decide(inputs(demand=30.0, forecast=f)).explain()
    if says is None:
        assert "median" not in text and "point 50, p95 62" in text
    else:
        assert says in text


@pytest.mark.parametrize(("residuals", "steps", "upper", "says"), [
    (312, 9, 62.0, "p95 62 requests/s at +210s (from 312 errors at 9 step(s))"),
    (0, 0, 50.0, "p95 50 requests/s at +210s (no errors yet: the point)"),
], ids=["k-step errors", "none yet"])
def test_explain_says_what_the_upper_rests_on(residuals: int, steps: int, upper: float, says: str) -> None:
    # a p95 from twenty errors is a different claim from one out of three hundred
    f = fc(50.0, upper).model_copy(update={"residuals": residuals, "errors_steps": steps})
    assert says in decide(inputs(demand=30.0, forecast=f)).explain()


def test_explain_says_why_a_scale_down_waits() -> None:
    d = decide(inputs(ready=5, recent=covered(5, (100.0, 4))))
    assert "scale-down limited to 4: the largest recommendation of the last 300s" in d.explain()
    d = decide(inputs(ready=5))
    assert "do not yet cover the 300s stabilisation window" in d.explain()


def test_mismatched_forecast_horizon_is_noted() -> None:
    d = decide(inputs(forecast=fc(20.0, horizon_s=60.0)))
    assert any("differs from the decision horizon" in r for r in d.reasons)


@pytest.mark.parametrize(("overrides", "words"), [
    ({"min_replicas": 5, "max_replicas": 4}, "min_replicas 5 > max_replicas 4"),
    ({"capacity": 0.0}, "capacity"),
    ({"demand": math.nan}, "demand"),
    ({"demand": -1.0}, "demand"),
    ({"starting": -1}, "starting"),
], ids=["min-over-max", "zero-capacity", "nan-demand", "negative-demand", "negative-starting"])
def test_invalid_inputs_are_rejected(overrides: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        inputs(**overrides)


class Gap(NamedTuple):
    """One row: the recommendations before ``NOW`` (``(seconds ago, replicas)``), and what a low tick does."""

    id: str
    before: tuple[tuple[float, int], ...]
    desired: int
    covered: bool
    gap: bool  # the reasons name a pause in the decisions


def every_tick(since_ago: float, until_ago: float, replicas: int) -> tuple[tuple[float, int], ...]:
    """One recommendation per 15 s tick, from ``since_ago`` down to ``until_ago`` seconds before NOW."""
    return tuple((float(ago), replicas) for ago in np.arange(since_ago, until_ago - 1e-9, -15.0))


# 10 ready, the observed load needs 1 (demand 10 / 10 per replica), 300 s window, 15 s ticks
GAPS = [Gap(*row) for row in [
    # 10 recommended every tick until a minute ago: the window holds 10
    ("steady", every_tick(315.0, 15.0, 10), 10, True, False),
    # the decisions stopped ten minutes ago (scaler, Redis or leader down): the window is empty, and
    # nothing says the load stayed low for it, so nothing is removed (the first start's rule)
    ("gap", ((600.0, 10),), 10, False, True),
    ("first-start", (), 10, False, False),
    # back after the gap, one low tick: still no whole window of evidence
    ("gap-then-one-low-tick", ((615.0, 10), (15.0, 1)), 10, False, True),
    # back after the gap, and low for a whole window since: down
    ("gap-then-refilled", ((915.0, 10), *every_tick(300.0, 15.0, 1)), 1, True, False),
    # a pause no longer than the window is no gap: the 10s before it are still in the window
    ("short-pause", (*every_tick(315.0, 150.0, 10), (15.0, 1)), 10, True, False),
    # ... and once they have left it, the window is the HPA's
    ("short-pause-then-low", ((315.0, 10), (300.0, 10), *every_tick(100.0, 15.0, 1)), 1, True, False),
]]


@pytest.mark.parametrize("row", GAPS, ids=[g.id for g in GAPS])
def test_a_pause_in_the_decisions_restarts_the_window(row: Gap) -> None:
    recent = tuple(Recommendation(at_s=NOW - ago, replicas=r) for ago, r in row.before)
    d = decide(inputs(demand=10.0, ready=10, recent=recent))
    assert (d.desired, d.window_covered) == (row.desired, row.covered)
    assert any("no decision for" in r for r in d.reasons) == row.gap, d.reasons


def test_a_loop_that_pauses_holds_until_a_whole_window_follows() -> None:
    # decide + prune as the loop runs them: 10 needed for an hour, a 10-minute outage, then 1 needed
    recent: tuple[Recommendation, ...] = ()
    seen: list[tuple[float, int]] = []
    for t in [*np.arange(0.0, 3600.0, 15.0), *np.arange(4200.0, 4800.0, 15.0)]:
        d = decide(inputs(now_s=float(t), demand=100.0 if t < 3600 else 10.0, ready=10, recent=recent))
        recent = prune((*recent, Recommendation(at_s=float(t), replicas=d.recommendation)), float(t), 300.0)
        seen.append((float(t), d.desired))
    downs = [t for t, desired in seen if desired < 10]
    assert downs[0] == 4200.0 + 300.0  # the first decision after the outage, one window later


def test_prune_keeps_the_window_and_one_before_it() -> None:
    recs = tuple(Recommendation(at_s=NOW - ago, replicas=r) for ago, r in [(500, 9), (320, 8), (300, 7), (100, 6)])
    kept = prune(recs, NOW, 300.0)
    # 500 and 320 are older than the window; 300 is at its start (kept: it proves coverage), 100 inside
    assert [(NOW - r.at_s, r.replicas) for r in kept] == [(300, 7), (100, 6)]


# ---------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------

rates = st.floats(0, 1000)
maybe_forecast = st.one_of(st.none(), st.tuples(rates, st.floats(0, 200)).map(lambda pu: fc(pu[0], pu[0] + pu[1])))
history = st.lists(st.tuples(st.floats(0, 600), st.integers(0, 60)), max_size=8).map(
    lambda xs: tuple(Recommendation(at_s=NOW - ago, replicas=r) for ago, r in xs))


@st.composite
def decision_inputs(draw: st.DrawFn) -> DecisionInputs:
    lo = draw(st.integers(0, 5))
    return inputs(demand=draw(st.one_of(st.none(), rates)), queue=draw(st.floats(0, 5000)),
                  capacity=draw(st.floats(0.5, 50)), forecast=draw(maybe_forecast), ready=draw(st.integers(0, 40)),
                  starting=draw(st.integers(0, 20)), min_replicas=lo, max_replicas=draw(st.integers(max(lo, 1), 60)),
                  tolerance=draw(st.sampled_from([0.0, 0.1, 0.2])), recent=draw(history))


@given(decision_inputs())
def test_recommend_agrees_with_decide(i: DecisionInputs) -> None:
    d = decide(i)
    assert recommend(i) == (d.recommendation, d.desired, d.published)


class AtBound(NamedTuple):
    id: str
    overrides: dict[str, Any]
    desired: int
    published: int


#: Decisions a min/max clamp cuts within the HPA's tolerance of the current count.
AT_BOUNDS = [
    # need 16 on 11 replicas, max 12: 12/11 is within 10%, 16/11 is not
    AtBound("up-to-max-within-tolerance", {"demand": 160.0, "ready": 11, "max_replicas": 12}, 12, 16),
    # need 5 on 11 replicas, min 10, window covered at 5: 10/11 is within 10%, 5/11 is not
    AtBound("down-to-min-within-tolerance", {"demand": 50.0, "ready": 11, "min_replicas": 10,
                                             "recent": covered(5)}, 10, 5),
    AtBound("up-to-max-beyond-tolerance", {"demand": 160.0, "ready": 8, "max_replicas": 12}, 12, 16),
    AtBound("within-bounds-publishes-desired", {"demand": 120.0, "ready": 8, "max_replicas": 12}, 12, 12),
    AtBound("held-at-max", {"demand": 160.0, "ready": 12, "max_replicas": 12}, 12, 16),
]


@pytest.mark.parametrize("row", AT_BOUNDS, ids=[r.id for r in AT_BOUNDS])
def test_the_hpa_given_the_published_value_reaches_the_bound(row: AtBound) -> None:
    # the stock HPA's steps (extender.sim.hpa, held to the Go controller by test_sim_baselines):
    # its tolerance test on the metric, then its own min/max
    i = inputs(**row.overrides)
    d = decide(i)
    assert (d.desired, d.published) == (row.desired, row.published)
    assert (f"published as {row.published}" in d.explain()) == (row.published != row.desired)
    hpa = Hpa(min_replicas=i.min_replicas, max_replicas=i.max_replicas, tolerance=i.tolerance)
    assert hpa.sync(NOW, d.current, d.current, float(d.published), 1.0) == d.desired



@given(decision_inputs())
def test_bounds_and_observed_floor(i: DecisionInputs) -> None:
    d = decide(i)
    assert i.min_replicas <= d.desired <= i.max_replicas
    if d.reactive_replicas is not None and not d.within_tolerance:
        # never below the observed need, except where maxReplicas says so
        assert d.desired >= min(i.max_replicas, math.ceil(d.reactive_replicas - 1e-9))


@given(decision_inputs())
def test_scale_down_only_on_observed_load(i: DecisionInputs) -> None:
    d = decide(i)
    if d.desired < min(d.current, i.max_replicas):  # a scale-down not forced by maxReplicas
        assert i.demand is not None
        assert d.reactive_replicas is not None and d.reactive_replicas < d.current
        assert d.window_covered
        # and never below what the window recommended (capped at current)
        assert d.desired >= min(d.current, d.window_max or 0)


@given(decision_inputs())
def test_a_forecast_never_lowers_the_decision(i: DecisionInputs) -> None:
    without = decide(i.model_copy(update={"forecast": None}))
    assert decide(i).desired >= without.desired


@given(decision_inputs(), st.integers(0, 20))
def test_only_ready_plus_starting_matters(i: DecisionInputs, shift: int) -> None:
    # move replicas between ready and starting: same total in flight, same decision. The need is
    # an absolute count from demand, so a starting replica is worth exactly a ready one.
    moved = min(shift, i.ready)
    other = i.model_copy(update={"ready": i.ready - moved, "starting": i.starting + moved})
    a, b = decide(i), decide(other)
    assert (a.candidate, a.recommendation, a.desired) == (b.candidate, b.recommendation, b.desired)


# ---------------------------------------------------------------------------------------------
# Scripted demand, tick by tick
# ---------------------------------------------------------------------------------------------

CAPACITY = 10.0  # requests/s per replica
SYNC = 15.0


@dataclass
class Replicas:
    """Ready replicas plus the times the starting ones will be ready."""

    ready: int
    starting: list[float] = field(default_factory=list)

    def advance(self, now: float) -> None:
        self.ready += sum(1 for r in self.starting if r <= now)
        self.starting = [r for r in self.starting if r > now]

    def scale_to(self, desired: int, now: float, delay: float) -> None:
        current = self.ready + len(self.starting)
        if desired > current:
            self.starting += [now + delay] * (desired - current)
        while self.ready + len(self.starting) > desired:  # starting pods go first, as a ReplicaSet would
            if self.starting:
                self.starting.pop()
            else:
                self.ready -= 1


class Tick(NamedTuple):
    t: float
    demand: float
    queue: float
    decision: Decision
    ready: int
    starting: int


def simulate(rate: Callable[[float], float], *, begin: float, end: float, forecaster: str | None,
             startup_s: float = 180.0, tick: float = 15.0, history_from: float | None = None,
             params: ForecastParams | None = None, queue: bool = False, max_replicas: int = 100) -> list[Tick]:
    """Run the loop: observe, forecast over the horizon, decide, order replicas.

    History is sampled every ``tick`` from ``history_from`` (default ``begin``); the queue, when
    modelled, is a fluid backlog: it grows by (demand - ready capacity) x tick and never below 0.
    """
    hz = horizon(startup_s, tick, SYNC, node_class="sim", cache="warm" if startup_s < 60 else "cold")
    ts = [float(t) for t in np.arange(history_from, begin, tick)] if history_from is not None else []
    ys = [rate(t) for t in ts]
    replicas = Replicas(ready=max(1, math.ceil(rate(begin) / CAPACITY)))
    recent: tuple[Recommendation, ...] = ()
    backlog = 0.0
    out: list[Tick] = []
    t = begin
    while t <= end:
        replicas.advance(t)
        if queue and out:
            backlog = max(0.0, backlog + (rate(t - tick) - CAPACITY * out[-1].ready) * tick)
        ts.append(t)
        ys.append(rate(t))
        f = forecast(forecaster, ts, ys, hz.seconds, params) if forecaster else None
        d = decide(DecisionInputs(workload="sim", now_s=t, demand=rate(t), queue=backlog, capacity=CAPACITY,
                                  forecast=f, horizon=hz, ready=replicas.ready, starting=len(replicas.starting),
                                  min_replicas=1, max_replicas=max_replicas, recent=recent))
        recent = prune((*recent, Recommendation(at_s=t, replicas=d.recommendation)), t, 300.0)
        replicas.scale_to(d.desired, t, SYNC + startup_s)
        out.append(Tick(t, rate(t), backlog, d, replicas.ready, len(replicas.starting)))
        t += tick
    return out


def first(ticks: list[Tick], cond: Callable[[Tick], bool]) -> float:
    return next(x.t for x in ticks if cond(x))


def short(ticks: list[Tick], since: float = -math.inf) -> list[float]:
    """Ticks (after ``since``) at which ready capacity was below demand."""
    return [x.t for x in ticks if x.t >= since and CAPACITY * x.ready < x.demand - 1e-9]


# --- ramp ------------------------------------------------------------------------------------

RAMP_START = 3600.0


def ramp(t: float) -> float:
    """20 req/s, then +3 req/s per minute from t = 1 h (one more replica's worth every 200 s)."""
    return 20.0 if t < RAMP_START else 20.0 + 0.05 * (t - RAMP_START)


def leads(ticks: list[Tick], levels: range) -> dict[int, float]:
    """Seconds between desired reaching k replicas and demand needing k (> (k-1) x capacity)."""
    out: dict[int, float] = {}
    for k in levels:
        needed = next(x.t for x in ticks if x.demand > (k - 1) * CAPACITY)
        decided = next(x.t for x in ticks if x.decision.desired >= k)
        out[k] = needed - decided
    return out


# Holt needs a few minutes of the ramp to learn its slope; levels from 6 on (demand 50+, 10 min
# into the ramp) are past that. Up to 9: from 10 replicas on, +1 is within the HPA's 10% tolerance.
LEARNED = range(6, 10)


#: The ramp's slope in req/s per second: a margin of x req/s above the point forecast is x / SLOPE
#: seconds of the ramp, so it moves the decision that much earlier.
SLOPE = 0.05


def margin_s(ticks: list[Tick], levels: range) -> dict[int, float]:
    """Seconds of the ramp the upper quantile's margin stood for when desired first reached k."""
    out: dict[int, float] = {}
    for k in levels:
        f = next(x.decision.inputs.forecast for x in ticks if x.decision.desired >= k)
        assert f is not None
        out[k] = f.spread / SLOPE
    return out


@pytest.mark.parametrize("startup_s", [16.0, 180.0], ids=["warm", "cold"])
def test_ramp_desired_rises_one_horizon_ahead(startup_s: float) -> None:
    h = startup_s + 15.0 + SYNC
    ticks = simulate(ramp, begin=0.0, end=RAMP_START + 1800, forecaster="holt", startup_s=startup_s)
    margins = margin_s(ticks, LEARNED)
    for k, lead in leads(ticks, LEARNED).items():
        assert lead >= h - 15.0, (k, lead, h)  # one horizon, to the tick
        # and no earlier than the upper quantile's margin explains: while Holt learns the slope its
        # errors at the horizon are large, and the calibrated p95 carries them
        assert lead <= h + margins[k] + 4 * 15.0, (k, lead, h, margins[k])
    # so, once the slope is learned, ready capacity never falls behind demand ...
    assert short(ticks, since=RAMP_START + 600) == []
    # ... while the reactive scaler rises with the load (lead 0) and is short all along the ramp
    reactive = simulate(ramp, begin=0.0, end=RAMP_START + 1800, forecaster=None, startup_s=startup_s)
    assert set(leads(reactive, LEARNED).values()) == {0.0}
    assert len(short(reactive, since=RAMP_START + 600)) > 10


def test_ramp_warm_cluster_acts_later_than_cold() -> None:
    warm_ticks = simulate(ramp, begin=0.0, end=RAMP_START + 1800, forecaster="holt", startup_s=16.0)
    cold_ticks = simulate(ramp, begin=0.0, end=RAMP_START + 1800, forecaster="holt", startup_s=180.0)
    # the point projects Holt's still-short slope 210 s ahead on the cold cluster, so it needs two
    # more replicas' worth of ramp (levels 8 and 9: 20 min into it) to be past learning
    point_learned = range(8, 10)
    warm, cold = point_leads(warm_ticks, point_learned), point_leads(cold_ticks, point_learned)
    # the horizons differ by 180 - 16 = 164 s; so do the leads of the point forecast, to within a
    # tick or two (the upper quantile's margin is wider at the longer horizon and adds to that)
    for k in point_learned:
        assert cold[k] - warm[k] == pytest.approx(164.0, abs=30.0), (k, warm[k], cold[k])
    assert all(c >= p for c, p in zip(leads(cold_ticks, point_learned).values(), cold.values(), strict=True))


def point_leads(ticks: list[Tick], levels: range) -> dict[int, float]:
    """Seconds between the point forecast needing k replicas and demand needing k."""
    out: dict[int, float] = {}
    for k in levels:
        needed = next(x.t for x in ticks if x.demand > (k - 1) * CAPACITY)
        point = next(x.t for x in ticks if (x.decision.forecast_point_replicas or 0.0) > k - 1)
        out[k] = needed - point
    return out


# --- daily cycle -----------------------------------------------------------------------------

DAY = 86_400.0


def daily(t: float) -> float:
    """20 req/s at midnight, 80 at noon."""
    return 20.0 + 60.0 * (1 - math.cos(2 * math.pi * t / DAY)) / 2


@pytest.mark.parametrize("startup_s", [16.0, 600.0], ids=["warm", "cold"])
def test_daily_cycle_holt_winters_stays_ahead(startup_s: float) -> None:
    # two days of history at 60 s, forecast on a 5 min grid (288 steps a day), day three decided
    # every 60 s (decisions start 2 h early so the cluster is settled at midnight)
    params = ForecastParams(step_s=300.0)
    kw: dict[str, Any] = {"begin": 2 * DAY - 7200, "end": 3 * DAY, "tick": 60.0, "history_from": 0.0,
                          "params": params, "startup_s": startup_s}
    ticks = simulate(daily, forecaster="holt-winters", **kw)
    # before two days of history it falls back to Holt; from midnight of day three it has them
    day3 = [x for x in ticks if x.t >= 2 * DAY]
    assert ticks[0].decision.inputs.forecast is not None
    assert ticks[0].decision.inputs.forecast.method == "holt"
    assert {x.decision.inputs.forecast.method for x in day3 if x.decision.inputs.forecast} == {"holt-winters"}
    assert short(day3) == []
    h = startup_s + 60.0 + SYNC
    # the rising half, 20 -> 80 req/s; 3 replicas are already up at midnight (20 req/s + headroom)
    for k, lead in leads(day3, range(4, 9)).items():
        assert lead >= h - 60.0, (k, lead, h)
    reactive = [x for x in simulate(daily, forecaster=None, **kw) if x.t >= 2 * DAY]
    assert len(short(reactive)) > len(short(day3))
    # and being early costs little: about as many ready replicas on average as the late reactive
    # scaler (the same curve, shifted by one horizon)
    mean_ready = sum(x.ready for x in day3) / len(day3)
    assert mean_ready <= sum(x.ready for x in reactive) / len(reactive) + 0.25


# --- step and spike: no cascade --------------------------------------------------------------

JUMP = 1800.0


def step(t: float) -> float:
    return 20.0 if t < JUMP else 60.0


def spike(t: float) -> float:
    """A one-minute spike to 80 req/s."""
    return 80.0 if JUMP <= t < JUMP + 60 else 20.0


def test_step_no_cascade_while_replicas_start() -> None:
    ticks = simulate(step, begin=0.0, end=3600.0, forecaster=None)
    during = [x for x in ticks if JUMP <= x.t < JUMP + SYNC + 180.0]
    # seen at the step (nothing could forecast it), then the same 6 on every tick while 4 start:
    # not 2 -> 4 -> 8 -> 16
    assert [x.decision.desired for x in during] == [6] * len(during)
    assert [x.starting for x in during] == [4] * len(during)
    assert first(ticks, lambda x: x.decision.desired > 2) == JUMP


@pytest.mark.parametrize("forecaster", ["ewma", "holt"])
def test_step_with_a_forecaster_follows_the_forecast_not_the_replicas(forecaster: str) -> None:
    # After a step the forecasters raise their upper bound (residuals jump; Holt also reads a
    # trend into the step), so desired may go past 6. It is still each tick's own need, bounded by
    # the forecast itself, and never a function of the replicas already starting.
    ticks = simulate(step, begin=0.0, end=3600.0, forecaster=forecaster)
    for x in ticks:
        d = x.decision
        assert d.inputs.forecast is not None
        assert d.candidate == math.ceil(max(x.demand, d.inputs.forecast.upper) / CAPACITY - 1e-9)
    worst = max(x.decision.inputs.forecast.upper for x in ticks if x.decision.inputs.forecast)
    assert max(x.decision.desired for x in ticks) <= math.ceil(worst / CAPACITY)
    # headroom, not a cascade: once at its peak, desired never rises again while demand stays at 60
    # (a cascade would keep adding while the replicas it ordered start). The p95 margin is the step
    # itself (+40) for as long as the step's k-step errors are more than 5% of the history's.
    desired = [x.decision.desired for x in ticks]
    peak = desired.index(max(desired))
    assert all(b <= a for a, b in itertools.pairwise(desired[peak:]))


def test_spike_no_cascade_then_stabilised_scale_down() -> None:
    ticks = simulate(spike, begin=0.0, end=3600.0, forecaster=None)
    by_t = {x.t: x for x in ticks}
    # 80 / 10 = 8 on each of the four spike ticks, however many replicas are starting
    assert [by_t[JUMP + s].decision.desired for s in (0, 15, 30, 45)] == [8, 8, 8, 8]
    # the last 8 was recommended at JUMP + 45; the 300 s window keeps it until JUMP + 345
    assert all(by_t[t].decision.desired == 8 for t in np.arange(JUMP, JUMP + 345, 15.0))
    assert by_t[JUMP + 345].decision.desired == 2
    assert by_t[JUMP + 345].decision.action == "scale-down"


def test_the_same_spike_cascades_under_a_ready_only_ratio() -> None:
    # the control: the rule of vllm-project/aibrix#2670, current x (load per ready pod / target),
    # fed the same ticks, multiplies while the replicas start
    current, ready, seen = 2, 2, []
    for _ in range(4):
        current = math.ceil(current * (80.0 / ready) / CAPACITY)
        seen.append(current)
    assert seen == [8, 32, 128, 512]


def test_spike_with_a_queue_grows_with_the_backlog_only() -> None:
    ticks = simulate(spike, begin=0.0, end=3600.0, forecaster=None, queue=True)
    for x in ticks:
        # each tick's desired is its own observation's need, (demand + queue / 60) / 10, whatever
        # is starting (or held by the window): the backlog adds, nothing multiplies
        need = math.ceil((x.demand + x.queue / 60.0) / CAPACITY - 1e-9)
        assert x.decision.candidate == need
    by_t = {x.t: x for x in ticks}
    # spike ticks: queue 0, 900, 1800, 2700 (60 req/s short x 15 s each) -> 8, 9.5, 11, 12.5 -> 8 10 11 13
    assert [by_t[JUMP + s].decision.desired for s in (0, 15, 30, 45)] == [8, 10, 11, 13]
    assert ticks[-1].decision.desired == 2  # drained and stabilised back down


# --- no scale-down on a forecast -------------------------------------------------------------


def falling(t: float) -> float:
    """100 req/s, then -3 req/s per minute from t = 30 min down to 20."""
    return 100.0 if t < JUMP else max(20.0, 100.0 - 0.05 * (t - JUMP))


def test_a_falling_forecast_changes_nothing() -> None:
    # Holt sees the fall coming and forecasts lower demand one horizon ahead; the decisions are
    # exactly the reactive scaler's: down only as observed load falls, after the window
    with_forecast = simulate(falling, begin=0.0, end=5400.0, forecaster="holt")
    reactive = simulate(falling, begin=0.0, end=5400.0, forecaster=None)
    assert any(x.decision.forecast_replicas is not None and x.decision.reactive_replicas is not None
               and x.decision.forecast_replicas < x.decision.reactive_replicas - 1 for x in with_forecast)
    fall_ends = JUMP + 80.0 / 0.05  # 100 -> 20 req/s at 3 req/s per minute
    assert [x.decision.desired for x in with_forecast if x.t <= fall_ends] == [
        x.decision.desired for x in reactive if x.t <= fall_ends]
    # where the fall stops, Holt's residuals turn positive and its upper bound may hold a replica
    # more for a while: a forecast may raise, never lower
    assert all(a.decision.desired >= b.decision.desired for a, b in zip(with_forecast, reactive, strict=True))
    assert reactive[-1].decision.desired == 2
    assert with_forecast[-1].decision.desired <= 3  # 20 req/s + the p95 headroom (22.07 / 10 -> 3)


def test_flat_load_with_a_forecast_of_nothing_holds() -> None:
    recent: tuple[Recommendation, ...] = ()
    hz = horizon(180.0, 15.0, 15.0)
    for k in range(100):  # 25 minutes of 50 req/s, and a forecaster that says demand will vanish
        t = NOW + 15.0 * k
        d = decide(DecisionInputs(workload="w", now_s=t, demand=50.0, capacity=10.0, forecast=fc(0.0), horizon=hz,
                                  ready=5, max_replicas=20, recent=recent))
        recent = prune((*recent, Recommendation(at_s=t, replicas=d.recommendation)), t, 300.0)
        assert (d.desired, d.action) == (5, "hold")


# --- clamps ----------------------------------------------------------------------------------


def test_max_replicas_caps_a_forecast_driven_ramp() -> None:
    ticks = simulate(ramp, begin=0.0, end=RAMP_START + 1800, forecaster="holt", max_replicas=6)
    assert max(x.decision.desired for x in ticks) == 6
    assert max(x.ready + x.starting for x in ticks) == 6
    assert any(x.decision.need > 6 for x in ticks)  # the need went past it; the clamp held


def test_horizon_type_round_trips() -> None:
    assert Horizon.model_validate_json(H.model_dump_json()) == H


def test_explain_shows_the_forecast_constants() -> None:
    ts = [float(t) for t in np.arange(0, 4 * 3600, 60.0)]
    ys = [20.0 + 0.01 * t for t in ts]
    f = forecast("holt", ts, ys, 300.0)
    hz = horizon(180.0, 15.0, SYNC, node_class="sim", cache="cold")
    d = decide(DecisionInputs(workload="sim", now_s=ts[-1], demand=ys[-1], queue=0.0, capacity=CAPACITY,
                              forecast=f, horizon=hz, ready=5, starting=0, min_replicas=1, max_replicas=100))
    line = next(x for x in d.explain().splitlines() if "constants" in x)
    assert line.startswith("  constants (fitted): alpha ")
    assert f"phi {f.constants['phi']:g}" in line


# ---------------------------------------------------------------------------------------------
# scaling.targetUtilization: the policy field reaches the decision; bad values are errors with file:line
# ---------------------------------------------------------------------------------------------

_POLICY_HEAD = """\
apiVersion: extender.io/v1alpha1
kind: Policy
metadata: {name: util}
nodeClasses:
  - name: g
    matchLabels: {pool: g}
    gpu: {product: NVIDIA-L4, count: 1}
    nvme: {capacity: 250GB, readBandwidth: 4GB/s}
    network: {nic: 10Gbps, objectStorePerStream: 2Gbps, imagePull: 50MB/s}
profiles:
  - name: chat
    match: {labels: {app: chat}}
    image: {reference: "vllm/vllm-openai:v0.11.0", size: 10GB}
    weights: {source: "s3://m/chat/", version: v1, bytes: 16GB}
scaling:
  queueDrain: 60s
"""


def test_target_utilization_from_the_policy_reaches_the_decision() -> None:
    policy = parse_policy(_POLICY_HEAD + "  targetUtilization: 0.8\n", "util.yaml")
    bounds = ReplicaBounds.model_construct(min_replicas=1, max_replicas=20)
    i = DecisionInputs.for_policy(policy.scaling, bounds, workload="chat", now_s=NOW, demand=20.0, capacity=10.0,
                                  horizon=H, ready=2)
    d = decide(i)
    # 20 / (10 x 0.8) = 2.5 -> 3; the reason shows the product
    assert (d.reactive_replicas, d.desired) == (2.5, 3)
    assert "/ (10 x 0.8)" in d.reasons[0]


@pytest.mark.parametrize(("field", "value", "words"), [
    pytest.param("targetUtilization", "0", "> 0", id="utilization-zero"),
    pytest.param("targetUtilization", "1.5", "<= 1", id="utilization-above-one"),
    pytest.param("targetUtilization", "most", "number", id="utilization-not-a-number"),
    pytest.param("provisionDelay", "-1m", "cannot be negative", id="provision-delay-negative"),
    pytest.param("provisionDelay", "soon", "duration", id="provision-delay-not-a-duration"),
])
def test_a_bad_scaling_value_is_an_error_with_its_line(field: str, value: str, words: str) -> None:
    with pytest.raises(PolicyError) as err:
        parse_policy(_POLICY_HEAD + f"  {field}: {value}\n", "util.yaml")
    (problem,) = err.value.problems
    assert (problem.source, problem.line, problem.path) == ("util.yaml", _POLICY_HEAD.count("\n") + 1,
                                                             f"scaling.{field}")
    assert words in problem.message
