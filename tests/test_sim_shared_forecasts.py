"""Forecasts shared between the runs of one preparation (``ForecastMemo``) change no figure: every
run gives what it gives alone, and the later runs do take forecasts from the earlier ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from extender.sim.scenario import load_scenario
from extender.sim.simulation import ForecastMemo, Prepared, Run, RunResult, prepare, simulate
from extender.sim.strategies import STRATEGIES
from tests.test_sim_snapshot import BENCH_LIKE
from tests.test_sim_world import POLICY_TEXT, POOLED

#: Every strategy that forecasts, and the oracle (which must neither read nor fill the memo).
ORDER = ["predictive", "oracle", "predictive-no-warm", "warm-only"]


def prepared(tmp_path: Path, text: str) -> Prepared:
    (tmp_path / "policy.yaml").write_text(POLICY_TEXT)
    (tmp_path / "s.yaml").write_text(text)
    return prepare(load_scenario(tmp_path / "s.yaml"))


def figures(result: RunResult) -> list[object]:
    """Everything a run reports per workload, arrays as lists, plus the fleet's figures."""
    out: list[object] = [result.warm_actions, result.fleet_gpu_seconds, result.fleet_gpus.tolist(),
                         result.nodes_launched, result.nodes_removed, result.nodes_consolidated]
    for w in result.workloads:
        t = w.timeline
        out += [w.name, w.served, w.queued, w.gpu_seconds, w.disrupted, w.startups.tolist(), w.cold.tolist(),
                w.ready_waits.tolist(), t.capacity.tolist(), t.ready.tolist(), t.starting.tolist(),
                t.pending.tolist(), t.queue.tolist()]
    return out


@pytest.mark.parametrize("scenario", [BENCH_LIKE.replace("REGISTRY", "false"), POOLED],
                         ids=["fixed-fleet", "autoscaled-pool"])
def test_shared_forecasts_change_no_figure(tmp_path: Path, scenario: str) -> None:
    alone = [figures(Run(prepared(tmp_path, scenario), STRATEGIES[name]).run()) for name in ORDER]
    memo: ForecastMemo = {}
    shared = [figures(r) for r in simulate(prepared(tmp_path, scenario), ORDER, forecasts=memo)]
    assert shared == alone
    assert memo  # the forecasting runs filled it ...


def test_later_runs_take_the_earlier_runs_forecasts(tmp_path: Path) -> None:
    p = prepared(tmp_path, BENCH_LIKE.replace("REGISTRY", "false"))
    memo: ForecastMemo = {}
    Run(p, STRATEGIES["predictive"], forecasts=memo).run()
    made = dict(memo)
    # ... and warm-only's look-ahead is predictive's: same ticks, same horizon, nothing new to make
    Run(p, STRATEGIES["warm-only"], forecasts=memo).run()
    assert memo.keys() == made.keys()
    assert all(memo[k] is made[k] for k in made)


@pytest.mark.parametrize(("name", "forecasts"), [
    ("default", False), ("cache-aware", False), ("predictive", True), ("oracle", False),
    ("predictive-no-warm", True), ("warm-only", True), ("predictive-calibrated", True),
])
def test_which_strategies_forecast(name: str, forecasts: bool) -> None:
    assert STRATEGIES[name].forecasts is forecasts


def test_a_single_forecasting_run_keeps_no_memo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[ForecastMemo | None] = []
    original = Run.__init__

    def spy(self: Run, *args: object, forecasts: ForecastMemo | None = None, **kwargs: object) -> None:
        seen.append(forecasts)
        original(self, *args, forecasts=forecasts, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Run, "__init__", spy)
    p = prepared(tmp_path, POOLED)
    simulate(p, ["default", "predictive", "oracle"])
    assert seen == [None, None, None]  # the demo's strategies: nothing would read what it kept
    seen.clear()
    simulate(p, ["predictive", "warm-only"])
    assert seen[0] is not None and seen[0] is seen[1]


def test_each_workload_forecasts_with_its_own_refit_phase(tmp_path: Path) -> None:
    # as the production scaler does (ScaleLoop.params): the refits of the workloads spread over the period
    from extender.core.forecast import refit_phase
    p = prepared(tmp_path, POOLED)
    memo: ForecastMemo = {}
    run = Run(p, STRATEGIES["predictive"], forecasts=memo)
    refit = run.params.refit_s  # the policy's
    for s in run.w:
        assert s.params.refit_phase_s == refit_phase(s.setup.profile.name, refit)
        assert s.params != run.params  # not the policy's own parameters, phase 0
    run.run()
    used = {key[4] for key in memo}  # the parameters each forecast was made with
    assert used == {s.params for s in run.w}
