"""What the forecaster keeps between calls in one process to save work; none of it changes a result.

The forecast is a function of the history alone (:mod:`extender.core.forecast`): a newly started
replica with nothing kept forecasts exactly what a warm one does. Everything here is therefore a
memo whose key is the data the value was made from, compared bit for bit, or a shortcut that
repeats the same float operations in the same order:

- :func:`cached`: values by a key that holds the content of their inputs (a digest of the fit data,
  :func:`digest`, and the parameters' JSON, :func:`by_identity`), oldest out first;
- :class:`Recent`: the values made from the last few sample histories, found again when a call
  passes the same samples (bit for bit);
- :func:`run_on`: a smoothing run over a grid that begins with an earlier run's grid resumes from
  that run's state instead of starting over (the same floats, see its docstring).

Each memo is a dict or list changed by single operations, atomic under the GIL, so threads share
them without a lock: at worst two threads make the same value (identically) and one is kept.
:func:`clear` forgets all of the memos owned here (:class:`Recent` instances are their owners').
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Generic, TypeVar

import numpy as np
from numpy.typing import NDArray

from extender.core import smoothing
from extender.core.smoothing import Run

F64 = NDArray[np.float64]
T = TypeVar("T")

#: Values :func:`cached` keeps. A workload holds about ten per refit period (``auto``'s choice per
#: horizon in steps, five candidates' fits, the refit, the daily profile): 256 keep a dozen
#: workloads forecast at two horizons (the flagship's twelve, the scaler's and the warmer's), where
#: 64 evicted fits still in use and refitted them on every forecast (its predictive run: 42 s ->
#: 19 s). An entry is a few arrays of the fit grid (tens of kB). :func:`run_on` keeps as many bases.
CACHE_SIZE = 256
_CACHE: dict[tuple[object, ...], object] = {}
_MISSING = object()


def cached(key: tuple[object, ...], make: Callable[[], object]) -> object:
    """The value for ``key``, made when absent; the oldest entries leave first once the cache is full."""
    value = _CACHE.get(key, _MISSING)
    if value is _MISSING:
        value = _CACHE[key] = make()
        for old in list(_CACHE)[: max(0, len(_CACHE) - CACHE_SIZE)]:
            _CACHE.pop(old, None)
    return value


#: Digests :func:`digest` keeps, by the identity of the array they were taken of.
LAST_DIGESTS = 16
_DIGESTS: list[tuple[F64, bytes]] = []


def digest(y: F64) -> bytes:
    """A 128-bit BLAKE2b digest of ``y``'s bytes; the one taken before when ``y`` is the same array
    object as one of the last :data:`LAST_DIGESTS` (arrays the forecaster keeps, which nothing writes to)."""
    for a, d in _DIGESTS:
        if a is y:
            return d
    d = hashlib.blake2b(np.ascontiguousarray(y).tobytes(), digest_size=16).digest()
    _DIGESTS[:] = [(y, d), *_DIGESTS][:LAST_DIGESTS]
    return d


#: Objects :func:`by_identity` keeps a value for: a scaler holds one set of forecast parameters per
#: workload. Holding the object keeps its id from being reused while it is listed.
IDENTITIES = 512
_BY_ID: dict[int, tuple[object, str]] = {}


def by_identity(obj: object, make: Callable[[], str]) -> str:
    """``make()`` for ``obj``, made once while ``obj`` is one of the last :data:`IDENTITIES` seen: for
    frozen objects only, whose value cannot change under the same identity."""
    got = _BY_ID.get(id(obj))
    if got is not None and got[0] is obj:
        return got[1]
    value = make()
    _BY_ID[id(obj)] = (obj, value)
    if len(_BY_ID) > IDENTITIES:
        _BY_ID.pop(next(iter(_BY_ID)))
    return value


def same_bits(a: F64, b: F64) -> bool:
    """Same shape and the same bits (NaN equal to the same NaN, -0.0 unequal to 0.0)."""
    if a.shape != b.shape:
        return False
    if a.size == 0:
        return True
    ai, bi = np.ascontiguousarray(a).view(np.int64), np.ascontiguousarray(b).view(np.int64)
    return bool(ai[-1] == bi[-1] and ai[0] == bi[0] and np.array_equal(ai, bi))


def _ends(t: F64, v: F64, more: tuple[object, ...]) -> tuple[object, ...]:
    """A cheap key of two sample arrays: lengths and the bits of the end values (equal arrays have
    equal keys; the whole arrays are compared only when the keys match)."""
    if len(t) == 0 or len(v) == 0:
        return (len(t), len(v), *more)
    ti, vi = t.view(np.int64), v.view(np.int64)
    return (len(t), len(v), int(ti[0]), int(ti[-1]), int(vi[0]), int(vi[-1]), *more)


class Recent(Generic[T]):
    """The values made from the last ``size`` sample histories ``(t, v)`` (kept as copies), with the
    other inputs ``more`` (compared with ``==``): a call with the same samples, bit for bit, gets
    the value made before."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._kept: list[tuple[tuple[object, ...], F64, F64, T]] = []

    def get(self, t: F64, v: F64, *more: object, make: Callable[[], T]) -> T:
        key = _ends(t, v, more)
        for kk, kt, kv, value in self._kept:
            if kk == key and same_bits(kt, t) and same_bits(kv, v):
                return value
        value = make()
        self._kept[:] = [(key, t.copy(), v.copy(), value), *self._kept][:self.size]
        return value

    def clear(self) -> None:
        self._kept.clear()


