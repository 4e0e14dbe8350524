"""Forecasters: a plain-Python oracle, hand-computed values, recovery of known shapes, edge cases, registry."""

from __future__ import annotations

import itertools
import math
import statistics
from typing import Any, NamedTuple, get_args

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.core.errors import UnknownNameError
from extender.core.forecast import (
    FORECASTERS,
    Forecast,
    ForecastParams,
    fit_holt_winters,
    forecast,
    forecaster,
    resample,
    spread_factor,
)
from extender.core.policy import Scaling

NAN = math.nan
NAMES = sorted(FORECASTERS)

# ---------------------------------------------------------------------------------------------
# The oracle: plain Python, textbook component forms, no numpy. Deliberately written differently
# from the implementation (dict binning, component-form updates, explicit sort and loops).
# ---------------------------------------------------------------------------------------------


def ref_grid(ts: list[float], ys: list[float], step: float | None) -> tuple[list[float], float, float | None]:
    """(grid, step, t_end): mean of the samples nearest each point t_end - k*step; NaN where none."""
    pairs = [(t, y) for t, y in zip(ts, ys, strict=True) if math.isfinite(t) and math.isfinite(y)]
    if not pairs:
        return [], step or 0.0, None
    t_end = max(t for t, _ in pairs)
    if step is None:
        distinct = sorted({t for t, _ in pairs})
        gaps = [b - a for a, b in itertools.pairwise(distinct)]
        step = statistics.median(gaps) if gaps else 0.0
    if step <= 0:
        return [sum(y for _, y in pairs) / len(pairs)], 0.0, t_end
    bins: dict[int, list[float]] = {}
    for t, y in pairs:
        bins.setdefault(round((t_end - t) / step), []).append(y)
    n = max(bins) + 1
    return [sum(bins[k]) / len(bins[k]) if k in bins else NAN for k in range(n - 1, -1, -1)], step, t_end


def ref_ewma(y: list[float], alpha: float) -> tuple[float, list[float]]:
    level = y[0]
    res = []
    for v in y[1:]:
        if math.isnan(v):
            continue
        res.append(v - level)
        level = alpha * v + (1 - alpha) * level
    return level, res


def ref_holt(y: list[float], alpha: float, beta: float) -> tuple[float, float, list[float]]:
    seen = [i for i, v in enumerate(y) if not math.isnan(v)]
    if len(seen) == 1:
        return y[seen[0]], 0.0, []
    i0, i1 = seen[0], seen[1]
    level, trend = y[i1], (y[i1] - y[i0]) / (i1 - i0)
    res = []
    for v in y[i1 + 1:]:
        if math.isnan(v):
            level = level + trend
            continue
        res.append(v - (level + trend))
        new_level = alpha * v + (1 - alpha) * (level + trend)
        trend = beta * (new_level - level) + (1 - beta) * trend
        level = new_level
    return level, trend, res


def mean_of_seen(xs: list[float]) -> float:
    seen = [x for x in xs if not math.isnan(x)]
    return sum(seen) / len(seen) if seen else NAN


def ref_hw(y: list[float], m: int, alpha: float, beta: float, gamma: float) -> tuple[float, float, list[float],
                                                                                     list[float]]:
    a1, a2 = mean_of_seen(y[:m]), mean_of_seen(y[m:2 * m])
    b0 = (a2 - a1) / m
    season = []
    for i in range(m):
        devs = [y[j * m + i] - (a + b0 * (i - (m - 1) / 2)) for j, a in ((0, a1), (1, a2))]
        d = mean_of_seen(devs)
        season.append(0.0 if math.isnan(d) else d)
    centre = sum(season) / m
    season = [s - centre for s in season]
    level, trend = a1 - b0 * (m - 1) / 2 - b0, b0
    res = []
    for t, v in enumerate(y):
        i = t % m
        if math.isnan(v):
            level = level + trend
            continue
        res.append(v - (level + trend + season[i]))
        new_level = alpha * (v - season[i]) + (1 - alpha) * (level + trend)
        new_trend = beta * (new_level - level) + (1 - beta) * trend
        season[i] = gamma * (v - level - trend) + (1 - gamma) * season[i]
        level, trend = new_level, new_trend
    return level, trend, season, res


