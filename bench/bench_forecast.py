"""Forecast accuracy: rolling-origin error per horizon and upper-quantile coverage, every forecaster
against the naive baselines (and statsmodels' damped additive ETS when it is installed).

Protocol (issue 17's, on whatever series are at hand): each series is a rate on a regular grid of
``step`` seconds. Origins every ``--every`` over the last ``--test`` of the series (at most 40% of
it); at each origin every forecaster sees at most ``--history`` of the series up to the origin and
forecasts 1, 2 and 3 steps ahead with the project's default parameters (the grid step set to the
series' own). Reported per horizon:

* **error**: mean absolute error as a share of the mean rate over the test span (``MAE / mean``);
* **ratio**: that error over the last value's, computed in the same run (below 1: better than naive);
  where it is above 1 (or above the ETS reference's), the bars say whether the difference can be
  told from noise: :func:`paired_z`, a Diebold-Mariano test on the paired absolute errors; and each
  bar says how many cells noise alone would put outside (:func:`bars`, ``by_chance``);
* **coverage**: the share of outcomes at or below the upper quantile (asked: 95%);
* **score**: the upper quantile's mean quantile (pinball) loss as a share of the mean rate
  (:func:`quantile_score`). Coverage alone rewards an upper that is needlessly high (one at
  infinity covers 100%); the score charges for both misses and width, and an exactly calibrated,
  sharpest upper minimises it, so it is the figure to compare two ways of setting the upper by.

Refit phase (``--phases N``). ``auto`` refits at boundaries a fixed phase into each refit period
(``ForecastParams.refit_phase_s``; the scaler derives it from the workload's name), and the
benchmark's clock starts at the series' first point, so which held-out stretch each refit chooses
on is an accident of where the file starts: trimming a series moves a cell by a percent or two.
With ``N > 1``, ``auto`` runs at the phases ``i refit_s / N`` (i = 0..N-1) and each origin's error
is the mean of its N absolute errors (coverage and score over all N uppers): the expected figure
over the phase, which the scaler's name hash draws from (``auto chose`` then counts every phase's
choice). The other forecasters run at phase 0. With ``--combine`` as well, ``auto``'s forecast at
an origin is the mean of the N phases' points and its upper the mean of their uppers (quantile
averaging): what ``auto`` bagged over its refit phases would forecast, at N times the CPU. By
Jensen's inequality its absolute error is at most the mean of the N errors at every origin.

Baselines: **last value** ``y[t]``, with an upper of its own for the score (:func:`naive_upper`:
the current rate plus the worst recent swings); **seasonal naive** ``y[t+k-m]`` (m = a day of steps; shown only
when the series is longer than a day); **ets** (optional): ``statsmodels`` ETS(A,Ad,N) fitted by
maximum likelihood at every origin on the same history, the reference issue 17 used. statsmodels
is not a dependency of the project; install it in the venv to get the column.

Series: the two synthetic workloads of ``scenarios/mixed-fleet.yaml`` (its own generator and seed,
Poisson arrivals, binned to the step); the bundled Azure code trace, as its 3.5-minute request
slice ``scenarios/traces/azure-code-slice.csv`` binned at 5 s and as the whole 57 minutes
(``scenarios/traces/azure-code-rates.csv``, requests per second) binned at 15 s (the scaler's
sampling step) and at 30 s; three synthetic series of 14 days at 600 s with known structure,
generated with a fixed seed (a daily season, a random walk, a spiky single tenant); eleven production
rates from the Numenta Anomaly Benchmark binned at 600 s (``scenarios/traces/nab-*.csv``: an AWS
load balancer's requests over 14 days, tweets about ten companies over 19.4-19.8 days); and every trace
given on the command line (rate or request CSV, any format ``extender simulate`` reads), binned at
``--trace-step``.

Run (from the repository root)::

    .venv/bin/python bench/bench_forecast.py
    .venv/bin/python bench/bench_forecast.py --trace my-rates.csv --trace-step 600 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
from numpy.typing import NDArray

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from extender.core.choice import AUTO_Z, dm_statistic  # noqa: E402
from extender.core.forecast import FORECASTERS, ForecastParams, forecast, residual_quantile  # noqa: E402
from extender.sim.scenario import TraceSpec, load_scenario  # noqa: E402
from extender.sim.synthetic import synthetic_arrivals  # noqa: E402
from extender.sim.traces import AZURE_CREDIT, arrivals_from, read_trace  # noqa: E402

F64 = NDArray[np.float64]
DAY = 86_400.0
HORIZONS = (1, 2, 3)
NAMES = ("auto", *sorted(n for n in FORECASTERS if n != "auto"))
#: Production rates from the Numenta Anomaly Benchmark (scenarios/traces/README.md), binned at 600 s.
NAB_TRACES = ("scenarios/traces/nab-elb-requests.csv",
              *(f"scenarios/traces/nab-twitter-{s}.csv" for s in ("aapl", "goog", "amzn", "crm", "cvs", "fb", "ibm",
                                                                   "ko", "pfe", "ups")))
NAB_CREDIT = "Numenta Anomaly Benchmark (NAB), MIT"


@dataclass(frozen=True)
class Series:
    name: str
    y: F64
    step: float
    source: str


# ---------------------------------------------------------------------------------------------
# Series
# ---------------------------------------------------------------------------------------------


def binned(times: F64, weights: F64, step: float, span: float) -> F64:
    """Requests per second in bins of ``step`` from 0 to ``span``."""
    n = max(1, math.ceil(span / step - 1e-9))
    idx = np.minimum((times / step).astype(np.int64), n - 1)
    return np.bincount(idx, weights=weights, minlength=n).astype(np.float64) / step


def scenario_series(path: Path, step: float) -> list[Series]:
    loaded = load_scenario(path)
    out = []
    for i, w in enumerate(loaded.scenario.workloads):
        spec = w.demand.synthetic
        if spec is None:
            continue
        rng = np.random.default_rng(loaded.scenario.seed * 1000 + i)
        a = synthetic_arrivals(spec, rng, bin_s=15.0)
        out.append(Series(f"{loaded.scenario.metadata.name}/{w.name}", binned(a.times, a.weights, step, a.span_s),
                          step, f"`{path.relative_to(ROOT)}`, its synthetic generator (seed {loaded.scenario.seed})"))
    return out


def trace_series(path: Path, step: float, label: str | None = None, credit: str = "") -> Series:
    """A trace binned at ``step``; ``credit`` as the trace option of that name (a rate CSV derived
    from the Azure trace needs it; the Azure request format is credited without it)."""
    trace = read_trace(path, TraceSpec(path=str(path), credit=credit))
    a = arrivals_from(trace, bin_s=min(step, 1.0))
    span = max(a.span_s, float(a.times[-1]) + a.bin_s) if len(a) else step
    return Series(label or path.name, binned(a.times, a.weights, step, span), step,
                  f"`{label or path}`" + (f" ({a.credit})" if a.credit else ""))


def synthetic_series(seed: int = 17) -> list[Series]:
    """Three 14-day series at 600 s with known structure (fixed seed)."""
    rng = np.random.default_rng(seed)
    step = 600.0
    n = int(14 * DAY / step)
    t = np.arange(n) * step
    daily = 100 * (1 + 0.5 * np.cos(2 * np.pi * (t - 14 * 3600) / DAY)) * np.exp(0.08 * rng.standard_normal(n))
    walk = 100 * np.exp(np.cumsum(0.04 * rng.standard_normal(n)))
    base = 5 + 2 * np.cos(2 * np.pi * t / DAY)
    spikes = np.zeros(n)
    for s in rng.choice(n, size=40, replace=False):
        spikes[s:s + rng.integers(1, 4)] += rng.uniform(10, 40)
    spiky = rng.poisson((base + spikes) * step).astype(np.float64) / step
    src = f"synthetic, seed {seed}"
    return [Series("synthetic/daily-season", daily, step, f"{src}: daily cosine (amplitude 0.5), 8% log-normal noise"),
            Series("synthetic/random-walk", walk, step, f"{src}: geometric random walk, 4% per step"),
            Series("synthetic/spiky-tenant", spiky, step, f"{src}: 5 req/s with a weak daily cycle, 40 spikes of "
                   "10-40 req/s lasting 1-3 steps, Poisson counts")]


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------


def ets_forecast(y: F64, k: int) -> F64 | None:
    """statsmodels ETS(A,Ad,N) forecasts 1..k steps ahead, or None when statsmodels is absent or fails."""
    try:
        from statsmodels.tsa.exponential_smoothing.ets import ETSModel  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = ETSModel(np.asarray(y, dtype=np.float64), error="add", trend="add", damped_trend=True).fit(disp=False)
            return np.asarray(res.forecast(k), dtype=np.float64)
    except Exception:  # a failed reference fit is reported as missing, not fatal
        return None


def naive_upper(y: F64, k: int, level: float) -> float:
    """The last value's own upper, the reference for the quantile score: ``y[t] + q``, q the
    split-conformal ``level`` quantile (:func:`residual_quantile`) of every observed k-step change
    ``y[j+k] - y[j]`` in the history. Absolute, with no model and no floor: what a user gets by
    adding the worst recent swings to the current rate."""
    changes = y[k:] - y[:-k]
    changes = changes[~np.isnan(changes)]
    return float(y[-1]) + max(residual_quantile(changes, level), 0.0)


def quantile_score(actual: float, upper: float, level: float) -> float:
    """The quantile (pinball) loss of ``upper`` as the ``level`` quantile of ``actual``::

        S = level (y - U)          when y > U (a miss, charged at level per unit short)
        S = (1 - level) (U - y)    otherwise (width, charged at 1 - level per unit spare)

    Its expectation is minimised by the true ``level`` quantile, so a lower mean score is a better
    upper on both counts at once (Gneiting and Raftery, *Strictly Proper Scoring Rules, Prediction,
    and Estimation*, JASA 2007).
    """
    d = actual - upper
    return level * d if d > 0 else (level - 1) * d


def evaluate(s: Series, *, every_s: float, test_s: float, history_s: float, level: float,
             with_ets: bool, phases: int = 1, combine: bool = False) -> dict[str, Any]:
    y, step = s.y, s.step
    n = len(y)
    t = np.arange(n) * step
    m = round(DAY / step)
    test_n = min(int(test_s / step), int(0.4 * n))
    every = max(1, round(every_s / step))
    hist_n = max(2, int(history_s / step))
    kmax = max(HORIZONS)
    origins = list(range(n - test_n - 1, n - kmax, every))
    params = ForecastParams(step_s=step, level=level)
    at_phase = [params.model_copy(update={"refit_phase_s": i * params.refit_s / phases}) for i in range(phases)]
    err: dict[str, dict[int, dict[int, float]]] = {}  # name -> k -> origin -> absolute error
    hit: dict[str, dict[int, list[bool]]] = {}
    score: dict[str, dict[int, list[float]]] = {}
    chosen: dict[int, dict[str, int]] = {}

    def add(name: str, k: int, o: int, points: list[float], actual: float, *,
            uppers: list[float] | None = None) -> None:
        """Record one origin's forecasts (one per refit phase): their mean absolute error, every upper."""
        err.setdefault(name, {}).setdefault(k, {})[o] = float(np.mean([abs(actual - p) for p in points]))
        for u in uppers or []:
            hit.setdefault(name, {}).setdefault(k, []).append(actual <= u)
            score.setdefault(name, {}).setdefault(k, []).append(quantile_score(actual, u, level))

    t0 = time.perf_counter()
    for o in origins:
        lo = max(0, o + 1 - hist_n)
        th, yh = t[lo:o + 1], y[lo:o + 1]
        for name in NAMES:
            for k in HORIZONS:
                runs = [forecast(name, th, yh, k * step, p) for p in (at_phase if name == "auto" else at_phase[:1])]
                points, uppers = [f.point for f in runs], [f.upper for f in runs]
                if combine:
                    points, uppers = [float(np.mean(points))], [float(np.mean(uppers))]
                add(name, k, o, points, y[o + k], uppers=uppers)
                if name == "auto":
                    picks = chosen.setdefault(k, {})
                    for f in runs:
                        picks[f.method] = picks.get(f.method, 0) + 1
        for k in HORIZONS:
            add("last value", k, o, [y[o]], y[o + k], uppers=[naive_upper(yh, k, level)])
            if o + k - m >= 0 and n > 2 * m:
                add("seasonal naive", k, o, [y[o + k - m]], y[o + k])
        if with_ets:
            ets = ets_forecast(yh, kmax)
            if ets is not None:
                for k in HORIZONS:
                    add("ets (statsmodels)", k, o, [float(ets[k - 1])], y[o + k])
    elapsed = time.perf_counter() - t0
    mean = float(np.mean(y[origins[0]:])) if origins else float("nan")
    rows: dict[str, dict[str, dict[int, float]]] = {}
    for name, by_k in err.items():
        rows[name] = {"error": {k: float(np.mean(list(v.values()))) / mean for k, v in by_k.items()}}
        if name in hit:
            rows[name]["coverage"] = {k: float(np.mean(v)) for k, v in hit[name].items()}
            rows[name]["score"] = {k: float(np.mean(v)) / mean for k, v in score[name].items()}
    for row in rows.values():
        row["ratio"] = {k: row["error"][k] / rows["last value"]["error"][k] for k in row["error"]}
    z = {ref: {k: paired_z(err["auto"][k], err[ref][k], k, every) for k in HORIZONS} for ref in err
         if ref in REFERENCES}
    return {"series": s.name, "source": s.source, "step_s": step, "points": n, "origins": len(origins),
            "mean_rate": mean, "rows": rows, "z": z, "auto_chose": chosen, "phases": phases, "combine": combine,
            "seconds": elapsed}


