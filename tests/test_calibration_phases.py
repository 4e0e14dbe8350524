"""Calibration with the engine's own phase times: rows in only a phase's columns separate what totals cannot.

The world's phase seconds come from the estimator itself (:func:`extender.core.calibration.design` at
the true factors), the oracle the fit must recover.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from extender.core.calibration import (
    CAPTURE_ROW,
    COLD,
    COMPILE_ROW,
    ENGINE_ROW,
    GRAPH,
    IMAGE,
    INIT,
    INIT_ROW,
    LOCAL,
    PARAMETERS,
    PHASE_COLUMNS,
    REMOTE,
    WARM,
    WEIGHTS_ROW,
    Observation,
    PhaseRows,
    PolicyValues,
    apply_calibration,
    cache_state,
    calibrate,
    design,
    fit_pair,
)
from extender.core.enginelog import EnginePhases, parse_engine_log
from extender.core.policy import PhaseOverride, Policy
from extender.core.schema import read_stored
from extender.state.observations import encode
from tests.calibration_world import factors, round_robin, starts, world
from tests.test_calibration import APPLY, CLASS, QWEN, WORKLOAD
from tests.test_enginelog import AOT_HIT, PER_GRAPH, SGL_PIECEWISE

PROFILE, NODE_CLASS = APPLY.profile(WORKLOAD), APPLY.node_class(CLASS)


def with_phases(observed: list[Observation], truth: tuple[float, ...], *, noise: float = 0.0, seed: int = 0,
                kinds: frozenset[str] = frozenset({"weights", "compile", "capture", "engine"})) -> list[Observation]:
    """Each start with the phase times the world gave it: the estimator's columns at the true factors.

    As vLLM logs them: ``initEngine`` (kind ``engine``) holds the compile and the graph capture.
    """
    rng = np.random.default_rng(seed)
    m = np.array(truth)
    seconds = design(PROFILE, NODE_CLASS, cache_state(observed), m).columns * m
    out = []
    for i, o in enumerate(observed):
        def noisy(value: float) -> float:
            return value * float(np.exp(rng.normal(0.0, noise)))

        compile_s = noisy(seconds[i, COLD] + seconds[i, WARM])
        capture = noisy(seconds[i, GRAPH])
        phases = EnginePhases(
            weights_load=noisy(seconds[i, REMOTE] + seconds[i, LOCAL]) if "weights" in kinds else None,
            compile=compile_s if "compile" in kinds else None,
            compile_cached=bool(seconds[i, WARM] > 0),
            graph_capture=capture if "capture" in kinds else None,
            init_engine=noisy(seconds[i, INIT]) + capture + compile_s if "engine" in kinds else None,
        )
        out.append(o.model_copy(update={"phases": phases}))
    return out


def fit_of(observed: list[Observation]) -> tuple[float, ...]:
    return calibrate(APPLY, observed).fits[(WORKLOAD, CLASS)].factors


#: Local weights 2x slower, warm compile 2x faster, graph capture 2x slower and engine init 0.75x.
WARM_TRUTH = factors(weightsLocal=2.0, compileWarm=0.5, graphCapture=2.0, engineInit=0.75)
#: The same, graph capture and engine init both 1.5x (what a log without a capture time can teach).
ONE_ENGINE_TRUTH = factors(weightsLocal=2.0, compileWarm=0.5, engine=1.5)


def test_an_always_warm_fleet_is_separated_by_its_phase_times() -> None:
    true_world = world(QWEN, WORKLOAD, CLASS, WARM_TRUTH)
    observed = starts(QWEN, true_world, WORKLOAD, CLASS, ["warm"] * 60, noise=0.03, seed=11)
    totals_only = calibrate(APPLY, observed).fits[(WORKLOAD, CLASS)]
    with_logs = calibrate(APPLY, with_phases(observed, WARM_TRUTH, noise=0.03, seed=12)).fits[(WORKLOAD, CLASS)]
    for j in (LOCAL, WARM, GRAPH, INIT):
        assert with_logs.factors[j] == pytest.approx(WARM_TRUTH[j], rel=0.06), PARAMETERS[j]
        assert with_logs.confidence[j] > totals_only.confidence[j], PARAMETERS[j]
    # from totals alone the four are one common factor: none is right
    assert totals_only.factors[LOCAL] == pytest.approx(totals_only.factors[WARM], rel=0.05)
    assert totals_only.factors[GRAPH] == pytest.approx(totals_only.factors[INIT], rel=1e-9)
    for j in (LOCAL, WARM, GRAPH, INIT):
        assert abs(totals_only.factors[j] - WARM_TRUTH[j]) > 0.25, PARAMETERS[j]
    # phases a warm fleet never runs still teach nothing
    for j in (IMAGE, REMOTE, COLD):
        assert with_logs.factors[j] == 1.0 and with_logs.confidence[j] == 0.0, PARAMETERS[j]


@pytest.mark.parametrize(("kinds", "truth", "learnt", "fewer"), [
    pytest.param({"weights"}, WARM_TRUTH, (LOCAL,), set(), id="weights-load"),
    pytest.param({"compile"}, WARM_TRUTH, (WARM,), set(), id="compile"),
    # a vLLM log (it has initEngine) whose compile time is missing: its capture holds no compile
    pytest.param({"capture", "engine"}, WARM_TRUTH, (GRAPH,), {"engine"}, id="graph-capture"),
    # initEngine holds the compile and the capture: it teaches engine init given their times
    pytest.param({"compile", "capture", "engine"}, WARM_TRUTH, (INIT,), {"compile", "capture"},
                 id="engine-init-less-the-compile-and-capture-it-holds"),
    # without a capture time it teaches the two together, in the policy's proportions
    pytest.param({"compile", "engine"}, ONE_ENGINE_TRUTH, (GRAPH, INIT), {"compile"},
                 id="engine-init-without-a-capture-time"),
])
def test_each_phase_time_teaches_its_own_factor(kinds: set[str], truth: tuple[float, ...], learnt: tuple[int, ...],
                                                fewer: set[str]) -> None:
    true_world = world(QWEN, WORKLOAD, CLASS, truth)
    observed = starts(QWEN, true_world, WORKLOAD, CLASS, ["warm"] * 60, noise=0.0)
    got = calibrate(APPLY, with_phases(observed, truth, kinds=frozenset(kinds))).fits[(WORKLOAD, CLASS)]
    # the same starts without that phase's time
    without = calibrate(APPLY, with_phases(observed, truth, kinds=frozenset(fewer))).fits[(WORKLOAD, CLASS)]
    for j in learnt:
        assert got.factors[j] == pytest.approx(truth[j], rel=0.06), PARAMETERS[j]
        assert abs(without.factors[j] - truth[j]) > abs(got.factors[j] - truth[j]), PARAMETERS[j]
        assert got.confidence[j] > without.confidence[j], PARAMETERS[j]


def test_a_mixed_fleet_with_phase_times_recovers_every_factor() -> None:
    truth = factors(imagePull=1.5, weightsRemote=2.0, weightsLocal=0.5, compileCold=3.0, compileWarm=1.5,
                    graphCapture=2.0, engineInit=0.75)
    true_world = world(QWEN, WORKLOAD, CLASS, truth)
    observed = starts(QWEN, true_world, WORKLOAD, CLASS, round_robin(120), noise=0.02, seed=3)
    got = fit_of(with_phases(observed, truth, noise=0.02, seed=4))
    for j in (IMAGE, REMOTE, LOCAL, COLD, WARM, GRAPH, INIT):
        assert got[j] == pytest.approx(truth[j], rel=0.08), PARAMETERS[j]


def test_without_phase_times_the_fit_is_the_totals_fit() -> None:
    true_world = world(QWEN, WORKLOAD, CLASS, WARM_TRUTH)
    observed = starts(QWEN, true_world, WORKLOAD, CLASS, round_robin(40), noise=0.05, seed=2)
    bare = fit_pair(APPLY, PROFILE, NODE_CLASS, observed)
    empty = fit_pair(APPLY, PROFILE, NODE_CLASS, [o.model_copy(update={"phases": EnginePhases()}) for o in observed])
    assert bare == empty  # exactly: a log that gave nothing adds no row


def test_a_compile_time_of_the_other_path_is_left_out() -> None:
    true_world = world(QWEN, WORKLOAD, CLASS, WARM_TRUTH)
    observed = with_phases(starts(QWEN, true_world, WORKLOAD, CLASS, ["warm"] * 30, noise=0.0), WARM_TRUTH)

    def compiled(o: Observation, seconds: float, cached: bool) -> Observation:  # the engine's own time unchanged
        assert o.phases is not None and o.phases.compile is not None and o.phases.init_engine is not None
        extra = seconds - o.phases.compile
        return o.model_copy(update={"phases": o.phases.model_copy(update={
            "compile": seconds, "compile_cached": cached, "init_engine": o.phases.init_engine + extra})})

    # the node held the cache, yet vLLM compiled from scratch: how long it took says nothing of the warm
    # compile (exactly: the fit is the same for 500 s and 900 s), which stays near the policy's
    missed = fit_of([compiled(o, 500.0, cached=False) for o in observed])
    assert missed == fit_of([compiled(o, 900.0, cached=False) for o in observed])
    assert missed[WARM] < 1.1
    # had vLLM said it loaded its cache, the same 500 s would count as a warm compile (up to the bound)
    hit = fit_of([compiled(o, 500.0, cached=True) for o in observed])
    assert hit[WARM] == APPLY.calibration.bounds.of("compile_warm").max


@pytest.mark.parametrize(("phases", "eager", "rows"), [
    # vLLM: initEngine holds the compile and the graph capture
    pytest.param(EnginePhases(compile=5.0, graph_capture=12.0, init_engine=60.0), False,
                 [(COMPILE_ROW, 5.0), (CAPTURE_ROW, 12.0), (INIT_ROW, 43.0)], id="vllm"),
    pytest.param(EnginePhases(compile=5.0, graph_capture=20.0, init_engine=25.0), False,
                 [(COMPILE_ROW, 5.0), (CAPTURE_ROW, 20.0)], id="vllm-capture-rounded-up-to-all-the-rest"),
    pytest.param(EnginePhases(compile=5.0, init_engine=60.0), False, [(COMPILE_ROW, 5.0), (ENGINE_ROW, 55.0)],
                 id="vllm-without-a-capture-time-one-row-of-both"),
    pytest.param(EnginePhases(graph_capture=12.0, init_engine=60.0), False, [(CAPTURE_ROW, 12.0)],
                 id="vllm-without-the-compile-time-init-holds"),
    pytest.param(EnginePhases(init_engine=60.0), True, [(ENGINE_ROW, 60.0)], id="vllm-eager-without-a-capture-time"),
    pytest.param(EnginePhases(graph_capture=12.0, init_engine=60.0), True, [(CAPTURE_ROW, 12.0), (INIT_ROW, 48.0)],
                 id="vllm-eager"),
    # SGLang: no initEngine, and a capture that may hold the compile (piecewise graphs, --enable-torch-compile)
    pytest.param(EnginePhases(weights_load=10.0, compile=5.0, graph_capture=12.0), False,
                 [(WEIGHTS_ROW, 10.0), (COMPILE_ROW, 5.0)], id="sglang-capture-of-a-compiling-start-left-out"),
    pytest.param(EnginePhases(weights_load=10.0, graph_capture=12.0), True, [(WEIGHTS_ROW, 10.0), (CAPTURE_ROW, 12.0)],
                 id="sglang-capture-of-a-start-that-does-not-compile"),
])
def test_each_log_gives_the_rows_its_times_support(phases: EnginePhases, eager: bool,
                                                   rows: list[tuple[int, float]]) -> None:
    observed = [starts(QWEN, QWEN, WORKLOAD, CLASS, ["warm"], noise=0.0)[0].model_copy(update={"phases": phases})]
    columns = design(PROFILE, NODE_CLASS, cache_state(observed)).columns
    if eager:
        columns[:, [COLD, WARM]] = 0.0  # a start that does not compile
    got = PhaseRows.of(observed, columns)
    assert list(zip(got.kind.tolist(), got.seconds.tolist(), strict=True)) == rows


#: An SGLang record stored before compileCached could be unknown: SGLang's parse said false.
OLD_SGLANG_RECORD = {"weightsLoad": 9.1, "compile": 9.2, "compileCached": False, "graphCapture": 23.56,
                     "initEngine": None}


@pytest.mark.parametrize(("phases", "state", "kept"), [
    # SGLang logs no cache hit or miss: its compile time counts on the path the estimator took
    pytest.param(parse_engine_log(SGL_PIECEWISE), "warm", True, id="sglang-warm-compile-start-keeps-its-compile"),
    pytest.param(parse_engine_log(SGL_PIECEWISE), "cold", True, id="sglang-cold-compile-start-keeps-its-compile"),
    # vLLM says which compile ran: the other path's time is left out
    pytest.param(parse_engine_log(PER_GRAPH), "warm", False, id="vllm-miss-on-a-warm-compile-start-left-out"),
    pytest.param(parse_engine_log(PER_GRAPH), "cold", True, id="vllm-miss-on-a-cold-compile-start-kept"),
    pytest.param(parse_engine_log(AOT_HIT), "warm", True, id="vllm-hit-on-a-warm-compile-start-kept"),
    pytest.param(parse_engine_log(AOT_HIT), "cold", False, id="vllm-hit-on-a-cold-compile-start-left-out"),
    # a stored SGLang record of an earlier release says false: read as written, a miss
    pytest.param(EnginePhases.model_validate(OLD_SGLANG_RECORD), "warm", False,
                 id="old-sglang-record-on-a-warm-compile-start-left-out-as-before"),
    pytest.param(EnginePhases.model_validate(OLD_SGLANG_RECORD), "cold", True,
                 id="old-sglang-record-on-a-cold-compile-start-kept"),
])
def test_a_compile_row_is_left_out_only_when_the_log_named_the_other_path(phases: EnginePhases, state: str,
                                                                          kept: bool) -> None:
    observed = [starts(QWEN, QWEN, WORKLOAD, CLASS, [state], noise=0.0)[0].model_copy(update={"phases": phases})]
    columns = design(PROFILE, NODE_CLASS, cache_state(observed)).columns
    assert columns[0, WARM if state == "warm" else COLD] > 0  # the estimator's compile path
    rows = PhaseRows.of(observed, columns)
    _, _, live = rows.rows(columns)
    assert (rows.kind == COMPILE_ROW).sum() == 1
    assert bool(live[rows.kind == COMPILE_ROW][0]) is kept


def test_phase_rows_scale_by_the_policys_seconds_of_the_phase() -> None:
    observed = starts(QWEN, QWEN, WORKLOAD, CLASS, ["warm", "cold"], noise=0.0)
    observed = [o.model_copy(update={"phases": EnginePhases(weights_load=10.0, compile=20.0, graph_capture=12.0,
                                                            init_engine=60.0)})
                for o in observed]
    base = design(PROFILE, NODE_CLASS, cache_state(observed))
    rows = PhaseRows.of(observed, base.columns)
    x, y, live = rows.rows(base.columns)
    assert live.all() and len(rows) == 8
    assert x.sum(axis=1) == pytest.approx(np.ones(8))  # at the policy's factors each row is 1
    warm_compile = PROFILE.compile.warm if CLASS not in PROFILE.overrides else base.columns[0, WARM]
    assert y[1] == pytest.approx(20.0 / warm_compile)
    assert y[2] == pytest.approx(12.0 / base.columns[0, GRAPH])
    assert y[3] == pytest.approx(28.0 / base.columns[0, INIT])  # engine init = init - compile - capture
    assert y[5] == pytest.approx(20.0 / base.columns[1, COLD])


def test_each_phase_row_takes_its_own_starts_policy_seconds() -> None:
    # twelve starts of every named state: a third without a log, a third with vLLM's whole log, a third
    # with one that gave no compile time; start 5 does not compile. Each row is of its own start, its
    # Q_i that start's seconds in its kind's columns, and each start gets the rows its own path allows
    full = EnginePhases(weights_load=10.0, compile=20.0, graph_capture=12.0, init_engine=60.0)
    no_compile = EnginePhases(weights_load=10.0, graph_capture=12.0, init_engine=60.0)
    observed = [o.model_copy(update={"phases": (None, full, no_compile)[i % 3]})
                for i, o in enumerate(starts(QWEN, QWEN, WORKLOAD, CLASS, round_robin(12), noise=0.0))]
    columns = design(PROFILE, NODE_CLASS, cache_state(observed)).columns
    columns[5, [COLD, WARM]] = 0.0
    rows = PhaseRows.of(observed, columns)
    kinds: dict[int, list[int]] = {}
    for start, kind, scale in zip(rows.start.tolist(), rows.kind.tolist(), rows.scale.tolist(), strict=True):
        assert scale == float(columns[start, list(PHASE_COLUMNS[kind])].sum()) > 0, (start, kind)
        kinds.setdefault(start, []).append(kind)
    whole = [WEIGHTS_ROW, COMPILE_ROW, CAPTURE_ROW, INIT_ROW]
    # without a compile time a compiling start's initEngine holds an unknown compile: its capture only
    assert kinds == {i: whole if i % 3 == 1 else [WEIGHTS_ROW, CAPTURE_ROW] for i in range(12) if i % 3} | {
        5: [WEIGHTS_ROW, CAPTURE_ROW, INIT_ROW]}


def test_a_restored_start_has_no_phase_rows() -> None:
    observed = starts(QWEN, QWEN, WORKLOAD, CLASS, ["warm"], noise=0.0)
    restored = np.zeros_like(design(PROFILE, NODE_CLASS, cache_state(observed)).columns)
    restored[:, -1] = 30.0  # only the snapshot restore column, as a restored start has
    rows = PhaseRows.of([o.model_copy(update={"phases": EnginePhases(weights_load=5.0, compile=5.0, graph_capture=2.0,
                                                                      init_engine=9.0)}) for o in observed], restored)
    assert len(rows) == 0


def one_engine_policy() -> Policy:
    """The policy with graph capture folded into engine init on the class: its INIT column is the one
    ``engine`` column the fit had before the two were fitted apart (``graph + init``, one factor, the
    same prior ``k x s``, the same bounds), so its fit is that fit (checked against the previous code)."""
    values = PolicyValues.of(PROFILE, NODE_CLASS)
    override = (PROFILE.overrides.get(CLASS) or PhaseOverride()).model_copy(
        update={"graph_capture": 0.0, "engine_init": values.graph_s + values.init_s})
    profile = PROFILE.model_copy(update={"overrides": {**PROFILE.overrides, CLASS: override}})
    return APPLY.model_copy(update={"profiles": tuple(profile if p.name == WORKLOAD else p for p in APPLY.profiles)})


@pytest.mark.parametrize(("states", "truth", "kinds"), [
    pytest.param(round_robin(80), WARM_TRUTH, None, id="mixed-totals-only"),
    pytest.param(["warm"] * 60, WARM_TRUTH, None, id="warm-totals-only"),
    pytest.param(round_robin(80), WARM_TRUTH, {"weights", "compile", "engine"}, id="vllm-logs-without-a-capture-time"),
    pytest.param(round_robin(80), WARM_TRUTH, {"weights", "capture"}, id="sglang-logs-of-compiling-starts"),
    pytest.param(["warm"] * 30, factors(engine=10.0), None, id="at-the-bound"),
    pytest.param(["warm"] * 2, factors(engine=0.5), None, id="two-starts"),
])
def test_without_capture_rows_the_fit_is_the_one_engine_factor_fit(
        states: list[str], truth: tuple[float, ...], kinds: set[str] | None) -> None:
    observed = starts(QWEN, world(QWEN, WORKLOAD, CLASS, truth), WORKLOAD, CLASS, states, noise=0.05, seed=5)
    if kinds is not None:
        observed = with_phases(observed, truth, noise=0.03, seed=6, kinds=frozenset(kinds))
    folded = one_engine_policy()
    fit = fit_pair(APPLY, PROFILE, NODE_CLASS, observed)
    one = fit_pair(folded, folded.profile(WORKLOAD), NODE_CLASS, observed)
    others = [j for j in range(len(PARAMETERS)) if j not in (GRAPH, INIT)]
    assert [fit.factors[j] for j in others] == pytest.approx([one.factors[j] for j in others], rel=1e-9)
    assert fit.factors[GRAPH] == pytest.approx(one.factors[INIT], rel=1e-9)  # both: the one engine factor
    assert fit.factors[INIT] == pytest.approx(one.factors[INIT], rel=1e-9)
    # the one factor's confidence, shared in the policy's proportions
    values = PolicyValues.of(PROFILE, NODE_CLASS)
    assert fit.confidence[GRAPH] + fit.confidence[INIT] == pytest.approx(one.confidence[INIT], abs=1e-12)
    assert fit.confidence[GRAPH] * values.init_s == pytest.approx(fit.confidence[INIT] * values.graph_s, rel=1e-9)
    # the applied policy: the same overrides, graph capture and engine init in the policy's proportions
    applied = apply_calibration(APPLY, [replace(fit, applied=True)]).profile(WORKLOAD).overrides[CLASS]
    before = apply_calibration(folded, [replace(one, applied=True)]).profile(WORKLOAD).overrides[CLASS]
    assert applied.graph_capture is not None and applied.engine_init is not None and before.engine_init is not None
    assert applied.graph_capture / values.graph_s == pytest.approx(applied.engine_init / values.init_s, rel=1e-9)
    assert applied.graph_capture + applied.engine_init == pytest.approx(before.engine_init, rel=1e-9)
    def written(override: PhaseOverride) -> dict[str, float]:
        return {k: v for k, v in override.model_dump(exclude={"graph_capture", "engine_init"}).items() if v is not None}

    assert written(applied) == pytest.approx(written(before), rel=1e-9)


def test_phases_are_stored_and_read_back_and_absent_phases_store_as_before() -> None:
    observed = starts(QWEN, QWEN, WORKLOAD, CLASS, ["warm"], noise=0.0)[0]
    assert "phases" not in json.loads(encode(observed))  # the stored form of a release without phases
    logged = observed.model_copy(update={"phases": EnginePhases(weights_load=3.5, compile_cached=True)})
    stored = json.loads(encode(logged))
    assert stored["phases"] == {"weightsLoad": 3.5, "compile": None, "compileCached": True, "graphCapture": None,
                                "initEngine": None}
    assert read_stored(Observation, encode(logged)) == logged


@pytest.mark.parametrize("phases", [
    pytest.param({"weightsLoad": -1}, id="negative"),
    pytest.param({"compile": 0}, id="zero"),
    pytest.param({"initEngine": 1e12}, id="too-large"),
    pytest.param({"graphCapture": "nan"}, id="nan"),
])
def test_an_observation_refuses_phase_times_no_log_gives(phases: dict[str, object]) -> None:
    observed = starts(QWEN, QWEN, WORKLOAD, CLASS, ["warm"], noise=0.0)[0]
    data = {**json.loads(encode(observed)), "phases": phases}
    with pytest.raises(ValueError, match="phases"):
        Observation.model_validate(data)