def ref_quantile(res: list[float], level: float) -> float:
    if not res:
        return 0.0
    ordered = sorted(res)
    return ordered[math.ceil(level * (len(ordered) - 1))]


def ref_spread_factor(h: float, psi: Any) -> float:
    k = max(1, math.ceil(h - 1e-9))
    total = 1.0
    for j in range(1, k):
        total += psi(j) ** 2
    return math.sqrt(total)


def hw_usable(y: list[float], m: int, min_seasons: int) -> bool:
    if m < 2 or len(y) < min_seasons * m:
        return False
    return all(2 * sum(not math.isnan(v) for v in y[j * m:(j + 1) * m]) >= m for j in (0, 1))


def ref_forecast(name: str, ts: list[float], ys: list[float], horizon: float, p: ForecastParams, *,
                 now: float | None = None) -> tuple[float, float, str]:
    """(point, upper, method) by the module docstring, step by step."""
    y, step, t_end = ref_grid(ts, ys, p.step_s)
    if t_end is None:
        return 0.0, 0.0, "none"
    lead = horizon + (max(0.0, now - t_end) if now is not None else 0.0)
    h = lead / step if step > 0 else 0.0
    a, b, g = p.alpha, p.beta, p.gamma
    m = round(p.season_s / step) if step > 0 else 0
    if name == "holt-winters" and hw_usable(y, m, p.min_seasons):
        level, trend, season, res = ref_hw(y, m, a, b, g)
        pos = len(y) - 1 + h
        lo = math.floor(pos)
        seasonal = (1 - (pos - lo)) * season[lo % m] + (pos - lo) * season[(lo + 1) % m]
        raw = level + h * trend + seasonal
        c = ref_spread_factor(h, lambda j: a + j * a * b + (g if j % m == 0 else 0.0))
        method = "holt-winters"
    elif name in ("holt", "holt-winters"):
        level, trend, res = ref_holt(y, a, b)
        raw = level + h * trend
        c = ref_spread_factor(h, lambda j: a + j * a * b)
        method = "holt"
    else:
        level, res = ref_ewma(y, a)
        raw = level
        c = ref_spread_factor(h, lambda j: a)
        method = "ewma"
    spread = max(ref_quantile(res, p.level), 0.0) * c
    return max(raw, 0.0), max(raw + spread, 0.0), method


# ---------------------------------------------------------------------------------------------
# Hand-computed values
# ---------------------------------------------------------------------------------------------

class Hand(NamedTuple):
    id: str
    forecaster: str
    timestamps: list[float]
    values: list[float]
    horizon_s: float
    params: dict[str, Any]
    point: float
    upper: float


