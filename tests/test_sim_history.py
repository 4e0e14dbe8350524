"""The scenario's ``history``: demand the scaler has seen before t = 0. Its forecasts read it, the
simulated demand does not change for it (synthetic), and a trace gives its first part to it."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from extender.core.forecast import forecast
from extender.sim.errors import ScenarioError
from extender.sim.scenario import SyntheticSpec, load_scenario
from extender.sim.simulation import Run, prepare
from extender.sim.strategies import STRATEGIES
from extender.sim.synthetic import rate_trace
from tests.test_sim import TINY_SCENARIO, cli, write_tiny

DAY = 86_400.0


class Formula(NamedTuple):
    name: str
    spec: dict[str, object]
    hour: int  # a step of the history (1 h steps from -1 d)
    expected: float  # the formula's rate there


FORMULA = [
    # rate(t) = 10 (1 + 0.5 cos(2 pi (t - 14h) / 1d)): t = -10 h is 14:00 the day before
    Formula("the daily peak a day before", {"daily": {"amplitude": 0.5, "peak": "14h"}}, 14, 15.0),
    Formula("the daily trough a day before", {"daily": {"amplitude": 0.5, "peak": "14h"}}, 2, 5.0),
    # a trend of +24 % a day: at t = -12 h the rate is 10 (1 - 0.12)
    Formula("a trend runs backwards", {"trend": 0.24}, 12, 8.8),
    # the trend's factor stops at 0 (as it does for a falling trend after t = 0)
    Formula("a steep trend stops at zero", {"trend": 5.0}, 0, 0.0),
]


@pytest.mark.parametrize("row", FORMULA, ids=[r.name for r in FORMULA])
def test_the_history_is_the_same_formula_before_t0(row: Formula) -> None:
    spec = SyntheticSpec.model_validate({"duration": "2d", "step": "1h", "base": 10, **row.spec})
    before = rate_trace(spec, np.random.default_rng(1), start=-DAY, duration=DAY)
    assert len(before.rates) == 24 and before.starts[0] == 0.0 and before.end == DAY
    assert before.rates[row.hour] == pytest.approx(row.expected)


#: The tiny scenario with a synthetic demand (noise, bursts, Poisson arrivals) and the predictive strategy.
SYNTHETIC = TINY_SCENARIO.replace("    demand: {trace: {path: step.csv}}\n", """\
    demand:
      synthetic: {duration: 2h, step: 5m, base: 0.5, daily: {amplitude: 0.5, peak: 14h}, noise: 0.2,
                  bursts: {perDay: 24, amplitude: 1, duration: 10m}}
