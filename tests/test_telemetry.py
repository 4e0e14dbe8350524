"""What the metrics say, measured on the real loops: the scaler's forecast error one horizon later,
its leadership, the agent's bytes per cache kind and its failed writes, the sync's relists and watch
restarts, and the ``--metrics-bind`` endpoint's answers.

The scaler runs its real loop on a real Redis with a scripted demand (tests/test_scale_loop.py's rig);
the agent scans a real cache directory and writes to a real Redis, then to one that was killed.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, NamedTuple, cast

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from extender.agent.loop import Agent, AgentSettings
from extender.agent.metrics import AgentMetrics
from extender.core.errors import ExtenderError, StateError
from extender.core.forecast import Forecast
from extender.core.inventory import InventorySnapshot, NodeState
from extender.core.policy import parse_policy
from extender.core.scaler import DecisionInputs, decide, horizon
from extender.files import PolicyFile, read_policy
from extender.kube.client import KubeClient
from extender.kube.metrics import SyncMetrics
from extender.kube.sync import ClusterSync, SyncSettings
from extender.scaler.loop import TickReport, WorkloadResult
from extender.scaler.metrics import ScalerMetrics, symmetric_error
from extender.state import InventoryStore, connect
from extender.state.sources import SourceStore
from extender.telemetry.endpoint import MetricsEndpoint
from extender.warm.loop import WarmLoop
from tests.conftest import RedisServer
from tests.scaler_policy import make_policy, policy_text
from tests.test_agent import NODE, cache  # noqa: F401 - the cache fixture
from tests.test_agent_scan import GiB
from tests.test_scale_loop import T0, TICK, make_rig

# ---- the forecast error --------------------------------------------------------------------------

ERRORS = [
    ("exact", 8.0, 8.0, 0.0),
    ("both-zero", 0.0, 0.0, 0.0),
    ("forecast-zero", 0.0, 5.0, 2.0),
    ("observed-zero", 5.0, 0.0, 2.0),
    ("half-again", 12.0, 8.0, 0.4),
    ("symmetric", 8.0, 12.0, 0.4),
]


@pytest.mark.parametrize(("forecast", "observed", "expected"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS])
def test_symmetric_error(forecast: float, observed: float, expected: float) -> None:
    assert symmetric_error(forecast, observed) == pytest.approx(expected)


def gauge(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def upper_checks(registry: CollectorRegistry, workload: str) -> tuple[float, float]:
    """(covered, exceeded) of ``extender_scaler_forecast_upper_checks_total``."""
    covered, exceeded = (gauge(registry, "extender_scaler_forecast_upper_checks_total", workload=workload, outcome=o)
                         for o in ("covered", "exceeded"))
    assert covered is not None and exceeded is not None  # both series exist from the start
    return covered, exceeded


@pytest.mark.integration
def test_the_forecast_is_scored_one_horizon_after_it_was_made(redis_server: RedisServer) -> None:
    """Steady demand: the error is 0. A step from 8 to 16: the forecasts made before it are off by 2/3."""
    step_at = T0 + 200 * TICK

    def demand(t: float) -> float:
        return 8.0 if t < step_at else 16.0

    rig = make_rig(redis_server.url, demand)
    registry = CollectorRegistry()
    metrics = ScalerMetrics(registry, rig.policy)
    horizon = 0.0
    errors: dict[float, float | None] = {}
    checks: dict[float, tuple[float, float]] = {}
    for k in range(210):
        report = rig.tick(T0 + k * TICK)
        metrics.observe(report)
        errors[report.now] = gauge(registry, "extender_scaler_forecast_error_ratio", workload="qwen3")
        checks[report.now] = upper_checks(registry, "qwen3")
        horizon = gauge(registry, "extender_scaler_horizon_seconds", workload="qwen3") or horizon
    assert horizon > TICK
    first_scored = T0 + horizon
    assert all(errors[t] == 0.0 for t in errors if t < first_scored)  # nothing due yet: the series at 0
    assert errors[step_at - TICK] == pytest.approx(0.0, abs=0.02)  # a steady demand was forecast right
    assert errors[step_at] == pytest.approx(symmetric_error(8.0, 16.0), abs=0.02)
    # the upper of a steady 8 covers 8 and not the 16 after the step: one check per forecast that came due
    due = sum(1 for t in errors if t + horizon <= step_at - TICK)
    assert checks[step_at - TICK] == (due, 0.0)
    covered, exceeded = checks[step_at]
    assert covered == due and exceeded >= 1
    assert sum(checks[T0 + 209 * TICK]) == sum(1 for t in errors if t + horizon <= T0 + 209 * TICK)
    assert gauge(registry, "extender_scaler_forecast_quantile", workload="qwen3") == 0.95
    # the observations kept for those windows reach back no further than the oldest pending one
    assert len(metrics._seen["qwen3"]) <= horizon / TICK + 2
    assert gauge(registry, "extender_scaler_observed_demand", workload="qwen3") == 16.0
    assert gauge(registry, "extender_scaler_leader") == 1.0
    assert gauge(registry, "extender_scaler_ticks_total", role="leader", result="ok") == 210.0
    assert gauge(registry, "extender_scaler_tick_duration_seconds_count") == 210.0


class Check(NamedTuple):
    id: str
    step_s: float  # the forecast's grid step
    demand: list[float]  # observed at the ticks from the due time - 45 s on
    covered: float
    exceeded: float


# one forecast, upper 20, due at T0 + 150 (horizon 120 + 15 + 15); the ticks around the due time
CHECKS = [
    Check("a tick's grid: the tick at the due time", 15.0, [99, 99, 99, 18, 99, 99], 1, 0),
    Check("... above the upper", 15.0, [0, 0, 0, 21, 0, 0], 0, 1),
    Check("a minute's grid: the mean of four ticks, the due tick above", 60.0, [99, 10, 10, 30, 10, 99], 1, 0),
    Check("... the mean above, the due tick under", 60.0, [0, 30, 30, 10, 30, 0], 0, 1),
]


@pytest.mark.parametrize("row", CHECKS, ids=[r.id for r in CHECKS])
def test_the_upper_is_checked_against_the_mean_over_its_grid_step(row: Check) -> None:
    # a forecast on a grid of s seconds is of the mean demand over the step around its time, not of
    # one tick of it: a minute's grid is checked against the mean of the ticks in [due - 30, due + 30)
    registry = CollectorRegistry()
    metrics = ScalerMetrics(registry, make_policy())
    h = horizon(120.0, TICK, 15.0)
    made = Forecast(point=15.0, upper=20.0, level=0.95, horizon_s=h.seconds, lead_s=h.seconds, requested="holt",
                    method="holt", observations=100, residuals=99, step_s=row.step_s, spread=5.0, t_end=T0)

    def tick(now: float, demand: float, forecast: Forecast | None = None) -> None:
        d = decide(DecisionInputs(workload="qwen3", now_s=now, demand=demand, capacity=10.0, ready=1,
                                  max_replicas=10, horizon=h, forecast=forecast))
        metrics.observe(TickReport(now, True, 1, "a", results=(WorkloadResult("qwen3", d),)))

    tick(T0, 15.0, made)
    due = T0 + h.seconds
    times = [due - 45.0 + TICK * i for i in range(len(row.demand))]
    for t in np.arange(T0 + TICK, times[0], TICK):
        tick(float(t), 0.0)
    for t, demand in zip(times, row.demand, strict=True):
        tick(t, demand)
    assert upper_checks(registry, "qwen3") == (row.covered, row.exceeded)


def test_a_standby_says_so_and_keeps_the_workload_series() -> None:
    registry = CollectorRegistry()
    metrics = ScalerMetrics(registry, make_policy())
    metrics.observe(TickReport(T0, False, 7, "other-candidate", duration_s=0.01))
    metrics.observe(TickReport(T0 + TICK, False, 0, "", error="leader election: store down"))
    assert gauge(registry, "extender_scaler_leader") == 0.0
    assert gauge(registry, "extender_scaler_ticks_total", role="standby", result="ok") == 1.0
    assert gauge(registry, "extender_scaler_ticks_total", role="standby", result="error") == 1.0
    assert gauge(registry, "extender_scaler_last_tick_timestamp_seconds") == T0 + TICK
    assert gauge(registry, "extender_scaler_desired_replicas", workload="llama") == 0.0


def test_the_published_placeholders_are_a_gauge() -> None:
    registry = CollectorRegistry()
    metrics = ScalerMetrics(registry, make_policy())
    decision = decide(DecisionInputs(workload="qwen3", now_s=T0, demand=30.0, capacity=10.0, ready=1,
                                     max_replicas=10, horizon=horizon(120.0, 15.0, 15.0)))
    metrics.observe(TickReport(T0, True, 1, "a", results=(WorkloadResult("qwen3", decision, standby=4),)))
    assert gauge(registry, "extender_scaler_standby_replicas", workload="qwen3") == 4.0
    metrics.observe(TickReport(T0 + TICK, True, 1, "a", results=(WorkloadResult("qwen3", decision),)))
    assert gauge(registry, "extender_scaler_standby_replicas", workload="qwen3") == 0.0


def test_samples_filled_from_the_past_are_counted() -> None:
    registry = CollectorRegistry()
    metrics = ScalerMetrics(registry, make_policy())
    decision = decide(DecisionInputs(workload="qwen3", now_s=T0, demand=30.0, capacity=10.0, ready=1,
                                     max_replicas=10, horizon=horizon(120.0, 15.0, 15.0)))
    assert gauge(registry, "extender_scaler_history_backfilled_samples_total", workload="qwen3") == 0.0
    metrics.observe(TickReport(T0, True, 1, "a", results=(WorkloadResult("qwen3", decision, backfilled=17_279),)))
    metrics.observe(TickReport(T0 + TICK, True, 1, "a", results=(WorkloadResult("qwen3", decision),)))
    assert gauge(registry, "extender_scaler_history_backfilled_samples_total", workload="qwen3") == 17_279.0


# ---- the agent -----------------------------------------------------------------------------------


@pytest.mark.integration
def test_the_agent_reports_bytes_per_kind_and_counts_failed_writes(cache: Path,  # noqa: F811 - the fixture
                                                                   redis_server: RedisServer, tmp_path: Path) -> None:
    registry = CollectorRegistry()
    client = connect(redis_server.url, tmp_path)
    a = Agent(AgentSettings(node_name=NODE, cache_root=cache), lambda: SourceStore(InventoryStore(client)),
              metrics=AgentMetrics(registry))
    try:
        report = a.scan()
        a.write(report)
        by_kind = {k: gauge(registry, "extender_agent_cache_bytes", kind=k)
                   for k in ("weights", "compile", "snapshot", "adapter")}
        entries = {k: gauge(registry, "extender_agent_cache_entries", kind=k)
                   for k in ("weights", "compile", "snapshot", "adapter")}
        assert by_kind["weights"] == float(sum(report.weights.values()))
        assert by_kind["weights"] == 16 * GiB + 43 * GiB  # llama3-8b complete, mixtral-61g partly there
        assert by_kind["compile"] == 4096 and by_kind["snapshot"] == 8 * GiB and by_kind["adapter"] == 0
        assert entries == {"weights": 2.0, "compile": 1.0, "snapshot": 1.0, "adapter": 0.0}
        assert gauge(registry, "extender_agent_nvme_free_bytes") == float(report.nvme_free)
        assert gauge(registry, "extender_agent_reports_total", result="written") == 1.0
        redis_server.kill()
        with pytest.raises(StateError):
            a.write(report)
        assert gauge(registry, "extender_agent_reports_total", result="failed") == 1.0
        assert gauge(registry, "extender_agent_scan_duration_seconds_count") == 1.0
    finally:
        client.close()


# ---- the sync's list-watch counters ----------------------------------------------------------------

#: (name, notes in order, relists of pods, watch restarts of pods, errors of pods)
NOTES = [
    ("first-list-and-watch", ["list", "watch"], 0.0, 0.0, 0.0),
    ("watch-timeout", ["list", "watch", "watch", "watch"], 0.0, 2.0, 0.0),
    ("gone-then-relist", ["list", "watch", "list", "watch"], 1.0, 1.0, 0.0),
    ("errors-retried", ["list", "error", "error", "watch"], 0.0, 0.0, 2.0),
]


@pytest.mark.parametrize(("notes", "relists", "restarts", "errors"), [n[1:] for n in NOTES],
                         ids=[n[0] for n in NOTES])
def test_relists_and_watch_restarts_leave_out_the_first(notes: list[str], relists: float, restarts: float,
                                                         errors: float) -> None:
    registry = CollectorRegistry()
    metrics = SyncMetrics(registry, make_policy())
    metrics.note("nodes", "list")
    for what in notes:
        metrics.note("pods", what)
    assert (gauge(registry, "extender_sync_relists_total", resource="pods"),
            gauge(registry, "extender_sync_watch_restarts_total", resource="pods"),
            gauge(registry, "extender_sync_watch_errors_total", resource="pods"),
            gauge(registry, "extender_sync_relists_total", resource="nodes")) == (relists, restarts, errors, 0.0)



MISTRAL = """\
  - name: mistral
    match: {labels: {extender.io/workload: mistral}}
    image: {reference: "vllm/vllm-openai:v0.11.0", size: 10GB}
    weights: {source: "s3://models/mistral/", version: v1, bytes: 14GB}
