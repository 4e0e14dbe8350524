"""``smoothing.run`` (a loop on Python floats) gives the same states, bit for bit, as the plain
numpy-scalar loop it replaced, kept here as the reference."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pytest

from extender.core import smoothing
from extender.core.smoothing import Constants, Run, Shape, Start


def reference_run(y: np.ndarray, shape: Shape, c: Constants, begin: Start | None = None) -> Run:
    """The recursion as first written: numpy arrays indexed per step."""
    s0 = begin if begin is not None else smoothing.start(y, shape)
    n = len(y)
    levels = np.full(n, np.nan)
    trends = np.full(n, np.nan)
    slots = np.full(n, np.nan)
    m = shape.m
    season = s0.season.tolist()
    level, trend = s0.level, s0.trend
    a, ab, g, phi = c.alpha, c.alpha * c.beta, c.gamma, c.phi
    if s0.t0 >= 0:
        levels[s0.t0], trends[s0.t0] = level, trend
    for t in range(s0.t0 + 1, n):
        v = float(y[t])
        pb = phi * trend
        if m:
            i = t % m
            if not math.isnan(v):
                e = v - (level + pb + season[i])
                if c.shift > 0 and abs(e) > c.shift * max(abs(level + pb + season[i]), c.floor):
                    level += pb + e
                    trend = pb
                else:
                    level += pb + a * e
                    trend = pb + ab * e
                    season[i] += g * e
            else:
                level += pb
                trend = pb
            slots[t] = season[i]
        elif not math.isnan(v):
            e = v - (level + pb)
            if c.shift > 0 and abs(e) > c.shift * max(abs(level + pb), c.floor):
                level += pb + e
                trend = pb
            else:
                level += pb + a * e
                trend = pb + ab * e
        else:
            level += pb
            trend = pb
        levels[t], trends[t] = level, trend
    return Run(y, shape, c, s0.t0, levels, trends, slots, s0.season, np.array(season, dtype=np.float64))


def _series(n: int, gaps: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    y = 100 + 30 * np.sin(2 * np.pi * t / 24) + 0.2 * t + 5 * rng.standard_normal(n)
    y[rng.random(n) < gaps] = np.nan
    return np.asarray(y, dtype=np.float64)


CASES = {
    "ewma": (Shape(trend=False), Constants(alpha=0.3), 0.0),
    "ewma-with-gaps": (Shape(trend=False), Constants(alpha=0.7), 0.2),
    "holt-damped": (Shape(trend=True), Constants(alpha=0.4, beta=0.1, phi=0.98), 0.1),
    "holt-leading-gaps": (Shape(trend=True), Constants(alpha=0.2, beta=0.3), 0.5),
    "holt-winters": (Shape(trend=True, m=24), Constants(alpha=0.3, beta=0.05, gamma=0.2, phi=0.95), 0.05),
    "holt-winters-gappy": (Shape(trend=True, m=24), Constants(alpha=0.5, beta=0.0, gamma=0.4), 0.3),
    # thresholds that some steps of the test series pass (noise 5 on a level of about 100)
    "ewma-with-shifts": (Shape(trend=False), Constants(alpha=0.2, shift=0.06, floor=10.0), 0.1),
    "holt-with-shifts": (Shape(trend=True), Constants(alpha=0.3, beta=0.1, phi=0.95, shift=0.08, floor=10.0), 0.0),
    "holt-winters-with-shifts": (Shape(trend=True, m=24),
                                 Constants(alpha=0.3, beta=0.05, gamma=0.2, shift=0.05, floor=10.0), 0.05),
}


def _shifts_taken(y: np.ndarray, shape: Shape, c: Constants) -> int:
    """How many steps of the reference run are level shifts (its level lands exactly on y - season)."""
    plain = reference_run(y, shape, Constants(alpha=c.alpha, beta=c.beta, gamma=c.gamma, phi=c.phi))
    shifted = reference_run(y, shape, c)
    return int(np.count_nonzero(~np.isclose(plain.level, shifted.level, equal_nan=True)))


def test_the_shift_cases_do_take_shifts() -> None:
    for name, (shape, c, gaps) in CASES.items():
        if c.shift:
            assert _shifts_taken(_series(24 * 9, gaps, seed=len(name)), shape, c) > 0, name


@pytest.mark.parametrize("name", list(CASES))
def test_run_equals_the_reference_bit_for_bit(name: str) -> None:
    shape, c, gaps = CASES[name]
    y = _series(24 * 9, gaps, seed=len(name))
    got, want = smoothing.run(y, shape, c), reference_run(y, shape, c)
    for f in ("level", "trend", "slot", "season_init", "season"):
        assert np.array_equal(getattr(got, f), getattr(want, f), equal_nan=True), f
    assert got.t0 == want.t0


@pytest.mark.parametrize("name", list(CASES))
def test_run_from_a_given_state_equals_the_reference(name: str) -> None:
    shape, c, gaps = CASES[name]
    y = _series(24 * 5, gaps, seed=7)
    full = reference_run(y, shape, c)
    at = 24 * 3
    begin = Start(at, float(full.level[at]), float(full.trend[at]), full.season)
    got, want = smoothing.run(y, shape, c, begin), reference_run(y, shape, c, begin)
    assert np.array_equal(got.level, want.level, equal_nan=True)
    assert np.array_equal(got.season, want.season, equal_nan=True)


#: Level shifts, step by step: (id, series, constants, step, the level after it).
SHIFTS: list[tuple[str, list[float], Constants, int, float]] = [
    # a step from 100 to 200 is a shift at 30% (|e| 100 > 0.3 x 100): the level starts again from 200
    ("a-step-is-followed-at-once", [100.0] * 5 + [200.0], Constants(alpha=0.1, shift=0.3, floor=10.0), 5, 200.0),
    # without a threshold the same step moves the level by alpha of it
    ("without-a-threshold-it-is-smoothed", [100.0] * 5 + [200.0], Constants(alpha=0.1), 5, 110.0),
    # an error under the threshold is noise: smoothed by alpha
    ("noise-is-smoothed", [100.0] * 5 + [104.0], Constants(alpha=0.1, shift=0.3, floor=10.0), 5, 100.4),
    # at zero demand the test is taken over the floor: 2 is under 0.3 x 10 (smoothed) ...
    ("near-zero-the-floor-holds-small-moves", [0.0] * 5 + [2.0], Constants(alpha=0.1, shift=0.3, floor=10.0), 5,
     0.2),
    # ... 5 is over it (a shift)
    ("near-zero-a-large-move-is-a-shift", [0.0] * 5 + [5.0], Constants(alpha=0.1, shift=0.3, floor=10.0), 5, 5.0),
    # a gap is no error at all: the level stays
    ("a-gap-is-not-a-shift", [100.0] * 5 + [math.nan], Constants(alpha=0.1, shift=0.01, floor=10.0), 5, 100.0),
]


@pytest.mark.parametrize(("y", "c", "step", "level"), [r[1:] for r in SHIFTS], ids=[r[0] for r in SHIFTS])
def test_level_shifts(y: list[float], c: Constants, step: int, level: float) -> None:
    got = smoothing.run(np.array(y), Shape(trend=False), c)
    assert got.level[step] == pytest.approx(level, abs=1e-12)


def test_a_shift_leaves_the_trend_and_the_season_alone() -> None:
    # Holt-Winters on two flat seasons, then a jump: the level takes it all
    m = 4
    y = np.array([100.0, 110.0, 90.0, 100.0] * 2 + [300.0])
    c = Constants(alpha=0.3, beta=0.2, gamma=0.3, shift=0.5, floor=10.0)
    r = smoothing.run(y, Shape(trend=True, m=m), c)
    before = smoothing.run(y[:-1], Shape(trend=True, m=m), c)
    t = len(y) - 1
    f = before.level[-1] + before.trend[-1] + before.season[t % m]
    assert abs(300.0 - f) > 0.5 * f  # it is a shift
    assert r.level[-1] + r.season[t % m] == pytest.approx(300.0)  # the next forecast starts from y
    assert r.trend[-1] == pytest.approx(before.trend[-1])  # phi = 1: the trend as it was
    assert np.array_equal(r.season, before.season)


def _steps(seed: int, n: int = 600) -> np.ndarray:
    """A level that jumps between 50 and 150 every 40-80 steps, with 4% noise."""
    rng = np.random.default_rng(seed)
    level, out = 50.0, list[float]()
    while len(out) < n:
        out += [level] * int(rng.integers(40, 80))
        level = 200.0 - level
    y = np.array(out[:n]) * np.exp(0.04 * rng.standard_normal(n))
    return np.asarray(y, dtype=np.float64)


FITS: list[tuple[str, np.ndarray, bool]] = [
    # (id, series, whether the fit takes a threshold)
    ("level-steps-with-noise", _steps(3), True),
    ("a-constant-has-no-typical-step", np.full(200, 42.0), False),
    ("a-pure-line-is-followed-without-shifts", 10.0 + 0.5 * np.arange(200.0), False),
]


@pytest.mark.parametrize(("y", "takes"), [r[1:] for r in FITS], ids=[r[0] for r in FITS])
def test_the_fit_takes_a_threshold_where_the_series_has_shifts(y: np.ndarray, takes: bool) -> None:
    shape = Shape(trend=False)
    c = smoothing.fit(y, shape)
    assert (c.shift > 0) is takes, c
    plain = smoothing.Constants(alpha=c.alpha)
    if takes:  # the threshold is what lets a small alpha smooth the noise and still follow the steps
        assert c.alpha < 1.0
        def loss(k: Constants) -> float:
            return float(np.sum(np.abs(smoothing.errors_at(smoothing.run(y, shape, k), 1))))
        assert loss(c) < 0.9 * min(loss(Constants(alpha=a)) for a in smoothing.ALPHAS)
    else:
        assert c == smoothing.Constants(alpha=plain.alpha, fitted=True)


class Floor(NamedTuple):
    id: str
    y: list[float]
    floor: float


#: The relative floor: half the mean of the demand above zero (smoothing.relative_floor).
FLOORS = [
    Floor("steady-demand-half-its-mean", [4.0, 6.0, 8.0], 3.0),
    # idle time does not shrink it: the same sessions with zeros between them give the same floor
    Floor("on-off-ignores-the-idle-bins", [0.0, 4.0, 0.0, 0.0, 6.0, 8.0, 0.0], 3.0),
    Floor("gaps-drop-out", [math.nan, 4.0, 6.0, math.nan, 8.0], 3.0),
    Floor("no-demand-at-all-a-tiny-positive-floor", [0.0, 0.0, math.nan], 1e-12),
    Floor("empty", [], 1e-12),
    # a series below zero (demand less its daily profile, fitted by the seasonal Holt) counts its
    # values above zero only
    Floor("a-deseasonalised-series-counts-what-is-above-zero", [-3.0, 1.0, -1.0, 3.0], 1.0),
]


@pytest.mark.parametrize("row", FLOORS, ids=[r.id for r in FLOORS])
def test_relative_floor(row: Floor) -> None:
    assert smoothing.relative_floor(np.array(row.y, dtype=float)) == pytest.approx(row.floor, rel=1e-12)
