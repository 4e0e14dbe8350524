"""Calibration with the engine's own phase times: rows in only a phase's columns separate what totals cannot.

The world's phase seconds come from the estimator itself (:func:`extender.core.calibration.design` at
the true factors), the oracle the fit must recover.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from extender.core.calibration import (
    COLD,
    ENGINE,
    IMAGE,
    LOCAL,
    PARAMETERS,
    REMOTE,
    WARM,
    Observation,
    PhaseRows,
    cache_state,
    calibrate,
    design,
    fit_pair,
)
from extender.core.enginelog import EnginePhases
from extender.core.schema import read_stored
from extender.state.observations import encode
from tests.calibration_world import factors, round_robin, starts, world
from tests.test_calibration import APPLY, CLASS, QWEN, WORKLOAD

PROFILE, NODE_CLASS = APPLY.profile(WORKLOAD), APPLY.node_class(CLASS)


def with_phases(observed: list[Observation], truth: tuple[float, ...], *, noise: float = 0.0, seed: int = 0,
                kinds: frozenset[str] = frozenset({"weights", "compile", "engine"})) -> list[Observation]:
    """Each start with the phase times the world gave it: the estimator's columns at the true factors."""
    rng = np.random.default_rng(seed)
    m = np.array(truth)
    seconds = design(PROFILE, NODE_CLASS, cache_state(observed), m).columns * m
    out = []
    for i, o in enumerate(observed):
        def noisy(value: float) -> float:
            return value * float(np.exp(rng.normal(0.0, noise)))

        compile_s = noisy(seconds[i, COLD] + seconds[i, WARM])
        engine = noisy(seconds[i, ENGINE])
        phases = EnginePhases(
            weights_load=noisy(seconds[i, REMOTE] + seconds[i, LOCAL]) if "weights" in kinds else None,
            compile=compile_s if "compile" in kinds else None,
            compile_cached=bool(seconds[i, WARM] > 0),
            graph_capture=engine * PROFILE.graph_capture / (PROFILE.graph_capture + PROFILE.engine_init),
            init_engine=engine + compile_s if "engine" in kinds else None,
        )
        out.append(o.model_copy(update={"phases": phases}))
    return out


def fit_of(observed: list[Observation]) -> tuple[float, ...]:
    return calibrate(APPLY, observed).fits[(WORKLOAD, CLASS)].factors


WARM_TRUTH = factors(weightsLocal=2.0, compileWarm=0.5, engine=1.5)


def test_an_always_warm_fleet_is_separated_by_its_phase_times() -> None:
    true_world = world(QWEN, WORKLOAD, CLASS, WARM_TRUTH)
    observed = starts(QWEN, true_world, WORKLOAD, CLASS, ["warm"] * 60, noise=0.03, seed=11)
    totals_only = calibrate(APPLY, observed).fits[(WORKLOAD, CLASS)]
    with_logs = calibrate(APPLY, with_phases(observed, WARM_TRUTH, noise=0.03, seed=12)).fits[(WORKLOAD, CLASS)]
    for j in (LOCAL, WARM, ENGINE):
        assert with_logs.factors[j] == pytest.approx(WARM_TRUTH[j], rel=0.06), PARAMETERS[j]
        assert with_logs.confidence[j] > totals_only.confidence[j], PARAMETERS[j]
    # from totals alone the three are one common factor: none is right
    assert totals_only.factors[LOCAL] == pytest.approx(totals_only.factors[WARM], rel=0.05)
    assert abs(totals_only.factors[LOCAL] - WARM_TRUTH[LOCAL]) > 0.5
    assert abs(totals_only.factors[WARM] - WARM_TRUTH[WARM]) > 0.5
    # phases a warm fleet never runs still teach nothing
    for j in (IMAGE, REMOTE, COLD):
        assert with_logs.factors[j] == 1.0 and with_logs.confidence[j] == 0.0, PARAMETERS[j]