# ---------------------------------------------------------------------------------------------
# Cost per tick
# ---------------------------------------------------------------------------------------------


def tick_cost(*, step: float = 15.0, hours: float = 67.0, ticks: int = 20,
              seed: int = 17) -> dict[str, dict[str, Any]]:
    """CPU seconds per forecast call at the scaler's scale: a history of ``hours`` at ``step`` s (the
    scaler's default 15 s tick, a fit window of 66 h and one refit period on top), lead 136 s.

    ``refit``: the first call after a refit boundary (fits every model it needs, memos emptied);
    ``tick``: the median of ``ticks`` later calls, one new sample each, inside the same refit
    period (what every scaler tick pays). The ``last`` forecaster's tick is the baseline. CPU time
    (``time.process_time``) rather than wall time, so that other work on a shared machine does not
    count.
    """
    from extender.core import forecast as module

    rng = np.random.default_rng(seed)
    n = int(hours * 3600 / step)
    t = 1_700_000_000.0 - 1_700_000_000.0 % 3600 + np.arange(n + ticks) * step
    y = 40 * (1 + 0.6 * np.cos(2 * np.pi * t / DAY)) * np.exp(0.05 * rng.standard_normal(t.size))
    y = rng.poisson(y * step) / step
    params = ForecastParams()
    out: dict[str, dict[str, Any]] = {}
    for name in NAMES:
        module.clear_memos()  # a refit boundary: nothing of this history kept yet
        t0 = time.process_time()
        method = forecast(name, t[:n], y[:n], 136.0, params).method
        refit = time.process_time() - t0
        times = []
        for i in range(1, ticks + 1):
            t0 = time.process_time()
            forecast(name, t[:n + i], y[:n + i], 136.0, params)
            times.append(time.process_time() - t0)
        out[name] = {"refit": refit, "tick": float(np.median(times)), "method": method}
    return out


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def table(result: dict[str, Any]) -> str:
    rows = result["rows"]
    groups = ("error", "vs last", "p95 cover", "p95 score")
    head = "| forecaster | " + " | ".join(f"{g} h={k}" for g in groups for k in HORIZONS) + " |"
    lines = [head, "|---|" + "---:|" * (len(groups) * len(HORIZONS))]
    for name, row in rows.items():
        cov, score = row.get("coverage", {}), row.get("score", {})
        lines.append(f"| {name} | " + " | ".join(pct(row["error"][k]) for k in HORIZONS) + " | "
                     + " | ".join(f"{row['ratio'][k]:.2f}" for k in HORIZONS) + " | "
                     + " | ".join(pct(cov[k]) if k in cov else "-" for k in HORIZONS) + " | "
                     + " | ".join(pct(score[k]) if k in score else "-" for k in HORIZONS) + " |")
    return "\n".join(lines)


