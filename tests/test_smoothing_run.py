"""``smoothing.run`` (a loop on Python floats) gives the same states, bit for bit, as the plain
numpy-scalar loop it replaced, kept here as the reference."""

from __future__ import annotations

import math

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
                level += pb + a * e
                trend = pb + ab * e
                season[i] += g * e
            else:
                level += pb
                trend = pb
            slots[t] = season[i]
        elif not math.isnan(v):
            e = v - (level + pb)
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
}


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