@pytest.mark.parametrize(("kinds", "learnt"), [
    pytest.param(frozenset({"weights"}), LOCAL, id="weights-load"),
    pytest.param(frozenset({"compile"}), WARM, id="compile"),
    pytest.param(frozenset({"compile", "engine"}), ENGINE, id="engine-init-with-the-compile-it-holds"),
])
def test_each_phase_time_teaches_its_own_factor(kinds: frozenset[str], learnt: int) -> None:
    true_world = world(QWEN, WORKLOAD, CLASS, WARM_TRUTH)
    observed = starts(QWEN, true_world, WORKLOAD, CLASS, ["warm"] * 60, noise=0.0)
    got = calibrate(APPLY, with_phases(observed, WARM_TRUTH, kinds=kinds)).fits[(WORKLOAD, CLASS)]
    assert got.factors[learnt] == pytest.approx(WARM_TRUTH[learnt], rel=0.06), PARAMETERS[learnt]
    # the same starts without that phase's time (the engine's needs the compile's: it holds it)
    fewer = frozenset({"compile"}) if learnt == ENGINE else frozenset()
    without = calibrate(APPLY, with_phases(observed, WARM_TRUTH, kinds=fewer)).fits[(WORKLOAD, CLASS)]
    assert abs(without.factors[learnt] - WARM_TRUTH[learnt]) > abs(got.factors[learnt] - WARM_TRUTH[learnt])
    assert got.confidence[learnt] > without.confidence[learnt]


def test_a_mixed_fleet_with_phase_times_recovers_every_factor() -> None:
    truth = factors(imagePull=1.5, weightsRemote=2.0, weightsLocal=0.5, compileCold=3.0, compileWarm=1.5, engine=0.7)
    true_world = world(QWEN, WORKLOAD, CLASS, truth)
    observed = starts(QWEN, true_world, WORKLOAD, CLASS, round_robin(120), noise=0.02, seed=3)
    got = fit_of(with_phases(observed, truth, noise=0.02, seed=4))
    for j in (IMAGE, REMOTE, LOCAL, COLD, WARM, ENGINE):
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


def test_an_engine_time_without_the_compile_it_holds_is_left_out() -> None:
    observed = starts(QWEN, QWEN, WORKLOAD, CLASS, ["warm"], noise=0.0)
    base = design(PROFILE, NODE_CLASS, cache_state(observed))
    unknown = [observed[0].model_copy(update={"phases": EnginePhases(init_engine=60.0)})]
    assert len(PhaseRows.of(unknown, base.columns)) == 0
    eager = base.columns.copy()
    eager[:, [COLD, WARM]] = 0.0  # a start that does not compile: its init is the engine's alone
    rows = PhaseRows.of(unknown, eager)
    assert len(rows) == 1 and rows.seconds[0] == 60.0


def test_phase_rows_scale_by_the_policys_seconds_of_the_phase() -> None:
    observed = starts(QWEN, QWEN, WORKLOAD, CLASS, ["warm", "cold"], noise=0.0)
    observed = [o.model_copy(update={"phases": EnginePhases(weights_load=10.0, compile=20.0, init_engine=60.0)})
                for o in observed]
    base = design(PROFILE, NODE_CLASS, cache_state(observed))
    rows = PhaseRows.of(observed, base.columns)
    x, y, live = rows.rows(base.columns)
    assert live.all() and len(rows) == 6
    assert x.sum(axis=1) == pytest.approx(np.ones(6))  # at the policy's factors each row is 1
    warm_compile = PROFILE.compile.warm if CLASS not in PROFILE.overrides else base.columns[0, WARM]
    assert y[1] == pytest.approx(20.0 / warm_compile)
    assert y[2] == pytest.approx(40.0 / base.columns[0, ENGINE])  # engine = init - compile
    assert y[4] == pytest.approx(20.0 / base.columns[1, COLD])


def test_a_restored_start_has_no_phase_rows() -> None:
    observed = starts(QWEN, QWEN, WORKLOAD, CLASS, ["warm"], noise=0.0)
    restored = np.zeros_like(design(PROFILE, NODE_CLASS, cache_state(observed)).columns)
    restored[:, -1] = 30.0  # only the snapshot restore column, as a restored start has
    rows = PhaseRows.of([o.model_copy(update={"phases": EnginePhases(weights_load=5.0, compile=5.0,
                                                                      init_engine=9.0)}) for o in observed], restored)
    assert len(rows) == 0


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
