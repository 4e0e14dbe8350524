"""Forecasters: a plain-Python oracle, hand-computed values, recovery of known shapes, edge cases, registry."""

from __future__ import annotations

import itertools
import math
import statistics
from pathlib import Path
from typing import Any, NamedTuple, get_args

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.core import forecast as fc
from extender.core import smoothing
from extender.core.errors import InvalidValueError, UnknownNameError
from extender.core.forecast import (
    FORECASTERS,
    Forecast,
    ForecastParams,
    forecast,
    forecaster,
    resample,
    spread_factor,
)
from extender.core.policy import Scaling
from extender.sim.scenario import TraceSpec
from extender.sim.traces import RateTrace, read_trace

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


def observed_at(y: list[float]) -> list[int]:
    return [i for i, v in enumerate(y) if not math.isnan(v)]


class RefState(NamedTuple):
    """The oracle's state after step ``t``: level, trend, the whole season (empty without one)."""

    level: float
    trend: float
    season: list[float]


def ref_t0(name: str, y: list[float], m: int) -> int:
    """The step after which the initial state holds (-1: before y[0])."""
    seen = observed_at(y)
    if name == "holt-winters":
        return -1
    if name == "holt" and len(seen) > 1:
        return seen[1]
    return seen[0]


def ref_state(name: str, y: list[float], upto: int, c: dict[str, float], m: int) -> RefState:
    """Component-form recursion (textbook, damped) from the initial state to step ``upto``."""
    a, b, g, phi = c["alpha"], c["beta"], c["gamma"], c["phi"]
    seen = observed_at(y)
    if name == "holt-winters":
        a1, a2 = mean_of_seen(y[:m]), mean_of_seen(y[m:2 * m])
        b0 = (a2 - a1) / m
        season = []
        for i in range(m):
            devs = [y[j * m + i] - (mean + b0 * (i - (m - 1) / 2)) for j, mean in ((0, a1), (1, a2))]
            d = mean_of_seen(devs)
            season.append(0.0 if math.isnan(d) else d)
        centre = sum(season) / m
        season = [s - centre for s in season]
        level, trend, t0 = a1 - b0 * (m - 1) / 2 - b0, b0, -1
    elif name == "holt" and len(seen) > 1:
        i0, i1 = seen[0], seen[1]
        level, trend, season, t0 = y[i1], (y[i1] - y[i0]) / (i1 - i0), [], i1
    else:
        level, trend, season, t0 = y[seen[0]], 0.0, [], seen[0]
    shift, floor = c.get("shift", 0.0), c.get("floor", 0.0)
    for t in range(t0 + 1, upto + 1):
        v = y[t]
        if math.isnan(v):
            level, trend = level + phi * trend, phi * trend
            continue
        s = season[t % m] if season else 0.0
        f = level + phi * trend + s
        if shift > 0 and abs(v - f) > shift * max(abs(f), floor):  # a level shift: start again from v
            level, trend = v - s, phi * trend
            continue
        new_level = a * (v - s) + (1 - a) * (level + phi * trend)
        new_trend = b * (new_level - level) + (1 - b) * phi * trend
        if season:
            season[t % m] = g * (v - level - phi * trend) + (1 - g) * s
        level, trend = new_level, new_trend
    return RefState(level, trend, season)


def ref_damped(phi: float, h: float) -> float:
    if phi == 1.0:
        return h
    return sum(phi ** j for j in range(1, int(h) + 1)) if h == int(h) else phi * (1 - phi ** h) / (1 - phi)


def ref_project(st: RefState, pos: float, h: float, phi: float, m: int, *, reach: float | None = None) -> float:
    """The forecast at grid position ``pos`` = origin + h, the trend projected over ``min(h, reach)``."""
    f = st.level + ref_damped(phi, h if reach is None else min(h, reach)) * st.trend
    if st.season:
        lo = math.floor(pos)
        f += (1 - (pos - lo)) * st.season[lo % m] + (pos - lo) * st.season[(lo + 1) % m]
    return f


def ref_errors(name: str, y: list[float], k: int, c: dict[str, float], m: int) -> list[float]:
    """k-step errors by brute force: rerun the recursion to every origin, project k steps."""
    out = []
    for t in range(max(ref_t0(name, y, m), 0), len(y) - k):
        if math.isnan(y[t + k]):
            continue
        out.append(y[t + k] - ref_project(ref_state(name, y, t, c, m), t + k, k, c["phi"], m))
    return out


def ref_forecasts(name: str, y: list[float], k: int, c: dict[str, float], m: int) -> list[float]:
    """The forecasts behind :func:`ref_errors`, in the same order."""
    return [ref_project(ref_state(name, y, t, c, m), t + k, k, c["phi"], m)
            for t in range(max(ref_t0(name, y, m), 0), len(y) - k) if not math.isnan(y[t + k])]


def mean_of_seen(xs: list[float]) -> float:
    seen = [x for x in xs if not math.isnan(x)]
    return sum(seen) / len(seen) if seen else NAN