HAND = [
    # (id, forecaster, timestamps, values, horizon_s, params, point, upper)
    # EWMA alpha 0.5: l 10 -> e 10, l 15 -> e 5, l 17.5. Residuals [10, 5]: q = r_(ceil(0.95*1)) = 10.
    # h = 30/15 = 2 steps: c = sqrt(1 + 0.5^2) = 1.118034; upper = 17.5 + 11.18034 = 28.68034
    Hand("ewma-three-points", "ewma", [0, 15, 30], [10, 20, 20], 30.0, {"alpha": 0.5},
         17.5, 17.5 + math.sqrt(1.25) * 10),
    # Holt alpha = beta = 0.5: state at t=1: l 3, b 2. t=2: f 5, e +1 -> l 5.5, b 2 + 0.25 = 2.25.
    # t=3: f 7.75, e -0.75 -> l 7.375, b 2.25 - 0.1875 = 2.0625. Point at h 2: 7.375 + 4.125 = 11.5.
    # Residuals sorted [-0.75, 1]: q = 1; psi_1 = 0.5 + 0.25 = 0.75, c = sqrt(1.5625) = 1.25 -> 12.75
    Hand("holt-four-points", "holt", [0, 1, 2, 3], [1, 3, 6, 7], 2.0, {"alpha": 0.5, "beta": 0.5}, 11.5, 12.75),
    # Same with a gap at t=2: t=2 predicted only: l 5. t=3: f 7, e 0 -> l 7, b 2. Point at h 2: 11.
    # No non-zero residual: q = 0, upper = point. (The step is given: inferred from spacings 1 and 2
    # it would be their median, 1.5.)
    Hand("holt-gap", "holt", [0, 1, 3], [1, 3, 7], 2.0, {"alpha": 0.5, "beta": 0.5, "step_s": 1.0}, 11.0, 11.0),
    # Holt-Winters m = 2 (season 2 s at a 1 s step), alpha = beta = gamma = 0.5, y = 1 3 2 4 4 5.
    # Init: A1 2, A2 3, b0 0.5; deviations from A_j + b0*(i - 0.5): season [-0.75, 0.75];
    # l = 2 - 0.25 - 0.5 = 1.25. t=0..3 fit exactly (e 0), l 3.25 after t=3.
    # t=4 (slot 0): f 3.25 + 0.5 - 0.75 = 3, e +1 -> l 4.25, b 0.75, s0 -0.25.
    # t=5 (slot 1): f 4.25 + 0.75 + 0.75 = 5.75, e -0.75 -> l 4.625, b 0.5625, s1 0.375.
    # h 2 -> slot (5 + 2) mod 2 = 1: 4.625 + 1.125 + 0.375 = 6.125. Residuals sorted [-0.75, 0, 0, 0, 0, 1]:
    # q = r_(ceil(0.95*5) = 5) = 1; psi_1 = 0.5 + 0.25 (1 mod 2 != 0: no gamma) -> c 1.25 -> 7.375
    Hand("holt-winters-m2", "holt-winters", [0, 1, 2, 3, 4, 5], [1, 3, 2, 4, 4, 5], 2.0,
     {"alpha": 0.5, "beta": 0.5, "gamma": 0.5, "season_s": 2.0}, 6.125, 7.375),
    # Same fit at h 1 -> slot 0: 4.625 + 0.5625 - 0.25 = 4.9375; c = 1 -> upper 5.9375
    Hand("holt-winters-m2-one-step", "holt-winters", [0, 1, 2, 3, 4, 5], [1, 3, 2, 4, 4, 5], 1.0,
     {"alpha": 0.5, "beta": 0.5, "gamma": 0.5, "season_s": 2.0}, 4.9375, 5.9375),
    # Falling Holt: l 0 at t=1 after 10, b -10; point at h 3 is -30 -> clamped to 0, upper too
    Hand("holt-clamped-at-zero", "holt", [0, 1], [10, 0], 3.0, {}, 0.0, 0.0),
    # One sample: flat, no residuals
    Hand("one-point-ewma", "ewma", [100], [7], 600.0, {}, 7.0, 7.0),
    Hand("one-point-holt", "holt", [100], [7], 600.0, {}, 7.0, 7.0),
    Hand("one-point-holt-winters", "holt-winters", [100], [7], 600.0, {}, 7.0, 7.0),
    # Empty and all-NaN: the neutral zero
    Hand("empty", "holt", [], [], 60.0, {}, 0.0, 0.0),
    Hand("all-nan", "holt-winters", [0, 15, 30], [NAN, NAN, NAN], 60.0, {}, 0.0, 0.0),
]


@pytest.mark.parametrize("row", HAND, ids=[r.id for r in HAND])
def test_hand_computed(row: Hand) -> None:
    params = ForecastParams(**row.params)
    f = forecast(row.forecaster, row.timestamps, row.values, row.horizon_s, params)
    assert f.point == pytest.approx(row.point, abs=1e-12)
    assert f.upper == pytest.approx(row.upper, abs=1e-12)
    # and the oracle agrees with the hand arithmetic
    oracle = ref_forecast(row.forecaster, row.timestamps, row.values, row.horizon_s, params)
    assert oracle[:2] == pytest.approx((row.point, row.upper))


