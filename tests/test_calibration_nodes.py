"""Per-node calibration: a node that starts replicas slower than its class's peers gets a factor on its
whole estimate (extender/core/calibration.py, "Per-node factors"), shrunk, bounded, expiring; the
extender scores with it and a fleet without per-node differences scores as before."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.api.scheduler.engine import Engine
from extender.api.scheduler.wire import NodeInfo
from extender.core.calibration import (
    NO_NODE_FACTORS,
    NODE_DEADBAND,
    NodeFactors,
    Observation,
    calibrate,
    effective_calibration,
)
from extender.core.estimate import STATES
from extender.core.inventory import InventorySnapshot, NodeState
from extender.core.policy import Policy, parse_policy
from extender.state.observations import CalibratedPolicy, ObservationStore
from tests.calibration_world import refresher_on, true_seconds
from tests.conftest import RedisServer

ROOT = Path(__file__).resolve().parent.parent
POLICY_TEXT = (ROOT / "policies" / "g5-pcie-fleet.yaml").read_text()
APPLY = parse_policy(POLICY_TEXT + "calibration: {mode: apply}\n")
#: The same, with fits that are never applied (fewer starts than 200): every start is estimated with the policy.
UNFITTED = parse_policy(POLICY_TEXT + "calibration: {mode: apply, minObservations: 200}\n")
CLASS = "g5.12xlarge"
LLAMA, MIXTRAL = "llama3-8b", "mixtral-61g"
PEERS = ("peer-0", "peer-1", "peer-2", "peer-3", "peer-4")
T0 = 1.75e9
_WORDS = {0: "absent", 1: "registry", 2: "local"}


def start(policy: Policy, workload: str, node: str, state: str, at: float, *, slowness: float = 1.0,
          noise: float = 1.0, index: int = 0) -> Observation:
    """One start of ``workload`` on ``node`` in the named state, ``slowness`` x the policy's seconds."""
    p, named = policy.profile(workload), STATES[state]
    seconds = true_seconds(policy, workload, CLASS, state) * slowness * noise
    return Observation(
        pod=f"serving/{workload}-{node}-{index}-{at:.0f}", workload=workload, node=node, node_class=CLASS,
        image_reference=p.image.reference, weights_version=p.weights.version, image=named.image,
        weights_bytes=float(p.weights.bytes) if named.weights else 0.0, compile=_WORDS[int(named.compile)],
        snapshot=named.snapshot, adapters=(named.adapters,) * len(p.preloaded_adapters), scheduled_at=at,
        ready_at=at + seconds)


def fleet(policy: Policy, per_node: int, *, slow: str | None = None, slowness: float = 1.5,
          slow_starts: int | None = None, states: Sequence[str] = ("warm",), t0: float = T0,
          noise: float = 0.0, seed: int = 0) -> list[Observation]:
    """``per_node`` starts of each workload on every peer (and on ``slow``: ``slow_starts``, that many x slowness),
    cycling through ``states``, a minute apart, with log-normal noise ``noise``."""
    rng = np.random.default_rng(seed)
    out: list[Observation] = []
    nodes = [*PEERS, *([slow] if slow else [])]
    for node in nodes:
        count = slow_starts if node == slow and slow_starts is not None else per_node
        for workload in (LLAMA, MIXTRAL):
            for i in range(count):
                at = t0 + 60.0 * (len(out) + 1)
                out.append(start(policy, workload, node, states[i % len(states)], at,
                                 slowness=slowness if node == slow else 1.0,
                                 noise=float(np.exp(rng.normal(0.0, noise))), index=i))
    return out


def shrunk(slowness: float, n: int, k: float) -> float:
    """The formula for n starts all ``slowness`` x their peers': ``m = n / (n + k) x ln(slowness)``,
    less the dead band, ``exp(sign(m) max(|m| - d, 0))``."""
    m = n / (n + k) * math.log(slowness)
    return math.exp(math.copysign(max(abs(m) - NODE_DEADBAND, 0.0), m))


# ---- the fit --------------------------------------------------------------------------------------------------


class SlowCase(NamedTuple):
    policy: Policy
    slow_starts: int
    states: tuple[str, ...]


