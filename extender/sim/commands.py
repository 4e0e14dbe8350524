"""``extender simulate SCENARIO.yaml [--trace [WORKLOAD=]CSV ...] [--strategies a,b] [--seed N] [--json] [--out DIR]``.

Loads the scenario (every problem reported as ``file:line: path: message``) and the demand of each
workload, logs one line per workload with the demand loaded (requests, mean and peak rate, duration:
through the ``extender.cli`` logger, so a JSON record with ``--log-format json``), replays it
through each strategy, and prints a table (or, with ``--json``, exactly the figures of
:data:`extender.sim.report.FIGURES` per strategy and per workload of each strategy).

``--trace WORKLOAD=CSV`` (repeatable) replaces that workload's demand with a CSV trace;
``--trace CSV`` the first workload's. The trace options (``--trace-format``, ``--time-column``,
``--rate-column``, ``--load-scale``, ``--time-scale``) apply to every ``--trace`` file, on top of
the workload's own ``trace`` settings in the scenario when it has them; ``,FIELD=VALUE`` after a
file sets a scenario trace field for that file only (``--trace api=r.csv,rateColumn=rps``).

``--out DIR`` also writes ``report.md`` with the table, PNG plots (per workload: demand vs ready
capacity, waiting requests and pending pods; the fleet's provisioned vs used GPUs; startup times),
and ``summary.json``.
A progress bar goes to stderr on long runs in a terminal. When the scenario has a ``truth``
(extender.sim.truth), the table is followed by the estimate error of new replicas over the run,
per strategy (also written to ``estimate-error.md`` with ``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from extender.arguments import FLAG_CHECK, comma_list, duration_or_zero_up_to, finite_number, flag_problem, whole_number
from extender.core.document import describe, format_path
from extender.core.errors import InvalidValueError, UnknownNameError
from extender.core.units import format_duration
from extender.process import current_logging
from extender.process import report as tell
from extender.sim.progress import Progress
from extender.sim.report import Report, build, markdown, table, to_json
from extender.sim.scenario import MAX_SPAN_S, Scenario, TraceSpec, load_scenario
from extender.sim.simulation import Prepared, RunResult, prepare, simulate
from extender.sim.strategies import STRATEGIES
from extender.sim.traces import demand_summary

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray
from extender.sim.truth import error_over_time, error_table


def register(subparsers: Any) -> None:
    """Add the ``simulate`` command to the CLI's subparsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "simulate", help="replay demand through default, cache-aware, predictive and oracle strategies",
        description="Replay a scenario's demand on a simulated cluster through each strategy and compare "
                    "SLO attainment, queueing delay, cold starts, startup time and GPU-hours.")
    p.add_argument("scenario", metavar="SCENARIO.yaml", help="scenario file (fleet, workloads, demand)")
    p.add_argument("--trace", metavar="[WORKLOAD=]CSV[,FIELD=VALUE...]", action="append", default=[], type=trace_text,
                   help="replace WORKLOAD's demand (without WORKLOAD=: the first workload's) with this CSV "
                        f"trace; repeatable; FIELD: {', '.join(TRACE_FIELDS)} (as in a scenario's trace)")
    p.add_argument("--trace-format", choices=("auto", "requests", "rate"),
                   help="how to read every --trace file: one request per row, or rows of rates (default: auto, "
                        "which refuses a file it cannot be sure about)")
    p.add_argument("--time-column", metavar="NAME", help="the time column of every --trace file")
    p.add_argument("--rate-column", metavar="NAME",
                   help="the rate column (requests/s) of every --trace file; makes it a rate trace")
    p.add_argument("--load-scale", type=trace_option("loadScale"), metavar="X",
                   help="multiply the load of every --trace file")
    p.add_argument("--time-scale", type=trace_option("timeScale"), metavar="X",
                   help="stretch the clock of every --trace file (0.001: timestamps in milliseconds)")
    p.add_argument("--strategies", type=strategy_names, metavar="A,B,...",
                   help=f"comma-separated subset of {','.join(STRATEGIES)} (default: the scenario's)")
    p.add_argument("--seed", type=whole_number(0), metavar="N",
                   help="override the scenario's seed (a whole number >= 0)")
    p.add_argument("--history", type=duration_or_zero_up_to(MAX_SPAN_S), metavar="DURATION",
                   help="override the scenario's history: demand the scaler has seen before t = 0 (1d: a "
                        "scaler that has run for a day; 0: one installed at t = 0; at most "
                        f"{format_duration(MAX_SPAN_S)}, as in a scenario)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    p.add_argument("--out", metavar="DIR", type=_report_dir,
                   help="also write report.md, summary.json and PNG plots here")
    p.set_defaults(handler=run, **{FLAG_CHECK: check_flags})


