"""The forecaster's process memos (recent runs resumed from a shared prefix, the last fit data, the
last gridded history) change no forecast: every result equals the one made with them emptied."""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import numpy as np
import pytest

from extender.core import forecast as fc
from extender.core import memo, smoothing
from extender.core.forecast import Forecast, ForecastParams, forecast
from extender.core.smoothing import Constants, Run, Shape


def clear_memos() -> None:
    """Empty every memo, as a newly started process has none."""
    fc.clear_memos()


def reference_run_on(y: np.ndarray, base: Run) -> Run:
    """``_run_on`` as it was before it kept recent runs: resume from ``base`` or run the whole grid."""
    n0 = len(base.y)
    shape, c = base.shape, base.constants
    reusable = (len(y) >= n0 and base.t0 < n0 - 1 and not (shape.seasonal and n0 < 2 * shape.m)
                and np.array_equal(y[:n0], base.y, equal_nan=True))
    if not reusable:
        return smoothing.run(y, shape, c)
    at = n0 - 1
    tail = smoothing.run(y, shape, c, smoothing.Start(at, float(base.level[at]), float(base.trend[at]), base.season))
    level, trend, slot = tail.level.copy(), tail.trend.copy(), tail.slot.copy()
    level[:n0], trend[:n0], slot[:n0] = base.level, base.trend, base.slot
    return Run(y, shape, c, base.t0, level, trend, slot, base.season_init, tail.season)


def _grid(n: int, seed: int, gaps: float = 0.0, m: int = 24) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    y = 50 + 20 * np.sin(2 * np.pi * t / m) + 3 * rng.standard_normal(n)
    y[rng.random(n) < gaps] = np.nan
    return np.asarray(y, dtype=np.float64)


def _growing(full: np.ndarray, start: int, anchors: int, seed: int) -> list[np.ndarray]:
    """Grids as a forecaster sees them: longer by one step per round, the newest point still
    moving, and ``anchors`` interleaved grids (the anchor at the newest sample moves every call)."""
    rng = np.random.default_rng(seed)
    out = []
    for n in range(start, len(full)):
        for a in range(anchors):
            y = full[:n].copy() + (a * 0.25 if a else 0.0)
            y[-1] += rng.normal()  # the newest point is a partial mean
            out.append(y)
    return out


class RunCase(NamedTuple):
    name: str
    shape: Shape
    constants: Constants
    gaps: float
    anchors: int
    base_len: int  # the base run's grid: a prefix of every call's (0: a grid the calls never begin with)
    leading_nans: int = 0


RUN_CASES = [
    RunCase("ewma, one anchor, calls begin with the base", Shape(trend=False), Constants(alpha=0.4), 0.0, 1, 60),
    RunCase("holt, five anchors, own grids", Shape(trend=True), Constants(alpha=0.3, beta=0.1, phi=0.97), 0.0, 5, 0),
    RunCase("holt with gaps", Shape(trend=True), Constants(alpha=0.5, beta=0.2), 0.15, 3, 60),
    RunCase("holt-winters, season of 24", Shape(trend=True, m=24),
            Constants(alpha=0.3, beta=0.05, gamma=0.2, phi=0.95), 0.05, 2, 0),
    RunCase("holt-winters resumed from the base", Shape(trend=True, m=24),
            Constants(alpha=0.2, beta=0.1, gamma=0.3), 0.0, 2, 50),
    RunCase("holt starting on one observation", Shape(trend=True), Constants(alpha=0.3, beta=0.1), 0.0, 1, 0, 70),
]


@pytest.mark.parametrize("case", RUN_CASES, ids=[c.name for c in RUN_CASES])
def test_run_on_with_recent_runs_equals_the_reference(case: RunCase) -> None:
    clear_memos()
    full = _grid(120, seed=len(case.name), gaps=case.gaps)
    full[:case.leading_nans] = np.nan
    base_y = full[:case.base_len] if case.base_len else _grid(55, seed=99)
    base = smoothing.run(base_y, case.shape, case.constants)
    calls = _growing(full, 72, case.anchors, seed=1)
    for y in calls:
        got, want = memo.run_on(y, base), reference_run_on(y, base)
        for f in ("level", "trend", "slot", "season_init", "season"):
            assert np.array_equal(getattr(got, f), getattr(want, f), equal_nan=True), f
        assert got.t0 == want.t0
    assert memo._RUNS, "nothing was kept: the memo was not exercised"