def ref_quantile(res: list[float], level: float) -> float:
    if not res:
        return 0.0
    # the ceil((N+1) level)-th smallest, the largest when there are too few for that rank
    ordered = sorted(res)
    rank = min(math.ceil((len(ordered) + 1) * level - 1e-9), len(ordered))
    return ordered[rank - 1]


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
    """(point, upper, method) with fixed constants (``p.fit`` off), by the module docstring, step by step."""
    assert not p.fit
    y, step, t_end = ref_grid(ts, ys, p.step_s)
    if t_end is None:
        return 0.0, 0.0, "none"
    lead = horizon + (max(0.0, now - t_end) if now is not None else 0.0)
    h = lead / step if step > 0 else 0.0
    m = round(p.season_s / step) if step > 0 else 0
    if name == "auto":
        name = "last"  # no fit, no held-out errors to choose by
    if name == "holt-winters" and not hw_usable(y, m, p.min_seasons):
        name = "holt"
    c = {"alpha": p.alpha, "beta": p.beta, "gamma": p.gamma, "phi": p.phi}
    if name in ("ewma", "last"):
        c.update(beta=0.0, gamma=0.0, phi=1.0)
        if name == "last":
            c["alpha"] = 1.0
    elif name == "holt":
        c["gamma"] = 0.0
    kind = "ewma" if name == "last" else name
    # the trend reaches half the history's span at most (forecast.trend_reach)
    raw = ref_project(ref_state(kind, y, len(y) - 1, c, m), len(y) - 1 + h, h, c["phi"], m,
                      reach=0.5 * (len(y) - 1))
    k = max(1, math.ceil(h - 1e-9))
    errs = ref_errors(kind, y, k, c, m)
    if len(errs) >= max(20, 3 * k):  # enough errors, over three horizons at least
        busy = [v for v in y if v > 0]  # the floor: half the mean of the demand above zero
        floor = max(0.5 * sum(busy) / len(busy), 1e-12) if busy else 1e-12
        rel = [e / max(f, floor) for e, f in zip(errs, ref_forecasts(kind, y, k, c, m), strict=True)]
        spread = max(ref_quantile(rel, p.level), 0.0) * max(raw, floor)
    else:
        a, b, g, phi = c["alpha"], c["beta"], c["gamma"], c["phi"]

        def psi(j: int) -> float:
            return a + a * b * ref_damped(phi, j) + (g if name == "holt-winters" and j % m == 0 else 0.0)

        spread = max(ref_quantile(ref_errors(kind, y, 1, c, m), p.level), 0.0) * ref_spread_factor(h, psi)
    return max(raw, 0.0), max(raw + spread, 0.0), name


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
    # EWMA alpha 0.5: l 10 -> e 10, l 15 -> e 5, l 17.5. Residuals [10, 5]: rank ceil(3 x 0.95) = 3 > 2,
    # so q is the largest, 10.
    # h = 30/15 = 2 steps: c = sqrt(1 + 0.5^2) = 1.118034; upper = 17.5 + 11.18034 = 28.68034
    Hand("ewma-three-points", "ewma", [0, 15, 30], [10, 20, 20], 30.0, {"alpha": 0.5},
         17.5, 17.5 + math.sqrt(1.25) * 10),
    # Holt alpha = beta = 0.5: state at t=1: l 3, b 2. t=2: f 5, e +1 -> l 5.5, b 2 + 0.25 = 2.25.
    # t=3: f 7.75, e -0.75 -> l 7.375, b 2.25 - 0.1875 = 2.0625. The history spans 3 steps, so the
    # trend reaches 1.5 of the 2 (trend_reach): point 7.375 + 1.5 x 2.0625 = 10.46875.
    # Residuals sorted [-0.75, 1]: q = the largest, 1; psi_1 = 0.5 + 0.25 = 0.75, c = sqrt(1.5625) = 1.25 -> 11.71875
    Hand("holt-four-points", "holt", [0, 1, 2, 3], [1, 3, 6, 7], 2.0, {"alpha": 0.5, "beta": 0.5}, 10.46875,
         11.71875),
    # Same with a gap at t=2: t=2 predicted only: l 5. t=3: f 7, e 0 -> l 7, b 2. Point at h 2, the
    # trend reaching 1.5 steps: 7 + 3 = 10.
    # No non-zero residual: q = 0, upper = point. (The step is given: inferred from spacings 1 and 2
    # it would be their median, 1.5.)
    Hand("holt-gap", "holt", [0, 1, 3], [1, 3, 7], 2.0, {"alpha": 0.5, "beta": 0.5, "step_s": 1.0}, 10.0, 10.0),
    # Holt-Winters m = 2 (season 2 s at a 1 s step), alpha = beta = gamma = 0.5, y = 1 3 2 4 4 5.
    # Init: A1 2, A2 3, b0 0.5; deviations from A_j + b0*(i - 0.5): season [-0.75, 0.75];
    # l = 2 - 0.25 - 0.5 = 1.25. t=0..3 fit exactly (e 0), l 3.25 after t=3.
    # t=4 (slot 0): f 3.25 + 0.5 - 0.75 = 3, e +1 -> l 4.25, b 0.75, s0 -0.25.
    # t=5 (slot 1): f 4.25 + 0.75 + 0.75 = 5.75, e -0.75 -> l 4.625, b 0.5625, s1 0.375.
    # h 2 -> slot (5 + 2) mod 2 = 1: 4.625 + 1.125 + 0.375 = 6.125. Residuals sorted [-0.75, 0, 0, 0, 0, 1]:
    # q = the largest (rank ceil(7 x 0.95) = 7 > 6) = 1; psi_1 = 0.5 + 0.25 (1 mod 2 != 0: no gamma) -> c 1.25 -> 7.375
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
    oracle = ref_forecast(row.forecaster, row.timestamps, row.values, row.horizon_s,
                          params.model_copy(update={"fit": False}))
    assert oracle[:2] == pytest.approx((row.point, row.upper))


def test_holt_winters_hand_state() -> None:
    # the state behind the "holt-winters-m2" row
    y = np.array([1, 3, 2, 4, 4, 5.0])
    r = smoothing.run(y, smoothing.Shape(trend=True, m=2), smoothing.Constants(alpha=0.5, beta=0.5, gamma=0.5))
    assert (r.level[-1], r.trend[-1]) == (4.625, 0.5625)
    assert r.season.tolist() == [-0.25, 0.375]
    # one-step errors from origin 0 on (the residual of y[0] against the initial state is not one)
    assert smoothing.errors_at(r, 1).tolist() == [0, 0, 0, 1, -0.75]


ALONG: list[tuple[str, list[float], int, int, list[list[float]]]] = [
    # (id, y, k, first, the errors of the last value at horizons 1..k, one row per origin), by hand
    ("two-steps", [1, 2, 4, 7], 2, 0, [[1, 3], [2, 5]]),
    ("one-step-is-errors-at", [1, 2, 4, 7], 1, 0, [[1], [2], [3]]),
    ("from-an-origin-on", [1, 2, 4, 7], 2, 1, [[2, 5]]),
    # a missing target leaves its cell NaN; the origin at the gap carries the level before it
    ("a-gap", [1, 2, math.nan, 7], 2, 0, [[1, math.nan], [math.nan, 5]]),
    ("horizon-past-the-data", [1, 2, 4], 3, 0, []),
]


@pytest.mark.parametrize(("y", "k", "first", "expected"), [r[1:] for r in ALONG], ids=[r[0] for r in ALONG])
def test_errors_along_the_path(y: list[float], k: int, first: int, expected: list[list[float]]) -> None:
    r = smoothing.run(np.array(y), smoothing.Shape(trend=False, m=0), smoothing.Constants(alpha=1.0))
    got = smoothing.errors_along(r, k, first)
    assert got.shape == (len(expected), k)
    np.testing.assert_array_equal(got, np.array(expected).reshape(-1, k))
    for j in range(1, k + 1):  # each column is errors_at j over the same origins
        column = got[:, j - 1]
        seen = column[~np.isnan(column)]
        assert seen.tolist() == smoothing.errors_at(r, j, first)[:seen.size].tolist()


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


@pytest.mark.parametrize(("ts", "step"), [
    # a stray timestamp 1e9 s in the past must not allocate a billion points
    pytest.param([0.0, 1e9 - 15, 1e9], 15.0, id="a-billion-steps-back"),
    # ... nor, more than 2^63 steps back, wrap around in the cast to a grid index
    pytest.param([-1e300, 1e9 - 15, 1e9], 15.0, id="beyond-int64-steps-back"),
    pytest.param([-1e18, 1e9 - 0.1, 1e9], 0.1, id="beyond-int64-at-a-fine-step"),
    pytest.param([-1.7e308, 1.7e308 - 15 * 2.0**971, 1.7e308], 15 * 2.0**971, id="span-overflows-to-inf"),
])
def test_resample_bounds_the_grid(ts: list[float], step: float) -> None:
    s = resample(ts, [1, 2, 3], step, max_points=10)
    assert s.values.tolist() == [2, 3]
    assert s.t_end == ts[-1]


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
    # auto: every candidate is exact here, so the tie goes to the simplest
    assert f.method == ("last" if name == "auto" else name)
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
    ewma = forecast("ewma", k * 15.0, y, 20 * 15.0)
    assert ewma.point - ewma.median_shift < truth - 30  # EWMA lags a trend ...
    assert ewma.median_shift > 0  # ... and its errors, all positive, say by how much


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
                   phi=st.sampled_from([1.0, 1.0, 0.98, 0.9, 0.8]), fit=st.just(False),
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
    known = r"\(known: auto, ewma, holt, holt-winters, last\)"
    with pytest.raises(UnknownNameError, match=r"no forecaster 'prophet' " + known):
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


