"""The scaler loop's wiring with scripted demand: real Redis, real lock, real estimator and inventory, real decide().

The demand comes from a scripted signal source, and a small fake cluster plays the HPA and the
kubelet: after each tick it scales the workload to the published desired replicas, new pods being
"starting" for a startup time before they turn ready. Time is the test's own clock (ticks are
driven by hand, the lock reads the same clock), so nothing here waits on wall time.

What the issue asks of the scaler, one test each: the forecast-driven desired replicas rise one
horizon before the load (ramp, daily cycle); a warm cluster gets a shorter horizon than a cold one;
starting replicas are counted (a step does not cascade); a spike scales up at once and down only
after the stabilisation window; nothing is scaled down on a forecast alone; history, the window and
the decisions survive a restart and ``extender scale explain`` prints them.

(The pure decision is tested in test_scaler.py; the HPA tolerance is set to 0 where a test measures
lead times, so that the desired count follows the need exactly.)
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

from extender import cli
from extender.core.caches import weights_key
from extender.core.errors import KubeError, SignalError
from extender.core.forecast import refit_phase
from extender.core.inventory import NodeState
from extender.core.policy import Policy, parse_policy
from extender.core.scaler import Decision
from extender.core.warming import Expectation
from extender.files import PolicyFile, policy_version
from extender.scaler.loop import LoopThread, ScaleLoop, TickReport, since_last_break, unfilled_span
from extender.scaler.observation import Observation
from extender.scaler.pods import Pod
from extender.scaler.scrape import ScrapeSource
from extender.scaler.serve import ScaleSettings, build_loop
from extender.state import InventoryStore, connect
from extender.state.decisions import MAX_REPLICAS, DecisionStore
from extender.state.history import HistoryStore, Sample
from extender.state.lock import LeaderLock
from tests.conftest import RedisServer
from tests.scaler_policy import make_policy, policy_text
from tests.test_signal_prometheus import past_demand, running_prometheus
from tests.vllm_endpoint import Counters, pod, vllm_text

pytestmark = pytest.mark.integration

T0 = 1_735_689_600.0
TICK = 15.0
GIB = 2**30
#: qwen3's cold start on the slowest class it may run on (a10g), seconds (extender estimate)
COLD_STARTUP_S = 474.9


@dataclass
class Scripted:
    """A signal source whose demand is a function of time (``None``: nothing observed)."""

    demand: Callable[[float], float | None]
    complete: Callable[[float], bool] = lambda t: True
    name: str = "scripted"

    def observe(self, pods: Sequence[Pod], now: float) -> Observation:
        rate = self.demand(now)
        return Observation(rate=rate, complete=rate is not None and self.complete(now), expected=1,
                           answered=int(rate is not None), note="" if self.complete(now) else "scripted gap")


@dataclass
class Cluster:
    """The HPA and the kubelet in one: scales qwen3 to what was published; new pods start for ``startup_s``."""

    startup_s: float
    now: float = T0
    pods: list[tuple[str, float]] = field(default_factory=list)  # (name, ready at)
    serial: int = 0
    fail: bool = False

    def __post_init__(self) -> None:
        self.scale_to(1, ready=True)

    def scale_to(self, n: int, *, ready: bool = False) -> None:
        while len(self.pods) < n:
            self.serial += 1
            self.pods.append((f"qwen3-{self.serial}", self.now if ready else self.now + self.startup_s))
        if len(self.pods) > n:  # like a ReplicaSet: not-ready pods go first
            self.pods.sort(key=lambda p: (p[1] <= self.now, p[0]))
            del self.pods[: len(self.pods) - n]

    def list_pods(self, label_selector: str, namespace: str | None = None) -> list[dict[str, Any]]:
        # like the API server: qwen3's pods live in its autoscaling.namespace, and a list elsewhere misses them
        if label_selector != "extender.io/workload=qwen3" or namespace != "default":
            return []
        if self.fail:
            raise KubeError("listing pods: 503 ServiceUnavailable")
        return [pod(name, f"10.1.{i // 250}.{i % 250}", ready=self.now >= at, uid=name)
                for i, (name, at) in enumerate(self.pods)]


@dataclass
class Rig:
    policy: Policy
    loop: ScaleLoop
    cluster: Cluster
    clock: list[float]
    client: Any

    def tick(self, now: float) -> TickReport:
        self.clock[0] = now
        self.cluster.now = now
        report = self.loop.tick(now)
        for r in report.results:
            if r.workload == "qwen3" and r.decision is not None:
                self.cluster.scale_to(r.decision.desired)
        return report

    def run(self, ticks: int, start: float = T0, tick: float = TICK) -> list[Decision]:
        out = []
        for k in range(ticks):
            report = self.tick(start + k * tick)
            assert report.leader, report
            (qwen,) = [r for r in report.results if r.workload == "qwen3"]
            assert qwen.decision is not None, qwen.error
            out.append(qwen.decision)
        return out


def make_rig(redis_url: str, demand: Callable[[float], float | None], *, holder: str = "a",
             startup_s: float = 120.0, cluster: Cluster | None = None, nodes: Sequence[NodeState] = (),
             complete: Callable[[float], bool] | None = None, **policy: Any) -> Rig:
    p = make_policy(**policy)
    client = connect(redis_url, "/nonexistent")
    if nodes:
        InventoryStore(client).put_many(nodes)
    clock = [T0]
    source = Scripted(demand) if complete is None else Scripted(demand, complete)
    c = cluster or Cluster(startup_s)
    loop = ScaleLoop(policy=p, lock=LeaderLock(client, holder, ttl_s=3 * p.scaling.tick,
                                               clock=lambda: int(clock[0] * 1000)),
                     history=HistoryStore(client), decisions=DecisionStore(client), pods=c,
                     inventory=InventoryStore(client), sources={"qwen3": source},
                     monotonic=lambda: clock[0])  # the rig's time: a tick takes none unless a test stalls it
    return Rig(p, loop, c, clock, client)


def first_tick(decisions: Sequence[Decision], condition: Callable[[Decision], bool]) -> float:
    return next(d.inputs.now_s for d in decisions if condition(d))


def need(demand: float, capacity: float = 4.0) -> int:
    return math.ceil(demand / capacity - 1e-9)


# ---- one horizon ahead ---------------------------------------------------------------------------


def test_a_ramp_is_met_one_horizon_before_the_load(redis_server: RedisServer) -> None:
    def ramp(t: float) -> float:
        return 2.0 + 0.02 * (t - T0)  # +0.3 requests/s per tick

    rig = make_rig(redis_server.url, ramp, scaling_extra="  tolerance: 0\n")
    decisions = rig.run(200)
    h = decisions[-1].inputs.horizon
    assert h.seconds == pytest.approx(COLD_STARTUP_S + 15 + 15, abs=0.5)  # startup + tick + hpa sync
    k = 10  # replicas: 40 requests/s, reached at T0 + 1900 s
    by_forecast = first_tick(decisions, lambda d: d.desired >= k)
    by_load = first_tick(decisions, lambda d: need(d.inputs.demand or 0) >= k)
    assert by_load - by_forecast == pytest.approx(h.seconds, abs=TICK)
    leading = next(d for d in decisions if d.inputs.now_s == by_forecast)
    assert leading.driver == "forecast"
    assert leading.inputs.forecast is not None and leading.inputs.forecast.method == "holt"


def test_a_daily_cycle_is_anticipated_once_two_days_are_known(redis_server: RedisServer) -> None:
    day = 86_400.0
    tick = 600.0  # coarse ticks keep three simulated days quick; the horizon grows by the tick too

    def cycle(t: float) -> float:
        return 40.0 + 32.0 * math.sin(2 * math.pi * (t - T0) / day)

    rig = make_rig(redis_server.url, cycle, tick="10m", forecaster="holt-winters",
                   scaling_extra="  tolerance: 0\n  step: 10m\n")
    decisions = rig.run(int(3 * day / tick), tick=tick)
    first, third = decisions[10], decisions[-50]
    assert first.inputs.forecast is not None and first.inputs.forecast.method == "holt"
    assert "fell back to holt" in first.inputs.forecast.note  # not two seasons of history yet
    assert third.inputs.forecast is not None and third.inputs.forecast.method == "holt-winters"
    h = third.inputs.horizon.seconds
    # day three's rising edge: the desired count already covers the load one horizon later
    rising = [d for d in decisions if 2 * day + 0.75 * day <= d.inputs.now_s - T0 < 2 * day + 0.95 * day]
    assert rising
    covered = [d.desired >= need(cycle(d.inputs.now_s + h)) for d in rising]
    assert all(covered), [(d.inputs.now_s - T0 - 2 * day, d.desired, need(cycle(d.inputs.now_s + h))) for d in rising]
    # ... which the load alone would not have asked for
    assert any(need(d.inputs.demand or 0) < need(cycle(d.inputs.now_s + h)) for d in rising)


def warm_node(name: str, *, cached: bool) -> NodeState:
    return NodeState.model_validate({
        "name": name, "nodeClass": "h100", "gpus": 8, "gpusFree": 8, "nvmeTotal": 30 * 10**12,
        "nvmeFree": 20 * 10**12, "images": ["docker.io/vllm/vllm-openai:v0.11.0"] if cached else [],
        "weights": {weights_key("qwen3", "rev-1"): 64 * GIB} if cached else {},
        "heartbeat": T0, "ttl": 10**9,
    })


@pytest.mark.parametrize(("nodes", "extra", "node", "cache", "expected"), [
    pytest.param([warm_node("warm-1", cached=True), warm_node("cold-1", cached=False)], "", "warm-1",
                 "image, weights local", 106.3, id="warm-node-free"),  # extender estimate, h100
    pytest.param([warm_node("cold-1", cached=False)], "", "cold-1", "cold", 466.9, id="only-cold-nodes-free"),
    pytest.param([], "", None, "cold: no fresh node with 1 free GPU(s), assuming the slowest class", COLD_STARTUP_S,
                 id="no-free-node"),
    pytest.param([], "  provisionDelay: 3m\n", None, "cold: no fresh node with 1 free GPU(s), assuming the slowest "
                 "class on a new node (+180s provisioning)", COLD_STARTUP_S + 180, id="no-free-node-autoscaled"),
    pytest.param([warm_node("cold-1", cached=False)], "  provisionDelay: 3m\n", "cold-1", "cold", 466.9,
                 id="a-free-node-needs-no-provisioning"),
])
def test_the_horizon_comes_from_the_node_the_next_replica_lands_on(
        redis_server: RedisServer, nodes: list[NodeState], *, extra: str, node: str | None, cache: str,
        expected: float) -> None:
    rig = make_rig(redis_server.url, lambda t: 4.0, nodes=nodes, scaling_extra=extra)
    (d,) = rig.run(1)
    h = d.inputs.horizon
    assert (h.node, h.cache) == (node, cache)
    assert h.startup_s == pytest.approx(expected, abs=0.1)
    assert h.seconds == pytest.approx(expected + 30, abs=0.1)


def test_without_any_history_the_warmer_is_told_the_decisions_own_replicas(redis_server: RedisServer) -> None:
    rig = make_rig(redis_server.url, lambda t: None)  # nothing observed yet, nothing stored: no forecast
    report = rig.tick(T0)
    (result,) = [r for r in report.results if r.workload == "qwen3"]
    assert result.decision is not None and result.decision.inputs.forecast is None
    assert result.expectation == Expectation.from_decision(result.decision)
    assert result.standby == 0


@pytest.mark.parametrize(("extra", "ahead_s"), [
    pytest.param("", COLD_STARTUP_S, id="fixed-fleet"),
    pytest.param("  provisionDelay: 3m\n", COLD_STARTUP_S + 180, id="autoscaled"),
])
def test_the_warmer_is_told_what_the_forecast_needs_one_cold_start_ahead(
        redis_server: RedisServer, extra: str, ahead_s: float) -> None:
    """On a warm node the decision looks one warm start ahead; the warmer one cold start (and a new
    node) ahead, at the replicas the forecast needs then beyond those running or starting."""
    def ramp(t: float) -> float:
        return 2.0 + 0.02 * (t - T0)

    rig = make_rig(redis_server.url, ramp, nodes=[warm_node("warm-1", cached=True)],
                   scaling_extra="  tolerance: 0\n" + extra)
    rig.run(119)
    report = rig.tick(T0 + 119 * TICK)
    (result,) = [r for r in report.results if r.workload == "qwen3"]
    decision = result.decision
    assert decision is not None and result.expectation is not None
    assert decision.inputs.horizon.seconds == pytest.approx(106.3 + 30, abs=0.1)  # the warm node
    (expectation,) = [e for e in report.expectations() if e.workload == "qwen3"]
    assert expectation == result.expectation
    assert expectation.within_s == pytest.approx(ahead_s + 30, abs=0.1)
    # the demand grows 0.02 /s: one cold start ahead it needs replicas the decision has not ordered
    assert expectation.replicas > decision.desired - decision.current
    assert expectation.replicas >= need(ramp(T0 + 119 * TICK + ahead_s)) - decision.current
    # placeholders hold room for the look-ahead's replicas the HPA is not creating this tick
    standby = expectation.replicas - max(decision.desired - decision.current, 0)
    assert standby > 0 and result.standby == standby
    assert rig.loop.decisions.published()["qwen3"].standby == standby
    assert rig.loop.decisions.records("qwen3")[0]["published"]["standby"] == standby


def test_a_warm_cluster_scales_later_than_a_cold_one(redis_server: RedisServer) -> None:
    def ramp(t: float) -> float:
        return 2.0 + 0.02 * (t - T0)

    warm = make_rig(redis_server.url, ramp, nodes=[warm_node("warm-1", cached=True)], scaling_extra="  tolerance: 0\n")
    warm_decisions = warm.run(120)
    warm.client.flushdb()
    cold = make_rig(redis_server.url, ramp, nodes=[warm_node("cold-1", cached=False)], scaling_extra="  tolerance: 0\n")
    cold_decisions = cold.run(120)
    assert warm_decisions[-1].inputs.horizon.seconds < cold_decisions[-1].inputs.horizon.seconds
    # a short startup needs less look-ahead: the warm cluster asks for each replica later
    k = 8
    assert first_tick(warm_decisions, lambda d: d.desired >= k) > first_tick(cold_decisions, lambda d: d.desired >= k)


# ---- replicas in flight, spikes, scale-down ------------------------------------------------------

#: The last value, at the median of its errors: a step or a spike gives a few k-step errors against
#: many zeros, so the forecast is the last observation with no spread, and the tests below see the
#: loop's own rules, not forecast noise.
FLAT: dict[str, Any] = {"forecaster": "last", "scaling_extra": "  quantile: 0.51\n"}


def test_a_step_counts_starting_replicas_and_does_not_cascade(redis_server: RedisServer) -> None:
    step_at = T0 + 40 * TICK

    def step(t: float) -> float:
        return 4.0 if t < step_at else 40.0

    rig = make_rig(redis_server.url, step, startup_s=120.0, **FLAT)
    decisions = rig.run(60)
    after = [d for d in decisions if d.inputs.now_s >= step_at]
    assert [d.desired for d in after] == [10] * len(after)  # 40 / 4, never 19, 28, ...
    starting = [d.inputs.starting for d in after[:9]]
    assert starting[0] == 0 and all(s == 9 for s in starting[1:8])  # 120 s of starting replicas counted
    assert after[-1].inputs.ready == 10 and after[-1].inputs.starting == 0


class ScrapeStall(NamedTuple):
    name: str
    where: str  # what took long, before the scrape: "pod-list" (the API server), "lock" (a slow Redis)


STALLS_BEFORE_SCRAPE = [ScrapeStall("a-slow-pod-list", "pod-list"), ScrapeStall("a-slow-lock-renewal", "lock")]


DAY = 86_400.0


@pytest.mark.parametrize(("times", "now", "kept"), [
    pytest.param([], T0, [], id="no-samples"),
    pytest.param([T0, T0 + TICK], T0 + 2 * TICK, [T0, T0 + TICK], id="no-hole"),
    pytest.param([T0, T0 + 3 * 3600], T0 + 3 * 3600 + TICK, [T0, T0 + 3 * 3600], id="hours-are-the-gap-rules"),
    pytest.param([T0, T0 + DAY], T0 + DAY + TICK, [T0, T0 + DAY], id="exactly-a-season-is-no-break"),
    pytest.param([T0, T0 + 2 * DAY, T0 + 2 * DAY + TICK], T0 + 2 * DAY + 2 * TICK, [T0 + 2 * DAY, T0 + 2 * DAY + TICK],
                 id="two-days-down-then-samples"),
    pytest.param([T0, T0 + TICK], T0 + 2 * DAY, [], id="two-days-down-up-to-now"),
    pytest.param([T0, T0 + 2 * DAY, T0 + 5 * DAY], T0 + 5 * DAY + TICK, [T0 + 5 * DAY], id="the-newest-break-counts"),
])
def test_a_hole_longer_than_a_season_restarts_the_series(times: list[float], now: float, kept: list[float]) -> None:
    samples = [Sample(t, 1.0) for t in times]
    assert [s.t for s in since_last_break(samples, now, DAY)] == kept


def test_a_scaler_back_after_days_does_not_scale_to_the_old_level(redis_server: RedisServer) -> None:
    # a day of 50-150 requests/s, the scalers down for two days, then 10 requests/s on 3 replicas:
    # the smoother carried the old level across the hole and the first tick scaled to 25 replicas
    noise = np.random.default_rng(1).normal(0.0, 3.0, int(DAY / TICK))
    day = [Sample(T0 + t, 100.0 + 50.0 * math.sin(2 * math.pi * t / DAY) + e)
           for t, e in zip(np.arange(0.0, DAY, TICK), noise, strict=True)]
    back = T0 + 3 * DAY - 3600
    rig = make_rig(redis_server.url, lambda t: 10.0, forecaster="auto", cluster=Cluster(120.0, now=back))
    rig.cluster.scale_to(3, ready=True)
    rig.loop.lock.commit(rig.loop.lock.acquire().token, rig.loop.history.stage_append("qwen3", day, now=day[-1].t))
    for k in range(6):
        (result,) = [r for r in rig.tick(back + k * TICK).results if r.workload == "qwen3"]
        assert result.decision is not None and result.decision.desired <= 3, (k, result.decision)


@pytest.mark.parametrize("case", STALLS_BEFORE_SCRAPE, ids=[c.name for c in STALLS_BEFORE_SCRAPE])
def test_a_stall_before_the_scrape_leaves_a_steady_rate_steady(redis_server: RedisServer, case: ScrapeStall) -> None:
    """Ten pods serve a steady 40 requests/s; one tick, something before the scrape takes 10 s. The
    counters' growth was divided by the time between tick starts: 66.7 requests/s (17 replicas at
    once, held by the stabilisation window for five minutes), then 13.3."""
    rig = make_rig(redis_server.url, lambda t: None, **FLAT)
    rig.cluster.scale_to(10, ready=True)
    clock = rig.clock

    def fetch(url: str, timeout_s: float, **_: Any) -> str:
        return vllm_text(Counters(requests=4.0 * (clock[0] - T0)))  # what each pod has served by now

    rig.loop.sources["qwen3"] = ScrapeSource.for_profile(rig.policy.profile("qwen3"), fetch)
    stall = {"at": T0 + 5 * TICK}
    list_pods, acquire = rig.cluster.list_pods, rig.loop.lock.acquire

    def slow(call: Callable[..., Any], where: str) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            if case.where == where and clock[0] == stall["at"]:
                clock[0] += 10.0
            return call(*args, **kwargs)
        return run

    rig.cluster.list_pods = slow(list_pods, "pod-list")  # type: ignore[method-assign]
    rig.loop.lock.acquire = slow(acquire, "lock")  # type: ignore[method-assign]
    decisions = rig.run(12)
    assert [d.inputs.demand for d in decisions[1:]] == pytest.approx([40.0] * 11)
    assert all(d.desired == 10 for d in decisions)


def test_a_spike_scales_up_at_once_and_down_after_the_window(redis_server: RedisServer) -> None:
    spike_at = T0 + 40 * TICK

    def spike(t: float) -> float:
        return 40.0 if t == spike_at else 4.0

    rig = make_rig(redis_server.url, spike, startup_s=60.0, **FLAT)
    decisions = rig.run(70)
    at = next(d for d in decisions if d.inputs.now_s == spike_at)
    assert (at.action, at.desired, at.driver) == ("scale-up", 10, "reactive")
    down = next(d for d in decisions if d.action == "scale-down")
    assert down.inputs.now_s - spike_at >= 300  # the default stabilisation window
    assert down.desired == 1
    held = [d for d in decisions if spike_at < d.inputs.now_s < down.inputs.now_s]
    assert all(d.desired == 10 for d in held)


def test_a_need_past_any_replica_count_is_published_at_the_largest_readers_take(redis_server: RedisServer) -> None:
    """1e12 requests/s at 4 per replica needs 2.5e11 replicas, past Kubernetes' int32: published as
    such, the entry would be unreadable (a 404 to the HPA, DATA_LOSS to KEDA); it is published capped."""
    rig = make_rig(redis_server.url, lambda t: 1e12, **FLAT)
    (decision,) = rig.run(1)
    assert decision.published > MAX_REPLICAS
    assert DecisionStore(rig.client).published()["qwen3"].desired == MAX_REPLICAS


def test_after_a_pause_longer_than_the_window_nothing_is_removed_until_a_window_follows(
        redis_server: RedisServer) -> None:
    # 40 req/s for a while, then no scaler for ten minutes (the window in Redis keeps its last
    # recommendation), then it comes back to 8 req/s: no decision in the pause, so no evidence
    rig = make_rig(redis_server.url, lambda t: 40.0 if t < T0 + 30 * TICK else 8.0, startup_s=60.0, **FLAT)
    before = rig.run(30)
    assert before[-1].desired == 10
    back = T0 + 30 * TICK + 600.0
    after = rig.run(25, start=back)
    assert after[0].action == "hold" and not after[0].window_covered
    assert any("no decision for" in r for r in after[0].reasons), after[0].explain()
    down = next(d for d in after if d.action == "scale-down")
    assert down.inputs.now_s == back + 300  # one whole window of decisions after the pause
    assert all(d.desired == 10 for d in after if d.inputs.now_s < down.inputs.now_s)


def test_nothing_is_scaled_down_on_a_forecast_alone(redis_server: RedisServer) -> None:
    def falling(t: float) -> float | None:
        k = (t - T0) / TICK
        if 60 <= k < 100:
            return None  # scrapes fail: the forecast (a falling trend) is all there is
        return max(4.0, 80.0 - 0.8 * k)

    rig = make_rig(redis_server.url, falling, scaling_extra="  tolerance: 0\n")
    decisions = rig.run(140)
    for d in decisions:
        assert d.inputs.forecast is None or d.forecast_replicas is not None
        if d.reactive_replicas is None:
            assert d.action != "scale-down", d.explain()
        if d.action == "scale-down":
            # the recommendation follows the observed load, never a lower forecast
            assert d.reactive_replicas is not None
            assert d.recommendation >= math.ceil(d.reactive_replicas - 1e-9), d.explain()
    blind = [d for d in decisions if d.inputs.demand is None]
    assert blind and all(d.desired == blind[0].desired for d in blind)
    falling_forecast = [d for d in decisions if d.forecast_point_replicas is not None and d.reactive_replicas
                        and d.forecast_point_replicas < d.reactive_replicas - 1]
    assert falling_forecast  # the forecast did predict less than the load: it just was not obeyed


def test_an_incomplete_observation_is_a_lower_bound(redis_server: RedisServer) -> None:
    def demand(t: float) -> float:
        return 40.0 if t < T0 + 10 * TICK else 8.0  # ... because half the pods stopped answering

    rig = make_rig(redis_server.url, demand, complete=lambda t: t < T0 + 10 * TICK, **FLAT)
    decisions = rig.run(40)
    assert all(d.desired == 10 for d in decisions)  # never down to 2 on a partial view
    # first the window holds it; once the window has only low recommendations, the lower-bound rule does
    noted = [d for d in decisions if any("is a lower bound, so no scale-down" in r for r in d.reasons)]
    assert noted and noted[0].inputs.now_s - (T0 + 9 * TICK) >= 300  # the last high one left the window
    assert noted[0].driver == "unobserved" and noted[0].recommendation == 10  # held: recorded as the current count


@pytest.mark.parametrize(("demand", "complete", "reason"), [
    pytest.param(None, False, "no observation this tick", id="no-pod-answers"),
    pytest.param(8.0, False, "is a lower bound, so no scale-down", id="some-pods-answer"),
])
def test_more_replicas_than_a_lowered_max_are_decided_on_any_observation(
        redis_server: RedisServer, demand: float | None, complete: bool, reason: str) -> None:
    # an edit lowered maxReplicas below the running count (or a rollout's surge passed it): the
    # decision is the bound, with or without a rate; with none it was a TypeError and no decision
    rig = make_rig(redis_server.url, lambda t: 40.0 if t < T0 + 3 * TICK else demand,
                   complete=lambda t: t < T0 + 3 * TICK or complete, **FLAT)
    assert rig.run(3)[-1].desired == 10
    rig.loop.set_policy(parse_policy(policy_text(**FLAT).replace("maxReplicas: 40", "maxReplicas: 6"), "p.yaml"))
    (decision,) = rig.run(1, start=T0 + 3 * TICK)
    assert (decision.action, decision.desired) == ("scale-down", 6)
    assert any(reason in r for r in decision.reasons), decision.reasons


def test_a_workload_whose_pods_cannot_be_listed_is_skipped(redis_server: RedisServer) -> None:
    rig = make_rig(redis_server.url, lambda t: 4.0)
    rig.cluster.fail = True
    report = rig.tick(T0)
    assert report.leader
    by_name = {r.workload: r for r in report.results}
    assert by_name["qwen3"].decision is None and "503" in by_name["qwen3"].error
    assert by_name["llama"].decision is not None  # the other workload is still decided
    assert DecisionStore(rig.client).records("qwen3") == []


# ---- restarts and explain ------------------------------------------------------------------------


def test_history_window_and_decisions_survive_a_restart(redis_server: RedisServer,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    def demand(t: float) -> float:
        return 40.0 if t < T0 + 30 * TICK else 4.0

    first = make_rig(redis_server.url, demand, holder="scaler-a", **FLAT)
    before = first.run(35)
    assert before[-1].desired == 10  # load fell 5 ticks ago: held by the stabilisation window
    first.loop.step_down()  # a clean stop releases the lock
    # a new process: new client, new loop, new holder; the cluster keeps running
    second = make_rig(redis_server.url, demand, holder="scaler-b", cluster=first.cluster, **FLAT)
    report = second.tick(T0 + 35 * TICK)
    assert report.leader and report.token == 2
    (d,) = [r.decision for r in report.results if r.workload == "qwen3"]
    assert d is not None
    assert d.inputs.forecast is not None and d.inputs.forecast.observations == 36  # 35 old samples + this one
    assert d.window_covered and d.window_max == 10  # the old leader's recommendations
    assert (d.action, d.desired) == ("hold", 10)

    url = redis_server.url
    assert cli.main(["scale", "explain", "qwen3", "--redis-url", url]) == 0
    out = capsys.readouterr().out
    assert "by scaler-b (fencing token 2)" in out
    assert "qwen3: hold at 10 (current 10 ready + 0 starting)" in out
    assert f"horizon: {d.inputs.horizon.seconds:g}s = startup" in out
    assert "scale-down to 1 held" in out or "scale-down limited to 10" in out
    assert "signal: scripted, 1 of 1 answered, complete" in out
    assert "published: extender-desired-replicas 10" in out
    # flat demand: the look-ahead needs nothing beyond the 10 running, so no placeholder
    assert out.rstrip().endswith(", extender-standby-replicas 0")

    assert cli.main(["scale", "explain", "qwen3", "--last", "3", "--redis-url", url]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[-4].startswith("time (UTC)") and len(table[-3:]) == 3

    assert cli.main(["scale", "--redis-url", url, "explain", "qwen3", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert (record["holder"], record["token"], record["decision"]["desired"]) == ("scaler-b", 2, 10)

    assert cli.main(["scale", "explain", "nope", "--redis-url", url]) == 1
    assert "no decision recorded for 'nope'" in capsys.readouterr().err


@dataclass
class Noted(Scripted):
    """A source whose observation carries ``note`` (what a scraped pod's answer put there)."""

    note: str = ""

    def observe(self, pods: Sequence[Pod], now: float) -> Observation:
        return Observation(rate=None, complete=False, expected=1, answered=0, note=self.note)


#: (name, a note quoting a pod's answer, how explain prints it)
NOTES = [
    ("terminal-escape", "not a Prometheus exposition: invalid metric name:\x1b[2J\x1b]0;owned\x07x 1",
     "not a Prometheus exposition: invalid metric name:\\x1b[2J\\x1b]0;owned\\x07x 1"),
    ("carriage-return", "GET http://10.1.0.0:8000/metrics: HTTP 500 oops\rall good",
     "GET http://10.1.0.0:8000/metrics: HTTP 500 oops\\rall good"),
    ("c1-control", "invalid metric name:\x9b2J", "invalid metric name:\\x9b2J"),
]


@pytest.mark.parametrize(("note", "shown"), [n[1:] for n in NOTES], ids=[n[0] for n in NOTES])
def test_explain_prints_what_a_pod_answered_without_its_control_characters(
        redis_server: RedisServer, capsys: pytest.CaptureFixture[str], note: str, shown: str) -> None:
    rig = make_rig(redis_server.url, lambda t: 4.0, **FLAT)
    rig.loop.sources["qwen3"] = Noted(lambda t: None, note=note)
    rig.run(1)
    assert cli.main(["scale", "explain", "qwen3", "--redis-url", redis_server.url]) == 0
    out = capsys.readouterr().out
    assert shown in out
    assert not any(c in out for c in "\x1b\x07\r\x9b")
    assert cli.main(["scale", "explain", "qwen3", "--json", "--redis-url", redis_server.url]) == 0
    assert json.loads(capsys.readouterr().out)["signal"]["note"] == note  # stored as it was


def test_a_standby_writes_nothing(redis_server: RedisServer) -> None:
    leader = make_rig(redis_server.url, lambda t: 4.0, holder="a")
    leader.run(3)
    standby = make_rig(redis_server.url, lambda t: 4.0, holder="b", cluster=leader.cluster)
    standby.clock[0] = leader.clock[0]
    records = len(DecisionStore(standby.client).records("qwen3", 100))
    report = standby.loop.tick(T0 + 3 * TICK)
    assert (report.leader, report.holder, report.results) == (False, "a", ())
    assert len(DecisionStore(standby.client).records("qwen3", 100)) == records


class StallCase(NamedTuple):
    name: str
    taken_by_another: bool  # during the stall another candidate took the lock (else it lay expired, unclaimed)


STALLS = [StallCase("another-led-meanwhile", True), StallCase("lapsed-but-unclaimed", False)]


@pytest.mark.parametrize("case", STALLS, ids=[c.name for c in STALLS])
def test_the_listeners_run_only_if_no_one_else_led_during_the_tick(redis_server: RedisServer,
                                                                   case: StallCase) -> None:
    """The tick stalls past its lease after its last commit. Every commit was fenced, but the warmer
    acts on the cluster, where no fence reaches: it must not run once another candidate led. A lease
    that lapsed unclaimed is still this term (the fence did not move), and is renewed."""
    rig = make_rig(redis_server.url, lambda t: 10.0)
    told: list[int] = []
    rig.loop.on_leader_tick.append(lambda report: told.append(report.token))
    first = rig.tick(T0)
    assert told == [first.token]
    other = LeaderLock(rig.client, "b", ttl_s=3 * TICK, clock=lambda: int(rig.clock[0] * 1000))
    commit = rig.loop.commit
    committed: list[str] = []

    def stalled(d: Any, token: int, now: float) -> Any:
        result = commit(d, token, now)
        committed.append(d.profile.name)
        if len(committed) == len(rig.loop.profiles):  # after the last commit: every write went through
            rig.clock[0] = now + 10 * TICK  # past the lease
            if case.taken_by_another:
                assert other.acquire().leader
        return result

    rig.loop.commit = stalled  # type: ignore[method-assign]
    report = rig.tick(T0 + TICK)
    assert report.leader and sorted(committed) == sorted(r.workload for r in report.results)
    if case.taken_by_another:
        assert report.fenced_out and "changed hands" in report.error
        assert told == [first.token]
    else:
        assert not report.fenced_out and report.error == ""
        assert told == [first.token, first.token]
        assert rig.loop.lock.current() == ("a", first.token, int((T0 + 11 * TICK + 3 * TICK) * 1000))


def test_a_bug_in_one_workload_does_not_stop_the_others(redis_server: RedisServer) -> None:
    def broken(t: float) -> float:
        raise RuntimeError("a bug in a signal source")

    rig = make_rig(redis_server.url, broken)
    report = rig.tick(T0)
    by_name = {r.workload: r for r in report.results}
    assert "unexpected error" in by_name["qwen3"].error and "a bug in a signal source" in by_name["qwen3"].error
    assert by_name["llama"].decision is not None


def test_a_corrupt_history_or_window_entry_is_dropped_and_the_decisions_go_on(redis_server: RedisServer) -> None:
    """A hand edit or a broken tool left a member that does not parse: the tick still decides, and
    its fenced write takes the member out."""
    rig = make_rig(redis_server.url, lambda t: 10.0)
    rig.run(3)
    history, decisions = rig.loop.history, rig.loop.decisions
    rig.client.zadd(history.key("qwen3"), {b"\xff garbage": T0})
    rig.client.zadd(decisions.recommendations_key("qwen3"), {b"garbage": T0})
    (decision,) = rig.run(1, start=T0 + 3 * TICK)
    assert decision.inputs.forecast is not None and decision.inputs.forecast.observations == 4
    assert not decision.window_covered  # the window started anew: no scale-down on a partial one
    assert len(history.read("qwen3", now=T0 + 3 * TICK)) == 4  # the garbage gone, the samples kept
    assert decisions.recommendations("qwen3") == [(T0 + 3 * TICK, decision.recommendation)]


def test_an_edited_policy_file_is_taken_from_the_next_tick(redis_server: RedisServer, tmp_path: Path) -> None:
    # The scaler (and through on_policy, the warmer and the metrics API) follows edits of its policy
    # file without a restart; an invalid edit keeps the last good policy.
    rig = make_rig(redis_server.url, lambda t: 1.0)  # one request/s: one replica is enough
    rig.loop.clock = lambda: rig.clock[0]
    path = tmp_path / "policy.yaml"
    path.write_text(policy_text(min_replicas=1))
    watcher = PolicyFile(path, policy_version(path.read_text()))
    seen: list[Policy] = []
    rig.loop.on_policy.append(seen.append)
    LoopThread(rig.loop, max_ticks=1, policy_file=watcher).run()
    assert DecisionStore(rig.client).published()["qwen3"].desired == 1 and seen == []

    path.write_text("apiVersion: extender.io/v1alpha1\nkind: Policy\nprofiles: [{name: 7}]\n")  # invalid
    assert watcher.poll().outcome == "invalid"
    path.write_text(policy_text(min_replicas=3))
    rig.clock[0] += TICK
    LoopThread(rig.loop, max_ticks=1, policy_file=watcher).run()
    (record,) = DecisionStore(rig.client).records("qwen3")
    assert record["decision"]["desired"] == 3  # the new minReplicas
    # on the wire, the need before the bound, 1: the HPA applies its minReplicas after its tolerance test
    assert DecisionStore(rig.client).published()["qwen3"].desired == record["published"]["desired"] == 1
    (policy,) = seen
    autoscaling = policy.profile("qwen3").autoscaling
    assert autoscaling is not None and autoscaling.min_replicas == 3
    assert watcher.version == policy_version(path.read_text())


@pytest.mark.parametrize(("edit", "kept"), [
    pytest.param(lambda text: text.replace("maxReplicas: 8", "maxReplicas: 9"), True, id="another-workloads-bound"),
    pytest.param(lambda text: text.replace("maxReplicas: 40", "maxReplicas: 30"), True, id="its-own-bound"),
    pytest.param(lambda text: text.replace("quantile: 0.51", "quantile: 0.6"), True, id="the-scaling-section"),
    pytest.param(lambda text: text.replace('"port": 8000', '"port": 8001'), False, id="its-own-signal"),
])
def test_a_policy_edit_keeps_what_a_scrape_source_learnt(redis_server: RedisServer, edit: Callable[[str], str],
                                                         kept: bool) -> None:
    """Every edit built every workload's source anew: a scrape source forgot each pod's previous
    counters, so the next tick had no rate for any workload (no observation, a hole in the history)."""
    text = policy_text(**FLAT)
    rig = make_rig(redis_server.url, lambda t: None, **FLAT)
    rig.cluster.scale_to(2, ready=True)

    def fetch(url: str, timeout_s: float, **_: Any) -> str:
        return vllm_text(Counters(requests=4.0 * (rig.clock[0] - T0)))

    loop = ScaleLoop(policy=parse_policy(text, "p.yaml"), lock=rig.loop.lock, history=rig.loop.history,
                     decisions=rig.loop.decisions, pods=rig.cluster, fetch=fetch, monotonic=lambda: rig.clock[0])
    rig.loop = loop
    assert [d.inputs.demand for d in rig.run(3)] == [None, 8.0, 8.0]
    assert edit(text) != text
    loop.set_policy(parse_policy(edit(text), "p.yaml"))
    (after,) = rig.run(1, start=T0 + 3 * TICK)
    assert (after.inputs.demand == 8.0) is kept
    assert (rig.loop.history.read("qwen3")[-1].t == T0 + 3 * TICK) is kept


class NoPods:
    def list_pods(self, label_selector: str, namespace: str | None = None) -> list[dict[str, Any]]:
        return []


@pytest.mark.parametrize(("tick_flag", "lease_flag", "tick", "lease"), [
    pytest.param(None, None, 60.0, 180.0, id="the-policy-s-tick-and-three-ticks-of-lease"),
    pytest.param(30.0, None, 30.0, 90.0, id="a-tick-flag-stays"),
    pytest.param(None, 100.0, 60.0, 100.0, id="a-lease-ttl-flag-stays"),
])
def test_extender_scale_takes_an_edited_tick_with_its_lease(
        redis_server: RedisServer, tick_flag: float | None, lease_flag: float | None, tick: float,
        lease: float) -> None:
    # as `extender scale` builds its loop; scaling.tick goes from 15s to 60s in the file
    settings = ScaleSettings(policy=make_policy(tick="15s"), redis_url=redis_server.url, tick_s=tick_flag,
                             lease_ttl_s=lease_flag)
    loop = build_loop(settings, connect(redis_server.url, "/nonexistent"), pods=NoPods())  # type: ignore[arg-type]
    loop.set_policy(make_policy(tick="60s"))
    assert loop.tick_s == tick
    taken = loop.lock.acquire()  # a lease shorter than the tick lapses between two renewals
    assert (taken.expires_ms - taken.now_ms) / 1000 == lease


def test_each_workload_refits_at_its_own_phase_of_the_period(redis_server: RedisServer) -> None:
    # the refits of many workloads spread over the hour instead of landing in one tick; the phase is
    # a function of the name and the policy, so a restarted or newly elected scaler keeps it
    rig = make_rig(redis_server.url, lambda t: 1.0, scaling_extra="  refit: 30m\n")
    params = rig.loop.params["qwen3"]
    assert params.refit_s == 1800.0
    assert params.refit_phase_s == refit_phase("qwen3", 1800.0) > 0.0
    again = make_rig(redis_server.url, lambda t: 1.0, holder="b", scaling_extra="  refit: 30m\n")
    assert again.loop.params["qwen3"] == params


def test_a_bare_heartbeat_reaches_the_loop_s_inventory(redis_server: RedisServer) -> None:
    # Bare heartbeats move the heartbeat sequence, not the version: a loop that re-read only when
    # the version moved counted every node stale one ttl after its last whole report.
    node = warm_node("gpu-a", cached=True).model_copy(update={"heartbeat": T0, "ttl": 60.0})
    rig = make_rig(redis_server.url, lambda t: 2.0, nodes=[node])
    first = rig.tick(T0)
    assert (first.fresh_nodes, first.stale_nodes) == (1, 0)
    InventoryStore(rig.client).beat_many({"gpu-a": T0 + 100})
    later = rig.tick(T0 + 120)
    assert (later.fresh_nodes, later.stale_nodes) == (1, 0)


# ---- a short history filled from the source's past ------------------------------------------------


@dataclass
class WithPast(Scripted):
    """A scripted source that also answers for the past (as the ``prometheus`` source's range queries)."""

    backfill: bool = True
    known_from: float = -math.inf  # no demand known before this
    fail: bool = False
    asked: list[tuple[float, float, float]] = field(default_factory=list)

    def past(self, start: float, end: float, step: float, *, budget_s: float) -> list[Sample]:
        assert budget_s == TICK  # a fill may take one tick's time
        self.asked.append((start, end, step))
        if self.fail:
            raise SignalError("query_range: HTTP 503")
        times = [start + k * step for k in range(math.floor((end - start) / step + 1e-9) + 1)]
        return [Sample(t, rate, 0.0) for t in times if t >= self.known_from and (rate := self.demand(t)) is not None]


DAY = 86_400.0
#: The store keeps three days; filled at the 15 s tick, one step short of the first stored sample.
FULL = round(3 * DAY / TICK) - 1


def rig_with_past(redis_url: str, source: WithPast) -> Rig:
    rig = make_rig(redis_url, source.demand)
    rig.loop.sources["qwen3"] = source
    return rig


def cycle(t: float) -> float:
    return 20.0 + 10.0 * math.cos(2 * math.pi * (t - T0) / DAY)


def test_a_new_scaler_forecasts_from_the_sources_past_at_once(redis_server: RedisServer) -> None:
    source = WithPast(cycle)
    rig = rig_with_past(redis_server.url, source)
    (result,) = [r for r in rig.tick(T0).results if r.workload == "qwen3"]
    assert source.asked == [(T0 - 3 * DAY + TICK, T0 - TICK, TICK)]
    assert result.backfilled == FULL
    assert result.decision is not None and result.decision.inputs.forecast is not None
    assert result.decision.inputs.forecast.observations > 10_000  # three days, not the one tick of a new history
    history = rig.loop.history.read("qwen3", now=T0)
    assert len(history) == FULL + 1
    assert history[0].rate == pytest.approx(cycle(T0 - 3 * DAY + TICK))
    # stored, so the next ticks ask nothing, past the ten minutes between tries too
    for k in range(1, 45):
        rig.tick(T0 + k * TICK)
    assert len(source.asked) == 1


class PastCase(NamedTuple):
    name: str
    source: WithPast
    stored_s: float  # history already in the store before the first tick (at the tick's cadence)
    asked: list[int]  # the ticks (of 15 s, from T0, every tick up to 41) at which the past is asked for
    filled: int  # samples in the store after tick 0, the first tick's own included


PAST_CASES = [
    PastCase("a full history is not filled", WithPast(cycle), 3 * DAY, [], FULL + 2),
    PastCase("a restart's gap of minutes is not filled", WithPast(cycle), 3 * DAY - 200.0, [], FULL - 12),
    PastCase("a day stored: the two days before it are filled", WithPast(cycle), DAY, [0], FULL + 1),
    PastCase("backfill off", WithPast(cycle, backfill=False), 0.0, [], 1),
    PastCase("a source that knows an hour fills an hour, and is not asked again",
             WithPast(cycle, known_from=T0 - 3600.0), 0.0, [0], 241),
    PastCase("a failed query is tried again ten minutes later", WithPast(cycle, fail=True), 0.0, [0, 40], 1),
]


@pytest.mark.parametrize("case", PAST_CASES, ids=[c.name for c in PAST_CASES])
def test_when_the_history_is_filled_from_the_past(redis_server: RedisServer, case: PastCase,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    rig = rig_with_past(redis_server.url, case.source)
    if case.stored_s:
        first = T0 - math.floor(case.stored_s / TICK) * TICK
        stored = [Sample(float(t), cycle(float(t)), 0.0) for t in np.arange(first, T0, TICK)]
        rig.loop.lock.commit(rig.loop.lock.acquire().token, rig.loop.history.stage_append("qwen3", stored, now=T0),
                             action="a stored history")
    asked = []
    for k in range(42):
        before = len(case.source.asked)
        rig.tick(T0 + k * TICK)
        if len(case.source.asked) > before:
            asked.append(k)
        if k == 0:
            assert len(rig.loop.history.read("qwen3", now=T0)) == case.filled
    assert asked == case.asked
    failed = "qwen3: could not fill the history from scripted: query_range: HTTP 503 (trying again in 10m)"
    assert (caplog.text.count(failed) == len(case.asked)) if case.source.fail else failed not in caplog.text


class Span(NamedTuple):
    name: str
    times: list[float]  # stored samples, seconds after the store's horizon (0)
    now: float
    answered: set[float]
    want: tuple[float, float] | None  # the first and last point asked for


#: The store keeps from 0 on; ticks of 15 s; a span needs 20 ticks (300 s) without a sample.
SPANS = [
    Span("an empty history: all the store keeps", [], 3000.0, set(), (15.0, 2985.0)),
    Span("an unbroken history: nothing", [float(t) for t in range(0, 3000, 15)], 3000.0, set(), None),
    Span("a hole of an hour: the points between, on the cadence",
         [*np.arange(0.0, 1000.0, 15.0), *np.arange(4600.0, 6000.0, 15.0)], 6000.0, set(), (1000.0, 4585.0)),
    Span("samples 19 ticks apart: not worth a query", [0.0, 15.0, 300.0, 315.0], 330.0, set(), None),
    Span("samples 20 ticks apart: the 19 points between", [0.0, 15.0, 315.0, 330.0], 345.0, set(), (30.0, 300.0)),
    Span("two holes: the newer first", [0.0, 600.0, 1200.0], 1215.0, set(), (615.0, 1185.0)),
    Span("the newer one answered: the older", [0.0, 600.0, 1200.0], 1215.0, {1200.0}, (15.0, 585.0)),
    Span("a scaler down for an hour: up to now", [*np.arange(0.0, 600.0, 15.0)], 4200.0, set(), (600.0, 4185.0)),
    Span("the span before the first sample", [*np.arange(900.0, 1200.0, 15.0)], 1200.0, set(), (15.0, 885.0)),
    Span("... answered", [*np.arange(900.0, 1200.0, 15.0)], 1200.0, {900.0}, None),
    Span("... answered, then the history shrank (a lost store): asked again", [*np.arange(1050.0, 1200.0, 15.0)],
         1200.0, {900.0}, (15.0, 1035.0)),
    Span("jitter: the points keep the newer sample's cadence, none on the older", [0.0, 15.0, 317.0, 1017.0],
         1032.0, set(), (327.0, 1002.0)),
]


@pytest.mark.parametrize("row", SPANS, ids=[r.name for r in SPANS])
def test_the_span_a_fill_asks_for(row: Span) -> None:
    samples = [Sample(float(t), 1.0) for t in row.times]
    assert unfilled_span(samples, 0.0, row.now, TICK, row.answered) == row.want


def hole(start: float, end: float) -> Callable[[float], float | None]:
    """The cycle, but nothing known of ``[start, end)``."""
    return lambda t: None if start <= t < end else cycle(t)


@pytest.mark.parametrize(("known", "filled", "asked"), [
    pytest.param(cycle, 240, [0], id="a hole of an hour the source knows is filled at the first tick"),
    pytest.param(hole(T0 - 2 * DAY, T0 - 2 * DAY + 3600.0), 0, [0],
                 id="a hole the source does not know either is asked once"),
])
def test_a_hole_in_the_history_is_filled(redis_server: RedisServer, known: Callable[[float], float | None],
                                         filled: int, asked: list[int], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="extender.scaler.loop")
    source = WithPast(known)
    rig = rig_with_past(redis_server.url, source)
    times = np.arange(T0 - 3 * DAY + TICK, T0, TICK)
    gone = (times >= T0 - 2 * DAY) & (times < T0 - 2 * DAY + 3600.0)  # an hour the scalers were down
    stored = [Sample(float(t), cycle(float(t)), 0.0) for t in times[~gone]]
    rig.loop.lock.commit(rig.loop.lock.acquire().token, rig.loop.history.stage_append("qwen3", stored, now=T0),
                         action="a stored history")
    ticks = []
    for k in range(42):
        before = len(source.asked)
        (result,) = [r for r in rig.tick(T0 + k * TICK).results if r.workload == "qwen3"]
        if len(source.asked) > before:
            ticks.append(k)
        if k == 0:
            assert result.backfilled == filled
            assert source.asked == [(T0 - 2 * DAY, T0 - 2 * DAY + 3600.0 - TICK, TICK)]
            assert len(rig.loop.history.read("qwen3", now=T0)) == len(stored) + filled + 1
    assert ticks == asked
    said = (f"qwen3: filled the history with {filled} samples from scripted, "
            + ("1h of demand" if filled else "no time of demand"))
    assert caplog.text.count(said) == 1


def test_one_workload_is_filled_per_tick(redis_server: RedisServer) -> None:
    qwen, llama = WithPast(cycle), WithPast(cycle)
    rig = rig_with_past(redis_server.url, qwen)
    rig.loop.sources["llama"] = llama
    asked = []
    for k in range(3):
        rig.tick(T0 + k * TICK)
        asked.append((len(qwen.asked), len(llama.asked)))
    assert asked == [(1, 0), (1, 1), (1, 1)]  # in the policy's order, one a tick
    # asked at the second tick, for the span before its first sample (T0), then the three ticks' own
    assert llama.asked == [(T0 - 3 * DAY + 2 * TICK, T0 - TICK, TICK)]
    assert len(rig.loop.history.read("llama", now=T0 + 2 * TICK)) == FULL - 1 + 3


def test_a_new_scaler_fills_its_history_from_a_real_prometheus(redis_server: RedisServer) -> None:
    # policy -> prometheus source -> loop -> Redis, nothing scripted but the cluster: Prometheus's
    # past is four hours of two pods' counters (2 requests/s, then 5; a queue of 3)
    end = int(time.time()) // 15 * 15 - 60
    with running_prometheus([], openmetrics=past_demand(end - 4 * 3600, end)) as prom:
        policy = make_policy(signal={"source": "prometheus", "prometheus": {
            "url": prom.url, "query": "sum(rate(demo_requests_total[1m]))", "queueQuery": "sum(demo_waiting)"}})
        client = connect(redis_server.url, "/nonexistent")
        now = float(end + 60)
        cluster = Cluster(120.0, now=now)
        loop = ScaleLoop(policy=policy, lock=LeaderLock(client, "a", ttl_s=45.0, clock=lambda: int(now * 1000)),
                         history=HistoryStore(client), decisions=DecisionStore(client), pods=cluster)
        (result,) = [r for r in loop.tick(now).results if r.workload == "qwen3"]
    assert result.error == "" and result.decision is not None
    history = loop.history.read("qwen3", now=now)
    # every 15 s of the four hours, give or take the edges of rate()'s 1m window (no sample of the
    # tick's own: the counters stopped a minute before it, so its instant query is empty)
    filled = [s for s in history if s.t < now]
    assert result.backfilled == len(filled) == len(history)
    assert 4 * 3600 // 15 - 8 <= len(filled) <= 4 * 3600 // 15 + 8
    assert {round(s.rate, 6) for s in filled if end - 4 * 3600 + 60 <= s.t < end - 2 * 3600} == {2.0}
    assert {round(s.rate, 6) for s in filled if end - 2 * 3600 + 60 <= s.t < end} == {5.0}
    assert {s.queue for s in filled} == {3.0}
    assert result.decision.inputs.forecast is not None and result.decision.inputs.forecast.observations > 900
