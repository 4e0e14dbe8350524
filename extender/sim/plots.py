"""PNG plots of a comparison: demand against ready capacity per strategy, and startup times.

matplotlib is imported when a plot is drawn (never at import time) and always with the Agg backend,
so ``--out`` works on a headless server and the CLI starts fast when no plot is asked for. It is an
optional dependency (the ``plots`` extra): :func:`require` says so before a long simulation starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from extender.core.errors import ExtenderError
from extender.sim.simulation import RunResult

F64 = NDArray[np.float64]

#: At most this many points per line: longer runs are averaged into buckets (a 14-day run at 15 s
#: has 80 640 ticks, far more than a figure has pixels).
MAX_POINTS = 2000


def require() -> None:
    """Fail with the install command when matplotlib is missing (it is the ``plots`` extra)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ExtenderError("PNG plots need matplotlib, an optional part: "
                            "pip install 'warmth-extender[plots]' (or run without --out)") from exc


def _bucket(values: F64, factor: int, how: str = "mean") -> F64:
    if factor <= 1:
        return values
    n = len(values) // factor * factor
    shaped = values[:n].reshape(-1, factor)
    return np.asarray(shaped.max(axis=1) if how == "max" else shaped.mean(axis=1), dtype=np.float64)


def capacity_plot(runs: Sequence[RunResult], workload: str, path: Path, *, dpi: int = 90) -> Path:
    """Demand and ready capacity (requests/s) over time, one panel per strategy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 1.9 * len(runs) + 0.6), sharex=True, squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        w = next(x for x in run.workloads if x.name == workload)
        factor = max(1, -(-run.n_ticks // MAX_POINTS))
        hours = _bucket(np.arange(run.n_ticks, dtype=np.float64) * (run.tick_s / 3600.0), factor)
        ax.plot(hours, _bucket(w.timeline.demand, factor), color="0.55", lw=0.8, label="demand")
        ax.plot(hours, _bucket(w.timeline.capacity, factor), color="tab:blue", lw=1.1, label="ready capacity")
        ax.set_ylabel("req/s")
        ax.set_title(run.strategy.name, loc="left", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("hours")
    fig.suptitle(f"{workload}: demand vs ready capacity", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def startup_plot(runs: Sequence[RunResult], path: Path) -> Path:
    """Distribution (ECDF) of the estimated startup of every pod placed, per strategy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    for run in runs:
        s = np.sort(np.concatenate([w.startups for w in run.workloads]))
        if len(s) == 0:
            continue
        ax.step(s, np.arange(1, len(s) + 1) / len(s), where="post", label=f"{run.strategy.name} ({len(s)} pods)")
    ax.set_xlabel("startup seconds (estimator, on the node the pod landed on)")
    ax.set_ylabel("share of pods")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