@pytest.mark.parametrize(("horizon", "now", "words"), [
    pytest.param(-1.0, None, "horizon", id="negative-horizon"),
    pytest.param(math.nan, None, "horizon", id="nan-horizon"),
    pytest.param(60.0, math.inf, "now must be a finite time", id="infinite-now"),
    pytest.param(60.0, math.nan, "now must be a finite time", id="nan-now"),
])
def test_bad_horizon_is_rejected(horizon: float, now: float | None, words: str) -> None:
    with pytest.raises(InvalidValueError, match=words):
        forecast("holt", [0], [1], horizon, now_s=now)


class Far(NamedTuple):
    horizon: float
    now: float | None
    step: float | None


FAR = [
    pytest.param(Far(365 * 86_400.0, None, None), id="a-year-at-the-sampling-step"),
    pytest.param(Far(1e15, None, None), id="a-horizon-of-1e15-s"),
    pytest.param(Far(300.0, 1e18, None), id="now-far-past-the-last-sample"),
    pytest.param(Far(300.0, None, 1e-9), id="a-nanosecond-grid"),
    pytest.param(Far(1e15, 1e18, 1e-9), id="beyond-numpy-integers"),
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("row", FAR)
def test_a_lead_of_any_length_is_forecast(name: str, row: Far) -> None:
    # the spread of a fallback grows with the lead in steps (spread_factor): a lead of billions of
    # steps must neither allocate them nor loop over them, nor overflow numpy's integers
    t, y = hourly_history(600, seed=4, start=1_700_000_000.0)
    f = forecast(name, t, y, row.horizon, ForecastParams(step_s=row.step, season_s=3600.0), now_s=row.now)
    assert math.isfinite(f.point) and math.isfinite(f.upper)
    assert 0.0 <= f.point <= f.upper


def _huge(kind: str) -> np.ndarray:
    i = np.arange(3000)
    y = 10 + np.random.default_rng(5).normal(size=i.size)
    return {"near-the-float-maximum": 1e307 * (1 + i % 5), "the-float-maximum": np.full(i.size, 1.7e308),
            "maximum-and-zero": np.where(i % 2, 1.7e308, 0.0), "one-1e300-sample": np.where(i == 2500, 1e300, y),
            "a-1e300-last-sample": np.where(i == i[-1], 1e300, y)}[kind]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("kind", ["near-the-float-maximum", "the-float-maximum", "maximum-and-zero",
                                  "one-1e300-sample", "a-1e300-last-sample"])
def test_demand_near_the_float_maximum_is_forecast(name: str, kind: str) -> None:
    # squared errors of values near 1.8e308 overflowed: NaN or inf forecasts, and auto raised
    # ZeroDivisionError on held-out errors that were all NaN
    t = 1_700_000_000.0 + np.arange(3000) * 60.0
    for step in (None, 7.0):
        f = forecast(name, t, _huge(kind), 300.0, ForecastParams(step_s=step))
        assert math.isfinite(f.point) and math.isfinite(f.upper)
        assert 0.0 <= f.point <= f.upper


@pytest.mark.parametrize("name", NAMES)
def test_a_power_of_two_scale_gives_the_same_forecast_scaled(name: str) -> None:
    t, y = hourly_history(600, seed=6, start=1_700_000_000.0)
    p = ForecastParams(season_s=3600.0)
    plain, huge = forecast(name, t, y, 300.0, p), forecast(name, t, y * 2.0**400, 300.0, p)
    assert (huge.point, huge.upper, huge.method, huge.constants) == (
        plain.point * 2.0**400, plain.upper * 2.0**400, plain.method, plain.constants)


class Psi(NamedTuple):
    n: int
    a: float
    b: float
    g: float
    m: int
    phi: float
    rel: float  # the tolerance against the term-by-term sum


def psi_terms(row: Psi) -> float:
    """``sum psi_j^2`` term by term, in plain Python (the oracle of :func:`fc.psi_square_sum`)."""
    total = 0.0
    for j in range(1, row.n + 1):
        damped = j if row.phi == 1.0 else row.phi * (1.0 - row.phi ** j) / (1.0 - row.phi)
        psi = row.a + row.a * row.b * damped + (row.g if row.m > 0 and j % row.m == 0 else 0.0)
        total += psi * psi
    return total


@pytest.mark.parametrize("row", [
    pytest.param(Psi(1, 0.3, 0.05, 0.2, 4, 0.98, 1e-12), id="one-term"),
    pytest.param(Psi(200_001, 1.0, 0.0, 0.0, 0, 1.0, 1e-12), id="last-value"),
    pytest.param(Psi(200_001, 0.3, 0.05, 0.0, 0, 1.0, 1e-12), id="holt-undamped"),
    pytest.param(Psi(200_001, 0.3, 0.4, 0.0, 0, 0.8, 1e-9), id="holt-damped"),
    pytest.param(Psi(200_001, 0.02, 0.4, 0.4, 5760, 0.98, 1e-9), id="holt-winters-damped"),
    pytest.param(Psi(200_001, 0.5, 1.0, 1.0, 7, 1.0, 1e-12), id="holt-winters-undamped"),
    pytest.param(Psi(200_001, 0.3, 0.05, 0.2, 1, 0.999999, 1e-9), id="slowly-damped"),
    pytest.param(Psi(200_001, 0.3, 0.05, 0.2, 3, 1 - 1e-14, 1e-5), id="damped-within-rounding-of-one"),
])
def test_psi_square_sum_is_the_sum(row: Psi) -> None:
    got = fc.psi_square_sum(row.n, row.a, row.b, row.g, row.m, phi=row.phi)
    assert got == pytest.approx(psi_terms(row), rel=row.rel)


def test_forecast_is_a_value() -> None:
    f = forecast("holt", [0, 15, 30], [1, 2, 3], 15.0)
    assert isinstance(f, Forecast)
    assert Forecast.model_validate_json(f.model_dump_json()) == f


# ---------------------------------------------------------------------------------------------
# Fitted constants: bounds, brute-force oracle, schedule, properties
# ---------------------------------------------------------------------------------------------

SHAPES = {"ewma": smoothing.Shape(trend=False), "holt": smoothing.Shape(trend=True),
          "holt-winters": smoothing.Shape(trend=True, m=4)}
#: The bounds the docs promise (smoothing.ALPHAS etc.), written out again on purpose.
BOUNDS = {"alpha": (0.02, 1.0), "beta": (0.0, 0.4), "gamma": (0.0, 0.4), "phi": (0.8, 1.0), "shift": (0.0, math.inf)}
COLUMNS = ("alpha", "beta", "gamma", "phi", "shift")


def row_constants(row: np.ndarray, floor: float = 0.0) -> dict[str, float]:
    """A grid row of ``smoothing.candidates`` as the oracle's constants."""
    return {**dict(zip(COLUMNS, map(float, row), strict=True)), "floor": floor}


def in_bounds(c: dict[str, float]) -> bool:
    lo_hi = all(BOUNDS[k][0] <= v <= BOUNDS[k][1] for k, v in c.items())
    return lo_hi and c["gamma"] <= 1.0 - c["alpha"] + 1e-12


def ref_sae(name: str, y: list[float], c: dict[str, float], m: int) -> float:
    """The fit's loss by brute force: the sum of absolute one-step errors."""
    return sum(abs(e) for e in ref_errors(name, y, 1, c, m)) + (ref_first_residual(y, c, m) if m else 0.0)


def ref_first_residual(y: list[float], c: dict[str, float], m: int) -> float:
    """The seasonal model's fit also scores y[0] against the initial state (before step 0)."""
    if math.isnan(y[0]):
        return 0.0
    st0 = ref_state("holt-winters", y, -1, c, m)
    return abs(y[0] - (st0.level + c["phi"] * st0.trend + st0.season[0]))


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(SHAPES)), st.lists(st.one_of(st.floats(0, 1000), st.just(NAN)), min_size=12,
                                                 max_size=40).filter(lambda v: sum(not math.isnan(x) for x in v) >= 3))