""").replace("strategies: [default]", "strategies: [predictive]")


class Span(NamedTuple):
    name: str
    history: str
    ticks: int  # of 15 s


SPANS = [
    Span("none", "0s", 0),
    Span("six hours", "6h", 1440),
    Span("not whole ticks: rounded up", "100s", 7),
]


@pytest.mark.parametrize("row", SPANS, ids=[r.name for r in SPANS])
def test_a_synthetic_history_leaves_the_simulated_demand_as_it_was(tmp_path: Path, row: Span) -> None:
    write_tiny(tmp_path)
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SYNTHETIC)
    alone = prepare(load_scenario(scenario)).workloads[0]
    scenario.write_text(SYNTHETIC + f"history: {row.history}\n")
    prepared = prepare(load_scenario(scenario))
    w = prepared.workloads[0]
    assert len(w.history) == row.ticks and prepared.history_s == row.ticks * 15.0
    assert np.array_equal(w.arrivals.times, alone.arrivals.times)
    assert np.array_equal(w.arrivals.weights, alone.arrivals.weights)
    if row.ticks:
        # Poisson counts of a rate that never falls to 0: demand in most ticks, whole requests in each
        assert np.count_nonzero(w.history) > row.ticks // 2
        assert np.allclose(w.history * 15.0, np.round(w.history * 15.0))


def test_a_trace_gives_its_first_part_to_the_history(tmp_path: Path) -> None:
    # step.csv: 1 request/s for the first minute, then 2/s until 300 s
    scenario = write_tiny(tmp_path)
    whole = prepare(load_scenario(scenario))
    scenario.write_text(TINY_SCENARIO + "history: 1m\n")
    prepared = prepare(load_scenario(scenario))
    w = prepared.workloads[0]
    assert w.history.tolist() == [1.0, 1.0, 1.0, 1.0]
    assert prepared.n_ticks == whole.n_ticks - 4  # the replay starts at the trace's minute 1
    assert w.arrivals.times[0] == 0.0 and np.allclose(w.arrivals.weights / w.arrivals.bin_s, 2.0)
    assert w.history.sum() * 15.0 + w.arrivals.total == pytest.approx(whole.workloads[0].arrivals.total)


def test_a_trace_no_longer_than_the_history_is_an_error(tmp_path: Path) -> None:
    scenario = write_tiny(tmp_path)
    scenario.write_text(TINY_SCENARIO + "history: 5m\n")
    with pytest.raises(ScenarioError) as info:
        prepare(load_scenario(scenario))
    (problem,) = info.value.problems
    assert problem.path == "history"
    assert "workload 'svc': its trace 'step.csv' lasts 5m, no longer than the history (5m)" in problem.message


def test_a_negative_history_is_located(tmp_path: Path) -> None:
    scenario = write_tiny(tmp_path)
    scenario.write_text(TINY_SCENARIO + "history: -1h\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(scenario)
    assert [p.path for p in info.value.problems] == ["history"]


def test_the_scalers_first_forecast_reads_the_history(tmp_path: Path) -> None:
    write_tiny(tmp_path)
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SYNTHETIC + "history: 6h\n")
    prepared = prepare(load_scenario(scenario))
    run = Run(prepared, STRATEGIES["predictive"])
    seen = prepared.workloads[0].history
    made = run._forecast(run.w[0], 0, 600.0)
    # the reference: the ticks -1439 .. 0 at 15 s, tick j holding the demand of [(j - 1) dt, j dt)
    # (the policy's fit window, 66 h, reaches past all of them)
    times = np.arange(-len(seen) + 1, 1, dtype=np.float64) * 15.0
    scaling = prepared.policy.scaling
    expected = forecast(scaling.forecaster, times, seen, 600.0, run.w[0].params, now_s=0.0)
    assert made == expected
    assert made.observations == len(seen) == 1440  # the policy's grid is the tick: every sample of 6 h


def test_an_upper_is_checked_against_the_demand_at_its_time_also_before_t0(tmp_path: Path) -> None:
    write_tiny(tmp_path)
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SYNTHETIC + "history: 1h\n")
    run = Run(prepare(load_scenario(scenario)), STRATEGIES["predictive"])
    w = run.w[0]
    seen = w.setup.history  # the tiny policy forecasts on the tick's grid: each check is one tick
    assert seen[-1] > 0 and seen[-2] > 0
    w.uppers = [(0.0, seen[-1]), (0.0, seen[-1] * 0.999), (-15.0, seen[-2]), (-15.0, seen[-2] * 0.999)]
    assert run._upper_checks(w) == [True, False, True, False]


@pytest.mark.parametrize(("scenario_history", "flag", "note"), [
    ("", "1m", "1m"),  # the flag gives one
    ("history: 1m\n", "0", None),  # the flag takes the scenario's away
    ("history: 1m\n", None, "1m"),  # the scenario's own
])
def test_the_history_flag_overrides_the_scenario_and_the_report_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], scenario_history: str, flag: str | None,
        note: str | None) -> None:
    scenario = write_tiny(tmp_path)
    scenario.write_text(TINY_SCENARIO + scenario_history)
    assert cli(str(scenario), *(("--history", flag) if flag is not None else ())) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if "before t = 0" in line]
    assert notes == ([] if note is None else [
        f"note: the scaler's forecasts started from {note} of demand seen before t = 0 (the scenario's history)"])
