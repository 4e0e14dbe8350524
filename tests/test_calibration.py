"""The calibration fitter (pure): design = estimator, convergence in a world off by 2x, robustness,
identifiability, bounds, confidence, and the one function that applies a fit to a policy."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.core.calibration import (
    COLD,
    GRAPH,
    IMAGE,
    INIT,
    LOCAL,
    PARAMETERS,
    REMOTE,
    WARM,
    Fit,
    Observation,
    PolicyValues,
    apply_calibration,
    box_ridge,
    cache_state,
    calibrate,
    design,
    effective_policy,
    estimate_errors,
    fit_pair,
)
from extender.core.errors import PolicyError
from extender.core.estimate import STATES, CacheState, breakdown, estimate
from extender.core.policy import Policy, cross_check, parse_policy
from extender.files import load_policy
from tests.calibration_world import STARTS, factors, round_robin, starts, true_seconds, world

ROOT = Path(__file__).resolve().parent.parent
QWEN = load_policy(ROOT / "policies" / "eks-p5-qwen3-moe.yaml")
WORKLOAD, CLASS = "qwen3-moe", "p5.48xlarge"
POLICIES = sorted([*(ROOT / "policies").glob("*.yaml"), *(ROOT / "scenarios").glob("*-policy.yaml")])


def with_calibration(policy: Policy, **update: object) -> Policy:
    return policy.model_copy(update={"calibration": policy.calibration.model_copy(update=update)})


APPLY = with_calibration(QWEN, mode="apply")


def calibrated_seconds(policy: Policy, state: str) -> float:
    return float(breakdown(policy.profile(WORKLOAD), policy.node_class(CLASS))[state]["total_s"])


# ---- the design is the estimator ------------------------------------------------------------------


@pytest.mark.parametrize("path", POLICIES, ids=[p.stem for p in POLICIES])
def test_design_at_factor_one_is_the_estimator(path: Path) -> None:
    policy = load_policy(path)
    rng = np.random.default_rng(3)
    n = 300
    for profile in policy.profiles:
        for node_class in policy.classes_for(profile):
            state = CacheState(rng.random(n) < 0.5,
                               rng.choice([0.0, 0.3, 1.0], n) * profile.weights.bytes,
                               rng.integers(0, 3, n).astype(np.int8), rng.random(n) < 0.5,
                               rng.choice([0.0, 5e9, 1e11], n), rng.random((n, len(profile.preloaded_adapters))) < 0.5)
            expected = estimate(profile, [node_class], np.zeros(n, dtype=np.intp), state).total_s
            got = design(profile, node_class, state).total(np.ones(len(PARAMETERS)))
            np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-9)


def test_applying_the_true_factors_gives_the_worlds_estimates() -> None:
    truth = factors(imagePull=2, weightsRemote=2, weightsLocal=0.5, compileCold=3, compileWarm=1.5, engine=0.7)
    true_world = world(QWEN, WORKLOAD, CLASS, truth)
    node_class = QWEN.node_class(CLASS)
    d = design(QWEN.profile(WORKLOAD), node_class, cache_state(starts(QWEN, true_world, WORKLOAD, CLASS, STARTS,
                                                                       noise=0.0)))
    expected = [true_seconds(true_world, WORKLOAD, CLASS, s) for s in STARTS]
    np.testing.assert_allclose(d.total(np.array(truth)), expected, rtol=1e-12)


# ---- convergence: a world off by 2x --------------------------------------------------------------------

#: (name, true factors, starts observed, cycling through cold, image, image+weights, warm). With the
#: default prior (3 starts) 160 starts bring every named state within 10 % of the truth when the
#: world is slower; a world twice as fast is further in the prior's terms (the policy's values are
#: twice the truth) and takes 280, more than the default window of 200 keeps (raised here).
WORLDS = [
    ("everything-2x-slower", factors(**dict.fromkeys(PARAMETERS, 2.0)), 160),
    ("half-bucket-bandwidth-twice-the-compile",
     factors(imagePull=2, weightsRemote=2, compileCold=2, compileWarm=2), 160),
    ("slow-downloads-fast-warm-compile", factors(imagePull=2, weightsRemote=2, compileCold=2, compileWarm=0.5), 160),
    ("everything-2x-faster", factors(**dict.fromkeys(PARAMETERS, 0.5)), 280),
]


@pytest.mark.parametrize(("truth", "n"), [w[1:] for w in WORLDS], ids=[w[0] for w in WORLDS])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_world_off_by_2x_is_learnt_within_10_percent(truth: tuple[float, ...], n: int, seed: int) -> None:
    true_world = world(QWEN, WORKLOAD, CLASS, truth)
    observed = starts(QWEN, true_world, WORKLOAD, CLASS, round_robin(n), noise=0.05, seed=seed)
    before = {s: calibrated_seconds(QWEN, s) / true_seconds(true_world, WORKLOAD, CLASS, s) - 1 for s in STARTS}
    calibrated = effective_policy(with_calibration(APPLY, window=400), observed)
    after = {s: calibrated_seconds(calibrated, s) / true_seconds(true_world, WORKLOAD, CLASS, s) - 1 for s in STARTS}
    assert max(abs(e) for e in before.values()) > 0.3, before  # the policy alone is far off
    assert max(abs(e) for e in after.values()) < 0.10, after


def test_the_error_falls_as_starts_are_observed() -> None:
    truth = factors(**dict.fromkeys(PARAMETERS, 2.0))
    true_world = world(QWEN, WORKLOAD, CLASS, truth)
    observed = starts(QWEN, true_world, WORKLOAD, CLASS, round_robin(160), noise=0.05, seed=4)
    worst = []
    for n in (0, 8, 20, 40, 80, 160):
        calibrated = effective_policy(APPLY, observed[:n])
        worst.append(max(abs(calibrated_seconds(calibrated, s) / true_seconds(true_world, WORKLOAD, CLASS, s) - 1)
                         for s in STARTS))
    assert worst == sorted(worst, reverse=True), worst
    assert worst[0] > 0.45 and worst[-1] < 0.10, worst


def test_a_few_observations_cannot_swing_it() -> None:
    true_world = world(QWEN, WORKLOAD, CLASS, factors(**dict.fromkeys(PARAMETERS, 2.0)))
    one = starts(QWEN, true_world, WORKLOAD, CLASS, ["warm"], noise=0.0)
    fit = fit_pair(APPLY, APPLY.profile(WORKLOAD), APPLY.node_class(CLASS), one)
    moved = calibrated_seconds(apply_calibration(APPLY, [replace(fit, applied=True)]), "warm")
    policy_s, true_s = calibrated_seconds(QWEN, "warm"), true_seconds(true_world, WORKLOAD, CLASS, "warm")
    share = (moved - policy_s) / (true_s - policy_s)
    # one observation against a prior worth three: a quarter of the way (1 / (1 + 3))
    assert 0.2 < share < 0.3, share


def test_outliers_are_down_weighted() -> None:
    truth = factors(**dict.fromkeys(PARAMETERS, 2.0))
    true_world = world(QWEN, WORKLOAD, CLASS, truth)
    observed = starts(QWEN, true_world, WORKLOAD, CLASS, round_robin(80), noise=0.03, seed=5)
    wild = [o.model_copy(update={"ready_at": o.scheduled_at + 10 * o.total_s}) for o in observed[:6]]
    calibrated = effective_policy(APPLY, [*wild, *observed[6:]])
    for s in STARTS:
        assert abs(calibrated_seconds(calibrated, s) / true_seconds(true_world, WORKLOAD, CLASS, s) - 1) < 0.12, s


# ---- identifiability ----------------------------------------------------------------------------------


def test_an_always_warm_fleet_teaches_nothing_about_cold_starts() -> None:
    true_world = world(QWEN, WORKLOAD, CLASS, factors(**dict.fromkeys(PARAMETERS, 2.0)))
    observed = starts(QWEN, true_world, WORKLOAD, CLASS, ["warm"] * 60, seed=6)
    fit = calibrate(APPLY, observed).fits[(WORKLOAD, CLASS)]
    for j in (IMAGE, REMOTE, COLD):
        assert fit.factors[j] == 1.0 and fit.confidence[j] == 0.0, PARAMETERS[j]
    warm_group = [fit.confidence[j] for j in (LOCAL, WARM, GRAPH, INIT)]
    assert all(0 < c < 1 for c in warm_group)
    # what it did learn: the warm start itself
    calibrated = effective_policy(APPLY, observed)
    assert abs(calibrated_seconds(calibrated, "warm") / true_seconds(true_world, WORKLOAD, CLASS, "warm") - 1) < 0.06


def test_phases_seen_only_together_share_a_discrepancy_in_proportion() -> None:
    true_world = world(QWEN, WORKLOAD, CLASS, factors(engine=2.0))
    fit = calibrate(APPLY, starts(QWEN, true_world, WORKLOAD, CLASS, ["warm"] * 40, noise=0.0)).fits[(WORKLOAD, CLASS)]
    # local weights, warm compile, graph capture and engine init are always seen together: one common factor
    assert fit.factors[LOCAL] == pytest.approx(fit.factors[WARM], rel=0.05)
    assert fit.factors[WARM] == pytest.approx(fit.factors[INIT], rel=0.05)
    assert fit.factors[GRAPH] == pytest.approx(fit.factors[INIT], rel=1e-6)
    assert fit.factors[INIT] > 1.5


# ---- bounds ---------------------------------------------------------------------------------------------


def test_a_world_beyond_the_bounds_stops_at_them() -> None:
    policy = parse_policy(QWEN_TEXT + "calibration: {mode: apply, bounds: {compileCold: {min: 0.5, max: 1.5}}}\n")
    true_world = world(policy, WORKLOAD, CLASS, factors(compileCold=10.0))
    observed = starts(policy, true_world, WORKLOAD, CLASS, ["image"] * 50, noise=0.0)
    fit = calibrate(policy, observed).fits[(WORKLOAD, CLASS)]
    assert fit.factors[COLD] == 1.5


@pytest.mark.parametrize(("bounds", "graph", "init"), [
    pytest.param("{}", (0.25, 4.0), (0.25, 4.0), id="default"),
    # a policy written when the two were one factor keeps its meaning
    pytest.param("{engine: {min: 0.5, max: 2}}", (0.5, 2.0), (0.5, 2.0), id="engine-bounds-both"),
    pytest.param("{engine: {min: 0.5, max: 2}, graphCapture: {min: 0.9, max: 3}}", (0.9, 3.0), (0.5, 2.0),
                 id="a-bound-of-its-own-comes-before-engine"),
    pytest.param("{default: {max: 8}, engineInit: {min: 0.8, max: 1.2}}", (0.25, 8.0), (0.8, 1.2),
                 id="engine-init-alone"),
])
def test_graph_capture_and_engine_init_are_bounded_apart_or_by_engine(
        bounds: str, graph: tuple[float, float], init: tuple[float, float]) -> None:
    policy = parse_policy(QWEN_TEXT + f"calibration: {{mode: apply, bounds: {bounds}}}\n")
    true_world = world(policy, WORKLOAD, CLASS, factors(graphCapture=20.0, engineInit=0.01))
    observed = starts(policy, true_world, WORKLOAD, CLASS, ["warm"] * 5, noise=0.0)
    fit = calibrate(policy, observed).fits[(WORKLOAD, CLASS)]
    assert (fit.lower[GRAPH], fit.upper[GRAPH]) == graph and (fit.lower[INIT], fit.upper[INIT]) == init
    assert all(fit.lower[j] <= fit.factors[j] <= fit.upper[j] for j in (GRAPH, INIT))


def test_no_fit_makes_a_download_faster_than_the_nic() -> None:
    # 17 streams x 2.7 Gbps is 45.9 Gbps: a 100 Gbps NIC allows at most 100 / 45.9 = 2.2x faster
    policy = parse_policy(QWEN_TEXT.replace("nic: 3200Gbps", "nic: 100Gbps") + "calibration: {mode: apply}\n")
    profile, node_class = policy.profile(WORKLOAD), policy.node_class(CLASS)
    impossible = [o.model_copy(update={"ready_at": o.scheduled_at + 0.2 * o.total_s})  # 5x faster than the policy
                  for o in starts(policy, policy, WORKLOAD, CLASS, ["image"] * 50, noise=0.0)]
    fit = calibrate(policy, impossible).fits[(WORKLOAD, CLASS)]
    remote_bps = min(node_class.network.nic, profile.weights.streams * node_class.network.object_store_per_stream)
    assert remote_bps / node_class.network.nic > policy.calibration.bounds.default.min  # the NIC is the tighter bound
    assert fit.factors[REMOTE] == pytest.approx(remote_bps / node_class.network.nic)
    assert fit.factors[COLD] == policy.calibration.bounds.default.min


QWEN_TEXT = (ROOT / "policies" / "eks-p5-qwen3-moe.yaml").read_text()

#: A start of random cache state and duration, for the property tests.
random_start = st.tuples(st.sampled_from(sorted(STATES.keys() - {"snapshot"})), st.floats(1.0, 20_000.0))


def observations_of(items: list[tuple[str, float]]) -> list[Observation]:
    p = QWEN.profile(WORKLOAD)
    out = []
    for i, (name, seconds) in enumerate(items):
        named = STATES[name]
        out.append(Observation(pod=f"s/p{i}", workload=WORKLOAD, node="n", node_class=CLASS,
                               image_reference=p.image.reference, weights_version=p.weights.version,
                               image=named.image, weights_bytes=float(p.weights.bytes) if named.weights else 0.0,
                               compile="local" if named.compile else "absent", scheduled_at=1e9 + i,
                               ready_at=1e9 + i + seconds))
    return out


@settings(max_examples=60, deadline=None)
@given(items=st.lists(random_start, min_size=1, max_size=40),
       low=st.floats(0.05, 1.0), high=st.floats(1.0, 20.0), prior=st.floats(0.1, 50.0))
def test_the_fit_never_leaves_the_policy_bounds(items: list[tuple[str, float]], low: float, high: float,
                                                prior: float) -> None:
    policy = with_calibration(QWEN, mode="apply", prior_observations=prior,
                              bounds=QWEN.calibration.bounds.model_copy(update={
                                  "default": QWEN.calibration.bounds.default.model_copy(update={"min": low,
                                                                                                "max": high})}))
    fit = calibrate(policy, observations_of(items)).fits[(WORKLOAD, CLASS)]
    for j, f in enumerate(fit.factors):
        assert low - 1e-12 <= fit.lower[j] <= f <= fit.upper[j] == high, (PARAMETERS[j], f)
        assert math.isfinite(f)


@settings(max_examples=60, deadline=None)
@given(first=st.lists(st.sampled_from(STARTS), min_size=0, max_size=30),
       more=st.lists(st.sampled_from(STARTS), min_size=1, max_size=30),
       truth=st.lists(st.floats(0.3, 3.0), min_size=len(PARAMETERS), max_size=len(PARAMETERS)),
       seed=st.integers(0, 2**16))
def test_more_consistent_observations_never_reduce_confidence(first: list[str], more: list[str],
                                                              truth: list[float], seed: int) -> None:
    true_world = world(QWEN, WORKLOAD, CLASS, truth)
    observed = starts(QWEN, true_world, WORKLOAD, CLASS, [*first, *more], noise=0.02, seed=seed)
    profile, node_class = APPLY.profile(WORKLOAD), APPLY.node_class(CLASS)
    before = fit_pair(APPLY, profile, node_class, observed[: len(first)]).confidence
    after = fit_pair(APPLY, profile, node_class, observed).confidence
    assert all(a >= b - 1e-9 for a, b in zip(after, before, strict=True)), (before, after)


def test_box_ridge_matches_the_unconstrained_solution_inside_the_box() -> None:
    rng = np.random.default_rng(0)
    a = rng.normal(size=(12, 5))
    q = a.T @ a + np.eye(5)
    b = rng.normal(size=5)
    exact = np.linalg.solve(q, b)
    got = box_ridge(q, b, np.full(5, -1e9), np.full(5, 1e9), np.zeros(5))
    np.testing.assert_allclose(got, exact, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize(("collinear", "half_width"), [
    pytest.param(False, 0.05, id="tight-box"),
    pytest.param(False, 0.5, id="some-bounds-active"),
    pytest.param(True, 0.05, id="collinear-pair-tight-box"),  # graph capture and engine init without capture rows
    pytest.param(True, 0.5, id="collinear-pair"),
])
def test_box_ridge_meets_the_optimality_conditions_when_bounds_bind(collinear: bool, half_width: float) -> None:
    rng = np.random.default_rng(1)
    a = rng.normal(size=(12, 5))
    if collinear:
        a[:, 4] = 0.5 * a[:, 3]
    q = a.T @ a + 0.1 * np.eye(5)
    b = 3.0 * rng.normal(size=5)
    lo, hi = np.full(5, 1.0 - half_width), np.full(5, 1.0 + half_width)
    assert not np.all((lo <= np.linalg.solve(q, b)) & (np.linalg.solve(q, b) <= hi))  # a bound binds
    m = box_ridge(q, b, lo, hi, np.ones(5))
    gradient = q @ m - b  # KKT: 0 inside, pushing outward at a bound
    at_lo, at_hi = np.isclose(m, lo, atol=1e-9), np.isclose(m, hi, atol=1e-9)
    assert np.all((lo <= m) & (m <= hi))
    assert np.all(gradient[at_lo] >= -1e-7) and np.all(gradient[at_hi] <= 1e-7)
    np.testing.assert_allclose(gradient[~at_lo & ~at_hi], 0.0, atol=1e-7)


# ---- which observations count, and using the fit ------------------------------------------------------


def test_only_current_known_recent_observations_count() -> None:
    policy = with_calibration(APPLY, window=10, max_age=3600.0)
    true_world = world(policy, WORKLOAD, CLASS, factors(engine=2))
    good = starts(policy, true_world, WORKLOAD, CLASS, ["warm"] * 12, t0=10_000.0)
    others = [
        good[0].model_copy(update={"workload": "nobody"}),
        good[0].model_copy(update={"node_class": "h100-somewhere"}),
        good[0].model_copy(update={"weights_version": "rev-0"}),
        good[0].model_copy(update={"image_reference": "vllm/vllm-openai:v0.10.0"}),
        good[0].model_copy(update={"scheduled_at": 0.0, "ready_at": 60.0}),
    ]
    result = calibrate(policy, [*good, *others], now=10_000.0 + 60 * 12 + 100)
    assert dict(result.skipped) == {"unknown workload": 1, "unknown node class": 1, "other version": 2,
                                    "too old": 1, "beyond window": 2}
    used = result.used[(WORKLOAD, CLASS)]
    assert len(used) == 10 and {o.pod for o in used} == {o.pod for o in good[2:]}  # the newest ten


@pytest.mark.parametrize("mode", ["off", "suggest"])
def test_only_apply_mode_changes_the_policy(mode: str) -> None:
    policy = with_calibration(QWEN, mode=mode)
    observed = starts(policy, world(policy, WORKLOAD, CLASS, factors(engine=2)), WORKLOAD, CLASS, ["warm"] * 20)
    assert effective_policy(policy, observed) is policy


def test_too_few_observations_are_not_applied() -> None:
    policy = with_calibration(APPLY, min_observations=5)
    observed = starts(policy, world(policy, WORKLOAD, CLASS, factors(engine=2)), WORKLOAD, CLASS, ["warm"] * 4)
    assert effective_policy(policy, observed) is policy
    assert effective_policy(policy, [*observed, *observed[:1]]) is not policy


def test_the_applied_fit_is_a_per_class_override_built_on_existing_ones() -> None:
    policy = parse_policy(QWEN_TEXT.replace("    startupSlo: 90s\n", "    startupSlo: 90s\n"
                                            "    overrides: {p5.48xlarge: {engineInit: 40s}}\n", 1)
                          + "calibration: {mode: apply}\n")
    observed = starts(policy, world(policy, WORKLOAD, CLASS, factors(compileCold=2)), WORKLOAD, CLASS, ["image"] * 30)
    fit = calibrate(policy, observed).fits[(WORKLOAD, CLASS)]
    override = effective_policy(policy, observed).profile(WORKLOAD).overrides[CLASS]
    assert override.compile_cold is not None and override.compile_cold > 60
    assert override.compile_cold == pytest.approx(53 * fit.factor("compileCold"))
    assert override.engine_init == pytest.approx(40 * fit.factor("engineInit"))  # the team's 40 s is the base
    assert override.graph_capture == pytest.approx(17 * fit.factor("graphCapture"))
    assert override.image_pull is None  # factor 1: nothing written
    assert policy.profile(WORKLOAD).overrides[CLASS].engine_init == 40.0  # the base policy is untouched


#: (row, factors) whose compile values cross: the warm compile fitted above the cold one, each factor
#: within its bounds, or the cold one fitted below the policy's warm compile
CROSSED = [
    pytest.param({"compileWarm": 4.0, "compileCold": 0.25}, id="warm-up-cold-down"),
    pytest.param({"compileCold": 0.05}, id="cold-alone-below-the-warm"),
    pytest.param({"compileWarm": 0.5, "compileCold": 0.03}, id="both-down-cold-further"),
    pytest.param({"compileWarm": 2.0}, id="warm-up-within-the-cold"),
]


@pytest.mark.parametrize("moved", CROSSED)
def test_an_applied_fit_never_makes_a_warm_compile_slower_than_a_cold_one(moved: dict[str, float]) -> None:
    # the override said warm > cold: the estimator cut it silently, `calibrate show` printed the uncut
    # value, and the override copied into a policy failed `policy check`
    policy = load_policy(ROOT / "policies/eks-p5-qwen3-moe.yaml")
    m = factors(**moved)
    n = len(PARAMETERS)
    fit = Fit(WORKLOAD, CLASS, 9, tuple(m), (0.0,) * n, (0.05,) * n, (4.0,) * n, 0, 0, 0, 0, True)
    applied = apply_calibration(policy, [fit])
    assert cross_check(applied) == []
    override = applied.profile(WORKLOAD).overrides[CLASS]
    base = PolicyValues.of(policy.profile(WORKLOAD), policy.node_class(CLASS))
    shown = base.scaled(m)
    cold = override.compile_cold if override.compile_cold is not None else base.compile_cold_s
    warm = override.compile_warm if override.compile_warm is not None else base.compile_warm_s
    assert (cold, warm) == pytest.approx((shown.compile_cold_s, shown.compile_warm_s))
    assert warm == pytest.approx(min(base.compile_warm_s * m[WARM], base.compile_cold_s * m[COLD]))


def test_estimate_errors_compare_the_estimate_with_the_duration() -> None:
    observed = starts(QWEN, QWEN, WORKLOAD, CLASS, ["warm", "cold"], noise=0.0)
    doubled = [o.model_copy(update={"ready_at": o.scheduled_at + 2 * o.total_s}) for o in observed]
    errors = estimate_errors(QWEN, [*doubled, doubled[0].model_copy(update={"workload": "nobody"})])
    assert [round(e.relative, 9) for e in errors] == [-0.5, -0.5]
    assert errors[0].estimated_s == pytest.approx(calibrated_seconds(QWEN, "warm"))


LORA = load_policy(ROOT / "scenarios" / "lora-tenants-policy.yaml")  # preloads 8 adapters


@pytest.mark.parametrize(("policy", "workload", "node_class", "adapters", "estimated"), [
    pytest.param(LORA, "llama3-8b-tenants", "g5.12xlarge", 8, True, id="as-many-adapters-as-preloaded-now"),
    pytest.param(LORA, "llama3-8b-tenants", "g5.12xlarge", 0, False, id="recorded-before-adapters-were-preloaded"),
    pytest.param(LORA, "llama3-8b-tenants", "g5.12xlarge", 9, False, id="recorded-when-one-more-was-preloaded"),
    pytest.param(QWEN, WORKLOAD, CLASS, 1, False, id="recorded-when-the-profile-had-adapters"),
    pytest.param(QWEN, WORKLOAD, CLASS, 0, True, id="no-adapters-then-or-now"),
])
def test_estimate_errors_leave_out_starts_of_another_adapter_count(
        policy: Policy, workload: str, node_class: str, adapters: int, estimated: bool) -> None:
    # `extender calibrate show` and the start metrics pass every stored start; one recorded before a
    # change of lora.preload has another number of adapter columns than the estimator builds
    start = Observation(pod="p", workload=workload, node="n", node_class=node_class, scheduled_at=0.0,
                        ready_at=100.0, adapters=(True,) * adapters)
    errors = estimate_errors(policy, [start])
    assert len(errors) == (1 if estimated else 0)
    if estimated:
        assert math.isfinite(errors[0].estimated_s) and errors[0].observed_s == 100.0


# ---- the policy section -----------------------------------------------------------------------------


@pytest.mark.parametrize(("section", "line", "path", "words"), [
    pytest.param("calibration: {mode: always}", 1, "calibration.mode", "'off', 'suggest' or 'apply'", id="mode"),
    pytest.param("calibration:\n  bounds:\n    engine: {min: 1.5, max: 3}", 3, "calibration.bounds.engine",
                 "must enclose 1", id="bounds-exclude-the-policy"),
    pytest.param("calibration:\n  bounds:\n    graphCapture: {max: 0.5}", 3, "calibration.bounds.graphCapture",
                 "must enclose 1", id="graph-capture-bounds-exclude-the-policy"),
    pytest.param("calibration:\n  bounds:\n    compile: {min: 0.5}", 3, "calibration.bounds.compile",
                 "unknown field", id="unknown-parameter"),
    pytest.param("calibration:\n  priorObservations: 0", 2, "calibration.priorObservations", "must be > 0",
                 id="prior"),
    pytest.param("calibration:\n  maxInventoryAge: 5M", 2, "calibration.maxInventoryAge", "ambiguous duration",
                 id="inventory-age"),
])
def test_bad_calibration_settings_are_located(section: str, line: int, path: str, words: str) -> None:
    base = QWEN_TEXT.count("\n")
    with pytest.raises(PolicyError) as info:
        parse_policy(QWEN_TEXT + section + "\n", "p.yaml")
    (problem,) = info.value.problems
    assert (problem.line, problem.path) == (base + line, path), problem
    assert words in problem.message, problem.message


class LocalCase(NamedTuple):
    id: str
    policy: str
    workload: str
    node_class: str
    weights_local: float
    #: The applied override's nvmeRead over the class's NVMe read (None: not written).
    nvme_read_ratio: float | None


#: Applying a weightsLocal fit changes only what the fit modelled: the NVMe read when the local weights
#: read is NVMe-bound; nothing when the network is the faster (it wrote the remote rate over the NVMe
#: read, and the snapshot read, at the NVMe rate, moved with it).
LOCAL_CASES = [
    LocalCase("NVMe-bound: the NVMe read scaled by the factor", "policies/eks-p5-qwen3-moe.yaml", WORKLOAD, CLASS,
              2.0, 0.5),
    LocalCase("remote faster than NVMe, factor < 1: the NVMe read left alone", "policies/h200-b200-snapshot.yaml",
              "dynamo-worker", "b200", 0.99, None),
    LocalCase("remote faster than NVMe, factor > 1: the NVMe read left alone", "policies/h200-b200-snapshot.yaml",
              "dynamo-worker", "h200", 2.0, None),
]


@pytest.mark.parametrize("case", LOCAL_CASES, ids=[c.id for c in LOCAL_CASES])
def test_an_applied_local_weights_fit_changes_only_what_it_modelled(case: LocalCase) -> None:
    policy = load_policy(ROOT / case.policy)
    profile, node_class = policy.profile(case.workload), policy.node_class(case.node_class)
    m = np.array(factors(weightsLocal=case.weights_local))
    fit = Fit(case.workload, case.node_class, 9, tuple(m), (0.0,) * 7, (0.25,) * 7, (4.0,) * 7, 0, 0, 0, 0, True)
    applied = apply_calibration(policy, [fit])
    nvme_read = applied.profile(case.workload).overrides[case.node_class].nvme_read
    ratio = None if nvme_read is None else nvme_read / node_class.nvme.read_bandwidth
    assert ratio == (None if case.nvme_read_ratio is None else pytest.approx(case.nvme_read_ratio))
    named = [s for s in STATES if not STATES[s].snapshot or profile.snapshot is not None]
    obs = starts(policy, policy, case.workload, case.node_class, named, noise=0.0)
    state = cache_state(obs)
    modelled = design(profile, node_class, state, m).total(m)
    got = estimate(applied.profile(case.workload), [applied.node_class(case.node_class)],
                   np.zeros(len(obs), dtype=np.intp), state).total_s
    assert got == pytest.approx(modelled)  # the applied estimate is the fit's model, snapshot starts included
