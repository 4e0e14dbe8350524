"""Observed starts end to end, on a real Redis: the store and its bounds, ``extender sync`` recording
starts from the API double's pods (and discarding the ones it cannot trust), the calibrated policy
the extender's refresher and the scaler take, and the two commands that show it."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from extender import cli
from extender.core.caches import weights_key
from extender.core.calibration import (
    NO_NODE_FACTORS,
    PARAMETERS,
    NodeFactor,
    NodeFactors,
    Observation,
    effective_policy,
    estimate_errors,
)
from extender.core.enginelog import EnginePhases, parse_engine_log
from extender.core.estimate import breakdown
from extender.core.policy import Policy, parse_policy
from extender.core.reports import AgentReport, KubeReport
from extender.core.scoring import scale_for
from extender.kube.client import KubeClient
from extender.kube.metrics import SyncMetrics
from extender.kube.objects import PodFacts
from extender.kube.observe import LOG_RESULTS, EngineLogs, StartObserver
from extender.state import InventoryStore
from extender.state.observations import CalibratedPolicy, ObservationStore, Stored
from extender.state.sources import SourceStore
from extender.warm.loop import WarmLoop
from tests.calibration_world import factors, refresher_on, round_robin, starts, world
from tests.conftest import RedisServer
from tests.kube_double import KubeDouble
from tests.kube_double.waiting import wait_until
from tests.test_sync import G5_12, LLAMA, VLLM, node, running_sync

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
POLICY_TEXT = (ROOT / "policies" / "g5-pcie-fleet.yaml").read_text()
SUGGEST = parse_policy(POLICY_TEXT + "calibration: {mode: suggest, captureWithin: 30s, maxInventoryAge: 60s}\n")
APPLY = parse_policy(POLICY_TEXT + "calibration: {mode: apply}\n")
WORKLOAD, CLASS = "llama3-8b", "g5.12xlarge"


@pytest.fixture
def client(redis_client: redis.Redis) -> redis.Redis:
    return redis_client


def rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def serving_pod(name: str, node_name: str, *, scheduled: float | None, ready: float | None = None,
                uid: str = "", restarted: float | None = None) -> dict[str, Any]:
    """A llama3-8b pod bound to ``node_name``: PodScheduled at ``scheduled``, Ready at ``ready`` (or not yet);
    with ``restarted``, its container ran once before and was started again then (kubelet's restart)."""
    conditions = []
    if scheduled is not None:
        conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": rfc3339(scheduled)})
    conditions.append({"type": "Ready", "status": str(ready is not None),
                       **({"lastTransitionTime": rfc3339(ready)} if ready is not None else {})})
    running = ready is not None or restarted is not None
    status: dict[str, Any] = {"phase": "Running" if running else "Pending", "conditions": conditions}
    if scheduled is not None:
        container: dict[str, Any] = {"name": "vllm", "restartCount": 0,
                                     "state": {"running": {"startedAt": rfc3339(scheduled + 2)}}}
        if restarted is not None:
            container.update(restartCount=1, state={"running": {"startedAt": rfc3339(restarted)}},
                             lastState={"terminated": {"exitCode": 137, "reason": "OOMKilled",
                                                       "startedAt": rfc3339(scheduled + 2),
                                                       "finishedAt": rfc3339(restarted - 1)}})
        status["containerStatuses"] = [container]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "serving", "labels": LLAMA, "uid": uid or f"uid-{name}"},
            "spec": {"nodeName": node_name, "containers": [
                {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
                 "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": status}


# ---- the store ------------------------------------------------------------------------------------


def test_the_store_keeps_the_newest_window_and_drops_old_starts(client: Any) -> None:
    store = ObservationStore(client, window=5, max_age_s=1000.0)
    observed = starts(APPLY, APPLY, WORKLOAD, CLASS, ["warm"] * 8, t0=10_000.0)  # ready a minute apart
    other = starts(APPLY, APPLY, WORKLOAD, "g5.xlarge", ["cold"], t0=10_000.0)
    assert store.version() == 0
    v1 = store.append(observed[:4], {"stale inventory": 2}, now=10_300.0)
    v2 = store.append([*observed[4:], *other], {"stale inventory": 1, "seen late": 1}, now=10_500.0)
    assert (v1, v2) == (1, 2) and store.version() == 2
    stored = store.read()
    mine = [o for o in stored.observations if o.node_class == CLASS]
    assert [o.pod for o in mine] == [o.pod for o in observed[3:]]  # the newest five
    assert stored.discarded == {"stale inventory": 3, "seen late": 1}
    # later, every pair's starts older than max_age go with the next write, even one adding nothing
    store.append([], now=20_000.0)
    assert [o.pod for o in store.read().observations if o.node_class == CLASS] == []
    assert stored.observations[0] == observed[3]  # a round trip keeps every field


def test_an_unreadable_member_is_skipped_not_fatal(client: Any) -> None:
    store = ObservationStore(client)
    store.append(starts(APPLY, APPLY, WORKLOAD, CLASS, ["warm"]), now=1.7e9 + 3600)
    client.zadd(store.key(WORKLOAD, CLASS), {'{"pod": 3}': 1.0})
    stored = store.read()
    assert len(stored.observations) == 1 and stored.unreadable == 1


# ---- the sync records starts ---------------------------------------------------------------------------


def report_agent(reader: SourceStore, name: str, *, age_s: float, weights: bool, ttl: float = 60.0) -> None:
    profile = SUGGEST.profile(WORKLOAD)
    reader.report_agent(name, AgentReport(
        weights={weights_key(WORKLOAD, profile.weights.version): profile.weights.bytes} if weights else {},
        heartbeat=time.time() - age_s, ttl=ttl, images=VLLM))


def test_sync_records_a_start_with_what_its_node_held_and_discards_what_it_cannot_trust(
    double: KubeDouble, redis_server: RedisServer, tmp_path: Path, client: Any
) -> None:
    reader = SourceStore(InventoryStore(client))
    store = ObservationStore(client)
    for name in ("warm-a", "stale-b", "no-agent-c", "late-d", "gone-e"):
        double.apply(node(name, G5_12, gpus=4))
    double.apply(serving_pod("already-ready", "warm-a", scheduled=time.time() - 600, ready=time.time() - 300))
    registry = CollectorRegistry()
    with running_sync(double, redis_server.url, tmp_path, SUGGEST, metrics=SyncMetrics(registry, SUGGEST)) as sync:
        wait_until(lambda: reader.store.names() >= {"warm-a", "stale-b"}, what="the nodes")
        report_agent(reader, "warm-a", age_s=5, weights=True)
        report_agent(reader, "stale-b", age_s=120, weights=True)  # older than maxInventoryAge
        report_agent(reader, "late-d", age_s=5, weights=True)
        report_agent(reader, "gone-e", age_s=5, weights=False)
        now = time.time()
        double.apply(serving_pod("fresh", "warm-a", scheduled=now))
        double.apply(serving_pod("stale", "stale-b", scheduled=now))
        double.apply(serving_pod("silent", "no-agent-c", scheduled=now))
        double.apply(serving_pod("late", "late-d", scheduled=now - 120))  # first seen 2 min after scheduling
        double.apply(serving_pod("gone", "gone-e", scheduled=now))
        assert sync.observer is not None
        wait_until(lambda: sum(store.read().discarded.values()) >= 3, what="the untrusted starts discarded")
        # the pods become Ready (one is deleted first), 42 s after they were scheduled
        for name, where in (("fresh", "warm-a"), ("stale", "stale-b"), ("silent", "no-agent-c"), ("late", "late-d")):
            double.apply(serving_pod(name, where, scheduled=now, ready=now + 42))
        double.remove("v1", "Pod", "gone", "serving")
        wait_until(lambda: len(store.read().observations) == 1 and sum(store.read().discarded.values()) == 4,
                   what="one start recorded, four discarded", report=lambda: f"{store.read()}")
    stored = store.read()
    (o,) = stored.observations
    assert (o.pod, o.workload, o.node, o.node_class) == ("serving/fresh", WORKLOAD, "warm-a", CLASS)
    assert o.image and o.weights_bytes == SUGGEST.profile(WORKLOAD).weights.bytes and o.compile == "absent"
    assert o.total_s == pytest.approx(42, abs=1.0)  # API times have a resolution of one second
    assert o.started_at is not None and o.scheduled_at <= o.started_at <= o.ready_at
    assert 0 <= o.inventory_age < 30
    assert stored.discarded == {"stale inventory": 2, "seen late": 1, "deleted before ready": 1}
    # the estimator's truth for the recorded start: observed, estimated and their ratio, once each
    labels = {"workload": WORKLOAD, "node_class": CLASS}
    (truth,) = estimate_errors(SUGGEST, [o])

    def sample(name: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert sample("extender_replica_startup_seconds_count") == 1.0
    assert sample("extender_replica_startup_seconds_sum") == pytest.approx(o.total_s)
    assert sample("extender_replica_startup_estimate_seconds_sum") == pytest.approx(truth.estimated_s)
    assert sample("extender_replica_startup_estimate_ratio_sum") == pytest.approx(truth.estimated_s / o.total_s)
    assert sample("extender_replica_startup_estimate_ratio_count") == 1.0


def test_a_sync_started_while_a_replica_restarts_counts_it_as_no_start(
    double: KubeDouble, redis_server: RedisServer, tmp_path: Path, client: Any
) -> None:
    """A replica Ready for an hour whose engine was just killed is starting again when a restarted sync
    lists it: that is no new start, recorded or discarded (it was counted 'seen late'); a start the
    sync saw late, listed beside it, still is."""
    reader = SourceStore(InventoryStore(client))
    store = ObservationStore(client)
    double.apply(node("warm-a", G5_12, gpus=4))
    now = time.time()
    double.apply(serving_pod("flapping", "warm-a", scheduled=now - 3600, restarted=now - 20))
    double.apply(serving_pod("late", "warm-a", scheduled=now - 120))  # never Ready, first seen 2 min on
    with running_sync(double, redis_server.url, tmp_path, SUGGEST):
        wait_until(lambda: reader.store.names() == {"warm-a"}, what="the node")
        report_agent(reader, "warm-a", age_s=1, weights=True)
        wait_until(lambda: store.read().discarded, what="the first pass's discards")
        assert store.read().discarded == {"seen late": 1}
        # Ready again, a readiness flap after it, and a new start on the node behind them
        double.apply(serving_pod("flapping", "warm-a", scheduled=now - 3600, restarted=now - 20, ready=now + 5))
        double.apply(serving_pod("flapping", "warm-a", scheduled=now - 3600, restarted=now - 20))
        double.apply(serving_pod("fresh", "warm-a", scheduled=now))
        double.apply(serving_pod("fresh", "warm-a", scheduled=now, ready=now + 30))
        wait_until(lambda: store.read().observations, what="the new start recorded")
    stored = store.read()
    assert [o.pod for o in stored.observations] == ["serving/fresh"]
    assert stored.discarded == {"seen late": 1}


def test_sync_observes_nothing_when_calibration_is_off(
    double: KubeDouble, redis_server: RedisServer, tmp_path: Path, client: Any
) -> None:
    policy = parse_policy(POLICY_TEXT)  # mode off by default
    reader = SourceStore(InventoryStore(client))
    double.apply(node("warm-a", G5_12, gpus=4))
    with running_sync(double, redis_server.url, tmp_path, policy) as sync:
        wait_until(lambda: reader.store.names() == {"warm-a"}, what="the node")
        report_agent(reader, "warm-a", age_s=1, weights=True)
        now = time.time()
        double.apply(serving_pod("p", "warm-a", scheduled=now, ready=now + 5))
        wait_until(lambda: (r := reader.kube_reports(["warm-a"])["warm-a"]) is not None and r.replicas,
                   what="the replica counted")
        assert sync.observer is None
    assert ObservationStore(client).version() == 0 and not client.keys("extender:calibration:*")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(age=st.floats(0.0, 400.0), ttl=st.floats(1.0, 300.0), max_age=st.floats(1.0, 300.0),
       agent=st.booleans())
def test_starts_from_stale_inventory_are_discarded(client: Any, age: float, ttl: float, max_age: float,
                                                   agent: bool) -> None:
    client.flushdb()
    policy = parse_policy(POLICY_TEXT + f"calibration: {{mode: suggest, maxInventoryAge: {max_age!r}s}}\n")
    now = 1.8e9
    reader = SourceStore(InventoryStore(client))
    reader.report_kube({"n1": node_report()})
    if agent:
        reader.report_agent("n1", AgentReport(heartbeat=now - age, ttl=ttl, images=VLLM))
    store = ObservationStore(client)
    observer = StartObserver(policy, clock=lambda: now)
    heard: list[Observation] = []
    observer.on_recorded.append(heard.extend)
    facts = PodFacts("serving/p", "n1", 1, WORKLOAD, "starting", uid="u", scheduled_at=now - 1)
    observer.pod(facts)
    observer.flush(InventoryStore(client), store)
    observer.pod(PodFacts("serving/p", "n1", 1, WORKLOAD, "running", uid="u", scheduled_at=now - 1,
                          started_at=now, ready_at=now + 30))
    observer.flush(InventoryStore(client), store)
    stored = store.read()
    # the freshness window of every reader (heartbeat - w <= now <= heartbeat + w, w the smaller of
    # the TTL and maxInventoryAge), on the heartbeat as stored: unix seconds lose the last bits of
    # a small age, so at the bound only the window's own arithmetic says which side it falls
    beat, window = now - age, min(ttl, max_age)
    trusted = agent and beat - window <= now <= beat + window
    assert len(stored.observations) == (1 if trusted else 0)
    assert heard == list(stored.observations)
    assert stored.discarded == ({} if trusted else {"stale inventory": 1})


def node_report() -> KubeReport:
    return KubeReport(node_class=CLASS, labels=G5_12, gpus=4, gpus_free=4, images=tuple(VLLM))


# ---- the calibrated policy the components take ------------------------------------------------------


def doubled_starts(policy: Policy, n: int = 40) -> list[Observation]:
    return starts(policy, world(policy, WORKLOAD, CLASS, factors(**dict.fromkeys(PARAMETERS, 2.0))), WORKLOAD,
                  CLASS, round_robin(n), t0=time.time() - 3600)


def test_the_calibrated_policy_follows_the_store_and_survives_an_outage(redis_server: RedisServer,
                                                                        client: Any) -> None:
    store = ObservationStore(client)
    reader = CalibratedPolicy(store, min_interval_s=0.0)
    assert reader.policy_for(APPLY) is APPLY  # nothing observed yet: the policy itself
    assert CalibratedPolicy(store).policy_for(SUGGEST) is SUGGEST
    store.append(doubled_starts(APPLY), now=time.time())
    calibrated = reader.policy_for(APPLY)
    assert calibrated is not APPLY and reader.policy_for(APPLY) is calibrated  # no new start: the same object
    assert calibrated == effective_policy(APPLY, store.read().observations, now=time.time())
    redis_server.kill()
    assert reader.policy_for(APPLY) is calibrated and reader.error is not None  # the last fit stays
    assert CalibratedPolicy(ObservationStore(client)).policy_for(APPLY) is APPLY  # nothing known: the base


class SlowStore(ObservationStore):
    """A real store whose every read takes ``took`` seconds on the test's fake clock ``now``."""

    def __init__(self, client: Any, now: list[float], took: float) -> None:
        super().__init__(client)
        self.now, self.took, self.reads = now, took, 0

    def read(self) -> Stored:
        self.now[0] += self.took
        self.reads += 1
        return super().read()


@pytest.mark.parametrize(("min_interval_s", "duty_factor", "took", "interval_s"), [
    pytest.param(30.0, 200.0, 0.05, 30.0, id="a cheap refit: the interval"),
    pytest.param(30.0, 200.0, 1.5, 300.0, id="a costly refit: 200 times its cost"),
    pytest.param(30.0, 0.0, 5.0, 30.0, id="no duty factor: the interval alone"),
    pytest.param(0.0, 200.0, 0.5, 100.0, id="no interval: the duty factor alone"),
    pytest.param(30.0, 200.0, 0.0, 30.0, id="a refit that took no time"),
])
def test_refits_are_spaced_by_a_multiple_of_their_cost(client: Any, min_interval_s: float, duty_factor: float,
                                                       took: float, interval_s: float) -> None:
    # at 20,000 stored starts a refit held a serving worker's GIL for 1-2.5 s every 30 s, and its p99 was
    # 1.25-1.8x that of calibration off (BENCHMARKS.md, "The refit in serving workers")
    now = [time.time()]
    store = SlowStore(client, now, took)
    reader = CalibratedPolicy(store, clock=lambda: now[0], min_interval_s=min_interval_s, duty_factor=duty_factor)
    store.append(doubled_starts(APPLY), now=now[0])
    fitted_at = now[0]
    fitted = reader.policy_for(APPLY)
    assert fitted is not APPLY
    assert reader.cost_s == pytest.approx(took) and reader.interval_s == pytest.approx(interval_s)
    later = [o.model_copy(update={"pod": f"{o.pod}-later"}) for o in doubled_starts(APPLY, n=2)]
    store.append(later, now=now[0])  # the version moved
    now[0] = fitted_at + interval_s - 0.01
    assert reader.policy_for(APPLY) is fitted and store.reads == 1  # too soon: one GET at most, no read
    now[0] = fitted_at + interval_s
    assert reader.policy_for(APPLY) is not fitted and store.reads == 2


def test_a_new_base_policy_is_fitted_at_once_however_costly_the_last_refit(client: Any) -> None:
    now = [time.time()]
    store = SlowStore(client, now, 10.0)
    reader = CalibratedPolicy(store, clock=lambda: now[0], min_interval_s=30.0, duty_factor=200.0)
    store.append(doubled_starts(APPLY), now=now[0])
    fitted = reader.policy_for(APPLY)
    assert reader.interval_s == pytest.approx(2000.0)
    swapped = parse_policy(POLICY_TEXT + "calibration: {mode: apply, priorObservations: 5}\n")
    calibrated = reader.policy_for(swapped)
    assert calibrated is not fitted and calibrated.calibration.prior_observations == 5 and store.reads == 2


def test_the_refresher_takes_its_refit_spacing_from_the_settings(client: Any, tmp_path: Path) -> None:
    refresher = refresher_on(client, tmp_path, POLICY_TEXT + "calibration: {mode: apply}\n", APPLY)
    refresher.settings = replace(refresher.settings, calibration_interval_s=3.0, calibration_duty_factor=7.0)
    refresher.refresh_once()
    calibration = refresher._calibration
    assert calibration is not None and (calibration.min_interval_s, calibration.duty_factor) == (3.0, 7.0)


def test_the_refresher_scores_with_the_calibrated_policy(redis_server: RedisServer, client: Any,
                                                         tmp_path: Path) -> None:
    refresher = refresher_on(client, tmp_path, POLICY_TEXT + "calibration: {mode: apply}\n", APPLY)
    refresher.refresh_once()
    refresher.refresh_once()
    assert refresher.engine is not None and refresher.engine.policy is APPLY
    ObservationStore(client).append(doubled_starts(APPLY), now=time.time())
    refresher.refresh_once()
    refresher.refresh_once()
    engine = refresher.engine
    assert engine is not None and engine.policy is not APPLY
    cold_policy = breakdown(APPLY.profile(WORKLOAD), APPLY.node_class(CLASS))["cold"]["total_s"]
    cold_now = breakdown(engine.policy.profile(WORKLOAD), engine.policy.node_class(CLASS))["cold"]["total_s"]
    assert cold_now > 1.3 * cold_policy
    assert engine.scales[WORKLOAD].reference_s > scale_for(APPLY, APPLY.profile(WORKLOAD)).reference_s
    assert refresher.policy is APPLY  # the base policy is kept: a reload replaces it, not the fit


# ---- the commands --------------------------------------------------------------------------------------


def test_calibrate_show_and_estimate_calibrated(redis_server: RedisServer, client: Any, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY_TEXT + "calibration: {mode: suggest}\n")
    observed = doubled_starts(SUGGEST)
    ObservationStore(client).append(observed, {"stale inventory": 3}, now=time.time())
    store_args = ["--redis-url", redis_server.url]
    assert cli.main(["calibrate", "show", "--policy", str(path), "--json", *store_args]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert len(shown["observations"]) == 40 and shown["discarded"] == {"stale inventory": 3}
    (fit,) = shown["fits"]
    assert (fit["workload"], fit["nodeClass"], fit["observations"], fit["applied"]) == (WORKLOAD, CLASS, 40, False)
    assert fit["medianErrorPolicy"] > 0.4 and fit["medianErrorFit"] < 0.15
    assert cli.main(["estimate", "--calibrated", "--policy", str(path), "--workload", WORKLOAD, "--json",
                     *store_args]) == 0
    estimated = json.loads(capsys.readouterr().out)
    assert estimated[WORKLOAD][CLASS] == fit  # the same fit, from the same observations
    assert estimated[WORKLOAD]["g5.xlarge"] is None  # no observation of that class
    params = {p["parameter"]: p for p in fit["parameters"]}
    assert params["compileCold"]["fitted"] > params["compileCold"]["policy"]
    assert params["imagePull"]["fitted"] < params["imagePull"]["policy"]  # a bandwidth: slower is smaller
    assert cli.main(["estimate", "--calibrated", "--policy", str(path), "--workload", WORKLOAD, *store_args]) == 0
    text = capsys.readouterr().out
    assert f"{WORKLOAD} on {CLASS}: 40 observation(s)" in text and "not applied: mode suggest" in text
    assert f"{WORKLOAD} on g5.xlarge: no observations" in text
    assert cli.main(["calibrate", "show", "--policy", str(path), "--limit", "3", *store_args]) == 0
    text = capsys.readouterr().out
    assert "starts not recorded: stale inventory 3" in text and text.count("serving/llama3-8b-") == 3


def test_the_scaler_takes_its_horizon_and_the_warmer_its_policy_from_the_fit(redis_server: RedisServer,
                                                                             client: Any) -> None:
    from tests.test_scale_loop import T0, make_rig, warm_node

    rig = make_rig(redis_server.url, lambda t: 4.0, nodes=[warm_node("warm-1", cached=True)],
                   scaling_extra="calibration: {mode: apply}\n")
    told: list[Policy] = []
    told_nodes: list[NodeFactors] = []

    def listen(policy: Policy, nodes: NodeFactors) -> None:
        told.append(policy)
        told_nodes.append(nodes)

    rig.loop.calibration = CalibratedPolicy(ObservationStore(rig.client), clock=lambda: T0, min_interval_s=0.0)
    rig.loop.on_estimator_policy.append(listen)
    warm = WarmLoop(rig.policy, None, None, starts_jobs=False)
    rig.loop.on_estimator_policy.append(warm.set_policy)  # as extender scale wires its warmer
    (before,) = rig.run(1)
    assert told == [rig.policy]  # the listeners always learn the policy in use, calibrated or not
    assert told_nodes == [NO_NODE_FACTORS] and warm.nodes is told_nodes[0]
    truth = world(rig.policy, "qwen3", "h100", factors(**dict.fromkeys(PARAMETERS, 2.0)))
    ObservationStore(rig.client).append(starts(rig.policy, truth, "qwen3", "h100", round_robin(40), t0=T0 - 7200),
                                        now=T0)
    (after,) = rig.run(1, start=T0 + 15)
    calibrated = effective_policy(rig.policy, ObservationStore(rig.client).read().observations, now=T0)
    assert len(told) == 2 and told[-1] == calibrated and rig.loop.estimator_policy is told[-1]
    # the warmer gets the per-node factors the scaler places with, in the same call
    assert told_nodes[-1] is rig.loop.estimator_nodes and told_nodes[-1]
    assert warm.policy.calibration == calibrated.calibration and warm.nodes is told_nodes[-1]
    # warm-1 holds the image and weights: its estimate, policy vs fitted
    expected = breakdown(calibrated.profile("qwen3"), calibrated.node_class("h100"))["image+weights"]["total_s"]
    assert before.inputs.horizon.startup_s == pytest.approx(106.3, abs=0.1)
    assert after.inputs.horizon.startup_s == pytest.approx(expected) and expected > 150
    assert after.inputs.horizon.node == "warm-1"


class Scripted(CalibratedPolicy):
    """A calibration reader that answers the base policy and the next of ``answers``'s factors."""

    def __init__(self, store: ObservationStore, answers: list[NodeFactors]) -> None:
        super().__init__(store)
        self.answers = answers

    def calibration_for(self, base: Policy) -> tuple[Policy, NodeFactors]:
        return base, self.answers.pop(0)


def test_the_warmer_hears_of_node_factors_that_move_alone(redis_server: RedisServer) -> None:
    """A refit can move the per-node factors and leave every class fit as it was (the policy the same
    object): the listeners are told then too, and not when neither moved."""
    from tests.test_scale_loop import make_rig, warm_node

    rig = make_rig(redis_server.url, lambda t: 4.0, nodes=[warm_node("warm-1", cached=True)],
                   scaling_extra="calibration: {mode: apply}\n")
    slow = NodeFactors({"warm-1": NodeFactor("warm-1", 1.4, 12, 0.8, 0.25, 4.0)})
    rig.loop.calibration = Scripted(ObservationStore(rig.client), [NO_NODE_FACTORS, slow, slow])
    told: list[NodeFactors] = []
    rig.loop.on_estimator_policy.append(lambda _policy, nodes: told.append(nodes))
    for k in range(3):
        rig.loop._calibrate()
        assert rig.loop.estimator_policy is rig.policy, k
    assert told == [NO_NODE_FACTORS, slow]


class StartCase(NamedTuple):
    id: str
    #: Seconds before the start since the agent's whole report, and since its last bare heartbeat (None: none since).
    report_age_s: float
    beat_age_s: float | None
    #: Ready minus PodScheduled, in seconds.
    duration_s: float
    recorded: int
    discarded: dict[str, int]


#: What the observer trusts (maxInventoryAge 60 s): a node is as fresh as its agent's latest heartbeat,
#: bare ones included (as every reader of the inventory sees it), within 60 s of the clock either
#: way (a report age below 0: stamped ahead by a clock that runs fast); a start whose Ready precedes its
#: PodScheduled (skewed clocks) is discarded with its own reason, never stored as a 0 s start.
START_CASES = [
    StartCase("a fresh whole report", 2.0, None, 30.0, 1, {}),
    StartCase("an old whole report kept fresh by bare heartbeats", 300.0, 2.0, 30.0, 1, {}),
    StartCase("an old whole report and no heartbeat since", 300.0, None, 30.0, 0, {"stale inventory": 1}),
    StartCase("a bare heartbeat older than maxInventoryAge", 300.0, 120.0, 30.0, 0, {"stale inventory": 1}),
    StartCase("a whole report stamped ahead within maxInventoryAge", -30.0, None, 30.0, 1, {}),
    # the agent's clock runs ahead: it was trusted however far, as if the report were brand new
    StartCase("a whole report stamped ahead beyond maxInventoryAge", -120.0, None, 30.0, 0, {"stale inventory": 1}),
    StartCase("Ready before PodScheduled (skewed clocks)", 2.0, None, -10.0, 0, {"ready before scheduled": 1}),
    StartCase("Ready at PodScheduled", 2.0, None, 0.0, 1, {}),
]


@pytest.mark.parametrize("case", START_CASES, ids=[c.id for c in START_CASES])
def test_what_a_start_found_and_when_it_was_ready_decide_whether_it_is_recorded(client: Any,
                                                                                 case: StartCase) -> None:
    client.flushdb()
    policy = parse_policy(POLICY_TEXT + "calibration: {mode: suggest, maxInventoryAge: 60s}\n")
    now = time.time()
    agent = SourceStore(InventoryStore(client))
    agent.report_kube({"n1": node_report()})
    agent.report_agent("n1", AgentReport(heartbeat=now - case.report_age_s, ttl=600, images=VLLM))
    if case.beat_age_s is not None:
        assert agent.beat_agent("n1", now - case.beat_age_s)
    store = ObservationStore(client)
    observer = StartObserver(policy, clock=lambda: now)
    scheduled = now - 1
    observer.pod(PodFacts("serving/p", "n1", 1, WORKLOAD, "starting", uid="u", scheduled_at=scheduled))
    observer.flush(InventoryStore(client), store)
    observer.pod(PodFacts("serving/p", "n1", 1, WORKLOAD, "running", uid="u", scheduled_at=scheduled,
                          started_at=scheduled, ready_at=scheduled + case.duration_s))
    observer.flush(InventoryStore(client), store)
    stored = store.read()
    assert len(stored.observations) == case.recorded and stored.discarded == case.discarded
    assert [o.total_s for o in stored.observations] == [case.duration_s] * case.recorded
    assert not observer.pending()


# ---- a pod's life between the writer's passes ---------------------------------------------------------

#: What the view hands the observer: a pod as seen (``PodFacts``), or ``str``: the pod of that key gone.
Event = PodFacts | str
T = 1.8e9  # the observer's clock
POD = "serving/web-0"


def seen(uid: str, where: str, *, ready: float | None = None) -> PodFacts:
    """The pod ``POD`` (a StatefulSet's: one name, a new uid each time it is created) as the view sees it."""
    return PodFacts(POD, where, 1, WORKLOAD, "running" if ready is not None else "starting", uid=uid,
                    scheduled_at=T - 2, started_at=T - 1 if ready is not None else None, ready_at=ready)


class LifeCase(NamedTuple):
    id: str
    #: Events before the writer's first pass, while it reads the nodes of new starts (the view's thread
    #: runs meanwhile), and before its second pass.
    before: list[Event]
    during_read: list[Event]
    after: list[Event]
    #: (node, weights bytes found there, seconds to Ready) of each recorded start of ``POD``.
    recorded: list[tuple[str, float, float]]
    discarded: dict[str, int]
    #: Starts followed at once, at most (``observe.MAX_PENDING``), when not the default.
    max_pending: int | None = None
    #: Events while the writer's first pass writes to the store (after its node reads).
    during_write: tuple[Event, ...] = ()


#: Another pod starting, on n1.
OTHER = PodFacts("serving/other-0", "n1", 1, WORKLOAD, "starting", uid="o1", scheduled_at=T - 2)
FULL = float(SUGGEST.profile(WORKLOAD).weights.bytes)
#: n1 holds the workload's weights, n2 nothing; both records are fresh.
LIFE_CASES = [
    LifeCase("Ready before the first pass", [seen("u1", "n1"), seen("u1", "n1", ready=T + 40)], [], [],
             [("n1", FULL, 42.0)], {}),
    LifeCase("deleted before Ready", [seen("u1", "n1")], [], [POD], [], {"deleted before ready": 1}),
    LifeCase("replaced under its name before Ready", [seen("u1", "n1")], [], [seen("u2", "n2")], [],
             {"deleted before ready": 1}),
    LifeCase("deleted after Ready, before the second pass", [seen("u1", "n1")], [],
             [seen("u1", "n1", ready=T + 40), POD], [("n1", FULL, 42.0)], {}),
    LifeCase("a readiness flap before the second pass: the first Ready counts", [seen("u1", "n1")], [],
             [seen("u1", "n1", ready=T + 40), seen("u1", "n1"), seen("u1", "n1", ready=T + 90)],
             [("n1", FULL, 42.0)], {}),
    # a Ready start whose pod was then replaced under its name was lost, counted 'deleted before ready'
    LifeCase("Ready, deleted and replaced on another node before the second pass", [seen("u1", "n1")], [],
             [seen("u1", "n1", ready=T + 40), POD, seen("u2", "n2")], [("n1", FULL, 42.0)], {}),
    LifeCase("Ready, then replaced with no deletion seen (a relist) before the second pass", [seen("u1", "n1")], [],
             [seen("u1", "n1", ready=T + 40), seen("u2", "n2")], [("n1", FULL, 42.0)], {}),
    LifeCase("Ready, replaced, and the replacement Ready too before the second pass", [seen("u1", "n1")], [],
             [seen("u1", "n1", ready=T + 40), seen("u2", "n2"), seen("u2", "n2", ready=T + 60)],
             [("n1", FULL, 42.0), ("n2", 0.0, 62.0)], {}),
    # each status update of a pod not followed for want of room counted it again
    LifeCase("a start over the pending bound, its pod updated three times, then Ready",
             [OTHER, seen("u1", "n1"), seen("u1", "n1"), seen("u1", "n1")], [], [seen("u1", "n1", ready=T + 40)],
             [], {"too many pending": 1}, max_pending=1),
    # the first node's record, read for the pod that went, was once given to the pod that replaced it
    LifeCase("replaced on another node while its first node was read", [seen("u1", "n1")],
             [POD, seen("u2", "n2")], [seen("u2", "n2", ready=T + 40)], [("n2", 0.0, 42.0)],
             {"deleted before ready": 1}),
    # the writer's pass remembered the pod it had just recorded after its deletion: known until a relist
    LifeCase("deleted while its start was written", [seen("u1", "n1"), seen("u1", "n1", ready=T + 40)], [], [],
             [("n1", FULL, 42.0)], {}, during_write=(POD,)),
    LifeCase("deleted and replaced while its start was written", [seen("u1", "n1"), seen("u1", "n1", ready=T + 40)],
             [], [seen("u2", "n2", ready=T + 60)], [("n1", FULL, 42.0), ("n2", 0.0, 62.0)], {},
             during_write=(POD, seen("u2", "n2"))),
    # a replica starting again when the sync first saw it (the sync restarted) was counted 'seen late'
    LifeCase("first seen starting again (a container of it ran before), then Ready",
             [replace(seen("u1", "n1"), restarted=True)], [], [replace(seen("u1", "n1", ready=T + 40), restarted=True)],
             [], {}),
    LifeCase("followed from its start, a container restarted before Ready: the start counts", [seen("u1", "n1")], [],
             [replace(seen("u1", "n1"), restarted=True), replace(seen("u1", "n1", ready=T + 40), restarted=True)],
             [("n1", FULL, 42.0)], {}),
    LifeCase("a new pod started and deleted while a discard was written", [seen("u1", "n1")], [POD], [], [],
             {"deleted before ready": 2}, during_write=(seen("u2", "n2"), POD)),
]


@pytest.mark.parametrize("case", LIFE_CASES, ids=[c.id for c in LIFE_CASES])
def test_what_a_pods_life_between_two_passes_records(client: Any, case: LifeCase,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import extender.kube.observe as observe_module

    client.flushdb()
    sources = SourceStore(InventoryStore(client))
    sources.report_kube({n: node_report() for n in ("n1", "n2")})
    held = {weights_key(WORKLOAD, SUGGEST.profile(WORKLOAD).weights.version): int(FULL)}
    sources.report_agent("n1", AgentReport(weights=held, heartbeat=T - 1, ttl=600, images=VLLM))
    sources.report_agent("n2", AgentReport(heartbeat=T - 1, ttl=600, images=VLLM))
    observer = StartObserver(SUGGEST, clock=lambda: T)
    store = ObservationStore(client)

    def play(events: Sequence[Event]) -> None:
        for event in events:
            observer.gone(event) if isinstance(event, str) else observer.pod(event)

    from extender.state.observations import read_nodes as real_read
    meanwhile = list(case.during_read)

    def read_while_the_view_moves(inventory: InventoryStore, names: Any) -> Any:
        read = real_read(inventory, names)
        play(meanwhile)
        meanwhile.clear()
        return read

    real_append = store.append
    written_meanwhile = list(case.during_write)

    def append_while_the_view_moves(*args: Any, **kwargs: Any) -> int:
        version = real_append(*args, **kwargs)
        play(written_meanwhile)
        written_meanwhile.clear()
        return version

    monkeypatch.setattr(observe_module, "read_nodes", read_while_the_view_moves)
    monkeypatch.setattr(store, "append", append_while_the_view_moves)
    if case.max_pending is not None:
        monkeypatch.setattr(observe_module, "MAX_PENDING", case.max_pending)
    play(case.before)
    observer.flush(InventoryStore(client), store)
    assert not meanwhile and not written_meanwhile, "the first pass read and wrote"
    play(case.after)
    observer.flush(InventoryStore(client), store)
    observer.flush(InventoryStore(client), store)
    stored = store.read()
    assert [(o.pod, o.node, o.weights_bytes, o.total_s) for o in stored.observations] == \
        [(POD, *start) for start in case.recorded]
    assert stored.discarded == case.discarded
    # a pod deleted is held by no name, whichever pass its deletion fell in (a relist used to be
    # what forgot it); once every pod went and its start was written, nothing is held at all
    events = [*case.before, *case.during_read, *case.during_write, *case.after]
    last = {e if isinstance(e, str) else e.key: e for e in events}
    assert observer.tracked() == {key for key, e in last.items() if not isinstance(e, str)}
    play(sorted(last))
    observer.flush(InventoryStore(client), store)
    assert observer.tracked() == set() and not observer.pending()


@pytest.mark.parametrize(("edit", "recorded", "discarded"), [
    # the new observer saw the pod again in the relist, past captureWithin: 'seen late', the start lost
    pytest.param("captureWithin: 30s", [("n1", FULL, 242.0)], {}, id="an-edit-keeps-the-start-in-flight"),
    pytest.param(None, [], {}, id="a-workload-no-longer-profiled-is-let-go"),
])
def test_a_policy_edit_mid_start_loses_nothing(client: Any, edit: str | None,
                                               recorded: list[tuple[str, float, float]],
                                               discarded: dict[str, int]) -> None:
    client.flushdb()
    sources = SourceStore(InventoryStore(client))
    sources.report_kube({"n1": node_report()})
    held = {weights_key(WORKLOAD, SUGGEST.profile(WORKLOAD).weights.version): int(FULL)}
    sources.report_agent("n1", AgentReport(weights=held, heartbeat=T - 1, ttl=600, images=VLLM))
    now = [T]
    observer = StartObserver(SUGGEST, clock=lambda: now[0])
    store = ObservationStore(client)
    observer.pod(seen("u1", "n1"))
    observer.flush(InventoryStore(client), store)  # the node read: what the start found
    now[0] = T + 200  # the edit lands well past captureWithin
    if edit is not None:
        edited = parse_policy(POLICY_TEXT + "calibration: {mode: suggest, " + edit + ", maxInventoryAge: 2m}\n")
    else:
        edited = parse_policy(POLICY_TEXT.replace(f"name: {WORKLOAD}", "name: renamed", 1)
                              + "calibration: {mode: suggest}\n")
    observer = observer.carried_into(edited)
    # the relist that follows an edit; the view gives a pod no profile matches no workload
    workload = WORKLOAD if edit is not None else None
    observer.pod(replace(seen("u1", "n1"), workload=workload))
    observer.pod(replace(seen("u1", "n1", ready=T + 240), workload=workload))
    observer.flush(InventoryStore(client), store)
    stored = store.read()
    assert [(o.node, o.weights_bytes, o.total_s) for o in stored.observations] == recorded
    assert stored.discarded == discarded


# ---- the engine's log -----------------------------------------------------------------------------

#: A vLLM V1 server's startup, as it logs it (one engine core), then a request served.
VLLM_STARTUP = """\
INFO 11-02 09:14:01 [__init__.py:239] Automatically detected platform cuda.
(EngineCore_DP0 pid=812) INFO 11-02 09:14:41 [gpu_model_runner.py:2653] Model loading took 15.2 GiB memory and 31.402117 seconds
(EngineCore_DP0 pid=812) INFO 11-02 09:15:05 [backends.py:218] Compiling a graph for dynamic shape takes 17.40 s
(EngineCore_DP0 pid=812) INFO 11-02 09:15:10 [monitor.py:34] torch.compile takes 23.42 s in total
(EngineCore_DP0 pid=812) INFO 11-02 09:15:25 [gpu_model_runner.py:3480] Graph capturing finished in 11 secs, took 0.61 GiB
(EngineCore_DP0 pid=812) INFO 11-02 09:15:25 [core.py:210] init engine (profile, create kv cache, warmup model) took 43.87 seconds
(APIServer pid=700) INFO 11-02 09:15:27 [api_server.py:1880] Starting vLLM API server 0 on http://0.0.0.0:8000
"""  # noqa: E501 (log lines as vLLM writes them)
#: What it holds: the phases a start read from it must carry.
STARTUP_PHASES = EnginePhases(weights_load=31.402117, compile=23.42, compile_cached=False, graph_capture=11.0,
                              init_engine=43.87)
#: A request line, repeated to make a log longer than its limit.
SERVED = '(APIServer pid=700) INFO 11-02 09:16:00 [logger.py:41] "POST /v1/completions HTTP/1.1" 200 OK\n'


class LogCase(NamedTuple):
    id: str
    #: The profile's ``engineLog`` (YAML flow mapping), or None: not set.
    engine_log: str | None
    #: Text served as the ``vllm`` container's log of each pod (None: none, the container not started).
    log: str | None
    #: Status the API double answers every log read with instead (e.g. 403 without the grant).
    fault: int | None
    #: Log reads the API double served, and the phases each recorded start carries.
    reads: int
    phases: EnginePhases | None
    #: extender_sync_engine_logs_total by result (the rest 0), and the warnings logged.
    results: dict[str, float]
    warnings: int


#: Two starts Ready in one writer's pass, each with its own log. Whatever the read gives, both
#: starts are recorded; a cause of failure is warned about once, not once per pod.
LOG_CASES = [
    LogCase("phases from a vLLM startup log", "{container: vllm}", VLLM_STARTUP, None, 2, STARTUP_PHASES,
            {"read": 2}, 0),
    LogCase("engineLog not set: no log read", None, VLLM_STARTUP, None, 0, None, {}, 0),
    LogCase("403 without the pods/log grant", "{container: vllm}", VLLM_STARTUP, 403, 2, None, {"forbidden": 2}, 1),
    LogCase("a container the pods have not (400)", "{container: engine}", VLLM_STARTUP, None, 2, None,
            {"missing": 2}, 1),
    LogCase("the pods are gone (404)", "{container: vllm}", VLLM_STARTUP, 404, 2, None, {"missing": 2}, 1),
    LogCase("the API server fails (500)", "{container: vllm}", VLLM_STARTUP, 500, 2, None, {"failed": 2}, 1),
    LogCase("a log without phase times", "{container: vllm}", SERVED * 3, None, 2, None, {"empty": 2}, 0),
    LogCase("a log longer than limitBytes: its beginning is read", "{container: vllm, limitBytes: 4KiB}",
            VLLM_STARTUP + SERVED * 200, None, 2, STARTUP_PHASES, {"read": 2}, 1),
    LogCase("limitBytes cutting through the startup: the lines before are read",
            "{container: vllm, limitBytes: 4KiB}", SERVED * 40 + VLLM_STARTUP, None, 2,
            parse_engine_log((SERVED * 40 + VLLM_STARTUP)[:4096].rpartition("\n")[0]), {"read": 2}, 1),
]


def engine_log_policy(engine_log: str | None) -> Policy:
    """The fleet's policy, calibrating, with ``engineLog`` set on llama3-8b (when given)."""
    text = POLICY_TEXT
    if engine_log is not None:
        marker = "    capacity: {perReplica: 4, unit: requests/s}\n"
        assert text.count(marker) >= 1
        text = text.replace(marker, marker + f"    engineLog: {engine_log}\n", 1)
    return parse_policy(text + "calibration: {mode: suggest, maxInventoryAge: 60s}\n")


@pytest.mark.parametrize("case", LOG_CASES, ids=[c.id for c in LOG_CASES])
def test_a_start_carries_the_phase_times_its_engine_logged(client: Any, double: KubeDouble, kube: Any,
                                                            caplog: pytest.LogCaptureFixture, case: LogCase) -> None:
    client.flushdb()
    policy = engine_log_policy(case.engine_log)
    assert (policy.profile(WORKLOAD).engine_log is not None) is (case.engine_log is not None)
    now = time.time()
    agent = SourceStore(InventoryStore(client))
    agent.report_kube({"n1": node_report()})
    agent.report_agent("n1", AgentReport(heartbeat=now, ttl=600, images=VLLM))
    pods = ("p", "q")
    for name in pods:
        double.apply(serving_pod(name, "n1", scheduled=now - 10))
        if case.log is not None:
            double.set_log("serving", name, "vllm", case.log)
    if case.fault is not None:
        double.fail("get", "pods", case.fault, times=len(pods))
    metrics = SyncMetrics(CollectorRegistry(), policy)
    observer = StartObserver(policy, clock=lambda: now, engine_logs=EngineLogs(kube, count=metrics.engine_log))
    store = ObservationStore(client)
    for state in ("starting", "running"):
        for name in pods:
            observer.pod(PodFacts(f"serving/{name}", "n1", 1, WORKLOAD, state, uid=name, scheduled_at=now - 10,
                                  started_at=now - 8, ready_at=now if state == "running" else None))
        with caplog.at_level(logging.WARNING, logger="extender.kube.observe"):
            observer.flush(InventoryStore(client), store)
    stored = store.read()
    assert sorted(o.pod for o in stored.observations) == ["serving/p", "serving/q"] and not stored.discarded
    assert [o.phases for o in stored.observations] == [case.phases] * 2
    assert sum(1 for r in double.requests if r.subresource == "log") == case.reads
    counts = {result: metrics.registry.get_sample_value("extender_sync_engine_logs_total", {"result": result})
              for result in LOG_RESULTS}
    assert counts == {result: case.results.get(result, 0.0) for result in LOG_RESULTS}
    warned = [r for r in caplog.records if r.name == "extender.kube.observe" and r.levelno == logging.WARNING]
    assert len(warned) == case.warnings, [r.getMessage() for r in warned]
    if case.fault == 403:
        assert "sync.readEngineLogs" in warned[0].getMessage()


def test_after_a_read_without_answer_the_pass_reads_no_more_logs(client: Any, double: KubeDouble,
                                                                 tmp_path: Path) -> None:
    """An API server that does not answer costs one pass one timeout: the other starts of the pass
    are recorded without reading (``skipped``)."""
    client.flushdb()
    policy = engine_log_policy("{container: vllm}")
    now = time.time()
    agent = SourceStore(InventoryStore(client))
    agent.report_kube({"n1": node_report()})
    agent.report_agent("n1", AgentReport(heartbeat=now, ttl=600, images=VLLM))
    kube = KubeClient.connect(str(double.write_kubeconfig(tmp_path / "kubeconfig")))
    double.stop()  # nothing listens any more: connection refused
    results: list[str] = []
    observer = StartObserver(policy, clock=lambda: now, engine_logs=EngineLogs(kube, count=results.append))
    store = ObservationStore(client)
    try:
        for state in ("starting", "running"):
            for name in ("p", "q", "r"):
                observer.pod(PodFacts(f"serving/{name}", "n1", 1, WORKLOAD, state, uid=name, scheduled_at=now - 10,
                                      started_at=now - 8, ready_at=now if state == "running" else None))
            observer.flush(InventoryStore(client), store)
    finally:
        kube.close()
    assert results == ["unreachable", "skipped", "skipped"]
    assert len(store.read().observations) == 3


class PodLogCase(NamedTuple):
    id: str
    text: str | bytes
    limit: int
    #: Whether the server stops at ``limitBytes`` (a proxy or an old server may not).
    honored: bool
    expected: tuple[str, bool]


LINE = "x" * 99 + "\n"  # 100 bytes
POD_LOG_CASES = [
    PodLogCase("shorter than the limit", LINE * 3, 4096, True, (LINE * 3, False)),
    PodLogCase("exactly the limit, ending a line", LINE * 41, 4100, True, (LINE * 41, True)),
    PodLogCase("cut by the server mid-line", LINE * 100, 4150, True, (LINE * 41, True)),
    PodLogCase("the server ignores limitBytes", LINE * 100, 4150, False, (LINE * 41, True)),
    PodLogCase("one line longer than the limit", "y" * 10_000 + "\n", 4096, True, ("", True)),
    PodLogCase("bytes that are not UTF-8 become U+FFFD", b"caf\xc3\n", 4096, True, ("caf\ufffd\n", False)),
]


@pytest.mark.parametrize("case", POD_LOG_CASES, ids=[c.id for c in POD_LOG_CASES])
def test_a_pod_log_is_read_up_to_its_limit_and_last_whole_line(double: KubeDouble, kube: KubeClient,
                                                               case: PodLogCase) -> None:
    double.apply(serving_pod("p", "n1", scheduled=time.time()))
    double.set_log("serving", "p", "vllm", case.text, honor_limit=case.honored)
    assert kube.read_pod_log("serving", "p", container="vllm", limit_bytes=case.limit) == case.expected
    # the connection is still good (a longer reply's was closed, not pooled with bytes pending)
    assert kube.read_pod_log("serving", "p", container="vllm", limit_bytes=case.limit) == case.expected
