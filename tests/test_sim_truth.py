"""The simulator's truth: a world whose phase times differ from the policy's, and strategies that learn it.

A hand-computed start in a world twice as slow to pull and to initialise; the scenario's truth
checked with located errors; the bundled ``calibration`` scenario (cut short) showing the estimate
error of new replicas falling once the calibrated strategy has seen starts, and not otherwise;
and a world that is the policy, where calibrating changes nothing.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from extender.core.calibration import GRAPH, INIT
from extender.core.errors import DocumentError
from extender.sim.commands import error_section
from extender.sim.report import build, summarise
from extender.sim.scenario import load_scenario
from extender.sim.simulation import prepare, simulate
from extender.sim.truth import Truth, TruthRule, check_truth, error_over_time, true_factors, world_policy
from tests.test_sim import SCENARIOS, TINY_SCENARIO, cut, write_tiny


def test_a_start_takes_the_worlds_time_and_the_strategy_believes_the_policy(tmp_path: Path) -> None:
    path = write_tiny(tmp_path)
    path.write_text(TINY_SCENARIO + "truth:\n  factors:\n    - factors: {imagePull: 2, engine: 2}\n")
    (run,) = simulate(prepare(load_scenario(path)), ["default"])
    w = run.workloads[0]
    # tests/test_sim.py: the pod placed at 75 s on box-01 takes 30 s image + 15 s weights + 10 s compile
    # + 5 s init by the policy; the world pulls the image in 60 s and initialises in 10 s
    assert w.placed_s.tolist() == [75.0]
    assert w.believed_s.tolist() == [60.0]
    assert w.startups.tolist() == [95.0]


@pytest.mark.parametrize(("truth", "path", "words"), [
    pytest.param("  factors:\n    - factors: {compile: 2}", "truth.factors[0].factors.compile",
                 "no parameter 'compile'", id="unknown-parameter"),
    pytest.param("  factors:\n    - {workload: nope, factors: {engine: 2}}", "truth.factors[0].workload",
                 "no profile 'nope'", id="unknown-workload"),
    pytest.param("  factors:\n    - {nodeClass: p4d, factors: {engine: 2}}", "truth.factors[0].nodeClass",
                 "no node class 'p4d'", id="unknown-class"),
    pytest.param("  factors:\n    - factors: {engine: 0}", "truth.factors[0].factors.engine", "must be > 0",
                 id="zero-factor"),
    pytest.param("  noise: -1", "truth.noise", "must be >= 0", id="negative-noise"),
    # NaN failed the upper bound first: "must be <= 1.0, got nan", as if it were a number too large
    pytest.param("  noise: .nan", "truth.noise", "expected a finite number, got nan", id="nan-noise"),
    pytest.param("  factors:\n    - factors: {weightsRemote: .nan}", "truth.factors[0].factors.weightsRemote",
                 "expected a finite number, got nan", id="nan-factor"),
])
def test_truth_errors_are_located(tmp_path: Path, truth: str, path: str, words: str) -> None:
    scenario = write_tiny(tmp_path)
    scenario.write_text(TINY_SCENARIO + "truth:\n" + truth + "\n")
    with pytest.raises(DocumentError) as info:
        load_scenario(scenario)
    (problem,) = info.value.problems
    assert problem.path == path and words in problem.message, problem
    assert problem.line is not None and problem.line > TINY_SCENARIO.count("\n")


def test_rules_multiply_and_apply_where_they_match() -> None:
    loaded = load_scenario(SCENARIOS / "calibration.yaml")
    truth = loaded.scenario.truth
    assert truth is not None
    extra = truth.model_copy(update={"factors": (*truth.factors, truth.factors[0].model_copy(
        update={"workload": "mixtral-61g", "node_class": "g5.12xlarge", "factors": {"engine": 2.0}}))})
    for j in (GRAPH, INIT):  # engine: graph capture and engine init alike
        assert true_factors(extra, "mixtral-61g", "g5.12xlarge")[j] == 3.0  # 1.5 everywhere x 2 here
        assert true_factors(extra, "llama3-8b", "g5.12xlarge")[j] == 1.5
    world = world_policy(loaded.policy, extra)
    assert world.profile("mixtral-61g").overrides["g5.12xlarge"].engine_init == pytest.approx(69 * 3)
    assert world.profile("mixtral-61g").overrides["g5.48xlarge"].engine_init == pytest.approx(69 * 1.5)
    assert world_policy(loaded.policy, None) is loaded.policy


@pytest.mark.parametrize(("factors", "graph", "init"), [
    pytest.param({"engine": 2.0}, 2.0, 2.0, id="engine-is-both-as-before-they-were-fitted-apart"),
    pytest.param({"graphCapture": 2.0}, 2.0, 1.0, id="graph-capture-alone"),
    pytest.param({"engineInit": 0.5}, 1.0, 0.5, id="engine-init-alone"),
    pytest.param({"engine": 2.0, "engineInit": 0.5}, 2.0, 1.0, id="the-alias-and-a-parameter-multiply"),
])
def test_engine_in_a_truth_is_graph_capture_and_engine_init(factors: dict[str, float], graph: float,
                                                           init: float) -> None:
    truth = Truth(factors=(TruthRule(factors=factors),))
    assert check_truth(truth, load_scenario(SCENARIOS / "calibration.yaml").policy) == []
    f = true_factors(truth, "any", "class")
    assert (f[GRAPH], f[INIT]) == (graph, init)
    assert sum(f) == len(f) - 2 + graph + init  # nothing else moved


def test_the_calibrated_strategy_learns_the_world_and_the_other_does_not() -> None:
    loaded = cut(load_scenario(SCENARIOS / "calibration.yaml"), 24 * 3600.0)
    prepared = prepare(loaded)
    runs = simulate(prepared, ["cache-aware", "cache-aware-calibrated"])
    errors = {}
    for r in runs:
        placed = np.concatenate([w.placed_s for w in r.workloads])
        believed = np.concatenate([w.believed_s for w in r.workloads])
        true = np.concatenate([w.startups for w in r.workloads])
        errors[r.strategy.name] = [b.mean for b in error_over_time(placed, believed, true, prepared.duration_s, 4)]
    plain, calibrated = errors["cache-aware"], errors["cache-aware-calibrated"]
    assert all(e > 0.25 for e in plain), plain  # the policy is some 35 % short of the world, all along
    # a quarter of a day of starts to learn from, then within 10 %
    assert calibrated[0] > 0.15 and calibrated[-1] < 0.10 and calibrated[-1] < calibrated[0] / 2, calibrated
    section = error_section(runs, prepared.duration_s, 4)
    assert section.splitlines()[0].startswith("estimate error of new replicas")
    assert "cache-aware-calibrated" in section and "18-24 h" in section


def test_calibrating_a_world_that_is_the_policy_changes_nothing() -> None:
    loaded = cut(load_scenario(SCENARIOS / "mixed-fleet.yaml"), 6 * 3600.0)
    prepared = prepare(loaded)
    plain, calibrated = simulate(prepared, ["cache-aware", "cache-aware-calibrated"])
    a, b = (summarise(r.workloads, 10.0) for r in (plain, calibrated))
    assert a == b
    for w in plain.workloads:
        assert np.array_equal(w.believed_s, w.startups)  # no truth: belief and world agree exactly
    report = build("t", 10.0, prepared.duration_s, [plain, calibrated])
    assert not math.isnan(report.summaries["cache-aware-calibrated"].slo_attainment)