@pytest.mark.parametrize("case", [
    pytest.param(SlowCase(APPLY, 10, ("warm",)), id="ten-warm-starts-per-workload-fits-applied"),
    pytest.param(SlowCase(APPLY, 10, ("image",)), id="ten-image-starts-per-workload-fits-applied"),
    pytest.param(SlowCase(UNFITTED, 10, ("cold", "image", "image+weights", "warm")), id="mixed-states-policy"),
    pytest.param(SlowCase(APPLY, 1, ("warm",)), id="one-start-per-workload-moves-it-little"),
    pytest.param(SlowCase(APPLY, 2, ("warm",)), id="two-starts-per-workload"),
])
def test_a_slow_node_gets_its_slowness_shrunk_by_the_prior(case: SlowCase) -> None:
    observed = fleet(case.policy, 10, slow="slow-0", slow_starts=case.slow_starts, states=case.states)
    nodes = calibrate(case.policy, observed, now=T0 + 86_400).nodes
    k = case.policy.calibration.prior_observations
    n = 2 * case.slow_starts  # both workloads' starts count
    got = nodes.nodes["slow-0"]
    assert got.starts == n and got.confidence == pytest.approx(n / (n + k))
    assert got.factor == pytest.approx(shrunk(1.5, n, k), rel=1e-6)
    # the peers are the class (exactly: the float rounding of times near 1.75e9 s is inside the dead band)
    assert all(nodes.factor(p) == 1.0 for p in PEERS)
    if case.slow_starts == 1:
        assert got.factor < 1.2  # two starts against a prior worth three: less than half the way (in log)


@pytest.mark.parametrize(("now", "expected_n"), [
    pytest.param(T0 + 3600 * 48, None, id="slow-and-fixed-starts-both-count"),
    pytest.param(T0 + 86_400 * 8, 0, id="slow-starts-expired-the-fixed-ones-remain"),
])
def test_a_fixed_node_drifts_back_as_its_slow_starts_expire(now: float, expected_n: int | None) -> None:
    slow = fleet(APPLY, 10, slow="slow-0", slow_starts=10)
    fixed = fleet(APPLY, 10, slow="slow-0", slowness=1.0, slow_starts=3, t0=T0 + 86_400 * 2)  # replaced disk
    nodes = calibrate(APPLY, [*slow, *fixed], now=now).nodes
    got = nodes.nodes["slow-0"]
    if expected_n is None:  # 20 slow starts and 6 normal ones: the median still says slow, by less
        assert got.starts == 26 and 1.0 < got.factor <= shrunk(1.5, 26, 3.0) + 1e-12
    else:
        assert got.starts == 6 and got.factor == 1.0


def test_a_penalized_idle_node_goes_back_to_one_when_its_starts_expire() -> None:
    observed = fleet(APPLY, 10, slow="slow-0", slow_starts=10)
    assert calibrate(APPLY, observed, now=T0 + 86_400).nodes.factor("slow-0") > 1.3
    later = fleet(APPLY, 10, t0=T0 + 86_400 * 6)  # its peers kept starting replicas, it got none
    nodes = calibrate(APPLY, [*observed, *later], now=T0 + 86_400 * 8).nodes  # maxAge 7d
    assert "slow-0" not in nodes.nodes and nodes.factor("slow-0") == 1.0


@pytest.mark.parametrize("node", [
    pytest.param("never-started-here", id="node-without-starts"),
    pytest.param("", id="empty-name"),
])
def test_a_node_without_starts_has_factor_one(node: str) -> None:
    nodes = calibrate(APPLY, fleet(APPLY, 5, slow="slow-0", slow_starts=5), now=T0 + 86_400).nodes
    assert nodes.factor(node) == 1.0 and NO_NODE_FACTORS.factor(node) == 1.0 and not NO_NODE_FACTORS


@pytest.mark.parametrize(("noise", "tolerance"), [
    pytest.param(0.0, 0.0, id="identical-nodes-exactly-one"),
    pytest.param(0.05, 0.05, id="five-percent-noise-within-its-shrinkage"),
])
def test_a_fleet_without_per_node_differences_gives_one_everywhere(noise: float, tolerance: float) -> None:
    observed = fleet(APPLY, 12, states=("cold", "image", "image+weights", "warm"), noise=noise, seed=5)
    nodes = calibrate(APPLY, observed, now=T0 + 86_400).nodes
    assert set(nodes.nodes) == set(PEERS)
    # each node's median of 24 centred residuals, shrunk by 24 / 27: a few percent at 5 % noise
    assert all(abs(math.log(f.factor)) <= tolerance for f in nodes.nodes.values())
    if noise == 0.0:
        assert not nodes and nodes.differing(0.0) == []


@settings(max_examples=30, deadline=None)
@given(slowness=st.floats(0.01, 100.0), count=st.integers(1, 12), low=st.floats(0.1, 1.0),
       high=st.floats(1.0, 10.0), prior=st.floats(0.1, 50.0))