#: What ``auto``'s error is compared with, cell by cell (:func:`paired_z`).
REFERENCES = ("last value", "ets (statsmodels)")


#: Relative difference below which two figures are the same: the forecaster regrids its history by
#: cumulative sums, so its "last value" can differ from the last sample in the last bits (one origin of
#: the Azure slice forecasts 1.5999999999999996 for 1.6). Such a difference is not a forecast that
#: differs, and must neither fail a bar nor make a paired z.
TIE = 1e-9


def paired_z(auto: dict[int, float], ref: dict[int, float], k: int, every: int) -> float:
    """How many standard errors ``auto``'s mean absolute error is below ``ref``'s on the origins both
    forecast (origin -> absolute error): the Diebold-Mariano statistic
    (:func:`extender.core.choice.dm_statistic`) on the paired errors. Negative: ``auto`` is
    behind; above ``-AUTO_Z`` (-1.645) it is not behind at 5% (a one-sided test).

    Origins ``every`` grid steps apart share the path of k-step errors when they are less than k
    steps apart, so the long-run variance counts lags below ``ceil(k / every)`` origins. Errors
    within :data:`TIE` of each other (relative to the largest) are one: otherwise a single rounding
    difference among identical forecasts gives a variance near zero and a z of any size.
    """
    shared = sorted(auto.keys() & ref.keys())
    if len(shared) < 2:
        return math.nan
    a = np.array([auto[o] for o in shared])
    r = np.array([ref[o] for o in shared])
    a = np.where(np.abs(a - r) <= TIE * float(np.max(np.abs(np.concatenate([a, r])))), r, a)
    return dm_statistic(a, r, math.ceil(k / every))