def test_holt_winters_hand_state() -> None:
    # the state behind the "holt-winters-m2" row
    level, trend, season, res = fit_holt_winters(np.array([1, 3, 2, 4, 4, 5.0]), 2, 0.5, 0.5, 0.5)
    assert (level, trend) == (4.625, 0.5625)
    assert season.tolist() == [-0.25, 0.375]
    assert res.tolist() == [0, 0, 0, 0, 1, -0.75]


def test_empty_history_says_so() -> None:
    f = forecast("holt", [], [], 60.0)
    assert (f.method, f.note, f.observations, f.t_end) == ("none", "no observations", 0, None)


# ---------------------------------------------------------------------------------------------
# Resampling
# ---------------------------------------------------------------------------------------------

GRIDS: list[tuple[str, list[float], list[float], float | None, list[float], float]] = [
    # (id, timestamps, values, step, expected grid, expected step)
    ("regular", [0, 15, 30], [1, 2, 3], None, [1, 2, 3], 15.0),
    # spacings 15, 30, 15 -> median 15; 30 is one missing point
    ("gap", [0, 15, 45, 60], [1, 2, 4, 5], None, [1, 2, NAN, 4, 5], 15.0),
    # scrape jitter: distinct spacings 15.2, 14.7, 15.2 -> median 15.2;
    # (45.1 - t) / 15.2 = 2.967, 1.993, 1.000, 0 -> rounded 3, 2, 1, 0: one sample per point
    ("jitter", [0, 15.2, 29.9, 45.1], [1, 2, 3, 4], None, [1, 2, 3, 4], 15.2),
    ("unsorted", [30, 0, 15], [3, 1, 2], None, [1, 2, 3], 15.0),
    # two samples at t=15 are averaged: (2 + 4) / 2 = 3
    ("duplicate-timestamps", [0, 15, 15, 30], [1, 2, 4, 5], None, [1, 3, 5], 15.0),
    # NaN value and infinite timestamp are missing data: t=15 goes, t=30 stays as the end
    ("nan-and-inf", [0, 15, math.inf, 30], [1, NAN, 9, 3], 15.0, [1, NAN, 3], 15.0),
    # ... and with the step inferred from what is left (0, 30) it is 30
    ("nan-and-inf-inferred", [0, 15, math.inf, 30], [1, NAN, 9, 3], None, [1, 3], 30.0),
    # coarser step averages: (50 - t) / 30 for t = 0..50 by 10 -> 1.67 1.33 1 0.67 0.33 0 -> 2 1 1 1 0 0
    # point 2: y0 = 0; point 1: mean(1, 2, 3) = 2; point 0: mean(4, 5) = 4.5
    ("downsample", [0, 10, 20, 30, 40, 50], [0, 1, 2, 3, 4, 5], 30.0, [0, 2, 4.5], 30.0),
    ("one-sample", [5], [2], None, [2], 0.0),
]


@pytest.mark.parametrize(("ts", "ys", "step", "grid", "expected_step"), [r[1:] for r in GRIDS],
                         ids=[r[0] for r in GRIDS])
def test_resample(ts: list[float], ys: list[float], step: float | None, grid: list[float],
                  expected_step: float) -> None:
    s = resample(ts, ys, step)
    np.testing.assert_array_equal(s.values, grid)
    assert s.step_s == pytest.approx(expected_step)
    assert ref_grid(ts, ys, step)[0] == pytest.approx(grid, nan_ok=True)


def test_resample_bounds_the_grid() -> None:
    # a stray timestamp 1e9 s in the past must not allocate a billion points
    s = resample([0.0, 1e9 - 15, 1e9], [1, 2, 3], 15.0, max_points=10)
    assert s.values.tolist() == [2, 3]


