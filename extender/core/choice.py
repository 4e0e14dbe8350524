"""How ``auto`` decides between its candidates, given their held-out losses against the last value's.

:func:`extender.core.forecast.choose` fits each candidate, runs it through the held-out part of the
fit window and scores it against the last value there; this module holds the decision on those
scores, and the statistic they are measured by. Pure functions of arrays and rows: no fitting here.

A candidate **clears the bar** (:func:`clears`) when its squared errors along the path to the horizon
k (each horizon's scaled by the last value's there) are below ``(1 - AUTO_MARGIN)`` times the last
value's by more than :data:`AUTO_Z` standard errors (:func:`gain_statistic`, a one-sided
Diebold-Mariano test with a superiority margin), and it is ahead by the margin at k itself::

    clears  <=>  z_path > AUTO_Z  and  z > 0

Of those that clear, the one with the largest ``z`` wins (the most certain gain, not the lowest
held-out error); with none, :data:`AUTO_FALLBACK` runs if its ``z`` at k is above 0 (its squared
error below ``(1 - AUTO_MARGIN)`` of the last value's), else the last value (:func:`pick`).
Why each piece, with the variants measured: BENCHMARKS.md, the forecast section.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]

#: How many standard errors a candidate's mean held-out squared error must be below the last value's
#: for it to be chosen at all (:func:`gain_statistic`): a one-sided Diebold-Mariano test at 5%.
AUTO_Z = 1.645
#: ... and lower than the last value's by more than this share: a gain of under 1% of the squared
#: error is not worth a switch, however consistent (:func:`gain_statistic`).
AUTO_MARGIN = 0.01
#: What ``auto`` runs when no candidate is clearly ahead, provided it is ahead by the margin at all
#: (:func:`pick`): the EWMA nests the last value (alpha 1, no shift), so choosing between the two is
#: choosing one constant, not a structure that a calm held-out stretch can flatter.
AUTO_FALLBACK = "ewma"


class Row(NamedTuple):
    """One candidate in :func:`~extender.core.forecast.choose`: its score at the horizon used, and its
    gain statistics against the last value there (``z``) and over the path to it (``z_path``)."""

    name: str
    score: float
    z: float
    z_path: float


def clears(row: Row) -> bool:
    """Whether a candidate is clearly ahead of the last value: ``z_path`` above :data:`AUTO_Z` and ``z``
    above 0 (:func:`~extender.core.forecast.choose`)."""
    return row.name != "last" and row.z_path > AUTO_Z and row.z > 0.0


class Pick(NamedTuple):
    """What :func:`pick` chose, and why, in the words of the forecast's note."""

    name: str
    why: str


def pick(rows: Sequence[Row]) -> Pick:
    """From :class:`Row` s (the last value's first): the candidate with the largest ``z`` among those
    with ``z_path`` above :data:`AUTO_Z` and ``z`` above 0 (the earliest, simplest one on a tie). When
    there is none, :data:`AUTO_FALLBACK` if it is ahead of the last value by the margin at k (its
    ``z`` above 0: ``score`` below ``1 - AUTO_MARGIN``), else the last value."""
    eligible = [r for r in rows if clears(r)]
    if eligible:
        return Pick(max(eligible, key=lambda r: r.z).name, "the clearest gain")
    if any(r.name == AUTO_FALLBACK and r.z > 0.0 for r in rows):
        return Pick(AUTO_FALLBACK, f"no model clears the bar, and {AUTO_FALLBACK} is below "
                                   f"{100 * (1 - AUTO_MARGIN):g}% of the last value")
    return Pick("last", "no model clears the bar")


def dm_statistic(new: F64, old: F64, k: int) -> float:
    """How many standard errors losses ``new`` (squared errors) are below ``old`` (same origins): the
    Diebold-Mariano statistic (Diebold and Mariano, *Comparing Predictive Accuracy*, 1995) with the
    Newey-West long-run variance::

        d_i = old_i - new_i,   c_i = d_i - mean(d)
        g_j = sum_i c_i c_{i-j} / N
        V   = g_0 + 2 sum_{j=1}^{k-1} (1 - j / k) g_j          Bartlett weights: V >= 0
        z   = mean(d) / sqrt(V / N)                           (V = 0: +inf, 0 or -inf by mean(d)'s sign)

    Errors of origins less than k apart share most of their path, so their loss differences are
    correlated up to lag k - 1; V counts that correlation as measured instead of assuming the worst
    (an earlier rule divided N by k, as if every k consecutive errors were one).
    """
    d = old - new
    mean = float(np.mean(d))
    c = d - mean
    lrv = float(np.mean(c * c))
    for j in range(1, min(k - 1, d.size - 1) + 1):  # Bartlett weights: the estimate stays >= 0
        lrv += 2.0 * (1.0 - j / k) * float(np.sum(c[j:] * c[:-j])) / d.size
    se = math.sqrt(max(lrv, 0.0) / d.size)
    if se == 0.0:
        return math.copysign(math.inf, mean) if mean else 0.0
    return mean / se


def gain_statistic(new: F64, old: F64, k: int) -> float:
    """How many standard errors losses ``new`` (a candidate's squared errors) are below
    ``(1 - AUTO_MARGIN) old`` (the last value's): ``dm_statistic(new, (1 - AUTO_MARGIN) old, k)``.
    Above :data:`AUTO_Z`, the candidate is *clearly* better (:func:`pick`): a one-sided
    Diebold-Mariano test with a superiority margin.

    On most series the smoothers' held-out errors differ by a few percent, driven by a burst or two
    inside the held-out stretch; choosing on that would add the choice's own noise to every
    forecast (a smoother picked in a calm stretch lags the next burst by its whole time constant).
    Squared rather than absolute errors for the same reason: a model that lags a burst pays for it
    here, as the scaler does in queueing.

    The margin: with level-shift thresholds, some candidates are near copies of the last value
    (alpha 0.8-0.9, a threshold that catches every large move). Their loss differences are tiny
    and steady, so a plain test finds a 0.1% gain "clear"; on the benchmark's spiky series such
    switches then lost 0.01-0.04% to the last value. The 1% was set on the benchmark's series: 2%
    gave up the gain on ``mixtral-61g`` at one step (1.008 of the ETS reference), 0 the spiky
    series (BENCHMARKS.md).
    """
    return dm_statistic(new, (1.0 - AUTO_MARGIN) * old, k)
