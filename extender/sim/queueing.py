"""One workload's FIFO queue in front of its ready replicas, and every request's queueing delay.

The serving model. During tick k (``[t_k, t_k + dt)``) the ready replicas serve at
``mu_k = ready_k x capacity`` requests/s; the cumulative service capacity ``C(t)`` is piecewise
linear (``C_0 = 0``, ``C_{k+1} = C_k + mu_k dt``). Requests are served in arrival order, never
before they arrive, and a ready replica never idles while requests wait (work-conserving).

Positions on the capacity clock. Packet j (weight ``w_j`` requests, ``W_{j-1}`` requests before
it) starts to be served when the capacity has reached::

    x_j = max(C(a_j), x_{j-1} + w_{j-1})
        = W_{j-1} + max over i <= j of (C(a_i) - W_{i-1})          a running maximum: vectorised

and its service begins at ``s_j = inf{t : C(t) > x_j}`` (the first moment capacity flows to it; a
tick without ready replicas does not serve). The queueing delay is ``s_j - a_j``.

* A request (``fluid=False``) is one packet of weight 1 arriving at ``a_j``.
* A fluid packet (rate traces, synthetic demand) spreads its ``w_j`` requests uniformly over
  ``[a_j, a_j + bin)``; bins never straddle a tick, where ``C`` is linear, so the position of the
  request in its middle is exactly ``x~_j = max(C(a_j + bin/2), x_j + w_j/2)`` and its delay
  ``s(x~_j) - (a_j + bin/2)`` stands for the packet (weighted by ``w_j`` in every statistic).

Served by time t (requests that began service): requests ``#{j : x_j < C(t)}``; fluid
``W_{m-1} + min(C(t) - x_m, w_m)`` with m the last packet with ``x_m < C(t)`` (positions are
increasing and ``x_{j+1} >= x_j + w_j``, so every packet before m is complete). What arrived and
has not begun service is the queue: ``arrived = served + queued`` holds by construction, and the
tests check it against the trace's own row count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from extender.sim.traces import Arrivals

F64 = NDArray[np.float64]


@dataclass(frozen=True)
class Delays:
    """Per packet: queueing delay (NaN if not served by the end), the weight it stands for."""

    delay_s: F64
    weights: F64

    @property
    def served(self) -> NDArray[np.bool_]:
        """Packets whose service began before the end."""
        return ~np.isnan(self.delay_s)


class FifoQueue:
    """The queue of one workload, advanced one tick at a time by the simulation loop."""

    def __init__(self, arrivals: Arrivals, n_ticks: int, tick_s: float) -> None:
        self.arrivals = arrivals
        self.dt = tick_s
        self.n = n_ticks
        w = arrivals.weights
        self.cum = np.cumsum(w)  # W_j, requests up to and including packet j
        self.before = self.cum - w  # W_{j-1}
        edges = np.arange(n_ticks + 1, dtype=np.float64) * tick_s
        #: packets of tick k are bounds[k]:bounds[k+1]
        self.bounds = np.searchsorted(arrivals.times, edges, side="left")
        self.capacity = np.zeros(n_ticks + 1)  # C_k at tick boundaries
        self.rate = np.zeros(n_ticks)  # mu_k
        self.x = np.empty(len(w))
        self._running = -np.inf
        self._closed = 0  # packets whose position is known

    def arrived(self, k: int) -> float:
        """Requests arrived before ``t_k``."""
        b = int(self.bounds[k])
        return float(self.cum[b - 1]) if b > 0 else 0.0

    def arrived_in(self, k: int) -> float:
        """Requests arriving during tick k."""
        lo, hi = int(self.bounds[k]), int(self.bounds[k + 1])
        return float(self.cum[hi - 1] - self.before[lo]) if hi > lo else 0.0

    def per_tick(self) -> F64:
        """Requests arriving during each tick (all ticks at once)."""
        totals = np.concatenate(([0.0], self.cum))
        return np.asarray(np.diff(totals[self.bounds]), dtype=np.float64)

    def serve(self, k: int, rate: float) -> None:
        """Fix tick k's service rate (requests/s) and place the packets arriving during it."""
        self.rate[k] = rate
        self.capacity[k + 1] = self.capacity[k] + rate * self.dt
        lo, hi = int(self.bounds[k]), int(self.bounds[k + 1])
        if hi == lo:
            return
        at = self.capacity[k] + rate * (self.arrivals.times[lo:hi] - k * self.dt)
        run = np.maximum.accumulate(np.maximum(at - self.before[lo:hi], self._running))
        self.x[lo:hi] = self.before[lo:hi] + run
        self._running = float(run[-1])
        self._closed = hi

    def served(self, k: int) -> float:
        """Requests whose service began before ``t_k`` (every packet before it must be placed)."""
        c = self.capacity[k]
        m = int(np.searchsorted(self.x[: self._closed], c, side="left")) - 1
        if m < 0:
            return 0.0
        if not self.arrivals.fluid:
            return float(m + 1)
        w = self.arrivals.weights
        return float(self.before[m] + min(c - self.x[m], w[m]))

    def queued(self, k: int) -> float:
        """Requests waiting at ``t_k``."""
        return max(self.arrived(k) - self.served(k), 0.0)

    def delays(self) -> Delays:
        """Every packet's queueing delay once all ticks are served (formulas in the module docstring)."""
        a = self.arrivals
        closed = self._closed
        x = self.x[:closed].copy()
        t = a.times[:closed].copy()
        if a.fluid:
            mid = t + a.bin_s / 2
            k = np.minimum((mid // self.dt).astype(np.int64), self.n - 1)
            c_mid = self.capacity[k] + self.rate[k] * (mid - k * self.dt)
            x = np.maximum(c_mid, x + a.weights[:closed] / 2)
            t = mid
        end = self.capacity[self.n]
        i = np.searchsorted(self.capacity, x, side="right")  # first boundary with C > x
        ok = x < end
        k = np.clip(i - 1, 0, self.n - 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            start = k * self.dt + (x - self.capacity[k]) / self.rate[k]
        delay = np.where(ok, np.maximum(start - t, 0.0), np.nan)
        full = np.full(len(a.times), np.nan)
        full[:closed] = delay
        return Delays(full, a.weights)