EDGES = {
    # the earlier grid has one observation (a trend's start waits for a second one, which the new
    # grid has after the shared prefix): resuming would keep the one-observation start
    "holt, a start on one observation": (Shape(trend=True), [np.nan] * 5 + [1.0] + [np.nan] * 3, [2.0, 3.5]),
    # a seasonal start reads two whole seasons: a shorter shared prefix cannot be resumed
    "holt-winters, prefix shorter than two seasons": (Shape(trend=True, m=4), list(np.arange(7.0)), [9.0, 1.0, 4.0]),
    "ewma, identical grid": (Shape(trend=False), [1.0, np.nan, 3.0, 4.0], []),
}


@pytest.mark.parametrize("name", list(EDGES))
def test_run_on_edges_equal_the_reference(name: str) -> None:
    shape, head, more = EDGES[name]
    c = Constants(alpha=0.5, beta=0.2, gamma=0.1)
    base = smoothing.run(np.array([7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0]), shape, c)
    clear_memos()
    first = np.array(head, dtype=np.float64)
    if shape.seasonal:
        first = np.concatenate([first, [8.0]])  # 8 points: two seasons of 4, so it can start
        y = np.concatenate([first[:6], more])  # shares 6 < 8 with it
    else:
        y = np.concatenate([first, more])
    memo.run_on(first, base)
    got, want = memo.run_on(y, base), reference_run_on(y, base)
    assert np.array_equal(got.level, want.level, equal_nan=True)
    assert np.array_equal(got.trend, want.trend, equal_nan=True)
    assert got.t0 == want.t0


@pytest.mark.parametrize("shape", [Shape(trend=False), Shape(trend=True),
                                   Shape(trend=True, m=12)], ids=["ewma", "holt", "holt-winters"])
def test_a_run_continued_from_a_prefix_is_the_run_over_the_whole(shape: Shape) -> None:
    rng = np.random.default_rng(5)
    y = 50 + np.cumsum(rng.normal(0, 1, 120))
    y[[7, 40, 41, 100]] = np.nan
    c = Constants(alpha=0.4, beta=0.1, gamma=0.2 if shape.seasonal else 0.0, phi=0.95)
    base = smoothing.run(y[:90], shape, c)
    whole = smoothing.run(y, shape, c)
    got = memo.run_on(y, base)
    for a, b in [(got.level, whole.level), (got.trend, whole.trend), (got.slot, whole.slot),
                 (got.season, whole.season), (got.season_init, whole.season_init)]:
        assert np.array_equal(a, b, equal_nan=True)  # bit for bit: the same operations in the same order
    assert got.t0 == whole.t0
    changed = y.copy()
    changed[3] += 1.0  # a different prefix: the whole series is run again
    assert np.array_equal(memo.run_on(changed, base).level, smoothing.run(changed, shape, c).level, equal_nan=True)


class ForecastCase(NamedTuple):
    name: str
    forecaster: str
    gaps: float
    every_ticks: int


FORECAST_CASES = [
    ForecastCase("auto, a minute apart", "auto", 0.0, 4),
    ForecastCase("auto with scrape gaps", "auto", 0.05, 4),
    ForecastCase("holt-winters, odd spacing", "holt-winters", 0.0, 7),
    ForecastCase("ewma, every tick", "ewma", 0.0, 1),
]


