"""Additive exponential smoothing with a damped trend: the recursion, its k-step forecasts, the fit.

One state-space model covers every forecaster (``extender.core.forecast``): a :class:`Shape` says
which components it has (level always; a damped trend; an additive season of ``m`` steps) and
:class:`Constants` how fast each follows the data. In error-correction form, with
``e_t = y_t - f_t`` and ``i = t mod m``::

    f_t  = l + phi b + s_i                           one-step forecast
    l   <- l + phi b + alpha e
    b   <- phi b + alpha beta e
    s_i <- s_i + gamma e

EWMA is the level alone (``b = 0``, no season); the last value is EWMA with ``alpha = 1``; Holt adds
the trend; Holt-Winters the season. ``phi = 1`` is the undamped trend. At a gap (NaN) the state is
predicted and not updated: ``l <- l + phi b``, ``b <- phi b``, the season stays.

Level shifts. With a shift threshold ``c > 0`` (``Constants.shift``), a step whose error is large
against the forecast is taken as a new level rather than noise::

    |e| > c max(|f_t|, u)   =>   l <- l + phi b + e,  b <- phi b,  season unchanged
                                 (the step runs with alpha = 1, beta = gamma = 0: f_{t+1} starts from y_t)

``u`` (``Constants.floor``) keeps the test meaningful near zero demand. Demand moves in steps a
smoother cannot follow: a tenant's batch job starts, a burst ends. A smoother that treats the
step as noise lags it by its whole time constant; the last value follows it at once but passes
every bit of noise on. With the threshold, a small alpha smooths the noise and a step is followed
in one sample. This is the additive smoother with level-shift detection of the robust
exponential smoothing literature in its simplest form (a threshold on the standardised one-step
error; Gelper, Fried and Croux, *Robust forecasting with exponential and Holt-Winters smoothing*,
2010, clean the large errors away, the opposite choice, right for outliers that do not persist).
On the benchmark's two bursty scenario series (bench/bench_forecast.py, one to three steps
ahead) EWMA with the threshold fitted made 0.91-1.00 of the last value's error, plain EWMA
0.94-1.08. ``c = 0``: no
shift is ever taken, the plain recursion above.

k-step forecast from the state after step t (the *origin*)::

    f_{t,k} = l_t + D_k b_t + s(t, t+k)      D_k = phi + phi^2 + ... + phi^k = phi (1 - phi^k) / (1 - phi)
                                             (D_k = k when phi = 1; the same formula for a fractional k)

where ``s(t, t+k)`` is the season slot of ``t+k`` as it stood at time t: that slot was last touched
at ``u = t + k - m ceil(k/m)`` (in ``(t-m, t]``), so it is the value stored after step u, or the
initial one when ``u < 0``. Storing the state after every step (:class:`Run`) therefore gives every
origin's forecast at every horizon without rerunning the recursion, which is what the k-step errors
(:func:`errors_at`) are made of.

Initial state (independent of the constants). Level only: ``l = y[i0]`` at the first observation
i0. Trend: at the second observation i1, ``l = y[i1]``, ``b = (y[i1] - y[i0]) / (i1 - i0)`` (one
observation: ``b = 0``). Season: from the first two seasons, with season means A1, A2::

    b0 = (A2 - A1) / m
    s_i = mean over j in {1, 2} of (y[(j-1)m + i] - A_j - b0 (i - (m-1)/2))   then centred to sum 0
    l  = A1 - b0 (m-1)/2 - b0                                              one step before y[0]

The fit (:func:`fit`) minimises the one-step sum of *absolute* errors over a bounded grid of
constants (:data:`ALPHAS` x :data:`BETAS` x :data:`PHIS` x :data:`GAMMAS`, with ``gamma <= 1 - alpha``,
the usual admissible region of the seasonal model), all grid points run side by side as numpy
vectors through one pass over time. Absolute rather than squared: demand has bursts (a tenant's
batch job, a retry storm) that nothing forecasts, and a squared loss lets the two or three bursts
of a fit window choose the constants for the calm hours around them (on the benchmark's bursty
series it picked alpha 0.6-0.7 where the last value, alpha 1, is the better forecaster; the
absolute loss picks the median-optimal smoother and alpha 1 there). A grid search rather than a
numerical optimiser: the bounds hold by construction, the answer does not depend on a starting
point or a tolerance, and ties go to the earliest grid point (smaller constants, less damping), so
the same history always gives the same constants.

The shift threshold is fitted in a second pass over the same loss: alpha again, together with
``c`` in :data:`SHIFTS` times the series' typical relative step (:func:`typical_step`, the median
of ``|y_t - y_{t-1}| / max(|y_{t-1}|, u)``), beta, gamma and phi kept from the first pass. The
first pass's constants (no shifts) are kept unless a threshold fits strictly better, so the
two-pass fit is never worse than the first pass alone; a constant series (typical step 0) never
gets a threshold.

A daily *profile* (:class:`Profile`, :func:`fit_profile`) is the smooth alternative to the season
slots: a few harmonics of the day fitted by least squares, which the seasonal Holt of
``extender.core.forecast`` takes out of the series before smoothing what is left. A slot per grid
step is estimated from one sample a day each (5 760 slots at 15 s); four harmonics are estimated
from all of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from extender.core.errors import InvalidValueError

F64 = NDArray[np.float64]

#: The grid the constants are fitted on, and so their bounds: alpha in [0.02, 1], beta in [0, 0.4],
#: phi in [0.8, 1], gamma in [0, min(0.4, 1 - alpha)]. beta multiplies alpha (``b += alpha beta e``),
#: so the trend always moves slower than the level; phi below 0.8 would flatten any trend within a
#: few steps, which EWMA already does.
ALPHAS = (0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
BETAS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.4)
PHIS = (1.0, 0.98, 0.95, 0.9, 0.8)
GAMMAS = (0.0, 0.05, 0.1, 0.2, 0.4)
#: Shift thresholds, as multiples of the series' typical relative one-step change (:func:`typical_step`):
#: from 1.5 (a step a little over the usual noise is a shift) to 8 (only a burst is).
SHIFTS = (1.5, 2.0, 3.0, 4.0, 6.0, 8.0)
#: The floor ``u`` of relative errors, as a share of the mean demand while there is any (the mean of
#: the values above zero): near zero demand a relative error means nothing (one request over a
#: forecast of 0.01 is +10 000%). Half: chosen by the upper's quantile score on the forecast
#: benchmark (BENCHMARKS.md), 29% lower than a tenth of the mean of every value over its 24 cells and
#: no cell worse by more than 0.3%; larger shares gain a little more on on/off demand and cost the
#: smooth series 3-8%.
SCALE_FLOOR = 0.5
#: Holt-Winters runs a season of m slots per grid point (m = 5 760 at 15 s), so it gets a coarser grid.
ALPHAS_SEASONAL = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)
BETAS_SEASONAL = (0.0, 0.05, 0.2)
PHIS_SEASONAL = (1.0, 0.98, 0.9)


@dataclass(frozen=True)
class Shape:
    """The components of the model: a trend (damped by phi) and a season of ``m`` steps (0: none)."""

    trend: bool
    m: int = 0

    @property
    def seasonal(self) -> bool:
        return self.m > 0


@dataclass(frozen=True)
class Constants:
    """Smoothing constants (module docstring); ``fitted`` says whether :func:`fit` chose them."""

    alpha: float
    beta: float = 0.0
    gamma: float = 0.0
    phi: float = 1.0
    #: The level-shift threshold c (0: none) and the floor u it is taken over (module docstring).
    shift: float = 0.0
    floor: float = 0.0
    fitted: bool = False

    def as_dict(self) -> dict[str, float]:
        return {"alpha": self.alpha, "beta": self.beta, "gamma": self.gamma, "phi": self.phi, "shift": self.shift}

    def limit(self) -> float:
        """The threshold the recursion compares ``|e| / max(|f|, floor)`` with: ``inf`` without shifts."""
        return self.shift if self.shift > 0 else math.inf


@dataclass(frozen=True)
class Start:
    """The initial state: it holds after step ``t0`` (``t0 = -1``: before ``y[0]``)."""

    t0: int
    level: float
    trend: float
    season: F64


@dataclass(frozen=True)
class Run:
    """The state after every step of the recursion over ``y``.

    ``level[t]``, ``trend[t]``: after step t (NaN for ``t < t0``); ``slot[t]``: the value of season
    slot ``t mod m`` after step t. ``season`` is the whole season after the last step. ``start`` is
    the initial state the run began from (``season_init`` its season).
    """

    y: F64
    shape: Shape
    constants: Constants
    t0: int
    level: F64
    trend: F64
    slot: F64
    season_init: F64
    season: F64


def damped_sum(phi: float, k: float) -> float:
    """``D_k = phi + ... + phi^k``; ``k`` itself when ``phi = 1`` (also for fractional k)."""
    if phi == 1.0:
        return k
    return float(phi * (1.0 - phi ** k) / (1.0 - phi))


def _observed(y: F64) -> NDArray[np.intp]:
    return np.flatnonzero(~np.isnan(y))


def _nanmean(a: F64, axis: int) -> F64:
    """Mean over non-NaN entries; NaN where there are none (without numpy's empty-slice warning)."""
    mask = ~np.isnan(a)
    counts = mask.sum(axis=axis)
    sums = np.where(mask, a, 0.0).sum(axis=axis)
    return np.asarray(np.where(counts > 0, sums / np.maximum(counts, 1), np.nan), dtype=np.float64)


def seasonal_ready(y: F64, m: int, min_seasons: int = 2) -> str:
    """Why the seasonal model cannot start on this grid yet, or ``""`` when it can.

    Needs ``m >= 2``, ``len(y) >= min_seasons * m`` and the first two seasons each at least half
    observed (their means and slot deviations are the initial state).
    """
    if m < 2:
        return f"a season of {m} step(s) is too short to estimate"
    need = min_seasons * m
    if len(y) < need:
        return f"{len(y)} of {need} steps ({min_seasons} seasons of {m}) of history"
    for j in (0, 1):
        seen = int(np.count_nonzero(~np.isnan(y[j * m:(j + 1) * m])))
        if 2 * seen < m:
            return f"season {j + 1} is only {seen} of {m} steps observed"
    return ""


def start(y: F64, shape: Shape) -> Start:
    """The initial state (module docstring). Needs one observation; the seasonal one two seasons."""
    obs = _observed(y)
    if obs.size == 0:
        raise InvalidValueError("no observations to fit")
    if shape.seasonal:
        m = shape.m
        if len(y) < 2 * m:
            raise InvalidValueError(f"the seasonal model needs two seasons ({2 * m} steps), got {len(y)}")
        first_two = y[:2 * m].reshape(2, m)
        a = _nanmean(first_two, axis=1)  # A1, A2
        b0 = float(a[1] - a[0]) / m if shape.trend else 0.0
        centre = np.arange(m) - (m - 1) / 2.0
        deviations = first_two - (a[:, None] + b0 * centre[None, :])
        season = np.nan_to_num(_nanmean(deviations, axis=0), nan=0.0)  # a slot unseen in both: no offset
        season = season - season.mean()
        return Start(-1, float(a[0]) - b0 * (m - 1) / 2.0 - b0, b0, season)
    i0 = int(obs[0])
    if not shape.trend or obs.size == 1:
        return Start(i0, float(y[i0]), 0.0, np.zeros(0))
    i1 = int(obs[1])
    return Start(i1, float(y[i1]), (float(y[i1]) - float(y[i0])) / (i1 - i0), np.zeros(0))


def run(y: F64, shape: Shape, c: Constants, begin: Start | None = None) -> Run:
    """The recursion over ``y`` from ``begin`` (default :func:`start`), keeping the state after each step.

    A plain loop on purpose: the recursion is sequential and this is its clearest statement. It
    runs on Python floats and lists (the same IEEE double operations in the same order as on numpy
    scalars, several times faster), and the states become arrays at the end.
    """
    s0 = begin if begin is not None else start(y, shape)
    n = len(y)
    nan = math.nan
    levels = [nan] * n
    trends = [nan] * n
    slots = [nan] * n
    m = shape.m
    season = s0.season.tolist()
    level, trend = s0.level, s0.trend
    a, ab, g, phi = c.alpha, c.alpha * c.beta, c.gamma, c.phi
    shifts, lim, floor = c.shift > 0, c.limit(), c.floor
    if s0.t0 >= 0:
        levels[s0.t0], trends[s0.t0] = level, trend
    values = np.asarray(y, dtype=np.float64).tolist()
    for t in range(s0.t0 + 1, n):
        v = values[t]
        pb = phi * trend
        i = t % m if m else 0
        if v != v:  # noqa: PLR0124 -- a gap: NaN is the only float unequal to itself
            level += pb
            trend = pb
        else:
            f = level + pb + season[i] if m else level + pb
            e = v - f
            if shifts and abs(e) > lim * max(abs(f), floor):
                level += pb + e
                trend = pb
            else:
                level += pb + a * e
                trend = pb + ab * e
                if m:
                    season[i] += g * e
        if m:
            slots[t] = season[i]
        levels[t], trends[t] = level, trend
    return Run(y, shape, c, s0.t0, np.array(levels, dtype=np.float64), np.array(trends, dtype=np.float64),
               np.array(slots, dtype=np.float64), s0.season, np.array(season, dtype=np.float64))


def forecasts_at(r: Run, k: int, origins: NDArray[np.intp]) -> F64:
    """``f_{t,k}`` for each origin t (each ``>= r.t0``), by the formula in the module docstring."""
    f = r.level[origins] + damped_sum(r.constants.phi, k) * r.trend[origins]
    if r.shape.seasonal:
        m = r.shape.m
        u = origins + k - m * math.ceil(k / m)
        from_run = r.slot[np.maximum(u, 0)]
        f = f + np.where(u >= 0, from_run, r.season_init[np.mod(u, m)])
    return np.asarray(f, dtype=np.float64)


def _origins(r: Run, k: int, first: int) -> NDArray[np.intp]:
    """The origins ``t >= max(first, t0)`` whose k-step target ``t + k`` lies inside y (maybe none)."""
    return np.arange(max(first, r.t0, 0), max(len(r.y) - k, 0))  # (k may be beyond numpy's integers)


def errors_at(r: Run, k: int, first: int = 0) -> F64:
    """The k-step errors ``y[t+k] - f_{t,k}`` of every origin ``t >= max(first, t0)`` whose target is observed."""
    origins = _origins(r, k, first)
    if origins.size == 0:  # (before origins + k: k may be beyond numpy's integers)
        return np.empty(0)
    target = r.y[origins + k]
    seen = ~np.isnan(target)
    return np.asarray(target[seen] - forecasts_at(r, k, origins[seen]), dtype=np.float64)


def errors_along(r: Run, k: int, first: int = 0) -> F64:
    """The errors at every horizon up to k of every origin ``t >= max(first, t0)`` with ``t + k`` inside
    y: an (origins, k) matrix whose column j - 1 is ``y[t+j] - f_{t,j}``, NaN where ``y[t+j]`` is
    missing. Its last column, without the NaN, is :func:`errors_at` at k."""
    origins = _origins(r, k, first)
    return np.column_stack([r.y[origins + j] - forecasts_at(r, j, origins) for j in range(1, k + 1)])


def relative_errors_at(r: Run, k: int, first: int, floor: float, offset: F64 | None = None) -> F64:
    """The k-step errors of :func:`errors_at` over their forecasts: ``e_{t,k} / max(f_{t,k}, floor)``.

    ``offset`` (aligned with ``r.y``): the run is over ``y - offset`` (a series with its daily
    profile taken out); the forecast of ``y`` is then ``f_{t,k} + offset[t+k]``, and that is what
    the error is relative to (the error itself is the same either way).
    """
    origins = _origins(r, k, first)
    if origins.size == 0:  # (before origins + k: k may be beyond numpy's integers)
        return np.empty(0)
    target = r.y[origins + k]
    seen = ~np.isnan(target)
    f = forecasts_at(r, k, origins[seen])
    scale = f if offset is None else f + offset[origins[seen] + k]
    return np.asarray((target[seen] - f) / np.maximum(scale, floor), dtype=np.float64)


def point_at(r: Run, h: float, trend_reach: float | None = None) -> float:
    """The forecast ``h`` steps (fractional allowed) after the last step: the season interpolated
    linearly between the two slots around position ``n - 1 + h``; the trend projected over
    ``min(h, trend_reach)`` steps (``None``: over ``h``)."""
    n = len(r.y)
    reach = h if trend_reach is None else min(h, max(trend_reach, 0.0))
    f = float(r.level[-1]) + damped_sum(r.constants.phi, reach) * float(r.trend[-1])
    if r.shape.seasonal:
        m = r.shape.m
        pos = n - 1 + h
        lo = math.floor(pos)
        frac = pos - lo
        f += (1 - frac) * float(r.season[lo % m]) + frac * float(r.season[(lo + 1) % m])
    return f


@dataclass(frozen=True)
class Profile:
    """A smooth additive daily profile: ``S(t) = sum_j a_j cos(2 pi j t / P) + b_j sin(2 pi j t / P)``.

    ``t`` in epoch seconds, so every replica and every grid anchoring agrees on the phase;
    ``coef`` holds ``(a_1, b_1, ..., a_J, b_J)``. ``S`` has mean zero over a period.
    """

    period_s: float
    coef: F64

    @property
    def harmonics(self) -> int:
        return len(self.coef) // 2

    def design(self, t: F64) -> F64:
        """The harmonic columns ``cos(2 pi j t / P), sin(2 pi j t / P)``, j = 1..J, interleaved."""
        phase = 2.0 * np.pi * np.mod(np.asarray(t, dtype=np.float64), self.period_s) / self.period_s
        j = np.arange(1, self.harmonics + 1, dtype=np.float64)
        w = phase[:, None] * j[None, :]
        out = np.empty((len(phase), 2 * self.harmonics))
        out[:, 0::2], out[:, 1::2] = np.cos(w), np.sin(w)
        return out

    def at(self, t: F64) -> F64:
        """``S(t)`` at each time of ``t``."""
        return np.asarray(self.design(np.atleast_1d(np.asarray(t, dtype=np.float64))) @ self.coef, dtype=np.float64)


def fit_profile(t: F64, y: F64, period_s: float, harmonics: int) -> Profile:
    """The daily profile of ``y`` (times ``t``) by least squares, next to a quadratic in time::

        y_t = c_0 + c_1 u + c_2 u^2 + S(t) + e_t      u = (t - mean t) / P

    The quadratic takes the level's drift over the window (a trend, a slow weekly swing), which
    would otherwise leak into the first harmonic when the window holds only a couple of periods.
    NaN values are skipped. numpy's ``lstsq`` (SVD) gives the minimum-norm answer on a degenerate
    design, so this never raises on a valid input.
    """
    zero = Profile(period_s, np.zeros(2 * harmonics))
    ok = ~np.isnan(y)
    tt, yy = np.asarray(t, dtype=np.float64)[ok], np.asarray(y, dtype=np.float64)[ok]
    if tt.size == 0 or harmonics < 1:
        return zero
    u = (tt - tt.mean()) / period_s
    x = np.column_stack([np.ones_like(u), u, u * u, zero.design(tt)])
    coef = np.linalg.lstsq(x, yy, rcond=None)[0]
    return Profile(period_s, np.asarray(coef[3:], dtype=np.float64))


def candidates(shape: Shape) -> F64:
    """The first pass's grid of constants for ``shape``: rows ``(alpha, beta, gamma, phi, shift)`` in
    a fixed order, ``shift`` 0 (no level shifts) throughout."""
    alphas: tuple[float, ...]
    betas: tuple[float, ...]
    phis: tuple[float, ...]
    if shape.seasonal:
        alphas, betas, phis = ALPHAS_SEASONAL, BETAS_SEASONAL, PHIS_SEASONAL
    else:
        alphas, betas, phis = ALPHAS, BETAS, PHIS
    if not shape.trend:
        betas, phis = (0.0,), (1.0,)
    rows = [(a, b, g, p, 0.0) for a in alphas for b in betas for p in phis
            for g in (GAMMAS if shape.seasonal else (0.0,)) if g <= 1.0 - a + 1e-12]
    return np.array(rows, dtype=np.float64)


def shift_candidates(shape: Shape, first: Constants, scale: float) -> F64:
    """The second pass's grid: every alpha of the first with every threshold ``c scale``, ``c`` in
    :data:`SHIFTS`, and ``first``'s beta, gamma and phi (rows as in :func:`candidates`)."""
    alphas = ALPHAS_SEASONAL if shape.seasonal else ALPHAS
    rows = [(a, first.beta, first.gamma, first.phi, c * scale) for c in SHIFTS for a in alphas
            if first.gamma <= 1.0 - a + 1e-12]
    return np.array(rows, dtype=np.float64).reshape(-1, 5)


def relative_floor(y: F64) -> float:
    """``u = SCALE_FLOOR x mean(y_t : y_t > 0)`` (at least 1e-12): the size under which an error is
    taken over ``u`` rather than over the forecast it missed.

    Over the values above zero, so that idle time does not shrink it: on on/off demand the mean of
    every value sits far below the level of a session, and errors off the near-zero forecasts of a
    quiet spell, divided by so small a floor, became ratios of 50 and more, which the upper quantile
    then multiplied by a busy forecast (387 req/s on a series that never passed 22.4).
    """
    busy = y[y > 0]  # NaN compares false: unobserved values drop out too
    return max(SCALE_FLOOR * float(np.mean(busy)), 1e-12) if busy.size else 1e-12


def typical_step(y: F64, floor: float) -> float:
    """The median relative one-step change ``|y_t - y_{t-1}| / max(|y_{t-1}|, floor)`` over neighbours
    both observed (0 without any): the noise a shift threshold is measured in."""
    prev, now = y[:-1], y[1:]
    ok = ~(np.isnan(prev) | np.isnan(now))
    if not ok.any():
        return 0.0
    return float(np.median(np.abs(now[ok] - prev[ok]) / np.maximum(np.abs(prev[ok]), floor)))


def sae(y: F64, shape: Shape, grid: F64, begin: Start, floor: float = 0.0) -> F64:
    """One-step sum of absolute errors of every row of ``grid`` (as :func:`candidates`) over ``y``,
    the level-shift test taken over ``floor`` (same recursion as :func:`run`).

    Rows whose recursion overflows score ``inf``.
    """
    p = len(grid)
    alpha, beta, gamma, phi = grid[:, 0], grid[:, 1], grid[:, 2], grid[:, 3]
    limit = np.where(grid[:, 4] > 0, grid[:, 4], np.inf)
    shifts = bool(np.isfinite(limit).any())
    ab = alpha * beta
    level = np.full(p, begin.level)
    trend = np.full(p, begin.trend)
    season = np.repeat(begin.season[:, None], p, axis=1) if shape.seasonal else np.zeros((0, p))
    total = np.zeros(p)
    m = shape.m
    trended = shape.trend  # without a trend, b stays 0 and phi b adds exactly 0: skip it
    si: F64 | float = 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(begin.t0 + 1, len(y)):
            v = float(y[t])
            if trended:
                pb = phi * trend
                base = level + pb
            else:
                base = level
            if math.isnan(v):
                level = base
                if trended:
                    trend = pb
                continue
            if m:
                i = t % m
                si = season[i]
                f = base + si
            else:
                f = base
            e = v - f
            ae = np.abs(e)
            total += ae
            if shifts:
                jump = ae > limit * np.maximum(np.abs(f), floor)
                level = base + np.where(jump, e, alpha * e)
                if trended:
                    trend = pb + np.where(jump, 0.0, ab * e)
                if m:
                    season[i] = si + np.where(jump, 0.0, gamma * e)
            else:
                level = base + alpha * e
                if trended:
                    trend = pb + ab * e
                if m:
                    season[i] = si + gamma * e
    return np.asarray(np.where(np.isfinite(total), total, np.inf), dtype=np.float64)


def fit(y: F64, shape: Shape, prefer: Constants | None = None) -> Constants:
    """The constants with the least one-step absolute error over ``y``, in two passes.

    First the grid of :func:`candidates` (no level shifts). Ties go to ``prefer`` (the configured
    constants) when it is a grid point, else to the earliest row. Ties are not rare: on a flat
    stretch every constant fits exactly, and the slowest row would then leave a trend that starts
    after the refit unlearned until the next one. Then :func:`shift_candidates` around the winner:
    a threshold is kept only when it fits strictly better (the earliest such row on a tie).
    The caller makes sure ``y`` has enough observations to start ``shape`` (and to mean something).
    """
    grid = candidates(shape)
    begin = start(y, shape)
    scores = sae(y, shape, grid, begin)
    best = int(np.argmin(scores))  # first minimum: the earlier (smaller, undamped) row
    if prefer is not None:
        want = np.array([prefer.alpha, prefer.beta if shape.trend else 0.0,
                         prefer.gamma if shape.seasonal else 0.0, prefer.phi if shape.trend else 1.0, 0.0])
        rows = np.flatnonzero(np.all(np.abs(grid - want) < 1e-12, axis=1))
        if rows.size and scores[rows[0]] <= scores[best]:
            best = int(rows[0])
    a, b, g, p, _ = (float(x) for x in grid[best])
    first = Constants(alpha=a, beta=b, gamma=g, phi=p, fitted=True)
    floor = relative_floor(y)
    scale = typical_step(y, floor)
    if scale <= 0:
        return first
    second = shift_candidates(shape, first, scale)
    again = sae(y, shape, second, begin, floor)
    j = int(np.argmin(again))
    if not again[j] < scores[best]:
        return first
    return Constants(alpha=float(second[j, 0]), beta=b, gamma=g, phi=p, shift=float(second[j, 4]), floor=floor,
                     fitted=True)