def run_on(y: F64, base: Run) -> Run:
    """``smoothing.run(y, base.shape, base.constants)``, reusing ``base`` when ``y`` begins with ``base.y``.

    Within a refit period the forecast grid Y usually begins with D itself (same samples, same grid
    points): the recursion over that prefix is then already in ``base``, and only the samples since
    the refit boundary are run, from the state ``base`` ended in. The result is the same, bit for
    bit: the same float operations in the same order. Any difference in the prefix (a grid
    anchored differently, a late sample) runs the whole of ``y``.

    The runs of the last calls with the same ``base`` are kept too (:func:`_resumed`): a call whose
    ``y`` shares a prefix with one of them (the same grid a few steps later) runs only the rest.
    """
    n0 = len(base.y)
    shape, c = base.shape, base.constants
    reusable = (len(y) >= n0 and base.t0 < n0 - 1 and not (shape.seasonal and n0 < 2 * shape.m)
                and _may_equal(y, base.y) and np.array_equal(y[:n0], base.y, equal_nan=True))
    how = "base" if reusable else "full"
    first = int(y[:1].view(np.int64)[0]) if len(y) else None  # a prefix shares the first value
    kept = _RUNS.get(id(base))
    listed = kept[1] if kept is not None and kept[0] is base else ()
    recent = tuple((h, r) for h, f, r in listed if h == how and f == first)
    out, same = _resumed(y, recent)
    if out is None:
        if not reusable:
            out = smoothing.run(y, shape, c)
        else:
            at = n0 - 1
            out = _spliced(y, base, at, smoothing.run(
                y, shape, c, smoothing.Start(at, float(base.level[at]), float(base.trend[at]), base.season)))
    others = tuple(e for e in listed if e[2] is not same)
    _RUNS[id(base)] = (base, ((how, first, out), *others)[:RECENT_RUNS])
    if len(_RUNS) > CACHE_SIZE:
        for old in list(_RUNS)[: len(_RUNS) - CACHE_SIZE]:
            _RUNS.pop(old, None)
    return out


#: Runs kept per base run for :func:`_resumed`: the forecast grid is anchored at the newest sample,
#: so calls a tick apart see different grids and a call finds its prefix in the one a grid step
#: (several ticks) earlier.
RECENT_RUNS = 12
#: ``id(base) -> (base, ((how, bits of y[0], run), ...))``, newest first; holding ``base`` keeps its
#: id from being reused while it is listed.
_RUNS: dict[int, tuple[Run, tuple[tuple[str, int | None, Run], ...]]] = {}


def _may_equal(y: F64, head: F64) -> bool:
    """False when ``y`` surely does not begin with ``head`` (their first values differ, NaN equal to
    NaN as in ``np.array_equal(..., equal_nan=True)``): a cheap test before the whole comparison."""
    if len(head) == 0:
        return True
    a, b = float(y[0]), float(head[0])
    return a == b or (a != a and b != b)  # noqa: PLR0124 -- NaN is the only float unequal to itself


def _prefix(a: F64, b: F64) -> int:
    """How many leading values ``a`` and ``b`` share, bit for bit."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.ascontiguousarray(a[:n]).view(np.int64) != np.ascontiguousarray(b[:n]).view(np.int64))
    return int(differ[0]) if len(differ) else n


def _spliced(y: F64, head: Run, at: int, tail: Run) -> Run:
    """``head``'s states up to step ``at``, then ``tail``'s (a run resumed from ``head``'s state at ``at``)."""
    level, trend, slot = tail.level.copy(), tail.trend.copy(), tail.slot.copy()
    level[:at + 1], trend[:at + 1], slot[:at + 1] = head.level[:at + 1], head.trend[:at + 1], head.slot[:at + 1]
    return Run(y, head.shape, head.constants, head.t0, level, trend, slot, head.season_init, tail.season)


def _resumed(y: F64, recent: tuple[tuple[str, Run], ...]) -> tuple[Run | None, Run | None]:
    """What :func:`run_on` would return for ``y``, from the longest prefix a recent run of the same
    kind (all of ``recent`` are) shares with it (``None``: none shares enough); and the recent run
    over the very same ``y``, if any.

    The recursion's state after step t depends only on its start and ``y[:t + 1]``, so resuming
    from a run's state after the last shared step repeats the same float operations in the same
    order. A run of the same kind started the same way: ``base`` resumed from the same base run
    (``y`` then shares base's whole grid), ``full`` from :func:`smoothing.start`, which reads only
    the steps up to ``t0`` (its first observation, or its second with a trend) and, for a season,
    the first two seasons, all inside the shared prefix. The season after step ``t`` is, per slot,
    its value after that slot's last step (``slot``), copied.
    """
    best: tuple[int, Run] | None = None
    how = ""
    for h, r in recent:
        shared = _prefix(y, r.y)
        if best is None or shared > best[0]:
            best, how = (shared, r), h
    if best is None:
        return None, None
    shared, r = best
    same = r if shared == len(y) == len(r.y) else None
    at = shared - 1
    shape = r.shape
    if at <= r.t0:
        return None, same
    if how == "full":
        if shape.seasonal and shared < 2 * shape.m:
            return None, same
        if not shape.seasonal and shape.trend and int(np.count_nonzero(~np.isnan(r.y[:r.t0 + 1]))) < 2:
            return None, same  # a start on one observation: a later second one would move it
    season = r.season_init
    if shape.seasonal:
        if at + 1 < shape.m:
            return None, same
        steps = np.arange(at + 1 - shape.m, at + 1)
        season = np.empty(shape.m)
        season[steps % shape.m] = r.slot[steps]
    tail = smoothing.run(y, shape, r.constants, smoothing.Start(at, float(r.level[at]), float(r.trend[at]), season))
    return _spliced(y, r, at, tail), same


def clear() -> None:
    """Forget what the memos of this module keep (as a newly started process would have nothing)."""
    _CACHE.clear()
    _DIGESTS.clear()
    _BY_ID.clear()
    _RUNS.clear()
