"""The figures of a run, and the terminal table, JSON summary and markdown report that show them.

Per strategy, over every workload's requests and pods (formulas; w_j is a packet's requests)::

    slo_attainment = sum of w_j with delay_j <= SLO  /  all requests that arrived
                     (requests still queued at the end count as misses)
    pXX_delay_s    = weighted XX-th percentile of the queueing delay of served requests
                     (inverted CDF: the smallest delay d with at least XX % of the weight <= d)
    cold_starts    = pods placed during the run that did not find every cache they can use on their
                     node (image; weights when the profile caches them and the class has NVMe;
                     compile artifacts when the profile has a compile-cache key); a snapshot
                     restore is warm. Initial replicas are not counted.
    mean_startup_s, p95_startup_s = over the estimated startups of the pods placed during the run
                     (placed -> Ready: the time a pod waits pending for a node is not in it)
    mean_ready_s, p95_ready_s = pod created -> Ready, over the pods placed during the run that became
                     Ready before its end (not deleted first): the pending time (no node had room;
                     with autoscaled pools, the node's provisioning) plus the startup, what an
                     operator sees between a scale-up and the new replica serving
    gpu_hours      = GPUs held by placed pods (starting or ready) x time, in hours; with autoscaled
                     node pools, GPUs of every provisioned node (launching or Ready) x time
    idle_gpu_hours = gpu_hours - served requests / capacity per replica x GPUs per replica / 3600
    unheld_gpu_hours = GPUs of provisioned nodes that no pod holds x time (with autoscaled node pools;
                     0 on a fixed fleet and for each workload): the part of the cost no workload owns
    requests       = requests that arrived during the run (the weight SLO attainment is a share of)
    pods_started   = pods placed during the run (what the startup figures are over)
    pods_ready     = of those, the pods that became Ready (what the ready figures are over)
    upper_coverage = of the scaler's forecasts whose grid step around their time (lead end +- step/2)
                     ended inside the run, the share whose upper quantile the mean demand observed
                     over that step stayed at or under; NaN without forecasts (the stock HPA, the
                     oracle). Each forecast counts once, though decisions may reuse it for a few ticks
    upper_checks   = how many forecasts that share is over
    disrupted_pods = pods deleted to drain an under-used node of a pool with
                     ``consolidationPolicy: WhenEmptyOrUnderutilized`` (each made again, its new
                     start among pods_started)
    consolidated_nodes = under-used nodes so drained and removed (0 for each workload, as
                     unheld_gpu_hours; empty nodes removed are not counted)

The same figures are computed per workload, over that workload's requests and pods only, so the
totals combine from them: ``requests``, ``pods_started``, ``cold_starts`` and ``upper_checks`` are
sums, as is ``disrupted_pods`` (``upper_coverage`` the mean weighted by ``upper_checks``);
``gpu_hours`` and ``idle_gpu_hours`` are sums plus the total's ``unheld_gpu_hours``;
``slo_attainment`` is the request-weighted mean of the workloads'; ``mean_startup_s`` the mean
weighted by ``pods_started``, ``mean_ready_s`` by ``pods_ready``; a percentile of the total lies between the
smallest and the largest of the workloads' (a percentile of a mixture does).

and, across strategies, the gap closed on SLO attainment::

    gap_closed = (predictive - default) / (oracle - default)      (undefined unless oracle > default:
                                                                  there is no gap to close otherwise)
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from numpy.typing import NDArray

from extender.sim.simulation import RunResult, WorkloadResult

F64 = NDArray[np.float64]

#: The figures of ``--json``, per strategy, in this order (issue 7).
FIGURES = ("slo_attainment", "p50_delay_s", "p95_delay_s", "p99_delay_s", "cold_starts", "mean_startup_s",
           "p95_startup_s", "mean_ready_s", "p95_ready_s", "gpu_hours", "idle_gpu_hours", "unheld_gpu_hours",
           "requests", "pods_started", "pods_ready", "upper_coverage", "upper_checks", "disrupted_pods",
           "consolidated_nodes")
#: The key of the per-workload section of each strategy in ``--json``.
WORKLOADS_KEY = "workloads"


@dataclass(frozen=True)
class Summary:
    """The figures of one strategy (or one workload of it); NaN where there is nothing to measure."""

    slo_attainment: float
    p50_delay_s: float
    p95_delay_s: float
    p99_delay_s: float
    cold_starts: int
    mean_startup_s: float
    p95_startup_s: float
    mean_ready_s: float
    p95_ready_s: float
    gpu_hours: float
    idle_gpu_hours: float
    unheld_gpu_hours: float
    requests: float
    pods_started: int
    pods_ready: int
    upper_coverage: float
    upper_checks: int
    disrupted_pods: int = 0
    consolidated_nodes: int = 0


def weighted_quantile(values: F64, weights: F64, q: float) -> float:
    """The smallest value with at least ``q`` of the total weight at or below it (NaN when empty)."""
    keep = weights > 0
    v, w = values[keep], weights[keep]
    if len(v) == 0:
        return math.nan
    order = np.argsort(v, kind="stable")
    cum = np.cumsum(w[order])
    i = int(np.searchsorted(cum, q * cum[-1] * (1 - 1e-12), side="left"))
    return float(v[order][min(i, len(v) - 1)])


def summarise(workloads: Sequence[WorkloadResult], slo_s: float, fleet_gpu_s: float | None = None,
              consolidated: int = 0) -> Summary:
    """The figures over the given workloads' requests and pods (formulas in the module docstring).

    ``fleet_gpu_s``: with autoscaled node pools, the GPU-seconds of every provisioned node, which then
    is the cost (``gpu_hours``) and what idle time is counted against. ``consolidated``: the run's
    under-used nodes drained (a figure of the fleet, not of a workload).
    """
    delays = np.concatenate([w.delays.delay_s for w in workloads]) if workloads else np.zeros(0)
    weights = np.concatenate([w.delays.weights for w in workloads]) if workloads else np.zeros(0)
    arrived = float(weights.sum())
    served = ~np.isnan(delays)
    met = float(weights[served & (delays <= slo_s + 1e-9)].sum())
    d, w = delays[served], weights[served]
    startups = np.concatenate([w.startups for w in workloads]) if workloads else np.zeros(0)
    ready = np.concatenate([w.ready_waits for w in workloads]) if workloads else np.zeros(0)
    cold = int(sum(int(w.cold.sum()) for w in workloads))
    held_s = sum(w.gpu_seconds for w in workloads)
    gpu_s = held_s if fleet_gpu_s is None else fleet_gpu_s
    busy_s = sum(w.busy_gpu_seconds for w in workloads)
    checks = sum(w.upper_checked for w in workloads)
    return Summary(
        slo_attainment=met / arrived if arrived > 0 else math.nan,
        p50_delay_s=weighted_quantile(d, w, 0.50),
        p95_delay_s=weighted_quantile(d, w, 0.95),
        p99_delay_s=weighted_quantile(d, w, 0.99),
        cold_starts=cold,
        mean_startup_s=float(startups.mean()) if len(startups) else math.nan,
        p95_startup_s=float(np.quantile(startups, 0.95, method="inverted_cdf")) if len(startups) else math.nan,
        mean_ready_s=float(ready.mean()) if len(ready) else math.nan,
        p95_ready_s=float(np.quantile(ready, 0.95, method="inverted_cdf")) if len(ready) else math.nan,
        gpu_hours=gpu_s / 3600.0,
        idle_gpu_hours=max(gpu_s - busy_s, 0.0) / 3600.0,
        unheld_gpu_hours=max(gpu_s - held_s, 0.0) / 3600.0,
        requests=arrived,
        pods_started=len(startups),
        pods_ready=len(ready),
        upper_coverage=sum(w.upper_covered for w in workloads) / checks if checks else math.nan,
        upper_checks=checks,
        disrupted_pods=sum(w.disrupted for w in workloads),
        consolidated_nodes=consolidated,
    )


def gap_closed(summaries: dict[str, Summary]) -> float | None:
    """``(predictive - default) / (oracle - default)`` on SLO attainment, when all three ran and the
    oracle is above default (else there is no gap, and a share of it would read as nonsense)."""
    try:
        d, p, o = (summaries[k].slo_attainment for k in ("default", "predictive", "oracle"))
    except KeyError:
        return None
    if not all(math.isfinite(x) for x in (d, p, o)) or o - d < 1e-9:
        return None
    return (p - d) / (o - d)


@dataclass(frozen=True)
class Report:
    """Everything the outputs show."""

    title: str
    slo_s: float
    duration_s: float
    summaries: dict[str, Summary]
    per_workload: dict[str, dict[str, Summary]]
    gap: float | None
    credits: tuple[str, ...]
    notes: tuple[str, ...]
    #: The level of the scaler's upper quantile (the policy's ``scaling.quantile``): what
    #: ``upper_coverage`` is to be read against.
    quantile: float | None = None


def build(title: str, slo_s: float, duration_s: float, runs: Sequence[RunResult], *, credits: Sequence[str] = (),
          notes: Sequence[str] = (), quantile: float | None = None) -> Report:
    """Summaries of each run, overall and per workload."""
    summaries = {r.strategy.name: summarise(r.workloads, slo_s, r.fleet_gpu_seconds, r.nodes_consolidated)
                 for r in runs}
    per_workload = {r.strategy.name: {w.name: summarise([w], slo_s) for w in r.workloads} for r in runs}
    return Report(title, slo_s, duration_s, summaries, per_workload, gap_closed(summaries),
                  tuple(dict.fromkeys(credits)), tuple(notes), quantile)


def _round(name: str, value: float | int) -> float | int | None:
    if isinstance(value, int):
        return value
    if not math.isfinite(value):
        return None
    return round(value, 6 if name == "slo_attainment" else 3)


def _figures(s: Summary) -> dict[str, float | int | None]:
    return {k: _round(k, v) for k, v in asdict(s).items()}


def to_json(report: Report) -> str:
    """``{strategy: {figure: value, ..., "workloads": {workload: {figure: value}}}}``: exactly
    :data:`FIGURES` for each strategy and each of its workloads (null where undefined)."""
    doc = {name: {**_figures(s), WORKLOADS_KEY: {w: _figures(ws) for w, ws in report.per_workload[name].items()}}
           for name, s in report.summaries.items()}
    return json.dumps(doc, indent=2)


def _fmt(value: float, spec: str) -> str:
    return "-" if not math.isfinite(value) else format(value, spec)


COLUMNS = (("strategy", "<12"), ("SLO met", ">8"), ("p50 s", ">7"), ("p95 s", ">7"), ("p99 s", ">7"),
           ("cold", ">5"), ("start s", ">8"), ("p95 s", ">7"), ("ready s", ">8"), ("GPU-h", ">8"),
           ("idle GPU-h", ">10"))


def _cells(name: str, s: Summary) -> list[str]:
    return [name, _fmt(100 * s.slo_attainment, ".1f") + " %" if math.isfinite(s.slo_attainment) else "-",
            _fmt(s.p50_delay_s, ".1f"), _fmt(s.p95_delay_s, ".1f"), _fmt(s.p99_delay_s, ".1f"), str(s.cold_starts),
            _fmt(s.mean_startup_s, ".0f"), _fmt(s.p95_startup_s, ".0f"), _fmt(s.mean_ready_s, ".0f"),
            _fmt(s.gpu_hours, ".1f"), _fmt(s.idle_gpu_hours, ".1f")]


def gap_line(report: Report) -> str:
    """One sentence on the gap closed (or why it is not shown)."""
    if report.gap is None:
        return "gap closed: n/a (needs default, predictive and oracle, the oracle above default in SLO attainment)"
    return (f"gap closed: predictive recovers {100 * report.gap:.0f} % of the SLO-attainment gap between "
            f"default and oracle")


def coverage_line(name: str, s: Summary, quantile: float | None) -> str:
    """How often the demand stayed under the forecasts' upper quantile in strategy ``name``'s run,
    and the level asked (``quantile``, when known)."""
    asked = "" if quantile is None else f", asked {100 * quantile:g} %"
    return (f"`{name}`: the forecast's upper quantile covered {100 * s.upper_coverage:.1f} % of the mean demand "
            f"over the grid step at the end of its lead ({s.upper_checks:,} forecasts{asked}).")


def disruption_line(name: str, s: Summary) -> str:
    """What consolidating under-used nodes did in strategy ``name``'s run (only said when it did)."""
    return (f"`{name}`: consolidation of under-used nodes drained {s.consolidated_nodes:,} nodes, deleting "
            f"{s.disrupted_pods:,} pods that were made again.")


