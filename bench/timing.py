"""Timing shared by the benchmarks that compare functions in one process."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def interleaved(fns: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    """Median seconds of each function over ``repeat`` rounds, the functions run in turn within every
    round so all see the same machine noise; each runs once untimed first (page cache, imports, the
    callers' own caches warm)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}
