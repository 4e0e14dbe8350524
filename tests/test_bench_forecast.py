"""bench/bench_forecast.py's own arithmetic, against figures worked out by hand: the chance that a
calibrated quantile passes a coverage cell, the quantile score and the naive upper it is compared
with."""

from __future__ import annotations

import functools
import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

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