def check_flags(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """What ``simulate`` refuses to start with (exit 2), or ``None``: the options of every ``--trace``
    file given without one."""
    given = [f"--{attr.replace('_', '-')}" for attr, _ in TRACE_OPTIONS if getattr(args, attr, None) is not None]
    if given and not args.trace:
        verb = "applies" if len(given) == 1 else "apply"
        return f"{' and '.join(given)} {verb} only to a --trace file, and none is given"
    return None


def _report_dir(text: str) -> str:
    """``--out``: a directory name; an empty one (it wrote nothing, silently, exit 0) is refused."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty: name a directory for the report")
    return text


def _exists(path: str) -> bool:
    """Whether ``path`` names something; a name the system refuses (too long, a NUL) names nothing."""
    try:
        return Path(path).exists()
    except (OSError, ValueError):
        return False


#: ``--trace`` options and the TraceSpec fields (camelCase) they set.
TRACE_OPTIONS = (("trace_format", "format"), ("time_column", "timeColumn"), ("rate_column", "rateColumn"),
                 ("load_scale", "loadScale"), ("time_scale", "timeScale"))
#: The fields a ``--trace`` file may set for itself (``,FIELD=VALUE``).
TRACE_FIELDS = ("format", "timeColumn", "rateColumn", "loadScale", "timeScale", "credit")


def _trace_fields(text: str) -> tuple[str, dict[str, str]]:
    """``[WORKLOAD=]CSV[,field=value...]`` -> (``[WORKLOAD=]CSV``, fields); a file that exists under the
    whole text is taken whole. :class:`InvalidValueError` for an item that is not ``FIELD=VALUE``."""
    head, *extra = [text] if _exists(text) else text.split(",")
    fields: dict[str, str] = {}
    for item in extra:
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in TRACE_FIELDS:
            raise InvalidValueError(f"{item!r} is not FIELD=VALUE with FIELD one of {', '.join(TRACE_FIELDS)}")
        fields[key.strip()] = value.strip()
    return head, fields


def _field_problems(exc: ValidationError) -> str:
    """A trace spec's validation errors in a line: ``field: message; ...``."""
    return "; ".join(f"{format_path(e['loc'])}: {describe(e, TraceSpec)}" for e in exc.errors())


def trace_text(text: str) -> str:
    """``--trace``: refuses, as a usage error (exit 2) before anything runs, a malformed ``,FIELD=VALUE``
    item, a value its field does not take, and a text that names no file; the workload's name is
    checked against the scenario once it is read (:func:`trace_specs`)."""
    try:
        head, fields = _trace_fields(text)
    except InvalidValueError as exc:
        raise argparse.ArgumentTypeError(f"{text}: {exc}") from None
    _, sep, path = head.partition("=")
    if not head or (sep and not path and not _exists(head)):
        raise argparse.ArgumentTypeError(f"{text!r} names no file: expected [WORKLOAD=]CSV")
    try:
        TraceSpec.model_validate({**fields, "path": head})
    except ValidationError as exc:
        raise argparse.ArgumentTypeError(f"{text}: {_field_problems(exc)}") from None
    return text


def trace_option(field: str) -> Callable[[str], float]:
    """An argparse type for the option that sets ``field`` of every ``--trace`` file (``--load-scale``,
    ``--time-scale``): a finite number > 0 within the field's own bounds, refused as a usage error
    before anything runs (a value past them was refused only once the scenario was read, exit 1,
    as a problem of the ``--trace`` file rather than of the flag)."""
    number = finite_number(0, above=True)

    def parse(text: str) -> float:
        value = number(text)
        try:
            TraceSpec.model_validate({field: value, "path": "-"})
        except ValidationError as exc:
            raise argparse.ArgumentTypeError(_field_problems(exc)) from None
        return value
    return parse


def _split_trace(text: str, names: list[str]) -> tuple[str, str, dict[str, str]]:
    """``[WORKLOAD=]CSV[,field=value...]`` -> (workload, path, fields); see :func:`trace_specs`."""
    try:
        head, fields = _trace_fields(text)
    except InvalidValueError as exc:
        raise InvalidValueError(f"--trace {text}: {exc}") from None
    name, sep, path = head.partition("=")
    if not sep or name not in names:
        if sep and not _exists(head):
            raise UnknownNameError(f"--trace {text}: no workload {name!r} (known: {', '.join(names)})")
        name, path = names[0], head
    return name, path, fields


def trace_specs(args: argparse.Namespace, scenario: Scenario) -> dict[str, TraceSpec]:
    """The trace spec of each workload named by ``--trace [WORKLOAD=]CSV[,FIELD=VALUE...]``.

    ``WORKLOAD=CSV`` is read as such when WORKLOAD is one of the scenario's workloads; otherwise the
    text is the first workload's file (so a file name with ``=`` still works) unless no such file
    exists, which is an :class:`UnknownNameError` naming the workloads. ``,FIELD=VALUE`` items set the
    trace fields of the scenario (``timeColumn``, ``rateColumn``, ``format``, ``loadScale``,
    ``timeScale``, ``credit``) for that file only (a file that exists under the whole text is taken
    whole). Each spec starts from the workload's ``trace`` in the scenario (when it has one), then the
    ``--trace-format``/``--time-column``/... options, then the file's own fields.
    """
    names = [w.name for w in scenario.workloads]
    options = {field: getattr(args, attr) for attr, field in TRACE_OPTIONS if getattr(args, attr, None) is not None}
    specs: dict[str, TraceSpec] = {}
    for text in args.trace:
        name, path, fields = _split_trace(text, names)
        if name in specs:
            raise InvalidValueError(f"--trace: two traces for workload {name!r}")
        workload = next(w for w in scenario.workloads if w.name == name)
        base = workload.demand.trace.model_dump(by_alias=True) if workload.demand.trace is not None else {}
        try:
            specs[name] = TraceSpec.model_validate({**base, **options, **fields, "path": path})
        except ValidationError as exc:
            raise InvalidValueError(f"--trace {text}: {_field_problems(exc)}") from None
    return specs


def log_demand(prepared: Prepared) -> None:
    """One line per workload with the demand loaded (extender.sim.traces.DemandSummary), before the run."""
    for w in prepared.workloads:
        d = demand_summary(w.profile.name, w.arrivals, prepared.duration_s)
        tell(d.line(), level=logging.INFO, workload=d.workload, demand_source=d.source, demand_kind=d.kind,
               requests=d.requests, duration_s=d.duration_s, mean_rps=d.mean_rps, peak_rps=d.peak_rps)


def strategy_names(text: str) -> list[str]:
    """``--strategies``: comma-separated strategy names, each once. An unknown name or an empty list
    is a usage error (exit 2, like every malformed flag), naming the known strategies."""
    names = comma_list(text)
    unknown = [n for n in names if n not in STRATEGIES]
    if unknown or not names:
        what = f"no strategy {unknown[0]!r}" if unknown else "empty"
        raise argparse.ArgumentTypeError(f"{what} (known: {', '.join(STRATEGIES)})")
    return names


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9.-]+", "-", name.lower()).strip("-") or "workload"