def test_fit_is_the_grid_minimum_of_the_one_step_absolute_error(name: str, y: list[float]) -> None:
    shape = SHAPES[name]
    if shape.seasonal and smoothing.seasonal_ready(np.array(y), shape.m):
        return
    fitted = smoothing.fit(np.array(y), shape)
    c = fitted.as_dict()
    assert in_bounds(c)
    # brute force: every row of both passes scored by the plain-Python oracle; the fit is no worse
    # than any first-pass row, nor than any threshold around the first pass's winner
    arr = np.array(y)
    floor = smoothing.relative_floor(arr)
    first = min(smoothing.candidates(shape), key=lambda r: ref_sae(name, y, row_constants(r), shape.m))
    a, b, g, p, _ = (float(x) for x in first)
    second = smoothing.shift_candidates(shape, smoothing.Constants(alpha=a, beta=b, gamma=g, phi=p),
                                        smoothing.typical_step(arr, floor))
    best = min(ref_sae(name, y, row_constants(r, floor), shape.m) for r in [first, *second])
    got = ref_sae(name, y, {**c, "floor": fitted.floor}, shape.m)
    assert got <= best * (1 + 1e-9) + 1e-9
    assert (fitted.shift > 0) == (fitted.floor > 0)  # a floor only goes with a threshold


def test_sae_matches_the_scalar_run() -> None:
    rng = np.random.default_rng(5)
    y = 50 + np.cumsum(rng.normal(0, 3, 80))
    y[[7, 30, 31]] = np.nan
    floor = smoothing.relative_floor(y)
    for shape in (smoothing.Shape(trend=True), smoothing.Shape(trend=True, m=6)):
        plain = smoothing.candidates(shape)[::37]
        shifted = plain.copy()
        shifted[:, 4] = 0.02  # a threshold of 2% of the forecast: some steps of this walk are shifts
        grid = np.vstack([plain, shifted])
        fast = smoothing.sae(y, shape, grid, smoothing.start(y, shape), floor)
        for row, score in zip(grid, fast, strict=True):
            a, b, g, phi, shift = (float(x) for x in row)
            c = smoothing.Constants(alpha=a, beta=b, gamma=g, phi=phi, shift=shift, floor=floor if shift else 0.0)
            r = smoothing.run(y, shape, c)
            e = smoothing.errors_at(r, 1)
            first = 0.0
            if shape.seasonal:  # the residual of y[0] against the initial state
                s0 = smoothing.start(y, shape)
                first = abs(y[0] - (s0.level + c.phi * s0.trend + s0.season[0]))
            assert score == pytest.approx(float(np.sum(np.abs(e))) + first, rel=1e-9)


def hourly_history(n: int, step: float = 60.0, seed: int = 0, start: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = start + np.arange(n) * step
    return t, 80 + np.cumsum(rng.normal(0, 2, n)).clip(-70)


@pytest.mark.parametrize("name", ["ewma", "holt", "holt-winters", "auto"])
def test_fitted_constants_are_in_bounds_and_reported(name: str) -> None:
    t, y = hourly_history(400)  # 400 min: D = the first 6 h, 288 training points
    f = forecast(name, t, y, 300.0, ForecastParams(season_s=3600.0))
    assert f.fitted or f.method == "last"  # auto may pick the last value, which has nothing to fit
    assert in_bounds(f.constants)


@pytest.mark.parametrize("shape", [
    pytest.param(smoothing.Shape(trend=False), id="ewma"),
    pytest.param(smoothing.Shape(trend=True), id="holt"),
    pytest.param(smoothing.Shape(trend=True, m=24), id="holt-winters"),
])
def test_every_constant_the_fit_can_choose_is_in_bounds(shape: smoothing.Shape) -> None:
    # the fit picks a row of these grids: on one history it may never reach a widened grid's edge
    # (the test above passed with alpha 0.01, beta 0.9, phi 0.5 in the grids); every row must be in bounds
    first = smoothing.candidates(shape)
    rows = [first, *(smoothing.shift_candidates(shape, smoothing.Constants(*row[:4]), 0.3) for row in first)]
    for row in np.vstack(rows):
        assert in_bounds(dict(zip(COLUMNS, row.tolist(), strict=True))), row


@pytest.mark.parametrize("name", NAMES)
def test_short_history_uses_the_fixed_constants(name: str) -> None:
    # 20 min at 1 min: however the refit period is halved, no training part holds 20 observations
    t, y = hourly_history(20)
    f = forecast(name, t, y, 120.0, ForecastParams(alpha=0.4, beta=0.1))
    assert not f.fitted
    if f.method in ("ewma", "holt"):
        assert f.constants["alpha"] == 0.4
    assert f.point == pytest.approx(ref_forecast(name, t.tolist(), y.tolist(), 120.0,
                                                 ForecastParams(alpha=0.4, beta=0.1, fit=False))[0])


def test_a_young_history_is_fitted_before_the_first_refit_period_ends() -> None:
    # 40 min at 1 min (last sample at 2340 s), refit 1 h: the boundary at 0 s has nothing behind
    # it; at 1800 s (periods of 1800 and 900 s) 31 points, 18 of them in the training part (60%);
    # the period halves to 450 s, whose boundary (2250 s) has 38 points behind it, 22 for training
    t, y = hourly_history(40)
    f = forecast("holt", t, y, 120.0)
    assert f.fitted
    # 30 min: at most 29 points behind any boundary (1687.5 s, period 112.5 s), 17 for training
    assert not forecast("holt", t[:30], y[:30], 120.0).fitted
    # and a longer history whose boundary at 3600 s holds enough keeps the whole period
    t, y = hourly_history(66)
    assert forecast("holt", t, y, 60.0).constants == forecast("holt", t[:62], y[:62], 60.0).constants


def test_constants_change_only_at_the_refit_boundary() -> None:
    t, y = hourly_history(24 * 60, seed=2)  # a day at 1 min
    p = ForecastParams(refit_s=3600.0)
    inside = [forecast("holt", t[:i], y[:i], 300.0, p).constants for i in range(12 * 60 + 1, 12 * 60 + 59, 7)]
    assert all(c == inside[0] for c in inside)
    # what came after the boundary does not enter the fit: change it, same constants
    y2 = y.copy()
    y2[12 * 60 + 5:12 * 60 + 50] *= 3
    assert forecast("holt", t[:12 * 60 + 50], y2[:12 * 60 + 50], 300.0, p).constants == inside[0]


PHASES: list[tuple[str, str, float, float]] = [
    # (id, workload, refit period, its phase): CRC-32's published check value, 0xCBF43926 for "123456789"
    ("crc32-check-value", "123456789", 2.0**32, float(0xCBF43926)),
    ("spread-over-an-hour", "123456789", 3600.0, 0xCBF43926 / 2.0**32 * 3600.0),
    ("empty-name", "", 3600.0, 0.0),
]


@pytest.mark.parametrize(("workload", "refit", "phase"), [r[1:] for r in PHASES], ids=[r[0] for r in PHASES])
def test_refit_phase(workload: str, refit: float, phase: float) -> None:
    from extender.core.forecast import refit_phase
    assert refit_phase(workload, refit) == pytest.approx(phase, rel=1e-12)
    assert 0.0 <= refit_phase(workload, refit) < refit


def test_workloads_refit_at_their_own_phase() -> None:
    t, y = hourly_history(24 * 60, seed=2)  # a day at 1 min, from t = 0
    base = ForecastParams(refit_s=3600.0)
    names = [f"model-{i}" for i in range(12)]
    phases = {base.for_workload(n).refit_phase_s for n in names}
    assert len(phases) == len(names)  # twelve workloads, twelve different moments in the hour
    p = base.model_copy(update={"refit_phase_s": 900.0})
    # with a phase of 15 min, the boundary is at 12:15: the constants differ on either side of it ...
    before = forecast("holt", t[:12 * 60 + 14], y[:12 * 60 + 14], 300.0, p).constants
    after = forecast("holt", t[:12 * 60 + 16], y[:12 * 60 + 16], 300.0, p).constants
    assert forecast("holt", t[:12 * 60 + 14], y[:12 * 60 + 14], 300.0, base).constants != before
    # ... and stay from 12:15 to 13:14, where the unphased boundary (13:00) changes nothing
    later = [forecast("holt", t[:i], y[:i], 300.0, p).constants for i in range(12 * 60 + 16, 13 * 60 + 15, 9)]
    assert all(c == after for c in later)
    assert before != after


finite_values = st.floats(0.5, 1e4)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(NAMES), finite_values, st.integers(60, 400), st.floats(0, 3000),
       st.lists(st.integers(1, 398), max_size=20))