def test_resample_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="2 timestamps but 3 values"):
        resample([0, 1], [1, 2, 3])


# ---------------------------------------------------------------------------------------------
# Known shapes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_constant_series_gives_constant_forecast(name: str) -> None:
    t = np.arange(0, 3 * 96) * 900.0  # three days at 15 min, enough for holt-winters
    f = forecast(name, t, np.full(t.size, 42.0), 1800.0)
    assert f.method == name
    assert f.point == pytest.approx(42.0, abs=1e-9)
    assert f.upper == pytest.approx(42.0, abs=1e-9)


def test_holt_recovers_an_exact_line() -> None:
    t = np.arange(50) * 15.0
    f = forecast("holt", t, 10 + 0.5 * np.arange(50), 150.0)
    # last value 10 + 0.5*49 = 34.5; 10 steps on: 39.5
    assert f.point == pytest.approx(39.5, abs=1e-9)
    assert f.upper == pytest.approx(39.5, abs=1e-9)


def test_holt_learns_a_trend_that_starts_later() -> None:
    # flat at 100 for 40 steps, then +2 per step for 300 steps; default alpha 0.3, beta 0.05
    k = np.arange(340)
    y = np.where(k < 40, 100.0, 100.0 + 2.0 * (k - 39))
    f = forecast("holt", k * 15.0, y, 20 * 15.0)
    truth = y[-1] + 2.0 * 20
    assert f.point == pytest.approx(truth, rel=1e-3)
    assert forecast("ewma", k * 15.0, y, 20 * 15.0).point < truth - 30  # EWMA lags a trend


def test_holt_trend_under_noise() -> None:
    rng = np.random.default_rng(7)
    k = np.arange(600)
    y = 50 + 0.2 * k + rng.normal(0, 2, k.size)
    f = forecast("holt", k * 15.0, y, 40 * 15.0)
    truth = 50 + 0.2 * (599 + 40)
    assert abs(f.point - truth) < 6  # 3 sigma of the noise
    assert f.upper > f.point  # noise gives a spread


def daily(t: np.ndarray) -> np.ndarray:
    return 100 + 50 * np.sin(2 * np.pi * t / 86_400)


def test_holt_winters_recovers_a_daily_sinusoid() -> None:
    t = np.arange(3 * 96) * 900.0
    for lead in (900.0, 3 * 3600.0, 6 * 3600.0, 12 * 3600.0):
        f = forecast("holt-winters", t, daily(t), lead)
        truth = float(daily(np.array([t[-1] + lead]))[0])
        assert f.point == pytest.approx(truth, rel=1e-9), lead
        assert f.upper == pytest.approx(truth, rel=1e-9)
    # Holt, extrapolating the local slope 12 h ahead, misses by tens
    assert abs(forecast("holt", t, daily(t), 12 * 3600.0).point - 100) > 20


def test_holt_winters_sinusoid_on_a_fine_grid() -> None:
    # two and a half days at 5 min (m = 288); a lead between grid points interpolates the season
    t = np.arange(720) * 300.0
    f = forecast("holt-winters", t, daily(t), 1000.0)
    assert f.point == pytest.approx(float(daily(np.array([t[-1] + 1000.0]))[0]), rel=1e-4)


@pytest.mark.parametrize(("missing", "rel"), [
    ([], 1e-12),
    # gaps after the first two seasons are predicted through: still exact
    ([200, 250, 300], 1e-12),
    # gaps inside the first two seasons bias the initial season means (a partial sine period does
    # not average to 100); the recursion then corrects most of it: 241.98 for 241.32
    ([10, 11, 150, 300], 5e-3),
], ids=["no-gaps", "gaps-after-init", "gaps-in-init"])
def test_holt_winters_with_trend_and_gaps(missing: list[int], rel: float) -> None:
    t = np.arange(4 * 96) * 900.0
    y = daily(t) + t / 3600.0  # +1 per hour
    y[missing] = np.nan
    lead = 4 * 3600.0
    f = forecast("holt-winters", t, y, lead)
    truth = float(daily(np.array([t[-1] + lead]))[0]) + (t[-1] + lead) / 3600
    assert f.method == "holt-winters"
    assert f.point == pytest.approx(truth, rel=rel)


