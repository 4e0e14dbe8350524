"""Demand forecasters: EWMA, Holt (level + trend) and additive Holt-Winters (daily season).

Each forecaster turns a demand history into the demand expected one *lead* ahead, as a point value
and an upper quantile, in the unit of the history (requests/s or tokens/s). The scaler sizes the
forecast need from the upper quantile (DESIGN.md section 6). One registry, :data:`FORECASTERS`,
maps the policy's ``scaling.forecaster`` name to the implementation.

Pipeline, every call (stateless: a restarted or newly elected scaler forecasts the same from the
same history, so no smoother state has to survive a failover)::

    raw samples (t_s, value) --resample--> regular grid y[0..n-1], step s, NaN = gap
                             --fit-------> state after y[n-1] + one-step residuals e_t
                             --project---> point at h = lead_s / s steps, upper quantile

Resampling (:func:`resample`). Samples with a non-finite timestamp or value are missing data, not
zero demand. The step is ``params.step_s`` or, when unset, the median spacing of the samples. The
grid is anchored at the last sample: grid point k (counted back from the end) is
``t_end - k * step_s`` and holds the mean of the samples nearest to it (``round((t_end - t) / s)``).
Rounding to the nearest point, rather than flooring into intervals, keeps a jittery 15 s scrape
(15.0 s, 15.2 s, 14.9 s) one sample per point; a step coarser than the sampling averages several
samples per point. A grid point with no sample is a gap (NaN); nothing is interpolated.

Gaps in the smoothers. At a gap the state is predicted and not updated: the level advances by the
trend, trend and season stay. That is the state-space reading of "not observed"; it neither invents
a value nor drops the time that passed.

The smoothers, in error-correction form (e_t = y_t - one-step forecast; alpha, beta, gamma in [0, 1];
m = season length in steps)::

    EWMA          f_t = l            l <- l + alpha e_t
    Holt          f_t = l + b        l <- l + b + alpha e_t        b <- b + alpha beta e_t
    Holt-Winters  f_t = l + b + s_i  (same l, b updates)           s_i <- s_i + gamma e_t,  i = t mod m

These are algebraically the textbook component forms (e.g. Holt: l_t = alpha y_t + (1 - alpha)
(l_{t-1} + b_{t-1}), b_t = beta (l_t - l_{t-1}) + (1 - beta) b_{t-1}); the tests check that against
a plain-Python reference written in the component form. The fits are a Python loop over time steps
on purpose: the recursion is sequential and a loop is the clearest statement of it; even a daily
season at 15 s (two days = 11 520 steps) takes milliseconds.

Initial state. EWMA: l = first sample. Holt: l = second observed sample, b = slope between the first
two observed samples (per step); one observation gives a flat forecast. Holt-Winters: from the first
two seasons, with season means A1, A2::

    b0 = (A2 - A1) / m                                  trend per step
    s_i = mean over j in {1, 2} of (y[(j-1)m + i] - A_j - b0 (i - (m-1)/2))   then centred to sum 0
    l  = A1 - b0 (m-1)/2 - b0                           level one step before y[0]

and the recursion then runs over the whole series (so the first two seasons' residuals are in
sample and somewhat optimistic).

Holt-Winters needs ``params.min_seasons`` (default 2) full seasons on the grid, each of the first two
at least half observed. Before that it falls back to Holt, which follows a daily cycle as a slowly
turning trend with some lag; the returned :class:`Forecast` says so in ``method`` and ``note``.

Projection at lead h = lead_s / s steps (fractional allowed)::

    point = l                      (EWMA)
          = l + h b                (Holt)
          = l + h b + s(n-1+h)     (Holt-Winters; the season interpolated linearly between slots)

The forecast is *at* the end of the lead, not a maximum over it: capacity ordered now cannot serve
demand earlier than the lead, and the decisions at later ticks cover later times.

Upper quantile. From the empirical distribution of the one-step residuals, widened to the lead with
the model's own variance growth::

    q     = r_(ceil(level (N-1)))           r_(0) <= ... <= r_(N-1) the sorted one-step residuals
    c_h   = sqrt(1 + sum_{j=1}^{k-1} psi_j^2),  k = max(1, ceil(h))
    psi_j = alpha                                        (EWMA)
          = alpha + j alpha beta                         (Holt)
          = alpha + j alpha beta + gamma [j mod m = 0]   (Holt-Winters)
    upper = point_raw + max(q, 0) c_h

c_h is the ratio of the k-step to the one-step forecast standard deviation of the matching
exponential-smoothing state-space model (Hyndman et al., *Forecasting with Exponential Smoothing*,
2008, class 1). Using the empirical quantile rather than a normal z keeps the skew of bursty demand;
scaling it by c_h is exact for normal errors and an approximation otherwise. The order statistic is
taken rounding *up* (numpy's ``method="higher"``), so a short history answers with its largest
error rather than an interpolation below it. No residuals (fewer than two observations for EWMA,
three for Holt) gives upper = point: the forecast then cannot raise the decision above the point,
and the scaler's reactive path still sees the observed load.

Non-negativity. Demand is never negative, so ``point = max(point_raw, 0)`` and
``upper = max(point_raw + spread, 0)``; since spread >= 0, ``upper >= point`` always.

No observation at all (empty or all-NaN history): point = upper = 0 with method ``"none"``. The
scaler only ever raises its decision on a forecast, so zero is the neutral answer, not a claim
that demand is zero.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import BaseModel, ConfigDict, Field

from extender.core.errors import UnknownNameError

if TYPE_CHECKING:
    from extender.core.policy import Scaling

F64 = NDArray[np.float64]

Method = Literal["ewma", "holt", "holt-winters", "none"]

#: A stray timestamp far in the past must not make the grid (and memory) explode; older points are
#: dropped. 100 000 points is a week at 6 s, about three weeks at 15 s.
MAX_POINTS = 100_000


class ForecastParams(BaseModel):
    """Smoothing constants, quantile level and grid of the forecasters (defaults: DESIGN.md section 6).

    ``alpha``: level smoothing (1 = follow the last sample). ``beta``: trend smoothing; small, because
    a trend projected a startup time ahead (up to ~1000 s) amplifies noise. ``gamma``: seasonal
    smoothing; each slot is revisited only once a season, so it can be larger than beta. ``level``:
    the upper quantile (AHPA's template uses 95). ``step_s``: grid step in seconds (``None``: the
    median sample spacing). ``season_s``: season length in seconds (a day). ``min_seasons``: full
    seasons required before Holt-Winters is used.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    alpha: float = Field(default=0.3, gt=0, le=1)
    beta: float = Field(default=0.05, ge=0, le=1)
    gamma: float = Field(default=0.2, ge=0, le=1)
    level: float = Field(default=0.95, gt=0.5, lt=1)
    step_s: float | None = Field(default=None, gt=0)
    season_s: float = Field(default=86_400.0, gt=0)
    min_seasons: int = Field(default=2, ge=2)

    @classmethod
    def from_scaling(cls, scaling: Scaling) -> ForecastParams:
        """The parameters a policy's ``scaling`` section sets."""
        return cls(alpha=scaling.alpha, beta=scaling.beta, gamma=scaling.gamma, level=scaling.quantile,
                   step_s=scaling.step, season_s=scaling.season)