def test_the_node_factor_never_leaves_its_bounds(slowness: float, count: int, low: float, high: float,
                                                 prior: float) -> None:
    policy = parse_policy(POLICY_TEXT + f"calibration: {{mode: apply, priorObservations: {prior!r}, "
                          f"bounds: {{node: {{min: {low!r}, max: {high!r}}}}}}}\n")
    observed = fleet(policy, count, slow="slow-0", slowness=slowness, slow_starts=count)  # a sixth of each pair
    got = calibrate(policy, observed, now=T0 + 86_400).nodes.nodes["slow-0"]
    assert low <= got.factor <= high and (got.lower, got.upper) == (low, high)
    unbounded = shrunk(slowness, 2 * count, prior)
    assert got.factor == pytest.approx(min(max(unbounded, low), high), rel=1e-6)


def test_effective_calibration_gives_factors_only_in_apply_mode() -> None:
    observed = fleet(APPLY, 5, slow="slow-0", slow_starts=5)
    suggest = parse_policy(POLICY_TEXT + "calibration: {mode: suggest}\n")
    assert effective_calibration(suggest, observed, now=T0 + 86_400) == (suggest, NO_NODE_FACTORS)
    policy, nodes = effective_calibration(APPLY, observed, now=T0 + 86_400)
    assert policy is not APPLY and nodes.factor("slow-0") == pytest.approx(shrunk(1.5, 10, 3.0))


# ---- the extender --------------------------------------------------------------------------------------------


def records(names: Sequence[str], now: float) -> list[NodeState]:
    """Fresh g5.12xlarge records with four free GPUs, every other one holding llama3-8b's image."""
    image = APPLY.profile(LLAMA).image.reference
    return [NodeState.model_validate({"name": name, "nodeClass": CLASS, "gpus": 4, "gpusFree": 4,
                                      "images": [image] if i % 2 == 0 else [], "heartbeat": now})
            for i, name in enumerate(names)]


def engine_scores(policy: Policy, nodes: NodeFactors, names: Sequence[str], now: float) -> dict[str, int]:
    snapshot = InventorySnapshot.build(policy, records(names, now), version=1, taken_at=now)
    engine = Engine(policy, snapshot, nodes=nodes)
    body = engine.prioritize_names(policy.profile(LLAMA), [*names, "not-in-inventory"], now)
    return {item["Host"]: int(item["Score"]) for item in json.loads(body)}


def test_a_fleet_without_per_node_differences_scores_as_before() -> None:
    names = [*PEERS, "slow-0"]
    observed = fleet(APPLY, 6, states=("cold", "warm"))
    observed += fleet(APPLY, 0, slow="slow-0", slowness=1.0, slow_starts=6, states=("cold", "warm"))
    policy, nodes = effective_calibration(APPLY, observed, now=T0 + 86_400)
    assert set(nodes.nodes) == set(names)
    now = T0 + 86_400
    # oracle: the engine as it was, without per-node factors
    assert engine_scores(policy, nodes, names, now) == engine_scores(policy, NO_NODE_FACTORS, names, now)


def test_the_extender_and_explain_prefer_the_peers_of_a_slow_node() -> None:
    names = ["slow-0", *PEERS]  # it holds the image, as peer-1 and peer-3 do
    observed = fleet(APPLY, 10, slow="slow-0", slowness=3.0, slow_starts=10, states=("cold", "image", "warm"))
    policy, nodes = effective_calibration(APPLY, observed, now=T0 + 86_400)
    now = T0 + 86_400
    before = engine_scores(policy, NO_NODE_FACTORS, names, now)
    after = engine_scores(policy, nodes, names, now)
    assert after["slow-0"] < before["slow-0"] and before["slow-0"] == before["peer-1"] > after["slow-0"]
    assert {n: after[n] for n in PEERS} == {n: before[n] for n in PEERS}  # its peers as before
    assert after["not-in-inventory"] == before["not-in-inventory"]
    snapshot = InventorySnapshot.build(policy, records(names, now), version=1, taken_at=now)
    engine = Engine(policy, snapshot, nodes=nodes)
    plain = Engine(policy, snapshot)
    asked = [NodeInfo(n, {}, ()) for n in ("slow-0", "peer-0", "elsewhere")]
    rows = {r["node"]: r for r in engine.explain(policy.profile(LLAMA), asked, now)}
    plain_rows = {r["node"]: r for r in plain.explain(policy.profile(LLAMA), asked, now)}
    r = nodes.factor("slow-0")
    assert rows["slow-0"]["nodeFactor"] == pytest.approx(r, abs=1e-4)
    assert rows["slow-0"]["totalSeconds"] == pytest.approx(plain_rows["slow-0"]["totalSeconds"] * r, rel=1e-3)
    assert rows["peer-0"]["nodeFactor"] == 1.0 and rows["elsewhere"]["nodeFactor"] == 1.0
    assert rows["peer-0"]["totalSeconds"] == plain_rows["peer-0"]["totalSeconds"]


# ---- through the store (real Redis) -----------------------------------------------------------------------