HW_FALLBACKS: list[tuple[str, int, list[int], float, str]] = [
    # (id, points at 900 s, indices set to NaN, season_s, words in the note)
    ("one-and-a-half-days", 144, [], 86_400.0, "144 of 192 steps"),
    ("first-season-mostly-missing", 200, list(range(1, 60)), 86_400.0, "season 1 is only 37 of 96"),
    ("season-shorter-than-two-steps", 200, [], 1000.0, "season of 1 step"),
]


@pytest.mark.parametrize(("n", "missing", "season_s", "words"), [r[1:] for r in HW_FALLBACKS],
                         ids=[r[0] for r in HW_FALLBACKS])
def test_holt_winters_falls_back_to_holt(n: int, missing: list[int], season_s: float, words: str) -> None:
    t = np.arange(n) * 900.0
    y = daily(t)
    y[missing] = np.nan
    f = forecast("holt-winters", t, y, 3600.0, ForecastParams(season_s=season_s))
    assert (f.requested, f.method) == ("holt-winters", "holt")
    assert words in f.note
    holt = forecast("holt", t, y, 3600.0)
    assert (f.point, f.upper) == (holt.point, holt.upper)


def test_a_silent_history_is_projected_over_its_silence() -> None:
    t = np.arange(20) * 15.0
    y = 10 + np.arange(20.0)
    # last sample 29 at t=285; now = 345 (4 ticks of silence), horizon 60 -> lead 120 s = 8 steps -> 37
    f = forecast("holt", t, y, 60.0, now_s=345.0)
    assert f.lead_s == 120.0
    assert f.point == pytest.approx(37.0)
    # a clock behind the last sample is no staleness
    assert forecast("holt", t, y, 60.0, now_s=0.0).lead_s == 60.0


def test_upper_quantile_covers_about_its_level() -> None:
    # iid noise around a level: the one-step 95% upper bound should cover ~95% of next values
    rng = np.random.default_rng(3)
    y = 100 + rng.normal(0, 5, 700)
    t = np.arange(y.size) * 15.0
    hits = [y[i + 1] <= forecast("ewma", t[:i + 1], y[:i + 1], 15.0, ForecastParams(alpha=0.1)).upper
            for i in range(200, 699)]
    assert 0.91 <= float(np.mean(hits)) <= 0.99


# ---------------------------------------------------------------------------------------------
# The oracle on arbitrary histories, and properties
# ---------------------------------------------------------------------------------------------

values = st.one_of(st.floats(0, 1e4), st.just(NAN))
spacings = st.sampled_from([15.0, 15.0, 15.0, 15.0, 14.9, 15.1, 30.0, 45.0])


@st.composite
def histories(draw: st.DrawFn, min_size: int = 0) -> tuple[list[float], list[float]]:
    ys = draw(st.lists(values, min_size=min_size, max_size=60))
    gaps = draw(st.lists(spacings, min_size=len(ys), max_size=len(ys)))
    ts = [1_700_000_000.0 + sum(gaps[:i]) for i in range(len(ys))]
    return ts, ys


PARAMS = st.builds(ForecastParams, alpha=st.floats(0.05, 1), beta=st.floats(0, 1), gamma=st.floats(0, 1),
                   level=st.sampled_from([0.8, 0.9, 0.95, 0.99]), season_s=st.sampled_from([60.0, 90.0, 150.0]))