def _history(days: float, gaps: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    t = np.arange(int(days * 5760)) * 15.0
    v = 40 * (1 + 0.6 * np.sin(2 * np.pi * (t - 8 * 3600) / 86400)) * (1 + 0.08 * rng.standard_normal(len(t)))
    v[rng.random(len(t)) < gaps] = np.nan
    return t, v


@pytest.mark.parametrize("case", FORECAST_CASES, ids=[c.name for c in FORECAST_CASES])
def test_forecasts_with_the_memos_equal_those_without(case: ForecastCase) -> None:
    """The simulator's pattern: a growing history, two horizons at each forecast tick, the grid
    anchored at the newest sample; short fit window and refit period so that a few hours cover
    several refit boundaries."""
    params = ForecastParams(step_s=300.0, refit_s=1800.0, fit_window_s=6 * 3600.0)
    t, v = _history(0.6, case.gaps, seed=3)
    start = int(6.5 * 3600 / 15)
    got: list[Forecast] = []
    clear_memos()
    for k in range(start, len(t), case.every_ticks):
        for horizon in (420.0, 900.0):
            got.append(forecast(case.forecaster, t[:k + 1], v[:k + 1], horizon, params, now_s=k * 15.0))
    want: list[Forecast] = []
    for k in range(start, len(t), case.every_ticks):
        for horizon in (420.0, 900.0):
            clear_memos()
            want.append(forecast(case.forecaster, t[:k + 1], v[:k + 1], horizon, params, now_s=k * 15.0))
    assert len(got) > 100
    assert got == want


class Lookup(NamedTuple):
    name: str
    t: list[float]
    v: list[float]
    more: tuple[object, ...]
    hit: bool


KEPT_T, KEPT_V = [0.0, 15.0, 30.0], [1.0, float("nan"), 0.0]

LOOKUPS = [
    Lookup("the same samples and inputs", KEPT_T, KEPT_V, (300.0,), True),
    Lookup("the same NaN is the same sample", KEPT_T, [1.0, float("nan"), 0.0], (300.0,), True),
    Lookup("-0.0 is not the 0.0 it was made from", KEPT_T, [1.0, float("nan"), -0.0], (300.0,), False),
    Lookup("a middle value changed, ends the same", KEPT_T, [1.0, 2.0, 0.0], (300.0,), False),
    Lookup("one sample more", [*KEPT_T, 45.0], [*KEPT_V, 0.0], (300.0,), False),
    Lookup("another input", KEPT_T, KEPT_V, (600.0,), False),
    Lookup("an equal input of another type", KEPT_T, KEPT_V, (300,), True),
]


@pytest.mark.parametrize("row", LOOKUPS, ids=[r.name for r in LOOKUPS])
def test_recent_finds_a_value_only_for_the_same_bits(row: Lookup) -> None:
    recent: memo.Recent[str] = memo.Recent(2)
    recent.get(np.array(KEPT_T), np.array(KEPT_V), 300.0, make=lambda: "kept")
    got = recent.get(np.array(row.t), np.array(row.v), *row.more, make=lambda: "made")
    assert got == ("kept" if row.hit else "made")


def test_recent_keeps_the_newest_and_forgets_on_clear() -> None:
    recent: memo.Recent[int] = memo.Recent(2)
    histories = [(np.arange(3.0), np.full(3, float(i))) for i in range(3)]
    for i, (t, v) in enumerate(histories):
        recent.get(t, v, make=partial(int, i))
    assert [recent.get(t, v, make=lambda: -1) for t, v in histories[1:]] == [1, 2]
    assert recent.get(*histories[0], make=lambda: -1) == -1  # the oldest of three left a memo of two
    recent.clear()
    assert recent.get(*histories[2], make=lambda: -1) == -1


def test_by_identity_is_by_the_object_not_by_equality() -> None:
    memo.clear()
    a, b = ForecastParams(), ForecastParams()
    assert a == b and a is not b
    assert memo.by_identity(a, lambda: "a") == "a"
    assert memo.by_identity(a, lambda: "again") == "a"
    assert memo.by_identity(b, lambda: "b") == "b"
    memo.clear()
    assert memo.by_identity(a, lambda: "after clear") == "after clear"


def test_cached_makes_once_and_lets_the_oldest_go_first(monkeypatch: pytest.MonkeyPatch) -> None:
    memo.clear()
    monkeypatch.setattr(memo, "CACHE_SIZE", 2)
    made: list[str] = []

    def make(key: str) -> str:
        made.append(key)
        return key.upper()

    for key in ("a", "b", "a", "c", "b", "a"):
        assert memo.cached((key,), partial(make, key)) == key.upper()
    # a, b made; a kept; c pushes a (the oldest) out; b still kept; a made again
    assert made == ["a", "b", "c", "a"]
    memo.clear()