def within(coverage: float, level: float, band: float) -> bool:
    """The coverage bar: ``|coverage - level| <= band`` (1e-12 of slack: 98 of 100 is 3 points off)."""
    return abs(coverage - level) <= band + 1e-12


def hits_chance(n: int, h: int, level: float) -> float:
    """``P(h) = C(n, h) L^h (1 - L)^(n - h)``: the chance that an exactly calibrated quantile (each
    outcome at or below it with probability ``L = level``, independently) covers h of n outcomes."""
    return math.comb(n, h) * level**h * (1 - level) ** (n - h)


def calibrated_pass(n: int, level: float, band: float) -> float:
    """The chance that an exactly calibrated quantile's coverage over ``n`` independent origins lands
    within ``band`` of ``level``: ``sum P(h)`` (:func:`hits_chance`) over the hit counts h with
    ``|h / n - L| <= band``. What a coverage cell can tell: 0.38 at 20 origins, 0.94 at 150."""
    return sum(hits_chance(n, h, level) for h in range(n + 1) if within(h / n, level, band))


def calibration_p(n: int, hits: int, level: float) -> float:
    """The exact two-sided binomial test that the quantile is calibrated, given ``hits`` of ``n``
    outcomes covered: the chance of a count no more likely than the one seen::

        p = sum P(h) over the h with P(h) <= P(hits) (1 + 1e-7)        P: :func:`hits_chance`

    (the minimum-likelihood p-value, R's ``binom.test``; the 1e-7 keeps a tie a tie in floating
    point). Below 0.05 the coverage is told from a calibrated quantile's luck at 5%: 18 of 20
    covered gives 0.26, 44 of 44 gives 0.17, 90 of 90 gives 0.02."""
    seen = hits_chance(n, hits, level) * (1 + 1e-7)
    return min(1.0, sum(c for h in range(n + 1) if (c := hits_chance(n, h, level)) <= seen))


