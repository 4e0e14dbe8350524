"""PNG plots of a comparison: per workload demand against ready capacity and what waits (queue,
pending pods); the fleet's provisioned GPUs against those pods hold; startup times. The time axis is
in days when the run is longer than two days, else in hours.

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


#: Runs longer than this are plotted against days, shorter ones against hours.
DAYS_AFTER_S = 2 * 86400.0


def time_axis(n_ticks: int, tick_s: float) -> tuple[F64, str]:
    """Each tick's start in the plot's unit, and the unit's label: days for long runs, else hours."""
    unit, label = (86400.0, "days") if n_ticks * tick_s > DAYS_AFTER_S else (3600.0, "hours")
    return np.arange(n_ticks, dtype=np.float64) * (tick_s / unit), label


def capacity_plot(runs: Sequence[RunResult], workload: str, path: Path, *, dpi: int = 90) -> Path:
    """Per strategy (one row each): demand and ready capacity (requests/s) on the left; on the right
    what waits, the queue (requests, the most in each plotted bucket) and the pods pending placement."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 2, figsize=(13, 1.9 * len(runs) + 0.6), sharex=True, squeeze=False,
                             gridspec_kw={"width_ratios": (3, 2)})
    label = "hours"
    for i, (row, run) in enumerate(zip(axes, runs, strict=True)):
        w = next(x for x in run.workloads if x.name == workload)
        factor = max(1, -(-run.n_ticks // MAX_POINTS))
        x, label = time_axis(run.n_ticks, run.tick_s)
        x = _bucket(x, factor)
        ax = row[0]
        ax.plot(x, _bucket(w.timeline.demand, factor), color="0.55", lw=0.8, label="demand")
        ax.plot(x, _bucket(w.timeline.capacity, factor), color="tab:blue", lw=1.1, label="ready capacity")
        ax.set_ylabel("req/s")
        ax.set_title(run.strategy.name, loc="left", fontsize=9)
        ax.grid(alpha=0.3)
        ax = row[1]
        ax.plot(x, _bucket(w.timeline.queue, factor, "max"), color="tab:red", lw=0.9, label="waiting requests")
        ax.set_ylabel("requests", fontsize=8)
        ax.grid(alpha=0.3)
        pods = ax.twinx()
        pending = _bucket(w.timeline.pending.astype(np.float64), factor, "max")
        pods.step(x, pending, where="post", color="tab:purple", lw=0.9, label="pending pods")
        pods.set_ylabel("pods", fontsize=8)
        pods.set_ylim(bottom=0, top=max(1.0, float(pending.max(initial=0.0))) * 1.05)  # whole pods, from 0
        pods.yaxis.get_major_locator().set_params(integer=True)
        if i == 0:
            ax.set_title("waiting", loc="left", fontsize=9)
            lines = ax.get_lines() + pods.get_lines()
            ax.legend(lines, [str(ln.get_label()) for ln in lines], loc="upper right", fontsize=8)
    axes[0, 0].legend(loc="upper right", fontsize=8)
    for ax in axes[-1]:
        ax.set_xlabel(label)
    fig.suptitle(f"{workload}: demand vs ready capacity, and what waits", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def used_gpus(run: RunResult) -> F64:
    """GPUs held by placed pods (starting or ready) per tick, over every workload."""
    used = np.zeros(run.n_ticks)
    for w in run.workloads:
        used += (w.timeline.ready + w.timeline.starting) * w.gpus_per_replica
    return used


def gpu_plot(runs: Sequence[RunResult], provisioned: Sequence[F64], path: Path, *, note: str = "",
             dpi: int = 90) -> Path:
    """Per strategy: the GPUs provisioned (``provisioned[i]``, per tick of ``runs[i]``) and the GPUs
    placed pods hold; the gap between them is what idles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 1.9 * len(runs) + 0.8), sharex=True, squeeze=False)
    label = "hours"
    for ax, run, prov in zip(axes[:, 0], runs, provisioned, strict=True):
        factor = max(1, -(-run.n_ticks // MAX_POINTS))
        x, label = time_axis(run.n_ticks, run.tick_s)
        x = _bucket(x, factor)
        ax.plot(x, _bucket(np.asarray(prov, dtype=np.float64), factor), color="0.3", lw=1.1, label="provisioned")
        ax.plot(x, _bucket(used_gpus(run), factor), color="tab:green", lw=1.0, label="held by pods")
        ax.set_ylabel("GPUs")
        ax.set_ylim(bottom=0)
        ax.set_title(run.strategy.name, loc="left", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0, 0].legend(loc="lower right", fontsize=8)
    axes[-1, 0].set_xlabel(label)
    fig.suptitle("GPUs: provisioned vs held by pods" + (f" ({note})" if note else ""), fontsize=10)
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
    if ax.get_legend_handles_labels()[0]:  # no pod placed: no legend, and no warning on stderr (JSON logs)
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
