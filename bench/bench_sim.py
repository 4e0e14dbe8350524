"""Simulation speed: simulated seconds per wall-clock second, per strategy, against a bare trace replay.

Two workloads of the simulator, each run once per strategy in one process:

* **interval**: a 14-day interval trace (one rate row per minute, 20,160 rows, written to a
  temporary CSV from the seeded synthetic generator: daily and weekly cycles, trend, noise, bursts)
  replayed through ``llama3-8b`` on 200 nodes of the bundled ``mixed-fleet`` policy (100
  g5.12xlarge, 50 g5.48xlarge, 50 g5.xlarge: 850 GPUs) at 15 s ticks (80,640 ticks);
* **requests**: the sample request trace (``AzureLLMInferenceTrace_code.csv``, 8,819 requests over
  57 minutes; Azure Public Dataset (Microsoft), CC-BY 4.0) through ``scenarios/azure-code-sample.yaml``.
  The file is not bundled: pass the trace CSV you downloaded with ``--requests`` (docs/sources.md);
  without it, or when the file does not exist, the row is skipped with a message.

Each row gives wall-clock and CPU seconds (``time.process_time``: on a machine shared with other
work, the CPU time moves less than the wall time) and both against the baseline's.

The **baseline** is the same trace replay without any strategy: the demand loaded, then per tick the
queue placed at a fixed service rate (``FifoQueue.serve``) and read back (``queued``), then the
delays computed. The ratio ``strategy / baseline`` is what scheduling, scaling, estimating and
warming cost on top of moving the requests.

``--parts`` then runs every strategy on the interval trace once more with timers around the parts
of the loop (their overhead is a few percent, which is why it is a separate run) and prints the
share of CPU time each takes: the forecaster (``Run._forecast``, the scaler's and the warmer's),
the rest of the scaling decision, the warm planner and its snapshot, placement, the tick's
events, and the rest (queues, timelines, the loop).

Run (from the repository root)::

    .venv/bin/python bench/bench_sim.py
    .venv/bin/python bench/bench_sim.py --days 14 --json out.json --parts
    .venv/bin/python bench/bench_sim.py --requests AzureLLMInferenceTrace_code.csv   # + the requests row
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from extender.sim import cluster as sim_cluster  # noqa: E402
from extender.sim import simulation as sim_loop  # noqa: E402
from extender.sim.queueing import FifoQueue  # noqa: E402
from extender.sim.scenario import LoadedScenario, SyntheticSpec, load_scenario  # noqa: E402
from extender.sim.simulation import ForecastMemo, Prepared, prepare, simulate  # noqa: E402
from extender.sim.synthetic import rate_trace  # noqa: E402

STRATEGIES = ("default", "cache-aware", "predictive", "oracle", "predictive-no-warm", "warm-only")

INTERVAL_SCENARIO = """\
apiVersion: extender.io/v1alpha1
kind: Scenario
metadata: {{name: bench-interval}}
policy: {policy}
seed: 11
slo: {{queueDelay: 10s}}
cluster:
  nodes:
    - {{nodeClass: g5.12xlarge, count: 100, warm: [{{workload: llama3-8b, fraction: 0.2}}]}}
    - {{nodeClass: g5.48xlarge, count: 50, warm: [{{workload: llama3-8b, fraction: 0.2}}]}}
    - {{nodeClass: g5.xlarge, count: 50, warm: [{{workload: llama3-8b, fraction: 0.2}}]}}
workloads:
  - name: llama3-8b
    maxReplicas: 600
    demand: {{trace: {{path: {trace}}}}}
"""


def write_interval_trace(path: Path, days: float) -> int:
    """A per-minute rate trace of ``days`` days from the synthetic generator; returns its rows."""
    spec = SyntheticSpec.model_validate({
        "duration": f"{days}d", "step": "1m", "base": 400, "daily": {"amplitude": 0.6, "peak": "14h"},
        "weekly": {"amplitude": 0.15, "peak": "2d"}, "trend": 0.01, "noise": 0.08,
        "bursts": {"perDay": 3, "amplitude": 0.8, "duration": "20m"}})
    trace = rate_trace(spec, np.random.default_rng(11))
    rows = "".join(f"{t:.0f},{r:.4f}\n" for t, r in zip(trace.starts, trace.rates, strict=True))
    path.write_text("timestamp,rate\n" + rows)
    return len(trace.starts)


def baseline(prepared: Prepared) -> tuple[float, float]:
    """Wall and CPU seconds for the bare replay: every workload's queue served at a fixed rate, tick by tick."""
    start, cpu = time.perf_counter(), time.process_time()
    for w in prepared.workloads:
        q = FifoQueue(w.arrivals, prepared.n_ticks, prepared.tick_s)
        rate = w.capacity * max(w.initial_replicas, 1)
        for k in range(prepared.n_ticks):
            q.queued(k)
            q.serve(k, rate)
        q.delays()
    return time.perf_counter() - start, time.process_time() - cpu


