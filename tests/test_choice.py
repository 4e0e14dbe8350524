"""auto's decision rule (extender.core.choice): the Diebold-Mariano statistic against a plain-Python
reference, the bar with its margin, and the pick, as tables of named rows."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.core.choice import AUTO_MARGIN, AUTO_Z, Row, dm_statistic, gain_statistic, pick

_D = np.random.default_rng(9).normal(0.3, 1.0, 100)
#: loss differences along a shared path: each the mean of 10 consecutive N(0.1, 1) draws, so
#: neighbours up to 9 apart share most of their terms (as k-step errors of nearby origins do)
_SHARED = np.convolve(np.random.default_rng(9).normal(0.1, 1.0, 109), np.ones(10) / 10, "valid")

CLEARLY: list[tuple[str, np.ndarray, np.ndarray, int, bool]] = [
    # (id, new errors, old errors, k, clearly better)
    # lower by 1 every time: sd 0, any positive mean is clear
    ("always-lower", np.full(50, 1.0), np.full(50, 2.0), 1, True),
    ("identical", np.full(50, 1.0), np.full(50, 1.0), 1, False),
    ("always-higher", np.full(50, 2.0), np.full(50, 1.0), 1, False),
    # d ~ N(0.3, 1), 100 of them: se = sd / 10 ~ 0.1, mean 0.3 > 2 se at k = 1 ...
    ("noisy-gain-one-step", np.full(100, 5.0) - _D, np.full(100, 5.0), 1, True),
    # ... and at k = 10 too: they are independent, and the long-run variance measures that
    # (the earlier N / k rule assumed 10 independent errors only and said no)
    ("noisy-gain-ten-steps-independent", np.full(100, 5.0) - _D, np.full(100, 5.0), 10, True),
    # mean 0.12 over sd 0.32 / 10: t ~ 3.9 when read as independent (k = 1) ...
    ("shared-path-read-as-independent", np.full(100, 5.0) - _SHARED, np.full(100, 5.0), 1, True),
    # ... but about 1.4 once the correlation up to lag 9 is counted (k = 10): not clear
    ("shared-path-ten-steps", np.full(100, 5.0) - _SHARED, np.full(100, 5.0), 10, False),
    # the margin: a gain of 0.5% every time is as steady as can be, and still under 1% ...
    ("steady-gain-under-the-margin", 0.995 * (5.0 + _D), 5.0 + _D, 1, False),
    # ... 2% every time is over it
    ("steady-gain-over-the-margin", 0.98 * (5.0 + _D), 5.0 + _D, 1, True),
]


def ref_diebold_mariano(d: list[float], k: int) -> float:
    """mean(d) over its Newey-West standard error with Bartlett weights up to lag k - 1, the slow way."""
    n = len(d)
    mu = statistics.fmean(d)
    c = [x - mu for x in d]
    v = sum(x * x for x in c) / n
    for j in range(1, min(k - 1, n - 1) + 1):
        v += 2 * (1 - j / k) * sum(c[i] * c[i - j] for i in range(j, n)) / n
    return mu / math.sqrt(v / n) if v > 0 else (math.inf if mu > 0 else -math.inf)


@pytest.mark.parametrize(("new", "old", "k", "expected"), [r[1:] for r in CLEARLY], ids=[r[0] for r in CLEARLY])
def test_clearly_better(new: np.ndarray, old: np.ndarray, k: int, expected: bool) -> None:
    assert (ref_diebold_mariano(list((1 - AUTO_MARGIN) * old - new), k) > AUTO_Z) is expected
    assert (gain_statistic(new, old, k) > AUTO_Z) is expected


#: a squared error: zero, or far enough from underflow that a power of two divides it exactly
LOSS = st.one_of(st.just(0.0), st.floats(1e-100, 1e4))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(LOSS, LOSS), min_size=2, max_size=60), st.integers(1, 4), st.integers(-20, 20))
def test_the_gain_statistic_does_not_depend_on_the_units(pairs: list[tuple[float, float]], k: int,
                                                          exponent: int) -> None:
    # the path's losses are each horizon's divided by the last value's mean there; at one step that
    # is one constant for both sides, so the path's statistic is the horizon's (choose: "at k = 1 the
    # two statistics are one"). A power of two divides exactly, so the statistic must not move at all
    new, old = (np.array(x, dtype=np.float64) for x in zip(*pairs, strict=True))
    scale = 2.0 ** exponent
    assert gain_statistic(new / scale, old / scale, k) == gain_statistic(new, old, k)


def _rows(*rows: tuple[str, float, float, float]) -> list[Row]:
    return [Row("last", 1.0, 0.0, 0.0), *(Row(*r) for r in rows)]


PICKS: list[tuple[str, list[Row], str]] = [
    # (id, rows (name, score, z at k, z over the path 1..k), the pick)
    # nothing clear: the EWMA (the last value with alpha fitted) runs if it is ahead by the margin at k
    ("nothing-clear-the-ewma-ahead-runs", _rows(("ewma", 0.7, 1.6, 1.6), ("holt", 0.9, 1.2, 1.2)), "ewma"),
    ("nothing-clear-the-ewma-behind-keeps-the-last-value", _rows(("ewma", 1.02, -0.3, -0.3), ("holt", 0.9, 1.2, 1.2)),
     "last"),
    ("nothing-clear-the-ewma-level-keeps-the-last-value", _rows(("ewma", 0.99, 0.0, 1.0)), "last"),
    ("nothing-clear-the-fallback-is-the-ewma-alone", _rows(("holt", 0.7, 1.6, 1.6)), "last"),
    ("a-clear-candidate-before-the-fallback", _rows(("ewma", 0.7, 1.6, 1.6), ("holt", 0.9, 1.7, 1.7)), "holt"),
    # the lowest score is not the most certain gain: the larger z wins (the 57-minute Azure sample)
    ("largest-z-not-lowest-score", _rows(("ewma", 0.68, 1.9, 1.9), ("holt", 0.91, 2.3, 2.3)), "holt"),
    ("one-clear-candidate", _rows(("ewma", 0.95, 1.7, 1.7), ("holt", 0.8, 1.0, 1.0)), "ewma"),
    ("tie-goes-to-the-simpler", _rows(("ewma", 0.8, 3.0, 3.0), ("holt", 0.7, 3.0, 3.0)), "ewma"),
    ("just-at-the-bar-is-not-over-it", _rows(("holt", 0.8, 1.645, 1.645)), "last"),
    ("an-infinite-z-wins", _rows(("ewma", 0.5, 2.0, 2.0), ("holt", 0.9, math.inf, math.inf)), "holt"),
    # the path is the evidence: under the bar at k alone (the Azure trace at 15 s, three steps: z 1.58),
    # over it along one to three steps
    ("the-path-clears-the-bar", _rows(("ewma", 0.8, 1.58, 2.4)), "ewma"),
    # over the bar along the path but behind the last value at the horizon used: not run there
    ("ahead-on-the-path-behind-at-k", _rows(("holt", 1.02, -0.3, 2.5)), "last"),
    ("ahead-on-the-path-level-at-k", _rows(("holt", 0.99, 0.0, 2.5)), "last"),
    # a gain at k that the shorter horizons do not bear out is not evidence enough
    ("clear-at-k-not-on-the-path", _rows(("holt", 0.8, 2.0, 1.2)), "last"),
    # among the eligible, the largest z at k wins, not the largest over the path
    ("eligible-ranked-at-k", _rows(("ewma", 0.8, 1.0, 3.0), ("holt", 0.85, 1.4, 2.0)), "holt"),
]


@pytest.mark.parametrize(("rows", "expected"), [r[1:] for r in PICKS], ids=[r[0] for r in PICKS])
def test_auto_picks_the_clearest_gain_else_the_better_of_last_and_ewma(rows: list[Row], expected: str) -> None:
    assert pick(rows).name == expected


WHY = [
    # (id, rows, why): the reason the forecast's note gives, from the rule that chose
    ("a-clear-candidate", _rows(("ewma", 0.7, 1.6, 1.6), ("holt", 0.9, 1.7, 1.7)), "the clearest gain"),
    ("the-fallback", _rows(("ewma", 0.7, 1.6, 1.6)),
     "no model clears the bar, and ewma is below 99% of the last value"),
    ("nothing-ahead", _rows(("ewma", 0.99, 0.0, 1.0)), "no model clears the bar"),
]


@pytest.mark.parametrize(("rows", "why"), [r[1:] for r in WHY], ids=[r[0] for r in WHY])
def test_the_pick_says_why(rows: list[Row], why: str) -> None:
    assert pick(rows).why == why


@pytest.mark.parametrize(("new", "old", "k"), [(r[1], r[2], r[3]) for r in CLEARLY], ids=[r[0] for r in CLEARLY])
def test_dm_statistic_is_the_reference_one(new: np.ndarray, old: np.ndarray, k: int) -> None:
    want = ref_diebold_mariano(list(old - new), k)
    got = dm_statistic(new, old, k)
    if math.isfinite(want):
        assert got == pytest.approx(want, rel=1e-9)
    else:  # no spread at all: the sign of the mean says which way (0 when the losses are equal)
        assert got == (want if float(np.mean(old - new)) else 0.0)