def bars(results: list[dict[str, Any]], level: float, band: float = 0.03) -> dict[str, Any]:
    """Issue 17's bars, cell by cell (a series at one horizon): ``auto``'s error at most the last
    value's and at most the ETS reference's (strictly: any excess fails), its coverage within
    ``band`` of ``level``. Each bar lists its failing cells with the exact figure; an error cell
    also with :func:`paired_z` against the reference, a coverage cell with its origins,
    :func:`calibrated_pass` of them and :func:`calibration_p` of its coverage over them (with
    ``--phases``, the mean over the phases rounded to a count of origins: the phases' uppers for
    one origin face the same outcome and mostly agree, so the outcomes are what is independent).
    ``told`` says whether the cell is told from noise at 5% (z below ``-AUTO_Z``, p below 0.05), and
    each bar counts those.

    ``by_chance`` says how many cells noise alone would put outside, for a forecaster exactly as good
    as measured: an error cell holds with probability ``q = Phi(z)``, its paired z taken as ``auto``'s
    true advantage in standard errors (cells whose errors tie, :data:`TIE`, hold for sure and are
    left out); a coverage cell, for an exactly calibrated quantile, with ``q`` =
    :func:`calibrated_pass` of its origins. Over a bar's cells::

        outside = sum_i (1 - q_i)      all_inside = prod_i q_i      at_most = prod_s min_{i in s} q_i

    ``outside`` holds whatever the cells' dependence; ``all_inside`` takes the cells as independent.
    The horizons of one series share their origins, so their cells pass or fail together more often
    than that; ``at_most`` is the chance were they to pass or fail as one (the series s independent),
    and the truth lies between the two."""
    out: dict[str, Any] = {}
    def ratio(ref: str) -> Any:
        return lambda r, k: r["auto"]["error"][k] / r[ref]["error"][k] if ref in r else None

    refs = dict(zip(("error no worse than the last value's", "error no worse than the ETS reference's"),
                    REFERENCES, strict=True))
    checks = {
        **{bar: ratio(ref) for bar, ref in refs.items()},
        f"coverage within {100 * band:g} points of {100 * level:g}%": lambda r, k: r["auto"]["coverage"][k],
    }
    for bar, value in checks.items():
        cells, failed = 0, []
        holds: dict[str, list[float]] = {}  # series -> each counted cell's chance of holding
        coverage = bar.startswith("coverage")
        for res in results:
            for k in HORIZONS:
                v = value(res["rows"], k)
                if v is None:
                    continue
                cells += 1
                z = res.get("z", {}).get(refs[bar], {}).get(k, math.nan) if bar in refs else math.nan
                q = (calibrated_pass(res["origins"], level, band) if coverage
                     else NormalDist().cdf(z) if abs(v - 1.0) > TIE and not math.isnan(z) else None)
                if q is not None:
                    holds.setdefault(res["series"], []).append(q)
                if within(v, level, band) if coverage else v <= 1.0 + TIE:
                    continue
                failed.append({"series": res["series"], "h": k, "value": v})
                if coverage:
                    n = res["origins"]
                    p = calibration_p(n, round(v * n), level)
                    failed[-1] |= {"origins": n, "calibrated_pass": q, "p": p, "told": p < 0.05}
                elif not math.isnan(z):
                    failed[-1] |= {"z": z, "told": z < -AUTO_Z}
        out[bar] = {"cells": cells, "held": cells - len(failed), "failed": failed,
                    "told": sum(bool(f.get("told")) for f in failed),
                    "by_chance": {"cells": sum(map(len, holds.values())),
                                  "outside": sum(1.0 - q for qs in holds.values() for q in qs),
                                  "all_inside": math.prod(q for qs in holds.values() for q in qs),
                                  "at_most": math.prod(min(qs) for qs in holds.values())}}
    return out