def test_a_constant_series_forecasts_itself(name: str, level: float, n: int, horizon: float,
                                            missing: list[int]) -> None:
    t = np.arange(n) * 60.0
    y = np.full(n, level)
    y[[i for i in missing if i < n - 1]] = np.nan
    f = forecast(name, t, y, horizon)
    assert f.point == pytest.approx(level, rel=1e-9)
    assert f.upper == pytest.approx(level, rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["holt", "auto"]), st.floats(0, 500), st.floats(-0.5, 5).filter(lambda b: abs(b) > 0.01),
       st.integers(400, 700), st.integers(1, 10))
def test_a_linear_trend_is_followed(name: str, a: float, b: float, n: int, k: int) -> None:
    t = np.arange(n) * 60.0
    y = 1000 + a + b * np.arange(n)
    f = forecast(name, t, y, k * 60.0)
    assert f.method == "holt"
    assert f.point == pytest.approx(1000 + a + b * (n - 1 + k), rel=1e-9)
    assert f.upper == pytest.approx(f.point, rel=1e-9)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(NAMES), st.integers(0, 10_000), st.integers(30, 500), st.floats(0, 3000))
def test_the_same_history_gives_the_same_forecast(name: str, seed: int, n: int, horizon: float) -> None:
    t, y = hourly_history(n, seed=seed, start=1_700_000_000.0)
    first = forecast(name, t, y, horizon)
    order = np.random.default_rng(seed).permutation(n)
    fc.clear_memos()  # another replica after a failover: nothing cached
    again = forecast(name, t[order], y[order], horizon)
    assert again == first
    assert 0.0 <= first.point <= first.upper  # fitted, so the point is the shifted median


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(("step", "repeat"), [
    pytest.param(60.0, 0, id="four-samples-per-point"),
    pytest.param(37.0, 0, id="a-step-that-does-not-divide-the-sampling"),
    pytest.param(None, 500, id="duplicate-timestamps"),
])
def test_the_order_of_the_samples_does_not_matter(name: str, step: float | None, repeat: int) -> None:
    # several samples per grid point are summed: in the order they came, the sum (and so the
    # forecast) moved with the order of a history that is the same
    rng = np.random.default_rng(1)
    t = 1_700_000_000.0 + np.arange(4000) * 15.0
    y = 1 / 3 + rng.gamma(2, 0.3, t.size) + np.sin(np.arange(t.size) / 50) * 0.3
    if repeat:  # the last samples three times at the same timestamps, with other values
        t, y = np.concatenate([t, t[-repeat:], t[-repeat:]]), np.concatenate([y, y[-repeat:] / 7, y[-repeat:] * 3.1])
    p = ForecastParams(step_s=step)
    fc.clear_memos()
    first = forecast(name, t, y, 300.0, p)
    for seed in range(3):
        order = np.random.default_rng(seed).permutation(t.size)
        fc.clear_memos()
        assert forecast(name, t[order], y[order], 300.0, p) == first


@pytest.mark.parametrize("name", NAMES)
def test_a_tick_inside_a_refit_period_forecasts_as_a_cold_start_does(name: str) -> None:
    # later ticks reuse the runs over the fit data made at the first one (memo.run_on,
    # _profile_on); a replica with nothing cached must still forecast exactly the same
    t, y = noisy_daily(3.5, 300.0, seed=3)
    t = t + 1_700_000_000.0 - 1_700_000_000.0 % 3600
    fc.clear_memos()
    n = len(t) - 20
    forecast(name, t[:n], y[:n], 900.0)  # the first tick after a boundary fits and caches
    for later in (n + 3, n + 9):
        warm = forecast(name, t[:later], y[:later], 900.0)
        fc.clear_memos()
        cold = forecast(name, t[:later], y[:later], 900.0)
        assert warm.method == cold.method and warm.constants == cold.constants
        assert warm.point == pytest.approx(cold.point, rel=1e-12, abs=1e-12)
        assert warm.upper == pytest.approx(cold.upper, rel=1e-12, abs=1e-12)


# ---------------------------------------------------------------------------------------------
# auto and calibration
# ---------------------------------------------------------------------------------------------


