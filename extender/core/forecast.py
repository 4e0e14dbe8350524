"""Demand forecasters: last value, EWMA, damped Holt, Holt-Winters (daily season), and ``auto``.

``auto`` also chooses among a *seasonal Holt*: damped Holt over the demand less its daily profile.

Each forecaster turns a demand history into the demand expected one *lead* ahead, as a point value
and an upper quantile, in the unit of the history (requests/s or tokens/s). The scaler sizes the
forecast need from the upper quantile (docs/scaler.md section 1). One registry, :data:`FORECASTERS`,
maps the policy's ``scaling.forecaster`` name to the implementation; ``auto`` is the default.

Pipeline, every call::

    raw samples (t_s, value) --resample--> regular grid y[0..n-1], step s, NaN = gap
                             --window----> D = the samples of the fit window before the refit
                                           boundary B, on their own grid; Y = y from the window on
                             --fit-------> constants from the older part of D (held-out errors, the
                                           choice), then from all of D (the point); cached by D's content
                             --run-------> state after every step of Y (extender.core.smoothing)
                             --project---> point at h = lead_s / s steps; upper from the k-step errors

Stateless in the sense that matters: the forecast is a function of the history alone, so a
restarted or newly elected scaler forecasts the same from the same history. The fit is cached in
the process only to save work (:mod:`extender.core.memo`); every memo is keyed by the data it read.

Resampling (:func:`resample`). Samples with a non-finite timestamp or value are missing data, not
zero demand. The step is ``params.step_s`` or, when unset, the median spacing of the samples. The
grid is anchored at the last sample: grid point k (counted back from the end) is
``t_end - k * step_s`` and holds the mean of the samples nearest to it (``round((t_end - t) / s)``).
Rounding to the nearest point, rather than flooring into intervals, keeps a jittery 15 s scrape
(15.0 s, 15.2 s, 14.9 s) one sample per point; a step coarser than the sampling averages several
samples per point, summed in the order of time (then value), whatever order they came in. A grid
point with no sample is a gap (NaN); nothing is interpolated.

The models are one additive state-space model with optional damped trend and season; the
recursion, k-step forecasts and gap rule are in :mod:`extender.core.smoothing`::

    last          EWMA with alpha = 1 (nothing to fit)
    ewma          level                         alpha, shift
    holt          level + damped trend          alpha, beta, phi, shift
    holt-winters  level + damped trend + season alpha, beta, phi, gamma, shift   (m = season_s / s)
    seasonal-holt holt over x = y - S(t)        alpha, beta, phi, shift; S the daily profile (auto only)

``shift`` is the level-shift threshold (:mod:`extender.core.smoothing`): a one-step error larger
than that share of the forecast restarts the level from the observation, so a smoother follows a
burst's start and end at once and still smooths the noise between them; 0 (the fixed constants)
is none.

The seasonal Holt's profile ``S`` (:func:`smoothing.fit_profile`) is :data:`PROFILE_HARMONICS`
harmonics of the day fitted by least squares to the training part (next to a quadratic drift),
as a function of the epoch time, so it is the same on every replica::

    x_t = y_t - S(t)       forecast: holt's forecast of x + S(t_end + lead)

It needs :data:`PROFILE_SEASONS` seasons of observations in the training part. Holt-Winters' slot
per grid step is one sample a day each (5 760 slots at 15 s): its season is as noisy as the data.
Four harmonics come from every sample of the training part; on the benchmark's daily series (8%
noise) the seasonal Holt's error is 7.0% where Holt-Winters' is 8.4%.

Refit schedule and fit window. ``B = floor((t_end - p) / refit_s) * refit_s + p`` (epoch seconds, so
every replica agrees on it; a young history halves ``refit_s`` until there is something to fit,
:func:`window`). ``p`` is the workload's refit phase (``params.refit_phase_s``, :func:`refit_phase`:
a hash of the workload's name spread over the period), so the workloads of one scaler refit at
different ticks of the hour rather than all in the tick after it (a refit of ``auto`` is about 0.7 s
of CPU on 67 h at 15 s; BENCHMARKS.md). The fit data D are the samples in ``(B - fit_window_s, B]``,
resampled on a grid anchored at the last of them, so that D does not move while later samples arrive
(a grid anchored at the newest sample would, whenever the step is coarser than the sampling). The
forecast runs the fitted constants over ``Y``, the forecast grid from ``B - fit_window_s`` on; older
history is not read at all. D is split: the first ``1 - holdout`` of it (the *training* part, 60% by
default) fixes the constants (smoothing.fit: the least one-step absolute error over a bounded grid);
the rest is held out. Constants change only when B moves (once per ``refit_s``), never on every
tick. The held-out 40% (26 h of the default 66 h) is what the model choice and the upper quantile
are measured on: with a fifth held out (13 h), a burst or two inside it decided both (the
benchmark's spiky series was covered 90.6% at a 95% quantile).

Select, then refit (:func:`_refitted`). Once the held-out part has been used (the choice made, the
k-step errors measured with the training-part constants), the constants the forecast runs with are
fitted again on the whole of D, as one does after model selection on a validation set: the newest
26 h are the closest to the demand being forecast, and leaving them out of the fit for good threw
them away. The quantile still comes from the training-part constants' errors after the training
part (out of sample), so it is measured on a close relative of the model that runs (same grid and
loss, 1.7 times the data) rather than on that model itself; on the benchmark's series its coverage
stayed within 3 points of the asked 95% wherever it was before. On the benchmark this took
``auto`` from 0.984 / 0.978 / 0.968 of the last value's error to 0.965 / 0.963 / 0.965 on the
bursty ``llama3-8b`` series, and from 0.96 to 0.89 at two steps on the short Azure sample.

A refit may retune the chosen model, not replace it (:data:`REFIT_REACH`): when the refitted
level constant is more than ten times larger or smaller than the validated one (the level's time
constant ``1 / alpha`` an order of magnitude apart), the validated constants run instead::

    run = refit     if  1/10 <= alpha_refit / alpha_validated <= 10
          validated otherwise

On a flat loss landscape the refit's minimum can land anywhere: on the benchmark's Azure trace at
15 s (an on/off series), EWMA chosen with alpha 0.6 refitted to 0.02, nearly a constant, the two
0.6% apart in one-step absolute error over D; it then ran at 1.21 of the last value's error and its
quantile, measured on the 0.6, covered every outcome. What the choice and the quantile measured is
the validated model; a model an order of magnitude slower or faster is another one.

Fixed constants (``params.alpha``, ``beta``, ``gamma``, ``phi``) are used, over the whole history,
when ``params.fit`` is off or the training part holds fewer than :data:`MIN_FIT_POINTS`
observations; the returned :class:`Forecast` says which (``constants``, ``fitted``).

Holt-Winters needs ``params.min_seasons`` (default 2) full seasons, each of the first two at least
half observed: in the training part to be fitted, else in the whole history with fixed constants.
When the training part is shorter than that (the default 60% of 66 h is 40 h) and D holds more, it
trains on exactly ``min_seasons`` seasons, provided half the held-out share is left after them
(:func:`_split`).
Before that it falls back to Holt, which follows a daily cycle as a slowly turning trend with some
lag; ``method`` and ``note`` say so.

``auto`` (model choice by out-of-sample error). Each of last value, EWMA, Holt, Holt-Winters and
the seasonal Holt (the last two only when they can start and the fit data shows a daily shape at
all, :func:`has_season`) is fitted on the training part and run on through the held-out part,
giving its k-step errors over the held-out origins, ``k = max(1, ceil(h))`` the horizon actually
needed. These forecasts are out of sample twice over: the constants never saw the held-out data,
and each forecast uses only data before its origin. The last value is the baseline; a candidate is
eligible only when its *squared* errors along the path to k (their mean over horizons 1..k, each
scaled by the last value's there) are lower than 99% of the last value's (:data:`AUTO_MARGIN`)
by more than :data:`AUTO_Z` (1.645: a one-sided test at 5%) standard errors of the mean paired
difference, the standard error counting the correlation of overlapping k-step errors (a
Diebold-Mariano test, :func:`gain_statistic`), and it is ahead by the margin at k itself; the
eligible one lowest at k by the most standard errors wins (:func:`choose`; the rule and its test
in :mod:`extender.core.choice`): the most certain gain, not the lowest held-out error. Squared: a
model that lags a burst pays for it in the choice, as the scaler pays for it in queueing. When no
candidate is eligible, the EWMA runs if its squared error at k is below 99% of the last value's at
all, else the last value (:data:`AUTO_FALLBACK`): the EWMA nests the last value (alpha 1, no level
shift), so that choice is one constant, fitted, where the test guards the step to a model with more
structure. With the test for the EWMA too, ``auto`` kept the last value at 354 of 574 origins on a
public series of tweet counts (NAB's Amazon series, held out from every rule here) where the EWMA
alone is level with a fitted ETS, and was up to 1.08 times ETS's error there (BENCHMARKS.md). (Before the level-shift
thresholds, smoothers chosen by absolute error lost 1.05x to the last value on the benchmark's
bursty series; with them, a choice by absolute error gains more there, 0.81-0.89 of the last
value's error against 0.92-0.96, but it took EWMA on the 57-minute Azure sample, 1.04 of the last
value's error at one step. BENCHMARKS.md has the variants.)
Without enough held-out errors (:func:`enough_errors`: at least :data:`MIN_ERRORS`, and
:data:`MIN_WINDOWS` horizons' worth), ``auto`` has no evidence and runs the last value, the
baseline every model has to beat; the note says so.

Projection at lead h = lead_s / s steps (fractional allowed)::

    point = l + D_h b + s(n-1+h)      D_h = phi + ... + phi^h; the season interpolated between slots

The forecast is *at* the end of the lead, not a maximum over it: capacity ordered now cannot serve
demand earlier than the lead, and the decisions at later ticks cover later times.

Upper quantile, from the model's own out-of-sample errors at the horizon used, relative to the
forecast they missed::

    r_{t,k} = (y[t+k] - f_{t,k}) / max(f_{t,k}, u)      every origin t after the training part (or
                                                       after the initial state with fixed constants)
                                                       whose target is observed; u = 0.5 x the
                                                       mean of y above zero (smoothing.relative_floor)
    q       = r_(ceil((N+1) level))                    the ceil((N+1) level)-th smallest; r_(N), the
                                                       largest, when that rank exceeds N
    upper   = point_raw + max(q, 0) max(point_raw, u)

(for the seasonal Holt, ``f_{t,k}`` is its forecast of y: x's forecast plus ``S`` at t+k; for a
fitted model, the errors are those of the constants fitted on the training part). The rank is the
split-conformal one (Vovk et al., *Algorithmic Learning in a Random World*, 2005; Lei et al.,
*Distribution-Free Predictive Inference for Regression*, 2018): if the next error is exchangeable
with the N measured ones, it falls at or below ``r_(ceil((N+1) level))`` with probability at least
``level``, whatever N; the plain sample quantile ``r_(ceil(level (N-1)))`` is one rank lower for
most N and under-covers a short series. The empirical quantile of k-step errors keeps the skew
of bursty demand and needs no variance model, so its coverage is the asked level whatever the
model's misfit. Relative, because demand's noise
grows with its level (Poisson counts, bursts that multiply the rate): errors measured at night
under-cover the afternoon peak in absolute terms (the benchmark showed 1-3 points less coverage).
Without enough such errors (:func:`enough_errors`) it falls back to the one-step residuals widened
by the model's variance growth (Hyndman et al., *Forecasting with Exponential Smoothing*, 2008, class 1)::

    upper = point_raw + max(r_(ceil((N+1) level)), 0) c_h      c_h = sqrt(1 + sum_{j=1}^{k-1} psi_j^2)
    psi_j = alpha + alpha beta D_j + gamma [j mod m = 0]

and with no residual at all (one observation) upper = point: the forecast then cannot raise the
decision above the point, and the scaler's reactive path still sees the observed load.

The point of a fitted model (not the last value) is the median of the same distribution
(:func:`median_shift`)::

    point = point_raw + median(r) max(point_raw, u)

so the point and the upper quantile are two quantiles of one forecast distribution, the point the one
absolute error is minimised by. The last value stays ``y[t]``: it is the baseline ``auto`` falls
back to without evidence, and a shift estimated from its errors is noise on a series without one
(on the benchmark's random walk it cost 1-2% of the error).

Short history (:func:`trend_reach`). The trend is not projected further than half the time the
history spans::

    reach = TREND_REACH (n - 1)                    steps; TREND_REACH = 0.5
    point = l + D_min(h, reach) b + s(n-1+h)

so on one hour of an opening ramp a lead of two hours adds at most half an hour of the ramp (the
issue this came from: Holt on a one-hour trace held every GPU for +35% GPU-hours). With a day of
history the reach is twelve hours, longer than any startup horizon, and nothing changes.

Non-negativity. Demand is never negative, so ``point = max(point_raw + shift, 0)`` and
``upper = max(point_raw + spread, 0)``; since the median of the errors is at most their
``level`` quantile and spread >= 0, ``upper >= point`` always.

Demand beyond :data:`LARGEST` (2^128; a buggy exporter's 1e300) is forecast at a power-of-two scale
and scaled back (:func:`_in_range`): the same forecast, without squared errors overflowing.

No observation at all (empty or all-NaN history): point = upper = 0 with method ``"none"``. The
scaler only ever raises its decision on a forecast, so zero is the neutral answer, not a claim
that demand is zero.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import BaseModel, ConfigDict, Field

from extender.core import memo, smoothing
from extender.core.choice import AUTO_MARGIN, Row, gain_statistic, pick
from extender.core.errors import InvalidValueError, UnknownNameError
from extender.core.smoothing import Constants, Run, Shape

if TYPE_CHECKING:
    from extender.core.policy import Scaling

F64 = NDArray[np.float64]

Method = Literal["last", "ewma", "holt", "holt-winters", "seasonal-holt", "none"]

#: A stray timestamp far in the past must not make the grid (and memory) explode; older points are
#: dropped. 100 000 points is a week at 6 s, about three weeks at 15 s.
MAX_POINTS = 100_000
#: Observations the training part needs before constants are fitted: fewer, and one burst decides
#: alpha; the fixed constants are the safer guess.
MIN_FIT_POINTS = 20
#: k-step errors needed for an empirical quantile or a model choice: at the 95th percentile of 20
#: errors the quantile is already the largest one.
MIN_ERRORS = 20
#: ... and at least this many horizons' worth of them: errors of origins less than k apart share
#: most of their path, so 20 errors at a 30-step horizon are one event seen 20 times (a single step
#: in the history would then be the "95th percentile").
MIN_WINDOWS = 3


def enough_errors(count: int, k: int) -> bool:
    """``count >= max(MIN_ERRORS, MIN_WINDOWS k)``: enough k-step errors to be a distribution."""
    return count >= max(MIN_ERRORS, MIN_WINDOWS * k)


class ForecastParams(BaseModel):
    """Constants, fit schedule, quantile level and grid of the forecasters (defaults: docs/scaler.md section 1).

    ``alpha``, ``beta``, ``gamma``, ``phi``: the fixed constants, used when ``fit`` is off or the
    history is too short to fit (level, trend, season smoothing; trend damping, 1 = none). ``fit``:
    fit the constants to the history. ``refit_s``: the refit period; ``fit_window_s``: history the
    fit reads; ``holdout``: the share of it held out to choose a model and calibrate the quantile.
    ``level``: the upper quantile (AHPA's template uses 95). ``step_s``: grid step in seconds
    (``None``: the median sample spacing). ``season_s``: season length in seconds (a day).
    ``min_seasons``: full seasons required before Holt-Winters is used. ``refit_phase_s``: the
    refit boundaries' offset from the epoch's multiples of ``refit_s`` (:func:`refit_phase`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    alpha: float = Field(default=0.3, gt=0, le=1)
    beta: float = Field(default=0.05, ge=0, le=1)
    gamma: float = Field(default=0.2, ge=0, le=1)
    phi: float = Field(default=1.0, gt=0, le=1)
    fit: bool = True
    refit_s: float = Field(default=3600.0, gt=0)
    #: 66 h: 26 h held out and 40 h to train on (a day and a half for the seasonal Holt's profile;
    #: Holt-Winters trains on two whole days and holds out 18 h), inside the history store's
    #: default three days with room for the refit period.
    fit_window_s: float = Field(default=66 * 3600.0, gt=0)
    holdout: float = Field(default=0.4, gt=0, lt=1)
    level: float = Field(default=0.95, gt=0.5, lt=1)
    step_s: float | None = Field(default=None, gt=0)
    season_s: float = Field(default=86_400.0, gt=0)
    min_seasons: int = Field(default=2, ge=2)
    refit_phase_s: float = Field(default=0.0, ge=0)

    @classmethod
    def from_scaling(cls, scaling: Scaling) -> ForecastParams:
        """The parameters a policy's ``scaling`` section sets."""
        return cls(alpha=scaling.alpha, beta=scaling.beta, gamma=scaling.gamma, phi=scaling.phi,
                   fit=scaling.fit, refit_s=scaling.refit, fit_window_s=scaling.fit_window,
                   level=scaling.quantile, step_s=scaling.step, season_s=scaling.season)

    def fixed(self) -> Constants:
        return Constants(alpha=self.alpha, beta=self.beta, gamma=self.gamma, phi=self.phi)

    def for_workload(self, name: str) -> ForecastParams:
        """These parameters with ``name``'s refit phase (:func:`refit_phase`)."""
        return self.model_copy(update={"refit_phase_s": refit_phase(name, self.refit_s)})


def refit_phase(workload: str, refit_s: float) -> float:
    """Where in the refit period ``workload``'s boundaries fall::

        p = crc32(workload) / 2^32 x refit_s          in [0, refit_s)

    A function of the name alone (CRC-32, not Python's per-process ``hash``), so every replica and
    every restart refits a workload at the same moments, and the workloads of one scaler spread
    their refits over the period instead of all refitting in the same tick.
    """
    return zlib.crc32(workload.encode()) / 2.0**32 * refit_s


class Forecast(BaseModel):
    """Demand expected ``lead_s`` after the last sample, in the unit of the history.

    ``requested`` is the forecaster asked for, ``method`` the one that produced the numbers (they
    differ on a fallback or an ``auto`` choice, and ``note`` says why). ``spread`` is
    ``upper - point_raw`` from the module docstring and ``median_shift`` ``point - point_raw`` before the
    floor at zero (:func:`median_shift`); ``residuals`` how many errors the quantile came
    from and ``errors_steps`` their horizon in grid steps (1 with the one-step fallback, 0 without
    errors); ``observations`` how many grid points held a sample. ``constants`` are the smoothing
    constants used, ``fitted`` whether they were fitted to this history.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    point: float
    upper: float
    level: float
    horizon_s: float
    lead_s: float
    requested: str
    method: Method
    note: str = ""
    observations: int
    residuals: int
    step_s: float
    spread: float
    t_end: float | None
    errors_steps: int = 0
    median_shift: float = 0.0
    constants: dict[str, float] = {}
    fitted: bool = False


# ---------------------------------------------------------------------------------------------
# Resampling
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Series:
    """A history on a regular grid: ``values[i]`` is the demand at ``t_end - (n-1-i) * step_s``.

    NaN marks a grid point without a sample. ``values[0]`` and ``values[-1]`` are observed (the grid
    spans first to last sample), unless the series is empty.
    """

    values: F64
    step_s: float
    t_end: float | None

    def __len__(self) -> int:
        return len(self.values)

    @property
    def observations(self) -> int:
        """Grid points that hold a sample."""
        return int(np.count_nonzero(~np.isnan(self.values)))


def resample(timestamps: ArrayLike, values: ArrayLike, step_s: float | None = None,
             max_points: int = MAX_POINTS) -> Series:
    """Put samples on a regular grid anchored at the last one (rules in the module docstring).

    ``step_s=None`` infers the step as the median positive spacing of the distinct timestamps, which
    ignores gaps as long as most samples are regular. A single distinct timestamp gives a one-point
    grid with step ``step_s or 0.0``.
    """
    t = np.asarray(timestamps, dtype=np.float64).ravel()
    y = np.asarray(values, dtype=np.float64).ravel()
    if t.shape != y.shape:
        raise InvalidValueError(f"{t.size} timestamps but {y.size} values")
    ok = np.isfinite(t) & np.isfinite(y)
    if not ok.all():
        t, y = t[ok], y[ok]
    if t.size == 0:
        return Series(np.empty(0), float(step_s or 0.0), None)
    if t.size > 1 and not bool(np.all(t[1:] > t[:-1])):
        # one order, whatever the callers': a grid point's mean sums its samples in this order, and
        # float sums depend on it (by an ulp, which a fit or the model choice can magnify)
        order = np.lexsort((y, t))
        t, y = t[order], y[order]
    t_end = float(t.max())
    if step_s is None:
        gaps = np.diff(np.unique(t))
        step_s = float(np.median(gaps)) if gaps.size else 0.0
    if step_s <= 0:
        return Series(np.array([float(y.mean())]), 0.0, t_end)
    with np.errstate(over="ignore"):  # a span beyond the float maximum is inf steps back: dropped below
        steps = np.rint((t_end - t) / step_s)  # grid points counted back from the end
    keep = steps < max_points  # before the cast: a stray timestamp may lie more than 2^63 steps back
    if not keep.all():
        steps, y = steps[keep], y[keep]
    back = steps.astype(np.int64)
    n = int(back.max()) + 1
    idx = n - 1 - back
    sums = np.bincount(idx, weights=y, minlength=n)
    counts = np.bincount(idx, minlength=n)
    grid = np.full(n, np.nan)
    np.divide(sums, counts, out=grid, where=counts > 0)
    return Series(grid, float(step_s), t_end)


# ---------------------------------------------------------------------------------------------
# Quantiles
# ---------------------------------------------------------------------------------------------


def residual_quantile(residuals: F64, level: float) -> float:
    """The finite-sample (split-conformal) quantile: the ``ceil((N+1) level)``-th smallest residual.

    0.0 when there are none; the largest one when ``(N+1) level > N`` (fewer than
    ``level / (1 - level)`` residuals, 19 at 95%).
    """
    n = residuals.size
    if n == 0:
        return 0.0
    rank = min(math.ceil((n + 1) * level - 1e-9), n)  # 1-based; 1e-9: 20 x 0.95 is 19.000000000000004
    return float(np.partition(residuals, rank - 1)[rank - 1])


def median_shift(errors: F64, point_raw: float, floor: float) -> float:
    """What a fitted model's point moves by to become the median of its forecast distribution::

        shift = median(r) max(point_raw, u)       r: the relative k-step errors the upper quantile
                                                  comes from; u the floor (module docstring)

    The upper quantile is ``point_raw`` plus the 95th percentile of the same errors; the point is
    their 50th. A point forecast judged by absolute error should be the median of what may happen
    (Gneiting, *Making and Evaluating Point Forecasts*, JASA 2011: absolute error is consistent for
    the median, squared error for the mean), and the constants are fitted by absolute error only one
    step ahead and before the refit. On bursty demand the two differ: a smoother's level sits
    between the bursts and the quiet stretches, where outcomes seldom fall, and its errors'
    median is below zero.
    """
    return float(np.median(errors)) * max(point_raw, floor)


def spread_factor(h_steps: float, alpha: float, beta: float = 0.0, gamma: float = 0.0, m: int = 0, *,
                  phi: float = 1.0) -> float:
    """``c_h = sqrt(1 + sum_{j=1}^{k-1} psi_j^2)``, ``k = max(1, ceil(h))``, ``psi_j`` per the docstring.

    ``beta=0`` gives EWMA's psi, ``gamma=0`` (or ``m=0``) Holt's.
    """
    k = horizon_steps(h_steps)
    if k - 1 > SUMMED_STEPS:
        return math.sqrt(1.0 + psi_square_sum(k - 1, alpha, beta, gamma, m, phi=phi))
    j = np.arange(1, k, dtype=np.float64)
    damped = j if phi == 1.0 else phi * (1.0 - phi ** j) / (1.0 - phi)
    psi = alpha + alpha * beta * damped
    if m > 0 and gamma > 0:
        psi = psi + gamma * (np.mod(j, m) == 0)
    return math.sqrt(1.0 + float(np.sum(psi * psi)))


#: :func:`spread_factor` sums up to this many terms one by one; beyond (a lead longer than the
#: longest grid, :data:`MAX_POINTS`: a year at 15 s is 2.1 million steps) in closed form.
SUMMED_STEPS = MAX_POINTS
#: Below this ``n (1 - phi)`` (phi within 1e-10 of 1 at the lengths it is used for),
#: :func:`psi_square_sum` takes the trend as undamped: the damping then moves the sum by about this
#: share, and the damped form would lose more to cancellation (``3 eps / (n (1 - phi))^2``).
UNDAMPED_BELOW = 1e-5


def psi_square_sum(n: int, alpha: float, beta: float = 0.0, gamma: float = 0.0, m: int = 0, *,
                   phi: float = 1.0) -> float:
    """``sum_{j=1}^{n} psi_j^2`` of :func:`spread_factor` in closed form, for a lead of any length::

        psi_j = a + a beta D_j (+ gamma when m > 0 and j mod m = 0)
        phi = 1:  D_j = j                 sum = n a^2 + 2 a B S1 + B^2 S2,   B = a beta,
                                          S1 = n(n+1)/2, S2 = n(n+1)(2n+1)/6
        phi < 1:  D_j = c u_j, c = phi / (1 - phi), u_j = 1 - phi^j
                  sum = n a^2 + 2 a B c U1 + (B c)^2 U2,   U1 = n - G(phi), U2 = n - 2 G(phi) + G(phi^2),
                  G(x) = x (1 - x^n) / (1 - x)
        season:   + q gamma^2 + 2 gamma sum_{i=1}^{q} psi_{im}       q = floor(n / m)

    ``1 - x^n`` as ``-expm1(n log x)``; the damping is ignored when ``n (1 - phi)`` is below
    :data:`UNDAMPED_BELOW`. Within 1e-9 of the term-by-term sum for a fitted phi (0.8 to 1), and
    1e-5 for one within 1e-10 of 1 (tests).
    """
    a, b = alpha, alpha * beta
    damped = phi != 1.0 and n * (1.0 - phi) >= UNDAMPED_BELOW
    log_phi = math.log(phi) if damped else 0.0

    def geometric(times: float, count: int) -> float:
        """``sum_{i=1}^{count} phi^(times i)``."""
        x = math.exp(times * log_phi)
        return x * -math.expm1(count * times * log_phi) / -math.expm1(times * log_phi)

    if damped:
        c = phi / (1.0 - phi)
        g1, g2 = geometric(1.0, n), geometric(2.0, n)
        total = n * a * a + 2.0 * a * b * c * (n - g1) + (b * c) ** 2 * (n - 2.0 * g1 + g2)
    else:
        total = n * a * a + a * b * n * (n + 1.0) + b * b * n * (n + 1.0) * (2.0 * n + 1.0) / 6.0
    q = n // m if m > 0 and gamma > 0 else 0
    if q:  # sum_{i=1}^{q} psi_{im}: a + b c (1 - phi^(im)) damped, a + b i m undamped
        at_m = q * (a + b * c) - b * c * geometric(float(m), q) if damped else q * a + b * m * q * (q + 1.0) / 2.0
        total += q * gamma * gamma + 2.0 * gamma * at_m
    return max(total, 0.0)


#: A trend is projected over at most this share of the time the history spans (:func:`trend_reach`).
TREND_REACH = 0.5


def trend_reach(series: Series) -> float:
    """``reach = TREND_REACH x (n - 1)`` grid steps: how far a trend of this history may be projected.

    An hour of an opening ramp says nothing about the next two hours; projected over a lead longer
    than the history, a trend fitted to it (or the fixed ``beta`` before there is enough to fit)
    holds capacity for a ramp that nothing has shown will go on. Long histories are unaffected: a
    day of history reaches twelve hours, more than any startup horizon.
    """
    return TREND_REACH * max(len(series) - 1, 0)


def horizon_steps(h_steps: float) -> int:
    """``k = max(1, ceil(h))``: the whole steps whose errors stand for a lead of ``h`` steps."""
    return max(1, math.ceil(h_steps - 1e-9))  # 1e-9: a lead of exactly 4 steps computed as 4.0000000001


# ---------------------------------------------------------------------------------------------
# Window, fit and the process cache of fits
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """What the fitted forecasters read.

    ``fit``: the fit data D, the samples in ``(B - fit_window_s, B]`` on their own grid (anchored at
    the last of them, so it does not move with later samples); its first ``split`` points are the
    training part. ``y``: the forecast grid from the fit window's start on; origins from
    ``held_from`` on lie after the training part (their forecasts are out of sample).
    """

    fit: F64
    split: int
    y: F64
    held_from: int
    step_s: float = 0.0
    fit_end: float = 0.0
    y_end: float = 0.0

    def fit_times(self) -> F64:
        """Epoch seconds of D's grid points."""
        return self.fit_end - self.step_s * np.arange(len(self.fit) - 1, -1, -1, dtype=np.float64)

    def y_times(self) -> F64:
        """Epoch seconds of Y's grid points."""
        return self.y_end - self.step_s * np.arange(len(self.y) - 1, -1, -1, dtype=np.float64)


def window(t: F64, v: F64, series: Series, params: ForecastParams) -> Window | None:
    """D, its split and Y (module docstring); ``None`` when there is nothing to fit.

    A young history (less than one refit period behind the boundary) would go unfitted for up to
    ``refit_s``; so the period is halved until the training part holds :data:`MIN_FIT_POINTS`
    observations, down to two grid steps. The boundaries of every halved period are the phase plus
    epoch multiples too, so the choice is still a function of the history (and the name) alone.
    """
    s, t_end = series.step_s, series.t_end
    if not params.fit or s <= 0 or t_end is None:
        return None
    period, phase = params.refit_s, params.refit_phase_s
    while period >= 2 * s:
        boundary = math.floor((t_end - phase) / period) * period + phase
        start = boundary - params.fit_window_s
        inside = (t <= boundary) & (t > start)
        d = _fit_data(t[inside], v[inside], s)
        split = len(d) - math.ceil(len(d) * params.holdout)
        if d.t_end is not None and int(np.count_nonzero(~np.isnan(d.values[:split]))) >= MIN_FIT_POINTS:
            n = len(series)
            # grid point i of the forecast grid is at t_end - (n-1-i) s
            first = max(0, n - 1 - math.floor((t_end - start) / s - 1e-9))
            split_t = d.t_end - (len(d) - 1 - split) * s
            held = n - 1 - math.floor((t_end - split_t) / s + 0.5)
            return Window(d.values, split, series.values[first:], max(0, held - first), s, d.t_end, t_end)
        period /= 2
    return None


#: The fit data D :func:`window` made from the last samples it read (one per workload forecast in
#: turn, in the simulator): D does not move between refit boundaries, and re-gridding it costs more
#: than comparing the samples. As many as :func:`memo.digest` keeps digests of, by identity: the
#: fit key digests these very arrays.
_FIT_DATA: memo.Recent[Series] = memo.Recent(memo.LAST_DIGESTS)


def _fit_data(t: F64, v: F64, step_s: float) -> Series:
    """``resample(t, v, step_s)``, through :data:`_FIT_DATA`."""
    return _FIT_DATA.get(t, v, step_s, make=lambda: resample(t, v, step_s))


def _fit_key(w: Window, params: ForecastParams) -> tuple[object, ...]:
    """What a fit on ``w`` reads, for :func:`memo.cached`: D's content (``fit_end`` too: the daily
    profile's phase depends on when D was, not only on its values) and the parameters but the level."""
    params_key = memo.by_identity(params, lambda: params.model_dump_json(exclude={"level"}))
    return (memo.digest(w.fit), len(w.fit), w.split, w.fit_end, params_key)


def _shape(name: str, m: int) -> Shape:
    return {"last": Shape(trend=False), "ewma": Shape(trend=False), "holt": Shape(trend=True),
            "holt-winters": Shape(trend=True, m=m), "seasonal-holt": Shape(trend=True)}[name]



#: Harmonics of the daily profile (:func:`smoothing.fit_profile`): periods down to 6 h, enough for
#: a morning ramp and an evening peak, few enough (8 numbers) to estimate from a day and a half.
PROFILE_HARMONICS = 4
#: Seasons of observations the training part needs before the daily profile is estimated: with one
#: season only, the level's drift and the first harmonic cannot be told apart.
PROFILE_SEASONS = 1.5


def _profile(w: Window, params: ForecastParams) -> smoothing.Profile:
    """The daily profile of D's training part (cached by D's content)."""
    def make() -> smoothing.Profile:
        return smoothing.fit_profile(w.fit_times()[:w.split], w.fit[:w.split], params.season_s, PROFILE_HARMONICS)
    got = memo.cached(("profile", *_fit_key(w, params)), make)
    assert isinstance(got, smoothing.Profile)
    return got


def _profile_on(times: F64, w: Window, params: ForecastParams) -> F64:
    """``S(times)`` of :func:`_profile`, reusing its values over D (cached) when ``times`` begin
    with D's grid times (within a refit period, Y's grid usually does): only the times since the
    boundary are computed. The same values either way, up to the rounding of a matrix product."""
    prof = _profile(w, params)
    d_times = w.fit_times()
    n0 = len(d_times)
    if len(times) < n0 or not np.array_equal(times[:n0], d_times):
        return prof.at(times)
    got = memo.cached(("profile-on-d", *_fit_key(w, params)), lambda: prof.at(d_times))
    assert isinstance(got, np.ndarray)
    return np.concatenate([got, prof.at(times[n0:])]) if len(times) > n0 else got.copy()


def _profile_ready(w: Window, m: int) -> bool:
    """Whether D's training part holds :data:`PROFILE_SEASONS` seasons of observations."""
    seen = int(np.count_nonzero(~np.isnan(w.fit[:w.split])))
    return m >= 2 and seen >= PROFILE_SEASONS * m


#: The fixed constants each model runs with when it is not fitted (unused ones stay 0, phi 1).
_FIXED: Mapping[str, Callable[[ForecastParams], Constants]] = MappingProxyType({
    "last": lambda p: Constants(alpha=1.0),
    "ewma": lambda p: Constants(alpha=p.alpha),
    "holt": lambda p: Constants(alpha=p.alpha, beta=p.beta, phi=p.phi),
    "holt-winters": ForecastParams.fixed,
    "seasonal-holt": lambda p: Constants(alpha=p.alpha, beta=p.beta, phi=p.phi),
})
#: The ``method`` a model's forecasts report.
_METHOD: Mapping[str, Method] = MappingProxyType({
    "last": "last", "ewma": "ewma", "holt": "holt", "holt-winters": "holt-winters",
    "seasonal-holt": "seasonal-holt"})


def _fixed(name: str, params: ForecastParams) -> Constants:
    return _FIXED[name](params)


def _split(w: Window, name: str, shape: Shape, params: ForecastParams) -> int:
    """Where D's training part ends for model ``name``: ``w.split``, except for Holt-Winters.

    Its slot-by-slot season starts from ``min_seasons`` whole seasons of the training part. When
    ``w.split`` holds fewer, it trains on exactly that many, provided half the held-out share of D
    stays held out (with the defaults: from 60 h of D on, as it did when a fifth was held out);
    :func:`choose` compares it with the others on the held-out origins they share.
    """
    if name != "holt-winters" or not shape.seasonal:
        return w.split
    need = params.min_seasons * shape.m
    return need if w.split < need <= len(w.fit) - math.ceil(len(w.fit) * params.holdout / 2) else w.split


def _can_fit(w: Window | None, name: str, shape: Shape, params: ForecastParams) -> bool:
    """Whether model ``name`` (of ``shape``) can be fitted on D's training part and run over Y."""
    if w is None:
        return False
    if name == "seasonal-holt":
        return _profile_ready(w, round(params.season_s / w.step_s))
    if name != "holt-winters":
        return True
    train = w.fit[:_split(w, name, shape, params)]
    return not (smoothing.seasonal_ready(train, shape.m, params.min_seasons)
                or smoothing.seasonal_ready(w.y, shape.m, params.min_seasons))


@dataclass(frozen=True)
class Fitted:
    """One model fitted on D's training part and run over D; forecasts from ``first`` on are out of sample."""

    run: Run
    first: int


def _fitted(name: str, shape: Shape, w: Window, params: ForecastParams) -> Fitted:
    """``name`` fitted on the training part of D and run over D (cached by D's content).

    The seasonal Holt runs over D less its daily profile (:func:`_profile`).
    """
    def make() -> Fitted:
        y = w.fit
        if name == "seasonal-holt":
            y = y - _profile_on(w.fit_times(), w, params)
        split = _split(w, name, shape, params)
        c = Constants(alpha=1.0) if name == "last" else smoothing.fit(y[:split], shape, _fixed(name, params))
        return Fitted(smoothing.run(y, shape, c), split)
    got = memo.cached(("fit", name, shape, *_fit_key(w, params)), make)
    assert isinstance(got, Fitted)
    return got


#: How far a refit may move the level constant from the validated one, as a factor either way
#: (module docstring, "Select, then refit"). On the benchmark any factor from 2 to 25 gave the same
#: bars; ten is an order of magnitude in the level's time constant.
REFIT_REACH = 10.0


@dataclass(frozen=True)
class Refit:
    """What :func:`_refitted` runs over D, and ``note``: why these are the validated constants, when
    the refit went beyond :data:`REFIT_REACH` (empty otherwise)."""

    run: Run
    note: str = ""


def _refitted(name: str, shape: Shape, w: Window, params: ForecastParams) -> Refit:
    """``name``'s constants fitted on the whole of D, training and held-out parts, and run over D
    (cached by D's content); the validated constants (:func:`_fitted`) when the refit's alpha is
    beyond :data:`REFIT_REACH` of theirs.

    The held-out part has done its work once a model is chosen and its errors are measured; the
    constants the forecast runs with then learn from all of D, the newest 26 h included.
    """
    def make() -> Refit:
        validated = _fitted(name, shape, w, params).run
        if name == "last":
            return Refit(validated)
        y = w.fit
        if name == "seasonal-holt":
            y = y - _profile_on(w.fit_times(), w, params)
        c = smoothing.fit(y, shape, _fixed(name, params))
        a = validated.constants.alpha
        if not 1.0 / REFIT_REACH <= c.alpha / a <= REFIT_REACH:
            return Refit(validated, f"the refit on the whole fit window took alpha from {a:g} to {c.alpha:g}, "
                                    f"beyond {REFIT_REACH:g} times either way: the validated constants run")
        return Refit(smoothing.run(y, shape, c))
    got = memo.cached(("refit", name, shape, *_fit_key(w, params)), make)
    assert isinstance(got, Refit)
    return got


def _fitted_forecast(name: str, ctx: Context, w: Window, note: str) -> Forecast:
    """The constants refitted on all of D run over Y; the quantile from the errors, after the
    training part, of the constants fitted on the training part alone (:class:`HeldOut`)."""
    shape = _shape(name, ctx.m)
    fitted = _fitted(name, shape, w, ctx.params)
    refit = _refitted(name, shape, w, ctx.params)
    first = w.held_from + fitted.first - w.split  # the same point in time on Y's grid
    off, ahead = None, 0.0
    y = w.y
    if name == "seasonal-holt":
        prof = _profile(w, ctx.params)
        off = _profile_on(w.y_times(), w, ctx.params)
        ahead = float(prof.at(np.array([w.y_end + ctx.lead_s]))[0])
        y = w.y - off
    r = memo.run_on(y, refit.run)
    held = HeldOut(r if refit.run.constants == fitted.run.constants else memo.run_on(y, fitted.run), first, off)
    return _finish(ctx, name, r, first, _join(note, refit.note), offset=off, ahead=ahead, held=held)


@dataclass(frozen=True)
class HeldOut:
    """Where a fitted model's quantile errors come from: its run over Y with the constants fitted on
    D's training part, from origin ``first`` (the held-out part and everything after it) on;
    ``offset`` the daily profile over Y when the run is over the demand less it (the seasonal Holt)."""

    run: Run
    first: int
    offset: F64 | None = None


# ---------------------------------------------------------------------------------------------
# From a run to a Forecast
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    """What every forecaster is called with: the grid, the lead, the parameters and the names."""

    series: Series
    horizon_s: float
    lead_s: float
    params: ForecastParams
    requested: str
    window: Window | None

    @property
    def h(self) -> float:
        return self.lead_s / self.series.step_s if self.series.step_s > 0 else 0.0

    @property
    def m(self) -> int:
        return round(self.params.season_s / self.series.step_s) if self.series.step_s > 0 else 0


def _finish(ctx: Context, name: str, r: Run, first: int, note: str, *, offset: F64 | None = None,
            ahead: float = 0.0, held: HeldOut | None = None) -> Forecast:
    """Point and upper quantile from a run over the whole window (module docstring).

    ``offset``, ``ahead``: the run is over the demand less a daily profile, ``offset`` its value at
    each grid point and ``ahead`` at the end of the lead (the seasonal Holt). ``held``: take the
    k-step errors from there (a fitted model) rather than from ``r`` after ``first``.
    """
    h = ctx.h
    k = horizon_steps(h)
    reach = trend_reach(ctx.series)
    raw = smoothing.point_at(r, h, reach) + ahead
    y = r.y if offset is None else r.y + offset
    floor = smoothing.relative_floor(y)
    if held is None:
        errs = smoothing.relative_errors_at(r, k, first, floor, offset)
    else:
        errs = smoothing.relative_errors_at(held.run, k, held.first, floor, held.offset)
    shift = 0.0
    if enough_errors(errs.size, k):
        q = max(residual_quantile(errs, ctx.params.level), 0.0)
        spread, n_err, steps = q * max(raw, floor), errs.size, k
        if held is not None and name != "last":
            shift = median_shift(errs, raw, floor)
    else:
        res = smoothing.errors_at(r, 1, r.t0)
        c = r.constants
        c_h = spread_factor(h, c.alpha, c.beta, c.gamma, r.shape.m, phi=c.phi)
        spread, n_err, steps = max(residual_quantile(res, ctx.params.level), 0.0) * c_h, res.size, 1 if res.size else 0
    method = _METHOD[name]
    if ctx.series.observations == 1 and method == "holt":
        note = _join(note, "one observation: flat forecast")
    s = ctx.series
    return Forecast(
        point=max(raw + shift, 0.0), upper=max(raw + spread, 0.0), level=ctx.params.level, horizon_s=ctx.horizon_s,
        lead_s=ctx.lead_s, requested=ctx.requested, method=method, note=note, observations=s.observations,
        residuals=n_err, step_s=s.step_s, spread=spread, t_end=s.t_end, errors_steps=steps, median_shift=shift,
        constants=r.constants.as_dict(), fitted=r.constants.fitted,
    )


def _model(name: str, ctx: Context, *, note: str = "") -> Forecast:
    """One model: fitted on D when its training part is long enough, else fixed constants over the
    whole grid; Holt-Winters without its seasons falls back to Holt."""
    p = ctx.params
    shape = _shape(name, ctx.m)
    if ctx.window is not None and _can_fit(ctx.window, name, shape, p):
        return _fitted_forecast(name, ctx, ctx.window, note)
    if name == "holt-winters":  # (not shape.seasonal: a grid without a step has no season at all)
        why = smoothing.seasonal_ready(ctx.series.values, shape.m, p.min_seasons)
        if why:
            return _model("holt", ctx, note=_join(note, f"fell back to holt: {why}"))
    r = smoothing.run(ctx.series.values, shape, _fixed(name, p))
    return _finish(ctx, name, r, r.t0, note)


#: The models ``auto`` chooses among, simplest first (ties go to the simpler).
AUTO_CANDIDATES = ("last", "ewma", "holt", "holt-winters", "seasonal-holt")
#: The candidates with a daily season: offered only when the fit data shows one (:func:`has_season`).
SEASONAL = frozenset({"holt-winters", "seasonal-holt"})


def _means(a: F64) -> F64:
    """The mean of each row of ``a`` over its observed (not NaN) entries; NaN for a row with none."""
    seen = ~np.isnan(a)
    count = seen.sum(axis=1)
    total = np.where(seen, a, 0.0).sum(axis=1)
    return np.asarray(np.where(count > 0, total / np.maximum(count, 1), np.nan), dtype=np.float64)


@dataclass(frozen=True)
class Choice:
    """``auto``'s pick at one horizon: the model and why (:func:`~extender.core.choice.pick`), every
    candidate's score and Diebold-Mariano statistics against the last value (:func:`choose`), and the
    number of held-out k-step origins of the last value."""

    name: str
    why: str
    scores: tuple[Row, ...]
    errors: int


def has_season(y: F64, m: int) -> bool:
    """Whether ``y`` has a daily shape at all: a quarter season ahead, yesterday's value at that time
    (seasonal naive) is a better guess than the value a quarter season ago (last value)::

        mean |y[t] - y[t-m]|  <  mean |y[t] - y[t-m/4]|      over t >= m with all three observed

    On a random walk the left side is twice the right (its errors grow as sqrt(lag)); on a daily
    cycle the right side is the cycle's own swing. Without this gate a season fitted to a couple of
    days of a random walk can win a short held-out stretch by chance.
    """
    g = max(1, m // 4)
    if m < 2 or len(y) <= m:
        return False
    now, day, quarter = y[m:], y[:-m], y[m - g:-g]
    ok = ~(np.isnan(now) | np.isnan(day) | np.isnan(quarter))
    if not ok.any():
        return False
    return float(np.mean(np.abs(now[ok] - day[ok]))) < float(np.mean(np.abs(now[ok] - quarter[ok])))


def choose(w: Window, ctx: Context, k: int) -> Choice | None:
    """The model ``auto`` runs at horizon k (``None``: too few held-out errors to tell).

    Every candidate that can be fitted (Holt-Winters and the seasonal Holt only when the fit data
    has a daily shape, :func:`has_season`) gives its squared errors at every horizon up to k on its
    held-out origins, and is compared with the last value on the origins they share (all of them,
    or the latest ones for a Holt-Winters that trained longer)::

        score  = mean(e_k^2) / mean(e_last,k^2)                 1 for the last value itself
        z_k    = gain_statistic(e_k^2, e_last,k^2, k)            at the horizon used
        p_t    = mean_j e_{t,j}^2 / mean(e_last,j^2)             j = 1..k: the path to the horizon
        z_path = gain_statistic(p, p_last, k)                    0 for the last value itself

    Whether to leave the last value at all is a question of evidence, and the path holds k times
    as much of it as the horizon alone: ``z_path`` is the Diebold-Mariano test on the average loss
    over horizons 1..k (Quaedvlieg, *Multi-Horizon Forecast Comparison*, JBES 2021), each horizon
    scaled by the last value's mean loss there so that the longest one, whose errors are the
    largest, does not drown the others. Which model to run is a question of the horizon used. A
    candidate is eligible when ``z_path > AUTO_Z`` and ``z_k > 0`` (it is ahead at k too, by the
    margin), and the eligible one with the largest ``z_k`` wins (:func:`pick`). At k = 1 the two
    statistics are one. With none eligible, the EWMA runs when ``score < 1 - AUTO_MARGIN`` (its
    ``z_k > 0``), the last value otherwise (:data:`AUTO_FALLBACK`).

    The largest statistic rather than the lowest score, because the two differ when a candidate's
    lower mean rests on a few large errors. On the benchmark's 57-minute Azure sample (24 held-out errors), EWMA's
    mean squared error was 0.68 of the last value's at z 1.9 and Holt's 0.91 at z above 2; the next
    half hour was 1.04 of the last value's absolute error with EWMA and 0.94 with Holt.
    """
    if not enough_errors(max(len(w.fit) - k, 0), k):  # not even every origin would do (a lead beyond D)
        return None
    paths: dict[str, F64] = {}
    for name in AUTO_CANDIDATES:
        shape = _shape(name, ctx.m)
        if not _can_fit(w, name, shape, ctx.params):
            continue
        if name in SEASONAL and not has_season(w.fit, ctx.m):
            continue
        f = _fitted(name, shape, w, ctx.params)
        e = smoothing.errors_along(f.run, k, f.first)
        if enough_errors(int(np.count_nonzero(~np.isnan(e[:, -1]))), k):
            paths[name] = e * e
        elif name == "last":  # the baseline has the most held-out errors of all: nothing to compare
            return None
    base = paths["last"]
    scale = _means(base.T)  # the last value's mean squared error at each horizon
    scale = np.where(scale > 0.0, scale, 1.0)  # NaN (no target at j) or 0 (a perfect last value)
    rows, held = [], 0
    for name, v in paths.items():
        shared = base[-len(v):]  # Holt-Winters may hold out fewer origins than the others
        at_k = ~np.isnan(v[:, -1])
        new, old = v[at_k, -1], shared[at_k, -1]
        score = float(np.mean(new)) / max(float(np.mean(old)), 1e-300)
        if name == "last":
            rows.append(Row(name, score, 0.0, 0.0))
            held = new.size  # the candidates come after it (AUTO_CANDIDATES)
            continue
        path_new, path_old = _means(v / scale), _means(shared / scale)
        seen = ~np.isnan(path_new)
        z_path = gain_statistic(path_new[seen], path_old[seen], k)
        rows.append(Row(name, score, gain_statistic(new, old, k), z_path))
    chosen = pick(rows)
    return Choice(chosen.name, chosen.why, tuple(rows), held)


def _auto(ctx: Context) -> Forecast:
    p = ctx.params
    if not p.fit:
        return _model("last", ctx, note="auto: fit is off, so no held-out errors to choose by: the last value")
    w = ctx.window
    k = horizon_steps(ctx.h)
    got = memo.cached(("choice", k, ctx.m, *_fit_key(w, p)), lambda: choose(w, ctx, k) or "none") if w else None
    if not isinstance(got, Choice):
        held = 0 if w is None else len(w.fit) - w.split
        return _model("last", ctx, note=f"auto: too little history before the refit boundary to compare models "
                                        f"({held} held-out steps at a horizon of {k}): the last value")
    table = ", ".join(f"{r.name} {r.score:.3f} (z {r.z:.1f}" + (f", {r.z_path:.1f} over 1-{k})" if k > 1 else ")")
                      for r in got.scores)
    note = (f"auto chose {got.name} ({got.why}) by squared error at {k} step(s) over {got.errors} held-out origins "
            f"(mean squared error over the last value's, and by how many standard errors it is below "
            f"{100 * (1 - AUTO_MARGIN):g}% of it: {table})")
    assert w is not None
    return _fitted_forecast(got.name, ctx, w, note)


def _join(a: str, b: str) -> str:
    return "; ".join(x for x in (a, b) if x)


# ---------------------------------------------------------------------------------------------
# The registry
# ---------------------------------------------------------------------------------------------


class Forecaster(Protocol):
    """Forecast a resampled series (at least one observation) ``ctx.lead_s`` seconds past its last point.

    ``ctx.horizon_s`` is only recorded (the lead already includes any staleness); ``ctx.requested``
    is the name it was called by, recorded next to the method that actually ran.
    """

    def __call__(self, ctx: Context) -> Forecast: ...


def _named(name: str) -> Forecaster:
    def one(ctx: Context) -> Forecast:
        return _model(name, ctx)
    return one


#: Name (as in the policy's ``scaling.forecaster``) -> implementation.
FORECASTERS: Mapping[str, Forecaster] = MappingProxyType({
    "auto": _auto,
    "last": _named("last"),
    "ewma": _named("ewma"),
    "holt": _named("holt"),
    "holt-winters": _named("holt-winters"),
})


def forecaster(name: str) -> Forecaster:
    """The forecaster registered as ``name``; :class:`UnknownNameError` lists the known ones."""
    try:
        return FORECASTERS[name]
    except KeyError:
        raise UnknownNameError(f"no forecaster {name!r} (known: {', '.join(sorted(FORECASTERS))})") from None


def forecast(name: str, timestamps: ArrayLike, values: ArrayLike, horizon_s: float,
             params: ForecastParams | None = None, *, now_s: float | None = None) -> Forecast:
    """Forecast demand ``horizon_s`` seconds after ``now_s`` with the forecaster called ``name``.

    ``timestamps`` in seconds (any epoch, any order), ``values`` in the demand unit; NaN and gaps
    allowed. The lead from the last sample is ``lead_s = horizon_s + max(0, now_s - t_end)``, so a
    history that stopped (scrape failures) is projected over the time it has been silent as well.
    ``now_s=None`` means now is the last sample.
    """
    fn = forecaster(name)
    if not horizon_s >= 0 or not math.isfinite(horizon_s):
        raise InvalidValueError(f"horizon must be a finite number of seconds >= 0, got {horizon_s!r}")
    if now_s is not None and not math.isfinite(now_s):
        raise InvalidValueError(f"now must be a finite time in seconds (or None: the last sample), got {now_s!r}")
    p = params if params is not None else ForecastParams()
    t = np.asarray(timestamps, dtype=np.float64).ravel()
    v, scale = _in_range(np.asarray(values, dtype=np.float64).ravel())
    series, win = _prepared(t, v, p)
    if series.t_end is None:
        return Forecast(point=0.0, upper=0.0, level=p.level, horizon_s=horizon_s, lead_s=horizon_s,
                        requested=name, method="none", note="no observations", observations=0,
                        residuals=0, step_s=series.step_s, spread=0.0, t_end=None)
    stale = max(0.0, now_s - series.t_end) if now_s is not None else 0.0
    got = fn(Context(series, horizon_s, horizon_s + stale, p, name, win))
    if scale == 1.0:
        return got
    top = float(np.finfo(np.float64).max)
    return got.model_copy(update={k: min(max(getattr(got, k) * scale, -top), top)
                                  for k in ("point", "upper", "spread", "median_shift")})


#: Demand values larger than this (a buggy exporter's 1e300) are forecast at a power-of-two scale:
#: squared errors, their variance and a projected trend of values near the float maximum overflow to
#: inf and NaN. 2^128 leaves room for all of them; every real rate is far below it.
LARGEST = 2.0**128


def _in_range(v: F64) -> tuple[F64, float]:
    """``v`` and 1, or ``v / 2^e`` and ``2^e`` when its largest finite magnitude is beyond :data:`LARGEST`
    (``2^e`` the power of two at or below it). Dividing by a power of two is exact, and every step
    of the forecast is equivariant to the scale of the demand (relative errors, ratios of errors,
    grid-searched constants), so the forecast of ``v / 2^e`` times ``2^e`` is the forecast of ``v``
    without the overflows; a result beyond the float maximum is that maximum."""
    finite = v[np.isfinite(v)]
    big = float(np.max(np.abs(finite))) if finite.size else 0.0
    if big <= LARGEST:
        return v, 1.0
    scale = math.ldexp(1.0, math.frexp(big)[1] - 1)  # v / scale below 2; 2^1024 is not a float
    return v / scale, scale


#: The histories :func:`forecast` gridded last: the same history is forecast at its horizons in a
#: row, and a scaler that does so grids it once.
_PREPARED: memo.Recent[tuple[Series, Window | None]] = memo.Recent(4)


def _prepared(t: F64, v: F64, p: ForecastParams) -> tuple[Series, Window | None]:
    """The history on its grid and the fit window (:func:`resample`, :func:`window`), through
    :data:`_PREPARED`."""
    def make() -> tuple[Series, Window | None]:
        series = resample(t, v, p.step_s)
        if series.t_end is None:
            return series, None
        ok = np.isfinite(t) & np.isfinite(v)
        return series, window(t, v, series, p) if ok.all() else window(t[ok], v[ok], series, p)
    return _PREPARED.get(t, v, p, make=make)


def clear_memos() -> None:
    """Forget everything this process kept to save work, as a newly started replica has nothing
    (:mod:`extender.core.memo`); the forecasts stay the same."""
    memo.clear()
    _FIT_DATA.clear()
    _PREPARED.clear()