def bars_report(b: dict[str, Any]) -> str:
    lines = ["### Issue 17's bars (`auto`, every series and horizon)", ""]
    for bar, r in b.items():
        outside = f", outside ({r['told']} of {len(r['failed'])} told from noise at 5%):" if r["failed"] else ""
        lines.append(f"- {bar}: {r['held']} of {r['cells']}{outside}")
        chance = r["by_chance"]
        who = ("an exactly calibrated quantile" if bar.startswith("coverage")
               else "a forecaster exactly as good as measured (each paired z its true advantage)")
        lines.append(f"  - by chance alone, {who}: {chance['outside']:.1f} of {chance['cells']} cells outside on "
                     f"average, all inside with probability {chance['all_inside']:.2g} (cells independent) "
                     f"to {chance['at_most']:.2g} (a series' horizons as one)")
        for f in r["failed"]:
            why = ""
            if "origins" in f:
                why = (f" ({f['origins']} origins: a calibrated quantile passes with probability "
                       f"{f['calibrated_pass']:.2f}; binomial p {f['p']:.2f}: "
                       f"{'miscalibrated' if f['told'] else 'not told apart'} at 5%)")
            elif "z" in f:
                why = f" (paired z {f['z']:+.2f}: {'behind' if f['told'] else 'not told apart'} at 5%)"
            lines.append(f"  - {f['series']} h={f['h']}: {f['value']:.4f}{why}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", action="append", default=[], type=Path, help="a rate or request CSV (repeatable)")
    ap.add_argument("--trace-step", type=float, default=600.0, help="grid step for --trace files, seconds")
    ap.add_argument("--every", type=float, default=7200.0, help="origin spacing, seconds (the bundled "
                    "short traces use one step)")
    ap.add_argument("--test", type=float, default=4 * DAY, help="evaluated span at the end, seconds")
    ap.add_argument("--history", type=float, default=7 * DAY, help="history per origin, seconds")
    ap.add_argument("--level", type=float, default=0.95)
    ap.add_argument("--no-ets", action="store_true", help="skip the statsmodels reference")
    ap.add_argument("--only", default="", help="comma-separated substrings of series names to run")
    ap.add_argument("--phases", type=int, default=1, help="run auto at this many refit phases spread over the "
                    "refit period and average each origin's error over them (1: phase 0 alone)")
    ap.add_argument("--combine", action="store_true", help="with --phases: score auto's mean forecast over "
                    "the phases (the mean point and the mean upper) instead of the mean of their errors")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--tick-cost", action="store_true", help="also time one forecast call at the scaler's scale "
                    "(15 s samples, 67 h of history), per forecaster")
    args = ap.parse_args(argv)
    if args.phases < 1:
        ap.error(f"--phases must be at least 1, got {args.phases}")
    if args.combine and args.phases < 2:
        ap.error("--combine needs --phases 2 or more: it averages auto's forecasts over the refit phases")
    slice_csv, hour_csv = "scenarios/traces/azure-code-slice.csv", "scenarios/traces/azure-code-rates.csv"
    series = [*scenario_series(ROOT / "scenarios/mixed-fleet.yaml", 300.0),
              trace_series(ROOT / slice_csv, 5.0, slice_csv),
              *(trace_series(ROOT / hour_csv, step, f"{hour_csv} at {step:g} s", AZURE_CREDIT)
                for step in (15.0, 30.0)),
              *synthetic_series(),
              *(trace_series(ROOT / nab, 600.0, nab, NAB_CREDIT) for nab in NAB_TRACES)]
    series += [trace_series(p, args.trace_step) for p in args.trace]
    if args.only:
        series = [s for s in series if any(w in s.name for w in args.only.split(","))]
    results = []
    for s in series:
        short = len(s.y) * s.step < 2 * DAY
        every = s.step if short else args.every
        r = evaluate(s, every_s=every, test_s=args.test, history_s=args.history, level=args.level,
                     with_ets=not args.no_ets, phases=args.phases, combine=args.combine)
        results.append(r)
        print(f"\n### {s.name}: {r['points']} points at {s.step:g} s, {r['origins']} origins every {every:g} s, "
              f"mean {r['mean_rate']:.3g} req/s ({r['seconds']:.1f} s)")
        print(f"source: {s.source}; auto chose: " + "; ".join(f"h={k} {c}" for k, c in r['auto_chose'].items()))
        print(table(r))
    out: dict[str, Any] = {"series": results, "bars": bars(results, args.level)}
    print("\n" + bars_report(out["bars"]))
    if args.tick_cost:
        cost = tick_cost()
        out["tick_cost"] = cost
        base = cost["last"]["tick"]
        print("\n### CPU per call: 15 s samples, 67 h of history, lead 136 s\n")
        print("| forecaster | ran | first call after a refit, ms | every other tick, ms | tick vs last |")
        print("|---|---|---:|---:|---:|")
        for name, c in cost.items():
            print(f"| {name} | {c['method']} | {1000 * c['refit']:.0f} | {1000 * c['tick']:.1f} | "
                  f"{c['tick'] / base:.2f} |")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