def fleet_gpus(prepared: Prepared) -> int:
    """GPUs of the fleet the scenario starts with."""
    return sum(prepared.policy.node_class(n.node_class).gpu.count for n in prepared.nodes)


def provisioned_gpus(run: RunResult, fleet: int) -> tuple[NDArray[np.float64], bool]:
    """GPUs provisioned per tick of a run, and whether the run tracked them: the run's own count when
    it has one (``RunResult.fleet_gpus``, with autoscaled node pools), else the fixed fleet's GPUs."""
    import numpy as np

    if len(run.fleet_gpus) == run.n_ticks:
        return run.fleet_gpus.astype(np.float64), True
    return np.full(run.n_ticks, float(fleet)), False


def write_outputs(out: Path, report: Report, runs: list[RunResult], fleet: int = 0,
                  written: list[Path] | None = None) -> list[Path]:
    """``report.md``, ``summary.json`` and the PNG plots in ``out`` (created if missing). ``fleet``: the
    fleet's GPUs, plotted as provisioned for runs that do not track provisioned GPUs themselves.
    ``written``: a list each file is added to as it is written (what an interrupted write leaves)."""
    from extender.sim import plots

    out.mkdir(parents=True, exist_ok=True)
    images: list[tuple[str, str]] = []
    written = [] if written is None else written
    start = len(written)
    for w in runs[0].workloads if runs else []:
        path = plots.capacity_plot(runs, w.name, out / f"capacity-{_slug(w.name)}.png")
        images.append((f"Demand, ready capacity and what waits: {w.name}", path.name))
        written.append(path)
    if runs:
        provisioned = [provisioned_gpus(r, fleet) for r in runs]
        note = "" if all(t for _, t in provisioned) else "a fixed fleet: provisioned = every node's GPUs"
        path = plots.gpu_plot(runs, [p for p, _ in provisioned], out / "gpus.png", note=note)
        images.append(("GPUs provisioned vs held by pods", path.name))
        written.append(path)
    path = plots.startup_plot(runs, out / "startup.png")
    images.append(("Startup time of the pods placed", path.name))
    written.append(path)
    md = out / "report.md"
    written.append(md)
    md.write_text(markdown(report, images, {k: s.summary for k, s in STRATEGIES.items()}), encoding="utf-8")
    js = out / "summary.json"
    written.append(js)
    js.write_text(to_json(report) + "\n", encoding="utf-8")
    return [md, js, *written[start:-2]]


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