class Forecast(BaseModel):
    """Demand expected ``lead_s`` after the last sample, in the unit of the history.

    ``requested`` is the forecaster asked for, ``method`` the one that produced the numbers (they
    differ on a fallback, and ``note`` says why). ``spread`` is ``max(q, 0) * c_h`` from the module
    docstring; ``residuals`` how many one-step residuals ``q`` came from; ``observations`` how many
    grid points held a sample.
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
        raise ValueError(f"{t.size} timestamps but {y.size} values")
    ok = np.isfinite(t) & np.isfinite(y)
    t, y = t[ok], y[ok]
    if t.size == 0:
        return Series(np.empty(0), float(step_s or 0.0), None)
    t_end = float(t.max())
    if step_s is None:
        gaps = np.diff(np.unique(t))
        step_s = float(np.median(gaps)) if gaps.size else 0.0
    if step_s <= 0:
        return Series(np.array([float(y.mean())]), 0.0, t_end)
    back = np.rint((t_end - t) / step_s).astype(np.int64)  # grid points counted back from the end
    keep = back < max_points
    back, y = back[keep], y[keep]
    n = int(back.max()) + 1
    idx = n - 1 - back
    sums = np.bincount(idx, weights=y, minlength=n)
    counts = np.bincount(idx, minlength=n)
    grid = np.full(n, np.nan)
    np.divide(sums, counts, out=grid, where=counts > 0)
    return Series(grid, float(step_s), t_end)


# ---------------------------------------------------------------------------------------------
# The smoothers (state after the last grid point + one-step residuals)
# ---------------------------------------------------------------------------------------------


def _observed(y: F64) -> NDArray[np.intp]:
    return np.flatnonzero(~np.isnan(y))


def fit_ewma(y: F64, alpha: float) -> tuple[float, F64]:
    """Simple exponential smoothing of a grid; returns ``(level, residuals)``.

    ``l = first observation``; then per step ``e = y - l; l += alpha e`` (gaps: no change).
    """
    obs = _observed(y)
    if obs.size == 0:
        raise ValueError("no observations to fit")
    level = float(y[obs[0]])
    residuals: list[float] = []
    for v in y[obs[0] + 1:].tolist():
        if math.isnan(v):
            continue
        e = v - level
        residuals.append(e)
        level += alpha * e
    return level, np.array(residuals, dtype=np.float64)


def fit_holt(y: F64, alpha: float, beta: float) -> tuple[float, float, F64]:
    """Holt's linear trend on a grid; returns ``(level, trend per step, residuals)``.

    State at the second observation i1 (after the first, i0): ``l = y[i1]``,
    ``b = (y[i1] - y[i0]) / (i1 - i0)``. Then per step ``f = l + b``; gap: ``l = f``; else
    ``e = y - f; l = f + alpha e; b += alpha beta e``. One observation: ``l = y[i0], b = 0``.
    """
    obs = _observed(y)
    if obs.size == 0:
        raise ValueError("no observations to fit")
    i0 = int(obs[0])
    if obs.size == 1:
        return float(y[i0]), 0.0, np.empty(0)
    i1 = int(obs[1])
    level = float(y[i1])
    trend = (level - float(y[i0])) / (i1 - i0)
    residuals: list[float] = []
    for v in y[i1 + 1:].tolist():
        f = level + trend
        if math.isnan(v):
            level = f
            continue
        e = v - f
        residuals.append(e)
        level = f + alpha * e
        trend += alpha * beta * e
    return level, trend, np.array(residuals, dtype=np.float64)


def _nanmean(a: F64, axis: int | None = None) -> F64:
    """Mean over non-NaN entries; NaN where there are none (without numpy's empty-slice warning)."""
    mask = ~np.isnan(a)
    counts = mask.sum(axis=axis)
    sums = np.where(mask, a, 0.0).sum(axis=axis)
    return np.asarray(np.where(counts > 0, sums / np.maximum(counts, 1), np.nan), dtype=np.float64)


def holt_winters_ready(y: F64, m: int, min_seasons: int = 2) -> str:
    """Why Holt-Winters cannot run on this grid yet, or ``""`` when it can.

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


def fit_holt_winters(y: F64, m: int, alpha: float, beta: float,
                     gamma: float) -> tuple[float, float, F64, F64]:
    """Additive Holt-Winters on a grid; returns ``(level, trend, season by slot, residuals)``.

    ``season[i]`` is the seasonal term of grid points ``t`` with ``t mod m == i``. The initial state
    (module docstring) comes from the first two seasons; the caller checks
    :func:`holt_winters_ready` first. Per step, slot ``i = t mod m``: ``f = l + b + s_i``; gap:
    ``l += b``; else ``e = y - f; l += b + alpha e; b += alpha beta e; s_i += gamma e``.
    """
    if len(y) < 2 * m:
        raise ValueError(f"Holt-Winters needs two seasons ({2 * m} steps), got {len(y)}")
    first_two = y[:2 * m].reshape(2, m)
    a = _nanmean(first_two, axis=1)  # A1, A2
    b0 = float(a[1] - a[0]) / m
    centre = np.arange(m) - (m - 1) / 2.0
    deviations = first_two - (a[:, None] + b0 * centre[None, :])
    season = np.nan_to_num(_nanmean(deviations, axis=0), nan=0.0)  # a slot unseen in both: no offset
    season = season - season.mean()
    level = float(a[0]) - b0 * (m - 1) / 2.0 - b0
    trend = b0
    s = season.tolist()
    residuals: list[float] = []
    for t, v in enumerate(y.tolist()):
        i = t % m
        if math.isnan(v):
            level += trend
            continue
        e = v - (level + trend + s[i])
        residuals.append(e)
        level += trend + alpha * e
        trend += alpha * beta * e
        s[i] += gamma * e
    return level, trend, np.array(s, dtype=np.float64), np.array(residuals, dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# From a fitted state to a Forecast
# ---------------------------------------------------------------------------------------------


def residual_quantile(residuals: F64, level: float) -> float:
    """``r_(ceil(level (N-1)))`` of the sorted residuals (0.0 when there are none)."""
    if residuals.size == 0:
        return 0.0
    return float(np.quantile(residuals, level, method="higher"))


def spread_factor(h_steps: float, alpha: float, beta: float = 0.0, gamma: float = 0.0, m: int = 0) -> float:
    """``c_h = sqrt(1 + sum_{j=1}^{k-1} psi_j^2)``, ``k = max(1, ceil(h))``, ``psi_j`` per the docstring.

    ``beta=0`` gives EWMA's psi, ``gamma=0`` (or ``m=0``) Holt's.
    """
    k = max(1, math.ceil(h_steps - 1e-9))  # 1e-9: a lead of exactly 4 steps computed as 4.0000000001
    j = np.arange(1, k, dtype=np.float64)
    psi = alpha + j * alpha * beta
    if m > 0 and gamma > 0:
        psi = psi + gamma * (np.mod(j, m) == 0)
    return math.sqrt(1.0 + float(np.sum(psi * psi)))


def _finish(point_raw: float, q: float, c_h: float, n_res: int, *, series: Series, horizon_s: float,
            lead_s: float, requested: str, method: Method, note: str, params: ForecastParams) -> Forecast:
    spread = max(q, 0.0) * c_h
    return Forecast(
        point=max(point_raw, 0.0), upper=max(point_raw + spread, 0.0), level=params.level,
        horizon_s=horizon_s, lead_s=lead_s, requested=requested, method=method, note=note,
        observations=series.observations, residuals=n_res, step_s=series.step_s, spread=spread,
        t_end=series.t_end,
    )


def _lead_steps(series: Series, lead_s: float) -> float:
    return lead_s / series.step_s if series.step_s > 0 else 0.0


def _ewma(series: Series, horizon_s: float, lead_s: float, params: ForecastParams,
          requested: str, *, note: str = "") -> Forecast:
    level, res = fit_ewma(series.values, params.alpha)
    c_h = spread_factor(_lead_steps(series, lead_s), params.alpha)
    return _finish(level, residual_quantile(res, params.level), c_h, res.size, series=series,
                   horizon_s=horizon_s, lead_s=lead_s, requested=requested, method="ewma", note=note,
                   params=params)


def _holt(series: Series, horizon_s: float, lead_s: float, params: ForecastParams,
          requested: str, *, note: str = "") -> Forecast:
    level, trend, res = fit_holt(series.values, params.alpha, params.beta)
    h = _lead_steps(series, lead_s)
    if series.observations == 1:
        note = (note + "; " if note else "") + "one observation: flat forecast"
    c_h = spread_factor(h, params.alpha, params.beta)
    return _finish(level + h * trend, residual_quantile(res, params.level), c_h, res.size, series=series,
                   horizon_s=horizon_s, lead_s=lead_s, requested=requested, method="holt", note=note,
                   params=params)


def _holt_winters(series: Series, horizon_s: float, lead_s: float, params: ForecastParams,
                  requested: str) -> Forecast:
    m = round(params.season_s / series.step_s) if series.step_s > 0 else 0
    why = holt_winters_ready(series.values, m, params.min_seasons)
    if why:
        return _holt(series, horizon_s, lead_s, params, requested, note=f"fell back to holt: {why}")
    level, trend, season, res = fit_holt_winters(series.values, m, params.alpha, params.beta, params.gamma)
    h = _lead_steps(series, lead_s)
    # the season at fractional position n-1+h, interpolated between its two neighbouring slots
    pos = len(series) - 1 + h
    lo = math.floor(pos)
    frac = pos - lo
    seasonal = (1 - frac) * float(season[lo % m]) + frac * float(season[(lo + 1) % m])
    c_h = spread_factor(h, params.alpha, params.beta, params.gamma, m)
    return _finish(level + h * trend + seasonal, residual_quantile(res, params.level), c_h, res.size,
                   series=series, horizon_s=horizon_s, lead_s=lead_s, requested=requested,
                   method="holt-winters", note="", params=params)


# ---------------------------------------------------------------------------------------------
# The registry
# ---------------------------------------------------------------------------------------------


class Forecaster(Protocol):
    """Forecast a resampled series (at least one observation) ``lead_s`` seconds past its last point.

    ``horizon_s`` is only recorded (the lead already includes any staleness); ``requested`` is the
    name it was called by, recorded next to the method that actually ran.
    """

    def __call__(self, series: Series, horizon_s: float, lead_s: float, params: ForecastParams,
                 requested: str) -> Forecast: ...


#: Name (as in the policy's ``scaling.forecaster``) -> implementation.
FORECASTERS: Mapping[str, Forecaster] = MappingProxyType({
    "ewma": _ewma,
    "holt": _holt,
    "holt-winters": _holt_winters,
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
        raise ValueError(f"horizon must be a finite number of seconds >= 0, got {horizon_s!r}")
    p = params if params is not None else ForecastParams()
    series = resample(timestamps, values, p.step_s)
    if series.t_end is None:
        return Forecast(point=0.0, upper=0.0, level=p.level, horizon_s=horizon_s, lead_s=horizon_s,
                        requested=name, method="none", note="no observations", observations=0,
                        residuals=0, step_s=series.step_s, spread=0.0, t_end=None)
    stale = max(0.0, now_s - series.t_end) if now_s is not None else 0.0
    return fn(series, horizon_s, horizon_s + stale, p, name)
