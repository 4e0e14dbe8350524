"""Seeded synthetic demand: daily and weekly cycles, a trend, log-normal noise and bursts.

The rate in requests/s at step k (``t = t0 + k x step``, ``D`` = 86 400 s, ``W`` = 7 D; ``t0`` is 0,
or ``-history`` for the demand before the simulation starts)::

    rate(t) = base x max(0, 1 + trend x t / D)
                   x (1 + a_d cos(2 pi (t - peak_d) / D))             daily cycle
                   x (1 + a_w cos(2 pi (t - peak_w) / W))             weekly cycle
                   x exp(noise x e_k - noise^2 / 2)                   e_k ~ N(0, 1), mean factor 1
                   x (1 + burst_amplitude)  while a burst is on        bursts: Poisson(perDay x days)
                                                                       of them, starts uniform

The rate is constant over each step. Arrivals integrate it over the simulator's bins; with
``arrivals: poisson`` each bin's count is drawn from a Poisson law with that mean, so bins carry
whole requests and the demand is as rough at low rates as real traffic is.

One generator per call, seeded, used in a fixed order (noise, then bursts, then counts): the same
seed gives the same demand, bit for bit.
"""

from __future__ import annotations

import math

import numpy as np

from extender.sim.scenario import SyntheticSpec
from extender.sim.traces import Arrivals, RateTrace, arrivals_from

DAY_S = 86_400.0
WEEK_S = 7 * DAY_S


def rate_trace(spec: SyntheticSpec, rng: np.random.Generator, *, start: float = 0.0,
               duration: float | None = None) -> RateTrace:
    """The synthetic rate as a step function (formula in the module docstring) over ``duration``
    seconds (default: the spec's) from ``t0 = start``; the trace's own clock starts at 0."""
    span = spec.duration if duration is None else duration
    n = max(1, math.ceil(span / spec.step - 1e-9))
    t = start + np.arange(n, dtype=np.float64) * spec.step
    rate = spec.base * np.maximum(0.0, 1.0 + spec.trend * t / DAY_S)
    rate = rate * (1.0 + spec.daily.amplitude * np.cos(2 * np.pi * (t - spec.daily.peak) / DAY_S))
    rate = rate * (1.0 + spec.weekly.amplitude * np.cos(2 * np.pi * (t - spec.weekly.peak) / WEEK_S))
    if spec.noise > 0:
        rate = rate * np.exp(spec.noise * rng.standard_normal(n) - spec.noise**2 / 2)
    bursts = spec.bursts
    if bursts.per_day > 0 and bursts.amplitude > 0:
        count = int(rng.poisson(bursts.per_day * span / DAY_S))
        starts = np.sort(rng.uniform(start, start + span, count))
        # a step is in a burst when its start falls inside [start, start + duration) of any burst
        inside = np.zeros(n, dtype=np.bool_)
        first = np.searchsorted(t, starts, side="left")
        last = np.searchsorted(t, starts + bursts.duration, side="left")
        cover = np.zeros(n + 1, dtype=np.int64)
        np.add.at(cover, first, 1)
        np.add.at(cover, last, -1)
        inside = np.cumsum(cover[:-1]) > 0
        rate = np.where(inside, rate * (1.0 + bursts.amplitude), rate)
    return RateTrace(t - start, np.asarray(rate, dtype=np.float64), float(n * spec.step))


def synthetic_arrivals(spec: SyntheticSpec, rng: np.random.Generator, *, bin_s: float,
                       duration_s: float | None = None) -> Arrivals:
    """The synthetic demand as arrivals in bins of ``bin_s`` seconds."""
    return _arrivals(spec, rate_trace(spec, rng), rng, bin_s=bin_s, duration_s=duration_s)


def synthetic_history(spec: SyntheticSpec, rng: np.random.Generator, *, bin_s: float, span_s: float) -> Arrivals:
    """The demand of the ``span_s`` seconds before the simulation starts (``t0 = -span_s``), on a
    clock of its own from 0: the history a running scaler holds at t = 0. Give it a generator of
    its own and the simulated demand is the same with or without it."""
    return _arrivals(spec, rate_trace(spec, rng, start=-span_s, duration=span_s), rng, bin_s=bin_s,
                     duration_s=span_s)


def _arrivals(spec: SyntheticSpec, trace: RateTrace, rng: np.random.Generator, *, bin_s: float,
              duration_s: float | None) -> Arrivals:
    arrivals = arrivals_from(trace, bin_s=bin_s, duration_s=duration_s, description="synthetic")
    if spec.arrivals == "poisson":
        counts = rng.poisson(arrivals.weights).astype(np.float64)
        return Arrivals(arrivals.times, counts, True, bin_s, arrivals.span_s, "synthetic (Poisson arrivals)")
    return arrivals