class OutputDir:
    """``--out``'s directory, created now (with its parents) so that a path that cannot be one (an
    existing file, a file on the way, a read-only place) is refused before minutes of simulation:
    :class:`~extender.core.errors.InvalidValueError` naming it.

    A run that does not finish (Ctrl-C, a bad scenario, a failed write) leaves no directory it created:
    leaving the ``with`` block by an exception removes the files written into :attr:`written` if
    :attr:`path` was created here, then each directory created here that is empty, deepest first. A
    directory that was there before is never removed, nor anything in it that was not written here.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.path = Path(text)
        #: Files written so far (:func:`write_outputs` adds each before writing it).
        self.written: list[Path] = []
        #: The directories this run created, deepest first.
        self.created: list[Path] = []

    def __enter__(self) -> OutputDir:
        missing = [d for d in (self.path, *self.path.parents) if not _exists(str(d))]
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise InvalidValueError(f"--out {self.text}: exists and is not a directory") from None
        except OSError as exc:
            self.created = [d for d in missing if d.is_dir()]  # a parent made before the failure
            self._remove()
            raise InvalidValueError(f"--out {self.text}: cannot create the directory: {exc.strerror or exc}") from None
        self.created = missing
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if kind is not None:
            self._remove()

    def _remove(self) -> None:
        if self.path in self.created:
            for file in self.written:
                with contextlib.suppress(OSError):
                    file.unlink(missing_ok=True)
        for directory in self.created:
            with contextlib.suppress(OSError):  # not empty (someone else's file), or gone already
                directory.rmdir()


def run(args: argparse.Namespace) -> int:
    """The ``simulate`` command."""
    if problem := flag_problem(args):
        tell(f"extender simulate: {problem}")
        return 2
    if not args.out:
        return _run(args, None)
    from extender.sim import plots

    plots.require()  # before minutes of simulation, not after
    with OutputDir(args.out) as out:
        return _run(args, out)


def _run(args: argparse.Namespace, out: OutputDir | None) -> int:
    loaded = load_scenario(args.scenario)
    if args.history is not None:
        loaded = dataclasses.replace(loaded, scenario=loaded.scenario.model_copy(update={"history": args.history}))
    names = args.strategies or list(loaded.scenario.strategies)
    traces = trace_specs(args, loaded.scenario)
    prepared = prepare(loaded, traces=traces, seed=args.seed)
    log_demand(prepared)
    # no bar with JSON logs: every line on stderr is then a JSON object
    progress = Progress(names, prepared.n_ticks, enabled=False if current_logging()[1] == "json" else None)
    try:
        runs = simulate(prepared, names, progress.update)
    finally:
        progress.close()
    sc = loaded.scenario
    title = sc.metadata.name or Path(args.scenario).stem
    notes = [f"demand of {name} replaced by {spec.path}" for name, spec in traces.items()]
    if prepared.history_s:
        notes.append(f"the scaler's forecasts started from {format_duration(prepared.history_s)} of demand seen "
                     "before t = 0 (the scenario's history)")
    credits = [w.arrivals.credit for w in prepared.workloads if w.arrivals.credit]
    report = build(title, sc.slo.queue_delay, prepared.duration_s, runs, credits=credits, notes=notes,
                   quantile=prepared.policy.scaling.quantile)
    errors = error_section(runs, prepared.duration_s) if sc.truth is not None else ""
    if out is not None:
        try:
            write_outputs(out.path, report, runs, fleet_gpus(prepared), out.written)
            if errors:
                out.written.append(out.path / "estimate-error.md")
                out.written[-1].write_text(f"```\n{errors}\n```\n", encoding="utf-8")
        except OSError as exc:  # the directory taken away or filled meanwhile
            where = exc.filename or args.out
            raise InvalidValueError(f"--out {args.out}: cannot write {where}: {exc.strerror or exc}") from None
    print(to_json(report) if args.json else table(report))
    if errors and not args.json:
        print(f"\n{errors}")
    return 0