def measure(name: str, loaded: LoadedScenario, trace: str | None = None) -> dict[str, Any]:
    """Prepare once (timed), the baseline, then each strategy; simulated seconds per wall second."""
    t0 = time.perf_counter()
    prepared = prepare(loaded, trace=trace)
    load_s = time.perf_counter() - t0
    base_s, base_cpu = baseline(prepared)
    sim_s = prepared.duration_s
    row: dict[str, Any] = {"name": name, "ticks": prepared.n_ticks, "nodes": len(prepared.nodes),
                           "simulated_s": sim_s, "load_s": load_s, "baseline_s": base_s, "baseline_cpu_s": base_cpu,
                           "baseline_speed": sim_s / base_s, "strategies": {}}
    shared: ForecastMemo = {}  # what one run of every strategy shares (simulate() does the same)
    for s in STRATEGIES:
        t, c = time.perf_counter(), time.process_time()
        simulate(prepared, [s], forecasts=shared)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        row["strategies"][s] = {"wall_s": wall, "cpu_s": cpu, "speed": sim_s / wall, "vs_baseline": wall / base_s,
                                "cpu_vs_baseline": cpu / base_cpu}
    row["sum_wall_s"] = sum(v["wall_s"] for v in row["strategies"].values())
    row["sum_cpu_s"] = sum(v["cpu_s"] for v in row["strategies"].values())
    return row


#: The timed parts of the loop: (label, class, method). A method called inside another is
#: subtracted from it (the forecaster from the decision, the snapshot from the warm step).
PARTS: tuple[tuple[str, type, str], ...] = (
    ("forecast", sim_loop.Run, "_forecast"), ("decide", sim_loop.Run, "_decide"),
    ("warm", sim_loop.Run, "_warm"), ("snapshot", sim_cluster.Cluster, "planning_snapshot"),
    ("place", sim_loop.Run, "_place_pending"), ("events", sim_loop.Run, "_events"),
)


def parts(prepared: Prepared) -> dict[str, dict[str, float]]:
    """Per strategy: CPU seconds, and the share of them each part of the loop takes."""
    spent: dict[str, float] = collections.defaultdict(float)
    saved: list[tuple[type, str, Callable[..., Any]]] = []

    def timed(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[label] += time.process_time() - t
        return wrapper

    for label, cls, name in PARTS:
        saved.append((cls, name, getattr(cls, name)))
        setattr(cls, name, timed(label, getattr(cls, name)))
    out: dict[str, dict[str, float]] = {}
    shared: ForecastMemo = {}
    try:
        for s in STRATEGIES:
            spent.clear()
            t = time.process_time()
            simulate(prepared, [s], forecasts=shared)
            cpu = time.process_time() - t
            own = {"forecast": spent["forecast"], "decide (other)": spent["decide"] - spent["forecast"],
                   "plan": spent["warm"] - spent["snapshot"], "snapshot": spent["snapshot"],
                   "place": spent["place"], "events": spent["events"]}
            own["rest"] = cpu - sum(own.values())
            out[s] = {"cpu_s": cpu, **{k: v / cpu for k, v in own.items()}}
    finally:
        for cls, name, fn in saved:
            setattr(cls, name, fn)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", type=float, default=14.0, help="length of the interval trace")
    parser.add_argument("--requests", metavar="CSV",
                        help="the trace CSV you downloaded (Azure LLM inference format); row skipped if not given")
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--parts", action="store_true",
                        help="then time the parts of the loop per strategy (a second, timed run)")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    shares: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        n = write_interval_trace(d / "interval.csv", args.days)
        (d / "bench.yaml").write_text(INTERVAL_SCENARIO.format(
            policy=ROOT / "scenarios/mixed-fleet-policy.yaml", trace=d / "interval.csv"))
        loaded = load_scenario(d / "bench.yaml")
        rows.append({**measure(f"interval ({n} rows, {args.days:g} days)", loaded), "rows": n})
        if args.parts:
            shares = parts(prepare(loaded))
    if args.requests is None:
        print("requests row skipped: no --requests CSV given (the Azure LLM inference code trace is not "
              "bundled; see docs/sources.md)", file=sys.stderr)
    elif not Path(args.requests).is_file():
        print(f"requests row skipped: {args.requests}: no such file", file=sys.stderr)
    else:
        rows.append(measure("requests (Azure code sample)", load_scenario(ROOT / "scenarios/azure-code-sample.yaml"),
                            trace=args.requests))
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, numpy {np.__version__}")
    head = ("trace", "ticks", "nodes", "strategy", "wall s", "cpu s", "sim s / wall s", "x baseline", "x (cpu)")
    print(f"{head[0]:<36}{head[1]:>8}{head[2]:>7}  {head[3]:<20}{head[4]:>9}{head[5]:>9}{head[6]:>16}{head[7]:>12}"
          f"{head[8]:>10}")
    for r in rows:
        print(f"{r['name']:<36}{r['ticks']:>8}{r['nodes']:>7}  {'(baseline)':<20}{r['baseline_s']:>9.2f}"
              f"{r['baseline_cpu_s']:>9.2f}{r['baseline_speed']:>16,.0f}{1.0:>12.1f}{1.0:>10.1f}")
        for s, v in r["strategies"].items():
            print(f"{'':<36}{'':>8}{'':>7}  {s:<20}{v['wall_s']:>9.2f}{v['cpu_s']:>9.2f}{v['speed']:>16,.0f}"
                  f"{v['vs_baseline']:>12.1f}{v['cpu_vs_baseline']:>10.1f}")
        print(f"{'':<36}{'':>8}{'':>7}  {'(sum of strategies)':<20}{r['sum_wall_s']:>9.2f}{r['sum_cpu_s']:>9.2f}")
    if shares:
        names = [k for k in next(iter(shares.values())) if k != "cpu_s"]
        print(f"\nwhere the time goes (interval trace; CPU share per part, a timed run):\n{'strategy':<20}{'cpu s':>8}"
              + "".join(f"{k:>16}" for k in names))
        for s, v in shares.items():
            print(f"{s:<20}{v['cpu_s']:>8.2f}" + "".join(f"{v[k]:>16.0%}" for k in names))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "parts": shares} if shares else rows, indent=2))


if __name__ == "__main__":
    main()