"""

#: (name, workload, node class, expected count after an edit that adds mistral: None when no series exists)
SYNC_EDITS = [
    ("added-workload-at-zero", "mistral", "h100", 0.0),
    ("added-workload-other-class", "mistral", "a10g", 0.0),
    ("kept-workload-kept", "qwen3", "h100", 0.0),
    ("outside-its-classes-none", "llama", "h100", None),
]


@pytest.mark.parametrize(("workload", "node_class", "expected"), [r[1:] for r in SYNC_EDITS],
                         ids=[r[0] for r in SYNC_EDITS])
def test_the_sync_creates_the_startup_series_of_a_reloaded_policy(tmp_path: Path, workload: str, node_class: str,
                                                                  expected: float | None) -> None:
    # rate() takes a new series' first sample as its baseline: a series made by the first start
    # would hide that start from ExtenderStartupEstimateOff
    path = tmp_path / "policy.yaml"
    path.write_text(policy_text())
    policy, version = read_policy(path)
    registry = CollectorRegistry()
    sync = ClusterSync(cast(KubeClient, None), lambda: cast(SourceStore, None), policy, SyncSettings(),
                       metrics=SyncMetrics(registry, policy), policy_file=PolicyFile(path, version))
    path.write_text(policy_text().replace("  - name: batch", MISTRAL + "  - name: batch"))
    assert sync.check_policy()
    for name in ("extender_replica_startup_seconds_count", "extender_replica_startup_estimate_ratio_count"):
        assert gauge(registry, name, workload=workload, node_class=node_class) == expected


# ---- the endpoint --------------------------------------------------------------------------------


def fetch(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


def test_the_endpoint_answers_metrics_and_probes() -> None:
    registry = CollectorRegistry()
    state: dict[str, Any] = {"ready": False}

    def ready() -> tuple[bool, dict[str, Any]]:
        if state.get("raise"):
            raise RuntimeError("probe broke")
        return state["ready"], {"why": "no report yet" if not state["ready"] else "ok"}

    endpoint = MetricsEndpoint("127.0.0.1:0", registry, ready=ready).start()
    base = f"http://127.0.0.1:{endpoint.port}"
    try:
        AgentMetrics(registry)
        code, content_type, body = fetch(f"{base}/metrics")
        assert (code, content_type.count("charset")) == (200, 1)
        assert b'extender_agent_reports_total{result="failed"} 0.0' in body
        assert fetch(f"{base}/healthz")[0] == 200
        code, _, body = fetch(f"{base}/readyz")
        assert (code, json.loads(body)) == (503, {"ready": False, "why": "no report yet"})
        state["ready"] = True
        assert fetch(f"{base}/readyz")[0] == 200
        state["raise"] = True
        code, _, body = fetch(f"{base}/readyz")
        assert (code, json.loads(body)["error"]) == (503, "RuntimeError: probe broke")
        assert fetch(f"{base}/other")[0] == 404
    finally:
        endpoint.close()


def test_a_taken_port_is_a_clear_error() -> None:
    first = MetricsEndpoint("127.0.0.1:0", CollectorRegistry()).start()
    try:
        with pytest.raises(ExtenderError, match=rf"--metrics-bind 127.0.0.1:{first.port}: cannot listen"):
            MetricsEndpoint(f"127.0.0.1:{first.port}", CollectorRegistry())
    finally:
        first.close()


# ---- the warmer's NVMe reserve -----------------------------------------------------------------------

RESERVE_POLICY = policy_text().replace("nvme: {capacity: 30TB, readBandwidth: 30GB/s}",
                                       "nvme: {capacity: 30TB, readBandwidth: 30GB/s, reserve: 2TB}")


def h100(name: str, free_tb: float, *, heartbeat: float = T0) -> NodeState:
    return NodeState.model_validate({
        "name": name, "nodeClass": "h100", "gpus": 8, "gpusFree": 8, "nvmeTotal": 30 * 10**12,
        "nvmeFree": int(free_tb * 10**12), "heartbeat": heartbeat, "ttl": 60,
    })


#: (name, h100 nodes, expected count below the 2 TB reserve)
RESERVE = [
    ("all-above", [h100("a", 5), h100("b", 2)], 0.0),
    ("one-below", [h100("a", 5), h100("b", 1.5)], 1.0),
    ("stale-node-not-counted", [h100("a", 1), h100("b", 0.5, heartbeat=T0 - 3600)], 1.0),
]


@pytest.mark.parametrize(("nodes", "expected"), [r[1:] for r in RESERVE], ids=[r[0] for r in RESERVE])
def test_the_warmer_counts_fresh_nodes_below_their_class_reserve(nodes: list[NodeState], expected: float) -> None:
    policy = parse_policy(RESERVE_POLICY, "reserve.yaml")
    registry = CollectorRegistry()
    warm = WarmLoop(policy, None, None, registry=registry)
    warm.tick(T0, snapshot=InventorySnapshot.build(policy, nodes, taken_at=T0))
    assert gauge(registry, "extender_warm_nodes_below_nvme_reserve", node_class="h100") == expected
    assert gauge(registry, "extender_warm_nodes_below_nvme_reserve", node_class="a10g") == 0.0


# ---- a policy edit that drops a workload or a node class --------------------------------------------


def _without_llama(text: str) -> str:
    return text[:text.index("  - name: llama")] + text[text.index("  - name: batch"):]


#: (name, the sample after the edit that dropped llama, its expected value: None when the series is gone)
DROPPED_WORKLOAD = [
    ("forecast-error-gone", "extender_scaler_forecast_error_ratio", {"workload": "llama"}, None),
    ("desired-gone", "extender_scaler_desired_replicas", {"workload": "llama"}, None),
    ("replicas-gone", "extender_scaler_replicas", {"workload": "llama", "state": "ready"}, None),
    ("driver-gone", "extender_scaler_decision_driver", {"workload": "llama", "driver": "reactive"}, None),
    ("counter-kept", "extender_scaler_decisions_total", {"workload": "llama", "action": "scale-up",
                                                         "driver": "reactive"}, 1.0),
    ("kept-workload-kept", "extender_scaler_forecast_error_ratio", {"workload": "qwen3"}, 0.9),
]


@pytest.mark.parametrize(("name", "labels", "expected"), [r[1:] for r in DROPPED_WORKLOAD],
                         ids=[r[0] for r in DROPPED_WORKLOAD])
def test_a_workload_the_policy_drops_leaves_no_gauge_behind(name: str, labels: dict[str, str],
                                                            expected: float | None) -> None:
    # nothing writes a dropped workload's gauges again: their last values would hold alerts firing
    registry = CollectorRegistry()
    metrics = ScalerMetrics(registry, make_policy())
    results = tuple(WorkloadResult(w, decide(DecisionInputs(workload=w, now_s=T0, demand=30.0, capacity=10.0, ready=1,
                                                            max_replicas=10, horizon=horizon(120.0, TICK, 15.0))))
                    for w in ("qwen3", "llama"))
    metrics.observe(TickReport(T0, True, 1, "a", results=results))
    for w in ("qwen3", "llama"):
        metrics.forecast_error.labels(w).set(0.9)  # what a missed forecast leaves
    metrics.set_policy(parse_policy(_without_llama(policy_text()), "edited.yaml"))
    assert gauge(registry, name, **labels) == expected


#: (name, the policy after the edit, node class or workload, sample, expected: None when the series is gone)
DROPPED_BY_THE_WARMER = [
    ("renamed-class-gone", RESERVE_POLICY.replace("  - name: h100\n", "  - name: h100-sxm\n"),
     "extender_warm_nodes_below_nvme_reserve", {"node_class": "h100"}, None),
    ("new-class-at-zero", RESERVE_POLICY.replace("  - name: h100\n", "  - name: h100-sxm\n"),
     "extender_warm_nodes_below_nvme_reserve", {"node_class": "h100-sxm"}, 0.0),
    ("kept-class-kept", RESERVE_POLICY, "extender_warm_nodes_below_nvme_reserve", {"node_class": "h100"}, 1.0),
    ("dropped-workload-gone", _without_llama(RESERVE_POLICY), "extender_warm_plan_saved_seconds",
     {"workload": "llama"}, None),
]


@pytest.mark.parametrize(("edited", "name", "labels", "expected"), [r[1:] for r in DROPPED_BY_THE_WARMER],
                         ids=[r[0] for r in DROPPED_BY_THE_WARMER])
def test_the_warmer_drops_the_series_of_classes_and_workloads_the_policy_drops(
        edited: str, name: str, labels: dict[str, str], expected: float | None) -> None:
    policy = parse_policy(RESERVE_POLICY, "reserve.yaml")
    registry = CollectorRegistry()
    warm = WarmLoop(policy, None, None, registry=registry)
    warm.tick(T0, snapshot=InventorySnapshot.build(policy, [h100("a", 1)], taken_at=T0))
    assert gauge(registry, "extender_warm_nodes_below_nvme_reserve", node_class="h100") == 1.0
    warm.set_policy(parse_policy(edited, "edited.yaml"))
    assert gauge(registry, name, **labels) == expected


# ---- the leader's view of the inventory ---------------------------------------------------------------


def _node(name: str, instance_type: str, *, heartbeat: float) -> NodeState:
    return NodeState.model_validate({"name": name, "labels": {"node.kubernetes.io/instance-type": instance_type},
                                     "gpus": 8, "heartbeat": heartbeat, "ttl": 60})


#: (name, inventory records, expected (fresh, stale) of extender_scaler_inventory_nodes)
INVENTORY_VIEWS = [
    ("gpu-nodes-reporting", [_node("gpu-1", "p5.48xlarge", heartbeat=T0), _node("gpu-2", "g5.12xlarge", heartbeat=T0)],
     (2.0, 0.0)),
    ("agent-stopped", [_node("gpu-1", "p5.48xlarge", heartbeat=T0), _node("gpu-2", "g5.12xlarge", heartbeat=T0 - 600)],
     (1.0, 1.0)),
    ("agent-never-ran-on-a-gpu-node", [_node("gpu-1", "p5.48xlarge", heartbeat=0.0)], (0.0, 1.0)),
    ("cpu-nodes-have-no-agent", [_node("gpu-1", "p5.48xlarge", heartbeat=T0), _node("cpu-1", "m5.large", heartbeat=0.0),
                                 _node("control-plane", "m5.xlarge", heartbeat=0.0)], (1.0, 0.0)),
]


@pytest.mark.integration
@pytest.mark.parametrize(("nodes", "expected"), [r[1:] for r in INVENTORY_VIEWS], ids=[r[0] for r in INVENTORY_VIEWS])
def test_the_leader_counts_stale_nodes_of_its_node_classes_only(redis_server: RedisServer, nodes: list[NodeState],
                                                                expected: tuple[float, float]) -> None:
    # the sync records every node, and no agent runs on a CPU node: its record never has a
    # heartbeat, and counted as stale it would hold ExtenderInventoryStale firing for good
    rig = make_rig(redis_server.url, lambda t: 8.0, nodes=nodes)
    registry = CollectorRegistry()
    ScalerMetrics(registry, rig.policy).observe(rig.tick(T0))
    assert (gauge(registry, "extender_scaler_inventory_nodes", freshness="fresh"),
            gauge(registry, "extender_scaler_inventory_nodes", freshness="stale")) == expected