def table(report: Report) -> str:
    """The terminal table: one row per strategy (the first column as wide as the longest name), then the gap closed."""
    width = max([12, *map(len, report.summaries)])
    columns = (("strategy", f"<{width}"), *COLUMNS[1:])
    head = "  ".join(format(h, spec) for h, spec in columns)
    lines = [f"{report.title}: {report.duration_s / 3600:.1f} h simulated, queueing-delay SLO {report.slo_s:g} s",
             "", head, "-" * len(head)]
    for name, s in report.summaries.items():
        lines.append("  ".join(format(c, spec) for c, (_, spec) in zip(_cells(name, s), columns, strict=True)))
    lines += ["", gap_line(report)]
    lines += [f"note: {n}" for n in report.notes]
    lines += [f"demand data: {c}" for c in report.credits]
    return "\n".join(lines)


def _md_table(rows: dict[str, Summary]) -> list[str]:
    head = [h for h, _ in COLUMNS]
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    out += ["| " + " | ".join(_cells(name, s)) + " |" for name, s in rows.items()]
    return out


def markdown(report: Report, images: Sequence[tuple[str, str]], strategies: dict[str, str]) -> str:
    """The markdown report: the table, the gap, per-workload tables, the plots (``(caption, file)``)."""
    lines = [f"# {report.title}", "",
             f"{report.duration_s / 3600:.1f} h simulated; a request meets the SLO when it waits at most "
             f"{report.slo_s:g} s for a replica.", "", *_md_table(report.summaries), "", gap_line(report) + ".", ""]
    covered = [coverage_line(name, s, report.quantile) for name, s in report.summaries.items() if s.upper_checks]
    lines += [*covered, ""] if covered else []
    drained = [disruption_line(name, s) for name, s in report.summaries.items() if s.consolidated_nodes]
    lines += [*drained, ""] if drained else []
    lines += ["Strategies:", ""] + [f"* `{k}`: {v}" for k, v in strategies.items() if k in report.summaries] + [""]
    workloads = sorted({w for per in report.per_workload.values() for w in per})
    for w in workloads:
        rows = {name: per[w] for name, per in report.per_workload.items() if w in per}
        lines += [f"## Workload `{w}`", "", *_md_table(rows), ""]
    for caption, file in images:
        lines += [f"## {caption}", "", f"![{caption}]({file})", ""]
    if report.notes:
        lines += ["## Notes", ""] + [f"* {n}" for n in report.notes] + [""]
    if report.credits:
        lines += ["## Data", ""] + [f"* Demand trace: {c}" for c in report.credits] + [""]
    lines += ["Figures: see `docs/simulator.md` for how each is computed."]
    return "\n".join(lines) + "\n"