@pytest.fixture
def client(redis_client: redis.Redis) -> redis.Redis:
    return redis_client


@pytest.mark.integration
def test_the_calibrated_policy_carries_the_node_factors_and_keeps_them_through_an_outage(
        redis_server: RedisServer, client: Any) -> None:
    now = time.time()
    store = ObservationStore(client)
    reader = CalibratedPolicy(store, clock=lambda: now, min_interval_s=0.0)
    assert reader.calibration_for(APPLY) == (APPLY, NO_NODE_FACTORS)
    store.append(fleet(APPLY, 6, slow="slow-0", slow_starts=6, t0=now - 86_400), now=now)
    policy, nodes = reader.calibration_for(APPLY)
    assert nodes.factor("slow-0") == pytest.approx(shrunk(1.5, 12, 3.0))
    assert reader.calibration_for(APPLY)[1] is nodes  # no new start: the same object (the engine is kept)
    redis_server.kill()
    assert reader.calibration_for(APPLY) == (policy, nodes) and reader.error is not None


@pytest.mark.integration
def test_the_refresher_builds_its_engine_with_the_node_factors(client: Any, tmp_path: Path) -> None:
    refresher = refresher_on(client, tmp_path, POLICY_TEXT + "calibration: {mode: apply}\n", APPLY)
    refresher.refresh_once()
    assert refresher.engine is not None and refresher.engine.nodes is NO_NODE_FACTORS
    ObservationStore(client).append(fleet(APPLY, 6, slow="slow-0", slow_starts=6, t0=time.time() - 86_400),
                                    now=time.time())
    refresher.refresh_once()
    refresher.refresh_once()
    engine = refresher.engine
    assert engine is not None and engine.nodes.factor("slow-0") == pytest.approx(shrunk(1.5, 12, 3.0))
    assert engine.nodes is refresher.estimator_nodes


@pytest.mark.integration
def test_calibrate_show_lists_the_nodes_off_their_class(redis_server: RedisServer, client: Any, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from extender import cli

    path = tmp_path / "policy.yaml"
    path.write_text(POLICY_TEXT + "calibration: {mode: suggest}\n")
    ObservationStore(client).append(fleet(APPLY, 6, slow="slow-0", slow_starts=6, t0=time.time() - 86_400),
                                    now=time.time())
    store_args = ["--redis-url", redis_server.url]
    assert cli.main(["calibrate", "show", "--policy", str(path), "--json", *store_args]) == 0
    (shown,) = json.loads(capsys.readouterr().out)["nodes"]  # the peers are their class: not listed
    assert (shown["node"], shown["starts"]) == ("slow-0", 12)
    assert shown["factor"] == pytest.approx(shrunk(1.5, 12, 3.0), abs=1e-4)
    assert shown["confidence"] == pytest.approx(12 / 15, abs=1e-4) and shown["bounds"] == [0.25, 4.0]
    assert cli.main(["calibrate", "show", "--policy", str(path), "--limit", "0", *store_args]) == 0
    text = capsys.readouterr().out
    assert "nodes estimated more than 5% off their class" in text and "(not applied: mode suggest)" in text
    (row,) = [line for line in text.splitlines() if line.strip().startswith("slow-0")]
    assert row.split()[1:4] == [f"{shrunk(1.5, 12, 3.0):.2f}", "12", "0.80"]


@pytest.mark.parametrize(("names", "with_factors", "expected"), [
    pytest.param(["slow-0", "peer-0", "peer-1"], False, "slow-0", id="without-factors-the-first-warm-node"),
    pytest.param(["slow-0", "peer-0", "peer-1"], True, "peer-1", id="with-factors-its-warm-peer"),
    pytest.param(["slow-0", "peer-0"], True, "slow-0", id="the-only-warm-node-at-its-factor"),
])
def test_the_scaler_places_the_next_replica_with_the_node_factors(names: list[str], with_factors: bool,
                                                                  expected: str) -> None:
    from extender.core.placement import next_replica

    observed = fleet(APPLY, 10, slow="slow-0", slowness=3.0, slow_starts=10, states=("cold", "image", "warm"))
    now = T0 + 86_400
    policy, nodes = effective_calibration(APPLY, observed, now=now)
    snapshot = InventorySnapshot.build(policy, records(names, now), version=1, taken_at=now)
    plain = next_replica(policy, policy.profile(LLAMA), snapshot, now)
    got = next_replica(policy, policy.profile(LLAMA), snapshot, now, nodes if with_factors else NO_NODE_FACTORS)
    assert got.node == expected
    factor = nodes.factor(expected) if with_factors else 1.0
    assert got.startup_s == pytest.approx(plain.startup_s * factor if expected == plain.node else plain.startup_s)
