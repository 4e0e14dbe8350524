"""bench/bench_forecast.py's own arithmetic, against figures worked out by hand: the chance that a
calibrated quantile passes a coverage cell, the quantile score and the naive upper it is compared
with."""

from __future__ import annotations

import functools
import importlib.util
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar, NamedTuple

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "bench_forecast.py"


@functools.cache
def bench() -> ModuleType:
    """The bench script as a module (it is not a package; its dataclasses need it in sys.modules)."""
    spec = importlib.util.spec_from_file_location("bench_forecast", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class Case(NamedTuple):
    id: str
    n: int
    passing: range  # hit counts h with |h / n - 0.95| <= 0.03


CASES = [
    Case("20 origins: only 19 of 20", 20, range(19, 20)),
    Case("44 origins: 41 to 43", 44, range(41, 44)),
    Case("90 origins: 83 to 88 (90 of 90 is outside)", 90, range(83, 89)),
    Case("100 origins: 92 to 98, both edges inside", 100, range(92, 99)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_calibrated_pass_sums_the_binomial_over_the_passing_counts(case: Case) -> None:
    want = sum(math.comb(case.n, h) * 0.95**h * 0.05 ** (case.n - h) for h in case.passing)
    assert bench().calibrated_pass(case.n, 0.95, 0.03) == pytest.approx(want, rel=1e-12)


class Calibration(NamedTuple):
    id: str
    n: int
    hits: int
    p: float  # worked out below each row; the same to 4 places as scipy 1.17.1's binomtest(hits, n, 0.95)


def chance(n: int, h: int) -> float:
    return math.comb(n, h) * 0.95**h * 0.05 ** (n - h)


CALIBRATIONS = [
    # 19 is the likeliest count of 20: every count is as or less likely, p = 1
    Calibration("19 of 20: the mode", 20, 19, 1.0),
    # P(18) = 0.189 is below P(19) = 0.377 and P(20) = 0.358: p = 1 - 0.377 - 0.358
    Calibration("18 of 20: the slice's cell", 20, 18, 1 - chance(20, 19) - chance(20, 20)),
    # P(44) = 0.95^44 = 0.105; P(40..43) are larger, P(39) = 0.046 and below smaller: p = P(44) + P(X <= 39)
    Calibration("44 of 44: over-covered", 44, 44, chance(44, 44) + sum(chance(44, h) for h in range(40))),
    # P(90) = 0.0099; of the low counts, those up to 80 are as unlikely: p = P(90) + P(X <= 80)
    Calibration("90 of 90: told apart", 90, 90, chance(90, 90) + sum(chance(90, h) for h in range(81))),
    Calibration("0 of 5: as far off as it gets", 5, 0, 0.05**5),
]


@pytest.mark.parametrize("row", CALIBRATIONS, ids=[r.id for r in CALIBRATIONS])
def test_calibration_p_is_the_exact_two_sided_binomial_test(row: Calibration) -> None:
    assert bench().calibration_p(row.n, row.hits, 0.95) == pytest.approx(row.p, rel=1e-9)


@pytest.mark.parametrize("row", CALIBRATIONS[1:4], ids=[r.id for r in CALIBRATIONS[1:4]])
def test_calibration_p_matches_the_published_figure(row: Calibration) -> None:
    # scipy.stats.binomtest(hits, n, 0.95).pvalue, scipy 1.17.1 (not a dependency; run once by hand)
    scipy = {(20, 18): 0.2642, (44, 44): 0.1721, (90, 90): 0.0244}
    assert bench().calibration_p(row.n, row.hits, 0.95) == pytest.approx(scipy[row.n, row.hits], abs=5e-5)


def test_the_bundled_rates_carry_their_credit_into_the_bench() -> None:
    from extender.sim.traces import AZURE_CREDIT
    rates = Path(__file__).resolve().parent.parent / "scenarios" / "traces" / "azure-code-rates.csv"
    assert AZURE_CREDIT in bench().trace_series(rates, 15.0, "x", AZURE_CREDIT).source
    assert "(" not in bench().trace_series(rates, 15.0, "x").source  # a rate file credits nothing by itself


class Score(NamedTuple):
    id: str
    actual: float
    upper: float
    score: float


#: The quantile (pinball) loss at 95%, worked by hand.
SCORES = [
    Score("a miss is charged 0.95 a unit", 12.0, 10.0, 1.9),
    Score("spare width is charged 0.05 a unit", 6.0, 10.0, 0.2),
    Score("on the upper exactly: nothing", 10.0, 10.0, 0.0),
    Score("an upper at zero missing nothing", 0.0, 0.0, 0.0),
]


@pytest.mark.parametrize("row", SCORES, ids=[r.id for r in SCORES])
def test_quantile_score(row: Score) -> None:
    assert bench().quantile_score(row.actual, row.upper, 0.95) == pytest.approx(row.score, rel=1e-12)


def test_the_quantile_score_is_lowest_at_the_empirical_quantile() -> None:
    # the property it is there for: over a sample, the constant upper with the lowest mean score is
    # the sample's 95% quantile, so a lower score is a better quantile, not just a wider one
    rng = np.random.default_rng(3)
    sample = rng.lognormal(1.0, 0.8, 400)
    uppers = np.sort(sample)
    mean_score = [float(np.mean([bench().quantile_score(a, u, 0.95) for a in sample])) for u in uppers]
    best = uppers[int(np.argmin(mean_score))]
    assert np.mean(sample <= best) == pytest.approx(0.95, abs=1 / len(sample))


class Naive(NamedTuple):
    id: str
    y: list[float]
    k: int
    upper: float


#: The last value's own upper: y[t] plus the split-conformal 95% quantile of the history's k-step
#: changes (of N changes, the ceil(0.95 (N + 1))-th smallest; the largest below 19 of them).
NAIVE = [
    Naive("a flat series: the last value itself", [5.0] * 30, 1, 5.0),
    # 39 one-step changes, 20 of +1 and 19 of -1: the 38th smallest of 39 is +1
    Naive("changes up and down", [10.0 + (i % 2) for i in range(40)], 1, 11.0 + 1.0),
    # three two-step changes (+2, +7, +1): fewer than 19, so the largest
    Naive("few changes: the largest", [1.0, 2.0, 3.0, 9.0, 4.0], 2, 4.0 + 7.0),
    # the quantile is never negative: a falling series keeps the last value as its upper
    Naive("only falls: no lower than the last value", [9.0, 8.0, 7.0, 6.0], 1, 6.0),
    # a gap takes out the changes it touches, nothing else
    Naive("a gap drops its changes", [1.0, float("nan"), 30.0, 2.0, 3.0], 1, 3.0 + 1.0),
]


@pytest.mark.parametrize("row", NAIVE, ids=[r.id for r in NAIVE])
def test_naive_upper(row: Naive) -> None:
    assert bench().naive_upper(np.array(row.y), row.k, 0.95) == pytest.approx(row.upper, rel=1e-12)


class Paired(NamedTuple):
    id: str
    auto: dict[int, float]
    ref: dict[int, float]
    k: int
    every: int
    #: what the statistic must equal: dm_statistic on these (auto, reference, lag) arrays
    same_as: tuple[list[float], list[float], int] | None


PAIRED = [
    Paired("equal errors: zero", {0: 1.0, 1: 2.0, 2: 3.0}, {0: 1.0, 1: 2.0, 2: 3.0}, 1, 1,
           ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], 1)),
    Paired("only the origins both forecast", {0: 1.0, 1: 5.0, 2: 2.0, 3: 1.0}, {0: 2.0, 2: 4.0, 3: 1.5}, 1, 1,
           ([1.0, 2.0, 1.0], [2.0, 4.0, 1.5], 1)),
    Paired("origins one step apart share k - 1 lags", {0: 1.0, 1: 3.0, 2: 2.0, 3: 4.0},
           {0: 2.0, 1: 2.5, 2: 3.0, 3: 6.0}, 3, 1, ([1.0, 3.0, 2.0, 4.0], [2.0, 2.5, 3.0, 6.0], 3)),
    Paired("origins two steps apart share fewer", {0: 1.0, 2: 3.0, 4: 2.0, 6: 4.0},
           {0: 2.0, 2: 2.5, 4: 3.0, 6: 6.0}, 3, 2, ([1.0, 3.0, 2.0, 4.0], [2.0, 2.5, 3.0, 6.0], 2)),
    Paired("fewer than two shared origins: no statistic", {0: 1.0, 1: 2.0}, {1: 3.0}, 1, 1, None),
    # the Azure slice: auto ran the last value at every origin, one of them regridded to 1.5999999999999996
    # for 1.6; without the tie the lone rounding difference over a zero variance made z -1.03
    Paired("a difference in the last bits is a tie: zero", {0: 0.4, 1: 2.0, 2: abs(2.0 - 1.5999999999999996)},
           {0: 0.4, 1: 2.0, 2: abs(2.0 - 1.6)}, 1, 1, ([0.4, 2.0, 0.4], [0.4, 2.0, 0.4], 1)),
    Paired("a difference of a millionth is not", {0: 0.4, 1: 2.0, 2: 0.400001}, {0: 0.4, 1: 2.0, 2: 0.4}, 1, 1,
           ([0.4, 2.0, 0.400001], [0.4, 2.0, 0.4], 1)),
]


@pytest.mark.parametrize("row", PAIRED, ids=[r.id for r in PAIRED])
def test_paired_z_is_the_diebold_mariano_statistic_on_the_shared_origins(row: Paired) -> None:
    from extender.core.choice import dm_statistic
    got = bench().paired_z(row.auto, row.ref, row.k, row.every)
    if row.same_as is None:
        assert math.isnan(got)
        return
    a, r, lag = row.same_as
    assert got == pytest.approx(dm_statistic(np.array(a), np.array(r), lag), rel=1e-12, abs=1e-12)


def test_paired_z_is_negative_when_auto_is_behind() -> None:
    rng = np.random.default_rng(5)
    ref = {o: float(e) for o, e in enumerate(rng.exponential(1.0, 200))}
    auto = {o: e * 1.5 for o, e in ref.items()}
    assert bench().paired_z(auto, ref, 1, 1) < -bench().AUTO_Z
    assert bench().paired_z(ref, auto, 1, 1) > bench().AUTO_Z


def test_an_error_cell_outside_says_whether_the_loss_is_told_apart_from_noise() -> None:
    def result(name: str, auto: float, z: float) -> dict[str, object]:
        errors = {k: auto for k in (1, 2, 3)}
        return {"series": name, "origins": 100, "z": {"last value": {k: z for k in (1, 2, 3)}},
                "rows": {"auto": {"error": errors, "coverage": {k: 0.95 for k in (1, 2, 3)}},
                         "last value": {"error": {k: 1.0 for k in (1, 2, 3)}}}}
    b = bench().bars([result("noise", 1.01, -0.4), result("loss", 1.2, -3.0), result("gain", 0.9, 2.0)], 0.95)
    failed = b["error no worse than the last value's"]["failed"]
    assert [(f["series"], f["z"]) for f in failed] == [("noise", -0.4)] * 3 + [("loss", -3.0)] * 3
    assert b["error no worse than the last value's"]["told"] == 3
    report = bench().bars_report(b)
    assert "3 of 6 told from noise at 5%" in report
    assert "noise h=1: 1.0100 (paired z -0.40: not told apart at 5%)" in report
    assert "loss h=3: 1.2000 (paired z -3.00: behind at 5%)" in report


class Chance(NamedTuple):
    id: str
    cells: list[tuple[float, float]]  # a series: auto's error over the last value's and its paired z, every horizon
    #: the error bar over all horizons: cells counted, outside on average, all inside (independent cells),
    #: all inside at most (a series' horizons as one)
    error: tuple[int, float, float, float]
    coverage: tuple[int, float, float, float]  # the same for the coverage bar, every series at 20 origins


Q20 = 0.3773536025353076  # calibrated_pass(20, 0.95, 0.03): only 19 of 20 passes (CASES above)
Z95 = 1.6448536269514722  # Phi(Z95) = 0.95
CHANCES = [
    Chance("a coin toss and a clear gain", [(1.01, 0.0), (0.9, Z95)],
           (6, 3 * 0.5 + 3 * 0.05, (0.5 * 0.95) ** 3, 0.5 * 0.95), (6, 6 * (1 - Q20), Q20**6, Q20**2)),
    Chance("ties hold for sure and are left out", [(1.0, 0.0), (1.0 + 1e-12, -1.0)],
           (0, 0.0, 1.0, 1.0), (6, 6 * (1 - Q20), Q20**6, Q20**2)),
    Chance("a sure loss", [(1.5, -math.inf)], (3, 3.0, 0.0, 0.0), (3, 3 * (1 - Q20), Q20**3, Q20)),
    Chance("no statistic: left out", [(1.01, math.nan)], (0, 0.0, 1.0, 1.0), (3, 3 * (1 - Q20), Q20**3, Q20)),
]


@pytest.mark.parametrize("row", CHANCES, ids=[r.id for r in CHANCES])
def test_by_chance_counts_what_noise_alone_would_put_outside(row: Chance) -> None:
    def result(i: int, ratio: float, z: float) -> dict[str, object]:
        return {"series": f"s{i}", "origins": 20, "z": {"last value": {1: z, 2: z, 3: z}},
                "rows": {"auto": {"error": {k: ratio for k in (1, 2, 3)}, "coverage": {k: 0.95 for k in (1, 2, 3)}},
                         "last value": {"error": {k: 1.0 for k in (1, 2, 3)}}}}
    b = bench().bars([result(i, *cell) for i, cell in enumerate(row.cells)], 0.95)
    for bar, want in (("error no worse than the last value's", row.error),
                      ("coverage within 3 points of 95%", row.coverage)):
        got = b[bar]["by_chance"]
        assert (got["cells"], got["outside"], got["all_inside"], got["at_most"]) == pytest.approx(
            want, rel=1e-12, abs=1e-12), bar


def test_at_most_takes_the_least_likely_horizon_of_each_series() -> None:
    zs = {1: 0.0, 2: 1.0, 3: -1.0}  # Phi: 0.5, 0.84, 0.16
    res = {"series": "s", "origins": 20, "z": {"last value": zs},
           "rows": {"auto": {"error": {k: 1.01 for k in zs}, "coverage": {k: 0.95 for k in zs}},
                    "last value": {"error": {k: 1.0 for k in zs}}}}
    got = bench().bars([res], 0.95)["error no worse than the last value's"]["by_chance"]
    assert got["at_most"] == pytest.approx(0.15865525393145707, rel=1e-12)  # Phi(-1)


def test_a_ratio_above_one_in_the_last_bits_holds_the_bar() -> None:
    def result(ratio: float) -> dict[str, object]:
        return {"series": "s", "origins": 574, "z": {},
                "rows": {"auto": {"error": {k: ratio for k in (1, 2, 3)}, "coverage": {k: 0.95 for k in (1, 2, 3)}},
                         "last value": {"error": {k: 1.0 for k in (1, 2, 3)}}}}
    bar = "error no worse than the last value's"
    assert bench().bars([result(1.0 + 1e-12)], 0.95)[bar]["held"] == 3
    assert bench().bars([result(1.0001)], 0.95)[bar]["held"] == 0


class Nab(NamedTuple):
    id: str
    path: str
    rows: int  # as scenarios/traces/README.md says
    upstream: str


NABS = [
    Nab("the load balancer's 14 days", "scenarios/traces/nab-elb-requests.csv", 4032,
        "realAWSCloudwatch/elb_request_count_8c0756.csv"),
    Nab("Apple's last 19.5 days", "scenarios/traces/nab-twitter-aapl.csv", 5611, "realTweets/Twitter_volume_AAPL.csv"),
    Nab("Google's last 19.5 days", "scenarios/traces/nab-twitter-goog.csv", 5707, "realTweets/Twitter_volume_GOOG.csv"),
    *(Nab(f"{s}'s last 5600 rows", f"scenarios/traces/nab-twitter-{s.lower()}.csv", 5600,
          f"realTweets/Twitter_volume_{s}.csv") for s in ("AMZN", "CRM", "CVS", "FB", "IBM", "KO", "PFE", "UPS")),
]


@pytest.mark.parametrize("row", NABS, ids=[r.id for r in NABS])
def test_the_bundled_nab_rates_are_read_whole_with_their_source_and_credit(row: Nab) -> None:
    from extender.sim.scenario import TraceSpec
    from extender.sim.traces import RateTrace, read_trace
    root = Path(__file__).resolve().parent.parent
    assert row.path in bench().NAB_TRACES
    lines = (root / row.path).read_text().splitlines()
    assert lines[0] == "timestamp,rate" and lines[1].startswith("#") and row.upstream in lines[1]
    trace = read_trace(root / row.path, TraceSpec(path=row.path))
    assert isinstance(trace, RateTrace) and len(trace.rates) == row.rows == len(lines) - 2
    assert bench().NAB_CREDIT in bench().trace_series(root / row.path, 600.0, row.path, bench().NAB_CREDIT).source


@dataclass(frozen=True)
class NoisyDay:
    """Three days at 600 s of a noisy daily cycle, the bench's series of it, and what evaluate() makes of
    it: origins every 3 h over the last day, at most a week of history, p95 uppers."""

    series: Any
    t: np.ndarray
    y: np.ndarray
    origins: range
    mean: float  # of the tested span

    STEP: ClassVar[float] = 600.0
    KW: ClassVar[dict[str, Any]] = {"every_s": 3 * 3600.0, "test_s": 86_400.0, "history_s": 7 * 86_400.0,
                                    "level": 0.95, "with_ets": False}

    @classmethod
    def drawn(cls, seed: int) -> NoisyDay:
        n = 3 * 144
        y = 50 + 20 * np.sin(2 * np.pi * np.arange(n) / 144) + np.random.default_rng(seed).normal(0, 4, n)
        return cls(bench().Series("noisy-day", y, cls.STEP, "test"), np.arange(n) * cls.STEP, y,
                   range(n - 144 - 1, n - 3, 18), float(np.mean(y[n - 145:])))

    def auto_at(self, o: int, k: int, phase: float) -> Any:
        from extender.core.forecast import ForecastParams, forecast
        return forecast("auto", self.t[:o + 1], self.y[:o + 1], k * self.STEP,
                        ForecastParams(step_s=self.STEP, refit_phase_s=phase))

    def evaluate(self, **kw: Any) -> dict[str, Any]:
        return bench().evaluate(self.series, **self.KW, **kw)  # type: ignore[no-any-return]


def test_phases_average_auto_over_its_refit_phases() -> None:
    # auto's error with --phases 2 is the mean of its absolute errors at the refit phases 0 and
    # 1800 s, origin by origin, worked out here directly
    day = NoisyDay.drawn(7)
    got = day.evaluate(phases=2)
    want = np.mean([np.mean([abs(day.y[o + 2] - day.auto_at(o, 2, ph).point) for ph in (0.0, 1800.0)])
                    for o in day.origins]) / day.mean
    assert got["phases"] == 2 and got["origins"] == len(day.origins)
    assert got["rows"]["auto"]["error"][2] == pytest.approx(want, rel=1e-12)
    assert sum(got["auto_chose"][2].values()) == 2 * len(day.origins)  # every phase's choice is counted
    one = day.evaluate()
    assert one["rows"]["auto"]["error"][2] != pytest.approx(want, rel=1e-9)  # the phase moves it: not a no-op


def test_combine_scores_the_mean_forecast_over_the_phases() -> None:
    # another draw of the same cycle: with --combine, auto's point at an origin is the mean of its
    # points at the phases 0 and 1800 s, and its upper the mean of their uppers
    day = NoisyDay.drawn(2)
    got = day.evaluate(phases=2, combine=True)
    made = [[day.auto_at(o, 1, ph) for ph in (0.0, 1800.0)] for o in day.origins]
    points = [np.mean([f.point for f in fs]) for fs in made]
    uppers = [np.mean([f.upper for f in fs]) for fs in made]
    want = np.mean([abs(day.y[o + 1] - p) for o, p in zip(day.origins, points, strict=True)]) / day.mean
    assert got["combine"] and got["rows"]["auto"]["error"][1] == pytest.approx(want, rel=1e-12)
    covered = np.mean([day.y[o + 1] <= u for o, u in zip(day.origins, uppers, strict=True)])
    assert got["rows"]["auto"]["coverage"][1] == pytest.approx(covered)
    apart = day.evaluate(phases=2)  # Jensen: never above the mean of the phases' errors
    for k in (1, 2, 3):
        assert got["rows"]["auto"]["error"][k] <= apart["rows"]["auto"]["error"][k] + 1e-12
    # one step ahead the two phases chose apart at some origins, on either side of the outcome
    assert got["rows"]["auto"]["error"][1] < apart["rows"]["auto"]["error"][1] - 1e-4


def test_combine_without_phases_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench().main(["--combine", "--only", "nothing"])
    assert exit_.value.code == 2 and "--combine needs --phases 2 or more" in capsys.readouterr().err


def test_phases_below_one_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench().main(["--phases", "0", "--only", "nothing"])
    assert exit_.value.code == 2 and "--phases must be at least 1, got 0" in capsys.readouterr().err


def test_a_coverage_cell_outside_says_whether_the_quantile_is_told_miscalibrated() -> None:
    def result(name: str, coverage: float, origins: int, phases: int = 1) -> dict[str, object]:
        ones = {k: 1.0 for k in (1, 2, 3)}
        return {"series": name, "origins": origins, "phases": phases, "z": {},
                "rows": {"auto": {"error": ones, "coverage": {k: coverage for k in (1, 2, 3)}},
                         "last value": {"error": ones}}}
    # 18 of 20 (p 0.26); 90 of 90 (p 0.02); 83.3% over six phases of 20 origins: 17 of 20 (p 0.08),
    # not 100 of 120 uppers (p 0.00: the phases of one origin face one outcome)
    b = bench().bars([result("short", 0.9, 20), result("wide", 1.0, 90), result("phased", 5 / 6, 20, 6)], 0.95)
    bar = b["coverage within 3 points of 95%"]
    told = [(f["series"], f["told"]) for f in bar["failed"][::3]]
    assert told == [("short", False), ("wide", True), ("phased", False)]
    assert bar["failed"][6]["p"] == pytest.approx(bench().calibration_p(20, 17, 0.95))
    assert bar["told"] == 3
    report = bench().bars_report(b)
    assert "short h=1: 0.9000 (20 origins: a calibrated quantile passes with probability 0.38; " \
           "binomial p 0.26: not told apart at 5%)" in report
    assert "wide h=2: 1.0000 (90 origins" in report and "binomial p 0.02: miscalibrated at 5%" in report


def test_tick_cost_times_every_forecaster_from_empty_memos() -> None:
    # CPU seconds are not asserted (they are measurements); what is: it runs, from empty memos,
    # every forecaster, and says which model each ran
    b = bench()
    got = b.tick_cost(step=300.0, hours=67.0, ticks=2)
    assert set(got) == set(b.NAMES)
    assert got["last"]["method"] == "last" and got["holt-winters"]["method"] in {"holt-winters", "holt"}
    for row in got.values():
        assert row["refit"] >= 0.0 and row["tick"] >= 0.0