def noisy_daily(days: float, step: float, seed: int, noise: float = 4.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = np.arange(0, days * 86_400, step)
    return t, 100 + 60 * np.sin(2 * np.pi * t / 86_400) + rng.normal(0, noise, t.size)


def test_auto_takes_the_season_when_the_horizon_needs_it() -> None:
    # 3 days at 15 min, 3 h ahead: only the season knows how far the cycle turns by then (the
    # held-out 13 h give 41 errors at 12 steps, over the three horizons' worth auto needs)
    t, y = noisy_daily(3, 900.0, seed=1)
    f = forecast("auto", t, y, 3 * 3600.0)
    assert f.method in {"holt-winters", "seasonal-holt"}, f.note
    assert f"auto chose {f.method}" in f.note


def test_auto_never_takes_a_season_a_random_walk_does_not_have() -> None:
    rng = np.random.default_rng(4)
    t = np.arange(0, 3 * 86_400, 900.0)
    y = 200 + np.cumsum(rng.normal(0, 5, t.size))
    for lead in (900.0, 2700.0, 6 * 3600.0):
        f = forecast("auto", t, y, lead)
        assert f.method not in {"holt-winters", "seasonal-holt"}, (lead, f.note)


def test_auto_without_enough_held_out_errors_runs_the_last_value() -> None:
    t, y = hourly_history(30)  # the period halves to 225 s: 6 held-out points, fewer than 20 errors
    f = forecast("auto", t, y, 120.0)
    assert (f.requested, f.method) == ("auto", "last")
    assert "too little history" in f.note


@pytest.mark.parametrize(("level", "k"), [(0.9, 1), (0.95, 1), (0.95, 3), (0.8, 2)],
                         ids=["p90-1", "p95-1", "p95-3", "p80-2"])
def test_upper_quantile_coverage_at_the_horizon(level: float, k: int) -> None:
    # AR(1) noise on a level that wanders: rolling origin at every step over the last 2 days; issue
    # 17 asks for coverage within 3 points of the level
    rng = np.random.default_rng(11)
    n = 4 * 144
    e = np.zeros(n)
    for i in range(1, n):
        e[i] = 0.6 * e[i - 1] + rng.normal(0, 5)
    y = 100 + np.cumsum(rng.normal(0, 0.5, n)) + e
    t = np.arange(n) * 600.0
    p = ForecastParams(level=level, refit_s=7200.0)
    hits = [y[i + k] <= forecast("auto", t[:i + 1], y[:i + 1], k * 600.0, p).upper
            for i in range(2 * 144, n - k)]
    assert abs(float(np.mean(hits)) - level) <= 0.03, float(np.mean(hits))


def _cos_days(days: int, m: int) -> np.ndarray:
    return 100 + 40 * np.cos(2 * np.pi * np.arange(days * m) / m)


HAS_SEASON: list[tuple[str, np.ndarray, int, bool]] = [
    # (id, series, m, has a daily shape)
    # yesterday's value is exact; six hours ago is a quarter turn off: |40 cos - 40 sin| on average
    ("daily-cosine", _cos_days(3, 24), 24, True),
    # a random walk: a day back is twice as far (sqrt(24) vs sqrt(6) steps of noise) as a quarter day
    ("random-walk", 100 + np.cumsum(np.random.default_rng(1).normal(0, 1, 72)), 24, False),
    # flat: both errors are 0, and 0 < 0 is false: no evidence of a season
    ("flat", np.full(72, 5.0), 24, False),
    ("shorter-than-a-season-and-one", _cos_days(1, 24), 24, False),
    ("season-of-one-step", _cos_days(3, 24), 1, False),
]


@pytest.mark.parametrize(("y", "m", "expected"), [r[1:] for r in HAS_SEASON], ids=[r[0] for r in HAS_SEASON])
def test_has_season(y: np.ndarray, m: int, expected: bool) -> None:
    from extender.core.forecast import has_season
    assert has_season(y.astype(np.float64), m) is expected


def test_auto_says_what_it_chose_and_why() -> None:
    t, y = noisy_daily(3, 900.0, seed=1)
    f = forecast("auto", t, y, 3 * 3600.0)
    for name in ("last", "ewma", "holt", "holt-winters"):
        assert f"{name} " in f.note  # every candidate's held-out error is listed
    assert "over 1-12)" in f.note  # with its statistic over the path as well as at the horizon
    assert f.fitted and f.errors_steps == 12
    one = forecast("auto", t, y, 900.0)
    assert one.errors_steps == 1 and "over 1-" not in one.note  # one step: the two statistics are one


# ---------------------------------------------------------------------------------------------
# The daily profile and the seasonal Holt
# ---------------------------------------------------------------------------------------------

DAY = 86_400.0

PROFILES: list[tuple[str, list[float], float, float]] = [
    # (id, harmonic coefficients a_1 b_1 ... a_4 b_4, drift per day, quadratic drift per day^2)
    ("one-cosine", [40, 0, 0, 0, 0, 0, 0, 0], 0.0, 0.0),
    ("two-peaks-and-a-ramp", [30, -10, 12, 8, 0, -5, 3, 0], 0.0, 0.0),
    # a trend and a slow swing across the window must not leak into the harmonics
    ("with-trend-and-curvature", [30, -10, 12, 8, 0, -5, 3, 0], 15.0, -4.0),
]


@pytest.mark.parametrize(("coef", "drift", "curve"), [r[1:] for r in PROFILES], ids=[r[0] for r in PROFILES])
def test_fit_profile_recovers_a_known_profile(coef: list[float], drift: float, curve: float) -> None:
    t = 1_700_000_000.0 + np.arange(0, 2.5 * DAY, 900.0)
    truth = smoothing.Profile(DAY, np.array(coef, dtype=np.float64))
    u = (t - t.mean()) / DAY
    y = 100 + drift * u + curve * u * u + truth.at(t)
    y[[3, 50, 51]] = np.nan  # gaps are skipped
    got = smoothing.fit_profile(t, y, DAY, 4)
    np.testing.assert_allclose(got.coef, coef, atol=1e-8)
    # the profile is a function of the time of day: a day later, the same value; mean zero over a day
    day = 1_700_000_000.0 + np.arange(0, DAY, 60.0)
    np.testing.assert_allclose(got.at(day + DAY), got.at(day), atol=1e-9)
    assert abs(float(np.mean(got.at(day)))) < 1e-9


def test_a_constant_series_has_a_flat_profile() -> None:
    t = np.arange(0, 2 * DAY, 600.0)
    assert np.allclose(smoothing.fit_profile(t, np.full(t.size, 7.0), DAY, 4).coef, 0.0, atol=1e-9)
    # nothing observed: no profile at all, no error
    assert not smoothing.fit_profile(t, np.full(t.size, np.nan), DAY, 4).coef.any()


def test_auto_takes_the_daily_profile_on_a_noisy_daily_series() -> None:
    # 3 days at 10 min, 8% noise: each slot of a slot-by-slot season is one noisy sample a day, the
    # four-harmonic profile averages all of them; one step ahead it beats the last value clearly
    rng = np.random.default_rng(3)
    t = np.arange(0, 3 * DAY, 600.0)
    y = 100 * (1 + 0.5 * np.cos(2 * np.pi * t / DAY)) * np.exp(0.08 * rng.standard_normal(t.size))
    f = forecast("auto", t, y, 600.0)
    assert f.method == "seasonal-holt", f.note
    assert "auto chose seasonal-holt" in f.note and f.fitted
    truth = 100 * (1 + 0.5 * math.cos(2 * math.pi * (t[-1] + 600.0) / DAY))
    assert abs(f.point - truth) < 0.08 * truth  # within one noise sd of the noiseless curve


def test_holt_winters_trains_on_two_seasons_when_the_held_out_share_leaves_fewer() -> None:
    # 3 days at 15 min: the fit window's older 60% is 1.65 days, short of two seasons; Holt-Winters
    # trains on exactly two and is still fitted, with its quantile from the steps after them
    t = np.arange(3 * 96) * 900.0
    f = forecast("holt-winters", t, daily(t) + np.random.default_rng(2).normal(0, 2, t.size), 3600.0)
    assert (f.method, f.fitted) == ("holt-winters", True)
    assert f.residuals >= 20 and f.errors_steps == 4


# ---------------------------------------------------------------------------------------------
# auto against the last value, rolling origin (the benchmark's protocol on small series)
# ---------------------------------------------------------------------------------------------


def _random_walk(rng: np.random.Generator, n: int, t: np.ndarray) -> np.ndarray:
    return 100 * np.exp(np.cumsum(0.04 * rng.standard_normal(n)))


def _spiky(rng: np.random.Generator, n: int, t: np.ndarray) -> np.ndarray:
    base = 5 + 2 * np.cos(2 * np.pi * t / DAY)
    spikes = np.zeros(n)
    for s in rng.choice(n, size=n // 50, replace=False):
        spikes[s:s + rng.integers(1, 4)] += rng.uniform(10, 40)
    return rng.poisson((base + spikes) * 600.0) / 600.0


def _bursty_daily(rng: np.random.Generator, n: int, t: np.ndarray) -> np.ndarray:
    # a smooth daily cycle, little noise, bursts of +80% for four steps: the last value is hard to beat
    y = 40 * (1 + 0.6 * np.cos(2 * np.pi * (t - 14 * 3600) / DAY)) * np.exp(0.03 * rng.standard_normal(n))
    for s in rng.choice(n - 4, size=n // 48, replace=False):
        y[s:s + 4] *= 1.8
    return y


def _daily(rng: np.random.Generator, n: int, t: np.ndarray) -> np.ndarray:
    return 100 * (1 + 0.5 * np.cos(2 * np.pi * t / DAY)) * np.exp(0.08 * rng.standard_normal(n))


class Versus(NamedTuple):
    id: str
    make: Any
    #: auto's mean absolute error over the last value's must be at most this
    at_most: float


VERSUS = [
    # no structure: nothing may beat the last value by more than chance, and auto must not lose to it
    Versus("random-walk", _random_walk, 1.0),
    # spikes of 1-3 steps: a smoother lags every spike down; the last value is the best of the models
    Versus("spiky-tenant", _spiky, 1.0),
    # the case that punished a smoother picked in a calm held-out stretch (mixed-fleet's llama3-8b)
    Versus("bursty-daily-cycle", _bursty_daily, 1.0),
    # a daily shape under 8% noise: auto must find it and gain clearly
    Versus("noisy-daily-cycle", _daily, 0.85),
]


@pytest.mark.parametrize("row", VERSUS, ids=[r.id for r in VERSUS])
def test_auto_does_not_lose_to_the_last_value(row: Versus) -> None:
    rng = np.random.default_rng(17)
    n = 5 * 144  # 5 days at 10 min
    t = 1_700_000_000.0 - 1_700_000_000.0 % DAY + np.arange(n) * 600.0
    y = row.make(rng, n, t)
    for k in (1, 3):
        auto, last = [], []
        for o in range(n - 2 * 144, n - k, 2):  # origins every 20 min over the last two days
            lo = max(0, o + 1 - 4 * 144)
            f = forecast("auto", t[lo:o + 1], y[lo:o + 1], k * 600.0, ForecastParams(step_s=600.0))
            auto.append(abs(y[o + k] - f.point))
            last.append(abs(y[o + k] - y[o]))
        ratio = float(np.mean(auto)) / float(np.mean(last))
        assert ratio <= row.at_most, (k, ratio)


# ---- short history: no trend projected beyond half the history's span ---------------------------------


@settings(max_examples=150, deadline=None)
@given(st.floats(0.01, 5.0), st.integers(3, 400), st.floats(0.0, 2000.0), st.booleans(),
       st.sampled_from(["holt", "auto", "holt-winters"]))
def test_a_short_ramp_is_not_extrapolated_beyond_half_its_span(slope: float, points: int, lead_steps: float,
                                                               fit: bool, name: str) -> None:
    step = 15.0
    t = [1_735_689_600.0 + i * step for i in range(points)]
    y = [10.0 + slope * i for i in range(points)]
    f = forecast(name, t, y, lead_steps * step, ForecastParams(fit=fit))
    reach = 0.5 * (points - 1)  # steps
    assert f.point <= y[-1] + slope * min(lead_steps, reach) * (1 + 1e-6) + 1e-6, f
    if name == "holt" and not fit:
        # a noiseless line: Holt's trend is the slope, projected over the lead up to the reach exactly
        assert f.point == pytest.approx(y[-1] + slope * min(lead_steps, reach), rel=1e-6)


def test_one_hour_of_a_ramp_holds_no_trend_for_two_hours() -> None:
    # the case: a one-hour trace opening on a ramp, forecast one cold start plus a node's
    # provisioning ahead (here two hours): auto has no held-out errors yet and runs the last value;
    # holt projects the ramp over half an hour at most instead of two hours
    step, slope = 60.0, 40.0 / 60  # 10 -> 50 requests/s in an hour
    t = [1_735_689_600.0 + i * step for i in range(61)]
    y = [10.0 + slope * i for i in range(61)]
    auto = forecast("auto", t, y, 7200.0)
    assert auto.method == "last"
    assert auto.point == pytest.approx(50.0)
    for fit in (True, False):
        holt = forecast("holt", t, y, 7200.0, ForecastParams(fit=fit))
        assert holt.point <= 50.0 + slope * 30 + 1e-6  # 70 at most; the whole lead would give 130
    long = [1_735_689_600.0 + i * step for i in range(24 * 60 + 1)]
    line = [10.0 + slope * i for i in range(len(long))]
    far = forecast("holt", long, line, 7200.0, ForecastParams(fit=False))
    assert far.point == pytest.approx(line[-1] + slope * 120)  # a day of history: the whole lead


# ---- the point of a fitted model is the median of its forecast distribution ---------------------------

AZURE_RATES = Path(__file__).resolve().parent.parent / "scenarios" / "traces" / "azure-code-rates.csv"


def _azure(step: int) -> tuple[np.ndarray, np.ndarray]:
    """The bundled Azure code trace (requests per second, one row a second) as ``step`` s means."""
    trace = read_trace(AZURE_RATES, TraceSpec(path=str(AZURE_RATES)))
    assert isinstance(trace, RateTrace)
    rates = trace.rates
    n = len(rates) // step
    return np.arange(n) * float(step), rates[:n * step].reshape(n, step).mean(axis=1)


def _azure_15s() -> tuple[np.ndarray, np.ndarray]:
    # on/off at 15 s: 48% of the bins empty, and a calmer second half than first
    return _azure(15)


class Shifted(NamedTuple):
    id: str
    series: Any
    name: str
    k: int


SHIFTED = [
    # a smoother's level sits between the sessions, where outcomes seldom fall
    Shifted("azure-15s ewma h=1", _azure_15s, "ewma", 1),
    Shifted("azure-15s ewma h=3", _azure_15s, "ewma", 3),
    Shifted("azure-15s holt h=2", _azure_15s, "holt", 2),
]


@pytest.mark.parametrize("row", SHIFTED, ids=[r.id for r in SHIFTED])
def test_the_median_point_has_less_absolute_error_than_the_raw_point(row: Shifted,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    t, y = row.series()
    n, k = len(y), row.k
    params = ForecastParams(step_s=15.0)
    origins = range(n - n // 3, n - k)

    def errors() -> tuple[list[float], list[float]]:
        got = [forecast(row.name, t[:o + 1], y[:o + 1], k * 15.0, params) for o in origins]
        assert all(f.fitted and f.errors_steps == k for f in got)
        return [abs(y[o + k] - f.point) for o, f in zip(origins, got, strict=True)], [f.median_shift for f in got]

    median, shifts = errors()
    monkeypatch.setattr(fc, "median_shift", lambda *_: 0.0)  # the same forecasts, the point left raw
    raw, _ = errors()
    assert any(s != 0.0 for s in shifts)
    assert float(np.mean(median)) < float(np.mean(raw))


def test_the_last_value_is_never_shifted() -> None:
    t, y = _azure_15s()
    params = ForecastParams(step_s=15.0)
    assert forecast("ewma", t, y, 15.0, params).median_shift != 0.0  # a series whose smoothers shift
    f = forecast("last", t, y, 15.0, params)
    assert f.median_shift == 0.0 and f.point == y[-1]


@pytest.mark.parametrize(("name", "note"), [
    ("holt", "one observation: flat forecast"),
    ("holt-winters", "fell back to holt: 1 of 11520 steps (2 seasons of 5760) of history; "
                     "one observation: flat forecast"),
], ids=["holt", "after a fallback note"])
def test_one_observation_says_the_forecast_is_flat(name: str, note: str) -> None:
    f = forecast(name, [1000.0], [7.0], 60.0, ForecastParams(step_s=15.0))
    assert (f.method, f.note, f.point, f.upper, f.residuals) == ("holt", note, 7.0, 7.0, 0)


class Idle(NamedTuple):
    id: str
    step: int
    k: int


IDLE = [Idle("azure-5s h=1", 5, 1), Idle("azure-5s h=3", 5, 3), Idle("azure-15s h=3", 15, 3),
        Idle("azure-30s h=1", 30, 1)]


@pytest.mark.parametrize("row", IDLE, ids=[r.id for r in IDLE])
def test_idle_spells_do_not_blow_up_the_upper(row: Idle) -> None:
    # on/off demand: errors off the near-zero forecasts of a quiet spell are taken over the floor,
    # and the upper scales them by the forecast. With a floor of a tenth of the mean of every bin
    # (idle ones too) the upper asked for 5-14 times the busiest bin seen so far; with half the mean
    # of the busy bins, at most 2.4 times, and it still covers
    t, y = _azure(row.step)
    n, k = len(y), row.k
    params = ForecastParams(step_s=float(row.step))
    origins = range(n - n // 3, n - k)
    got = [forecast("auto", t[:o + 1], y[:o + 1], k * row.step, params) for o in origins]
    assert all(f.residuals >= 20 for f in got)  # the upper is the relative quantile throughout
    assert max(f.upper / float(np.max(y[:o + 1])) for o, f in zip(origins, got, strict=True)) <= 3.0
    assert float(np.mean([y[o + k] <= f.upper for o, f in zip(origins, got, strict=True)])) >= 0.92


def test_the_path_to_the_horizon_is_evidence_too() -> None:
    # the bundled Azure trace at 15 s, three steps ahead: EWMA's held-out gain at three steps alone is z
    # 1.58, under the bar, so auto kept the last value there (1.00 of its error, where statsmodels' ETS
    # was 0.95). Along the path of one to three steps the same origins hold three times the evidence
    t, y = _azure(15)
    n, k = len(y), 3
    params = ForecastParams(step_s=15.0)
    origins = range(n - n // 3, n - k)
    got = [forecast("auto", t[:o + 1], y[:o + 1], k * 15.0, params) for o in origins]
    assert all("auto chose ewma (the clearest gain)" in f.note and "over 1-3)" in f.note for f in got)
    auto = np.mean([abs(y[o + k] - f.point) for o, f in zip(origins, got, strict=True)])
    last = np.mean([abs(y[o + k] - y[o]) for o in origins])
    assert auto / last < 0.95


class Unclear(NamedTuple):
    id: str
    ticker: str
    steps: int  # the history: the first this many 600 s steps of the series
    method: str
    why: str


UNCLEAR = [
    # no model clears the bar (the EWMA's held-out squared error well under the last value's, at about
    # one standard error), and the EWMA runs where the last value used to: on this series the old rule
    # was 1.05 times statsmodels' ETS error
    Unclear("amazon-the-ewma-ahead-runs", "amzn", 2401, "ewma",
            "(no model clears the bar, and ewma is below 99% of the last value)"),
    # nothing clears the bar and the EWMA is not ahead by the margin either: the last value
    Unclear("ibm-nothing-ahead-keeps-the-last-value", "ibm", 2151, "last", "auto chose last (no model clears the bar)"),
]


@pytest.mark.parametrize("row", UNCLEAR, ids=[r.id for r in UNCLEAR])
def test_with_no_clear_gain_auto_runs_the_ewma_only_when_it_is_ahead_by_the_margin(row: Unclear) -> None:
    # NAB's tweet volumes at 600 s
    path = AZURE_RATES.parent / f"nab-twitter-{row.ticker}.csv"
    trace = read_trace(path, TraceSpec(path=str(path)))
    assert isinstance(trace, RateTrace)
    y = trace.rates.reshape(-1, 2).mean(axis=1)[:row.steps]  # the 5-minute rates as 600 s means
    t = np.arange(y.size) * 600.0
    f = forecast("auto", t, y, 600.0, ForecastParams(step_s=600.0))
    assert f.method == row.method and row.why in f.note, f.note
    assert (f.point == pytest.approx(y[-1])) == (row.method == "last")


# ---- a refit retunes the chosen model; it does not replace it -----------------------------------------


def _daily_600s() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(17)
    t = 1_700_000_000.0 - 1_700_000_000.0 % DAY + np.arange(5 * 144) * 600.0
    return t, _daily(rng, len(t), t)


class Reach(NamedTuple):
    id: str
    series: Any
    name: str
    #: which constants must run: "validated" (the refit moved alpha more than REFIT_REACH) or "refit"
    runs: str


REACHES = [
    # on/off: EWMA validated at alpha 0.6, refitted on all of D to 0.02 (30 times slower)
    Reach("azure-15s ewma", _azure_15s, "ewma", "validated"),
    # Holt there: 0.6 -> 0.4, a retune
    Reach("azure-15s holt", _azure_15s, "holt", "refit"),
    Reach("noisy-daily holt", _daily_600s, "holt", "refit"),  # 0.3 -> 0.4
]


@pytest.mark.parametrize("row", REACHES, ids=[r.id for r in REACHES])
def test_a_refit_beyond_reach_runs_the_validated_constants(row: Reach) -> None:
    t, y = row.series()
    step = float(t[1] - t[0])
    p = ForecastParams(step_s=step)
    _, w = fc._prepared(t, y, p)
    assert w is not None
    shape = fc._shape(row.name, 0)
    validated = fc._fitted(row.name, shape, w, p).run.constants
    refit = smoothing.fit(w.fit, shape, fc._fixed(row.name, p))
    ratio = refit.alpha / validated.alpha
    beyond = not 1 / fc.REFIT_REACH <= ratio <= fc.REFIT_REACH
    assert ("validated" if beyond else "refit") == row.runs, ratio
    assert refit != validated  # the row tells the two apart
    f = forecast(row.name, t, y, step, p)
    assert f.constants == (validated if beyond else refit).as_dict()
    assert ("the validated constants run" in f.note) == beyond