def agrees_with_oracle(name: str, history: tuple[list[float], list[float]], horizon: float,
                       params: ForecastParams) -> None:
    ts, ys = history
    f = forecast(name, ts, ys, horizon, params)
    point, upper, method = ref_forecast(name, ts, ys, horizon, params)
    scale = 1.0 + max((abs(y) for y in ys if math.isfinite(y)), default=0.0)
    assert f.method == method
    assert f.point == pytest.approx(point, rel=1e-9, abs=1e-9 * scale * (1 + horizon))
    assert f.upper == pytest.approx(upper, rel=1e-9, abs=1e-9 * scale * (1 + horizon))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(NAMES), histories(), st.floats(0, 2000), PARAMS)
def test_matches_the_oracle(name: str, history: tuple[list[float], list[float]], horizon: float,
                            params: ForecastParams) -> None:
    agrees_with_oracle(name, history, horizon, params)


@settings(max_examples=200, deadline=None)
@given(histories(min_size=24), st.floats(0, 2000), PARAMS)
def test_holt_winters_matches_the_oracle(history: tuple[list[float], list[float]], horizon: float,
                                         params: ForecastParams) -> None:
    # longer histories, so that most examples reach Holt-Winters rather than its fallback
    agrees_with_oracle("holt-winters", history, horizon, params)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(NAMES), histories(), st.floats(0, 5000), PARAMS)
def test_finite_non_negative_upper_above_point(name: str, history: tuple[list[float], list[float]],
                                               horizon: float, params: ForecastParams) -> None:
    f = forecast(name, *history, horizon, params)
    assert math.isfinite(f.point) and math.isfinite(f.upper)
    assert 0.0 <= f.point <= f.upper
    assert f.spread >= 0.0


@given(st.floats(0, 200), st.floats(0.01, 1), st.floats(0, 1), st.floats(0, 1), st.integers(2, 10))
def test_spread_factor_matches_the_oracle(h: float, a: float, b: float, g: float, m: int) -> None:
    expected = ref_spread_factor(h, lambda j: a + j * a * b + (g if j % m == 0 else 0.0))
    assert spread_factor(h, a, b, g, m) == pytest.approx(expected, rel=1e-12)
    assert spread_factor(h, a, b, g, m) >= 1.0


def test_spread_factor_by_hand() -> None:
    # EWMA alpha 0.5 at 3 steps: sqrt(1 + 2 * 0.25) = sqrt(1.5)
    assert spread_factor(3.0, 0.5) == pytest.approx(math.sqrt(1.5))
    # a lead shorter than one step is one step: c = 1
    assert spread_factor(0.4, 0.5, 0.5) == 1.0


# ---------------------------------------------------------------------------------------------
# Registry and parameters
# ---------------------------------------------------------------------------------------------


def test_unknown_forecaster_names_the_known_ones() -> None:
    with pytest.raises(UnknownNameError, match=r"no forecaster 'prophet' \(known: ewma, holt, holt-winters\)"):
        forecaster("prophet")
    with pytest.raises(UnknownNameError):
        forecast("arima", [0], [1], 60.0)


def test_policy_names_are_the_registry() -> None:
    assert set(get_args(Scaling.model_fields["forecaster"].annotation)) == set(FORECASTERS)


def test_policy_defaults_are_the_forecast_defaults() -> None:
    assert ForecastParams.from_scaling(Scaling()) == ForecastParams()


def test_params_are_validated() -> None:
    with pytest.raises(ValueError, match="alpha"):
        ForecastParams(alpha=0)
    with pytest.raises(ValueError, match="level"):
        ForecastParams(level=1.0)


def test_bad_horizon_is_rejected() -> None:
    with pytest.raises(ValueError, match="horizon"):
        forecast("holt", [0], [1], -1.0)
    with pytest.raises(ValueError, match="horizon"):
        forecast("holt", [0], [1], math.nan)


def test_forecast_is_a_value() -> None:
    f = forecast("holt", [0, 15, 30], [1, 2, 3], 15.0)
    assert isinstance(f, Forecast)
    assert Forecast.model_validate_json(f.model_dump_json()) == f
