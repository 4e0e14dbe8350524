"""``extender simulate SCENARIO.yaml [--trace CSV] [--strategies a,b] [--seed N] [--json] [--out DIR]``.

Loads the scenario (every problem reported as ``file:line: path: message``), replays its demand
through each strategy, and prints a table (or, with ``--json``, exactly the figures of
:data:`extender.sim.report.FIGURES` per strategy). ``--out DIR`` also writes ``report.md`` with the
table, a demand-vs-capacity plot per workload and a startup-time plot (PNG), and ``summary.json``.
A progress bar goes to stderr on long runs in a terminal. When the scenario has a ``truth``
(extender.sim.truth), the table is followed by the estimate error of new replicas over the run,
per strategy (also written to ``estimate-error.md`` with ``--out``).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from extender.core.errors import UnknownNameError
from extender.process import current_logging
from extender.sim.progress import Progress
from extender.sim.report import Report, build, markdown, table, to_json
from extender.sim.scenario import load_scenario
from extender.sim.simulation import RunResult, prepare, simulate
from extender.sim.strategies import STRATEGIES
from extender.sim.truth import error_over_time, error_table


def register(subparsers: Any) -> None:
    """Add the ``simulate`` command to the CLI's subparsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "simulate", help="replay demand through default, cache-aware, predictive and oracle strategies",
        description="Replay a scenario's demand on a simulated cluster through each strategy and compare "
                    "SLO attainment, queueing delay, cold starts, startup time and GPU-hours.")
    p.add_argument("scenario", metavar="SCENARIO.yaml", help="scenario file (fleet, workloads, demand)")
    p.add_argument("--trace", metavar="CSV", help="replace the first workload's demand with this CSV trace")
    p.add_argument("--strategies", metavar="A,B,...",
                   help=f"comma-separated subset of {','.join(STRATEGIES)} (default: the scenario's)")
    p.add_argument("--seed", type=int, metavar="N", help="override the scenario's seed")
    p.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    p.add_argument("--out", metavar="DIR", help="also write report.md, summary.json and PNG plots here")
    p.set_defaults(handler=run)


def strategy_list(text: str | None, default: tuple[str, ...]) -> list[str]:
    """Parse ``--strategies``; an unknown name is an :class:`UnknownNameError` naming the known ones."""
    if text is None:
        return list(default)
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        if n not in STRATEGIES:
            raise UnknownNameError(f"no strategy {n!r} (known: {', '.join(STRATEGIES)})")
    if not names:
        raise UnknownNameError(f"--strategies is empty (known: {', '.join(STRATEGIES)})")
    return list(dict.fromkeys(names))


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9.-]+", "-", name.lower()).strip("-") or "workload"


def write_outputs(out: Path, report: Report, runs: list[RunResult]) -> list[Path]:
    """``report.md``, ``summary.json`` and the PNG plots in ``out`` (created if missing)."""
    from extender.sim import plots

    out.mkdir(parents=True, exist_ok=True)
    images: list[tuple[str, str]] = []
    written: list[Path] = []
    for w in runs[0].workloads if runs else []:
        path = plots.capacity_plot(runs, w.name, out / f"capacity-{_slug(w.name)}.png")
        images.append((f"Demand and ready capacity: {w.name}", path.name))
        written.append(path)
    path = plots.startup_plot(runs, out / "startup.png")
    images.append(("Startup time of the pods placed", path.name))
    written.append(path)
    md = out / "report.md"
    md.write_text(markdown(report, images, {k: s.summary for k, s in STRATEGIES.items()}), encoding="utf-8")
    js = out / "summary.json"
    js.write_text(to_json(report) + "\n", encoding="utf-8")
    return [md, js, *written]


#: Spans of the run the estimate error is shown in.
ERROR_SPANS = 8


def error_section(runs: list[RunResult], duration_s: float, spans: int = ERROR_SPANS) -> str:
    """The estimate error of the pods each strategy placed, per span of the run (extender.sim.truth)."""
    import numpy as np

    rows = []
    for r in runs:
        placed = np.concatenate([w.placed_s for w in r.workloads]) if r.workloads else np.zeros(0)
        believed = np.concatenate([w.believed_s for w in r.workloads]) if r.workloads else np.zeros(0)
        true = np.concatenate([w.startups for w in r.workloads]) if r.workloads else np.zeros(0)
        rows.append((r.strategy.name, error_over_time(placed, believed, true, duration_s, spans)))
    return error_table(rows)


def run(args: argparse.Namespace) -> int:
    """The ``simulate`` command."""
    if args.out:
        from extender.sim import plots

        plots.require()  # before minutes of simulation, not after
    loaded = load_scenario(args.scenario)
    names = strategy_list(args.strategies, loaded.scenario.strategies)
    prepared = prepare(loaded, trace=args.trace, seed=args.seed)
    # no bar with JSON logs: every line on stderr is then a JSON object
    progress = Progress(names, prepared.n_ticks, enabled=False if current_logging()[1] == "json" else None)
    try:
        runs = simulate(prepared, names, progress.update)
    finally:
        progress.close()
    sc = loaded.scenario
    title = sc.metadata.name or Path(args.scenario).stem
    notes = [f"demand of {prepared.workloads[0].profile.name} replaced by {args.trace}"] if args.trace else []
    credits = [w.arrivals.credit for w in prepared.workloads if w.arrivals.credit]
    report = build(title, sc.slo.queue_delay, prepared.duration_s, runs, credits=credits, notes=notes)
    errors = error_section(runs, prepared.duration_s) if sc.truth is not None else ""
    if args.out:
        write_outputs(Path(args.out), report, runs)
        if errors:
            (Path(args.out) / "estimate-error.md").write_text(f"```\n{errors}\n```\n", encoding="utf-8")
    print(to_json(report) if args.json else table(report))
    if errors and not args.json:
        print(f"\n{errors}")
    return 0
