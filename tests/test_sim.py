"""The simulator end to end: a hand-computed run, conservation, determinism, oracle >= predictive, the CLI.

The bundled scenarios run in full in ``extender simulate`` (docs/simulator.md); here the four-day
``mixed-fleet`` is cut to its first day so the suite stays fast (the oracle's bound is checked on
that day and on the whole ``azure-code-sample``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from extender.core.errors import ExtenderError, InvalidValueError, UnknownNameError
from extender.process import setup_logging
from extender.sim import commands
from extender.sim.errors import TraceError
from extender.sim.report import FIGURES, WORKLOADS_KEY, Report, Summary, build, gap_closed, gap_line, summarise, to_json
from extender.sim.scenario import LoadedScenario, load_scenario
from extender.sim.simulation import Prepared, RunResult, prepare, simulate

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"

# ---------------------------------------------------------------------------------------------
# A scenario small enough to compute by hand
# ---------------------------------------------------------------------------------------------

TINY_POLICY = """\
apiVersion: extender.io/v1alpha1
kind: Policy
nodeClasses:
  - name: box
    matchLabels: {kind: box}
    gpu: {product: test-gpu, count: 1}
    nvme: {capacity: 0}                       # nothing is cached but the image
    network: {nic: 800Mbps, objectStorePerStream: 80Mbps, imagePull: 80Mbps}
profiles:
  - name: svc
    match: {labels: {app: svc}}
    image: {reference: "example/svc:1", size: 300MB}
    weights: {source: "s3://m/", version: v1, bytes: 150MB, shardFiles: 1, loaderConcurrency: 1}
    compile: {cold: 10s, warm: 1s}           # no key: always compiled
    graphCapture: 0s
    engineInit: 5s
    capacity: {perReplica: 1, unit: requests/s}
"""

TINY_SCENARIO = """\
apiVersion: extender.io/v1alpha1
kind: Scenario
policy: policy.yaml
slo: {queueDelay: 10s}
cluster:
  nodes:
    - nodeClass: box
      count: 2
      warm: [{workload: svc, nodes: [0], caches: [image]}]
workloads:
  - name: svc
    minReplicas: 1
    maxReplicas: 2
    initialReplicas: 1
    demand: {trace: {path: step.csv}}
strategies: [default]
"""

# 1 request/s for a minute, then 2 requests/s; the last row holds for the median interval (60 s)
STEP_TRACE = "timestamp,rate\n0,1\n60,2\n120,2\n180,2\n240,2\n"


def write_tiny(tmp_path: Path) -> Path:
    (tmp_path / "policy.yaml").write_text(TINY_POLICY)
    (tmp_path / "step.csv").write_text(STEP_TRACE)
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_SCENARIO)
    return path


def test_a_target_utilization_that_underflows_asks_for_the_most_replicas(tmp_path: Path) -> None:
    # capacity x targetUtilization underflowed to 0 (both accepted: each only needs to be > 0) and the
    # claim's reactive need became NaN: a traceback mid-run; it is now the most the workload takes
    path = write_tiny(tmp_path)
    (tmp_path / "policy.yaml").write_text(TINY_POLICY + "scaling: {targetUtilization: 1e-320}\n")
    (run,) = simulate(prepare(load_scenario(path)), ["predictive"])
    tl = run.workloads[0].timeline
    assert (tl.ready + tl.starting + tl.pending).max() == 2  # maxReplicas


def test_tiny_step_matches_hand_computation(tmp_path: Path) -> None:
    prepared = prepare(load_scenario(write_tiny(tmp_path)))
    # 300 s of trace (4 rows of 60 s + the last one) at 15 s ticks
    assert prepared.n_ticks == 20
    (run,) = simulate(prepared, ["default"])
    w = run.workloads[0]
    tl = w.timeline

    # Initial replica at t = 0: LeastAllocated is 0 on both 1-GPU nodes ((1 - 1) x 100 // 1); ImageLocality
    # gives box-00 (image 300 MB on 1 of 2 nodes): scaled = 1.5e8 B; 100 x (1.5e8 - 23 MiB) // (977 MiB) = 12.
    # So it runs on box-00 and serves 1 request/s = the demand until t = 60: no queue.
    assert tl.queue[:5].tolist() == [0.0] * 5
    # t = 75: the tick 60-75 brought 30 requests for 15 of capacity: queue 15, demand 2/s.
    # HPA: usage = 2 + 15 / 60 (queueDrain) = 2.25 -> ratio 2.25 vs 1 replica, outside 0.1 -> ceil(2.25) = 3,
    # scale-up limit max(1 + 4, 2 x 1) = 5, maxReplicas 2 -> 2. The new pod goes to box-01 (the only free GPU):
    # image 3e8 B / 1e7 B/s = 30 s, weights 1.5e8 / min(1e8, 1 x 1e7) = 15 s, compile 10 s, graph 0, init 5 s
    # -> 60 s, ready at 135.
    assert w.startups.tolist() == [60.0]
    assert w.cold.tolist() == [True]
    assert tl.ready.tolist() == [1] * 9 + [2] * 11          # serves 2/s from the tick at 135 s
    assert tl.starting[5:9].tolist() == [1, 1, 1, 1]
    # Queue grows by 30 - 15 = 15 per tick for the 5 ticks 60..135, then stays: 2/s in, 2/s out.
    assert tl.queue[4:10].tolist() == [0.0, 15.0, 30.0, 45.0, 60.0, 75.0]
    assert tl.queue[10:].tolist() == [75.0] * 10
    # Conservation: 60 + 2 x 240 = 540 arrived, 75 still queued, 465 served.
    assert (w.arrived, w.served, w.queued) == (540.0, 465.0, 75.0)
    # Delays (5 s fluid bins, each at its midpoint): a request arriving at a in [60, 97.5] starts at
    # 60 + 2 (a - 60) (capacity 1/s, clock C(t) = t), i.e. waits a - 60; later ones wait 37.5 s
    # (C(s) = 135 + 2 (s - 135) = position 2a - 60). Bins 60 and 65 (mids 62.5, 67.5: 2.5 s, 7.5 s)
    # meet the 10 s SLO, with the 60 requests before the step: 80 / 540.
    s = summarise(run.workloads, 10.0)
    assert s.slo_attainment == pytest.approx(80 / 540)
    assert (s.p50_delay_s, s.p95_delay_s, s.p99_delay_s) == pytest.approx((37.5, 37.5, 37.5))
    served = w.delays.delay_s[~np.isnan(w.delays.delay_s)]
    assert sorted(set(np.round(served, 6)))[:4] == [0.0, 2.5, 7.5, 12.5]
    # GPU time: pod 1 for 300 s, pod 2 from 75 s: 525 GPU-s; busy 465 requests x 1 s: idle 60 GPU-s.
    assert s.gpu_hours == pytest.approx(525 / 3600)
    assert s.idle_gpu_hours == pytest.approx(60 / 3600)
    assert (s.cold_starts, s.mean_startup_s, s.p95_startup_s) == (1, 60.0, 60.0)
    # Created at 75 s and placed in the same tick (a GPU was free): Ready 60 s after its creation.
    assert w.ready_waits.tolist() == [60.0]
    assert (s.mean_ready_s, s.p95_ready_s, s.pods_ready) == (60.0, 60.0, 1)


# ---------------------------------------------------------------------------------------------
# The bundled scenarios
# ---------------------------------------------------------------------------------------------


def cut(loaded: LoadedScenario, seconds: float) -> LoadedScenario:
    return LoadedScenario(loaded.scenario.model_copy(update={"duration": seconds}), loaded.policy, loaded.source,
                          loaded.base_dir)


@pytest.fixture(scope="module")
def fleet_day() -> tuple[Prepared, list[RunResult]]:
    prepared = prepare(cut(load_scenario(SCENARIOS / "mixed-fleet.yaml"), 86_400.0))
    return prepared, simulate(prepared, ["default", "cache-aware", "predictive", "oracle"])


@pytest.fixture(scope="module")
def azure() -> tuple[Prepared, list[RunResult]]:
    prepared = prepare(load_scenario(SCENARIOS / "azure-code-sample.yaml"))
    return prepared, simulate(prepared, ["default", "cache-aware", "predictive", "oracle"])


def test_requests_are_conserved(fleet_day: tuple[Prepared, list[RunResult]],
                                azure: tuple[Prepared, list[RunResult]]) -> None:
    for prepared, runs in (fleet_day, azure):
        for run in runs:
            for setup, w in zip(prepared.workloads, run.workloads, strict=True):
                # arrived counts from the demand itself, served and queued from the queue's state
                assert w.arrived == pytest.approx(setup.arrivals.total)
                assert w.served + w.queued == pytest.approx(w.arrived)
                # service never exceeds ready capacity in any tick (a request counts when its service
                # begins, so one more may begin in a tick than the tick's capacity completes)
                served_per_tick = np.diff(w.timeline.served)
                slack = 1e-6 if setup.arrivals.fluid else 1.0
                assert np.all(served_per_tick <= w.timeline.capacity * run.tick_s + slack)
    # the request trace: one arrival per CSV row (700 rows in the slice)
    rows = (SCENARIOS / "traces" / "azure-code-slice.csv").read_text().count("\n") - 1
    assert azure[1][0].workloads[0].arrived == rows == 700


def test_oracle_attains_at_least_the_predictive_slo(fleet_day: tuple[Prepared, list[RunResult]],
                                                     azure: tuple[Prepared, list[RunResult]]) -> None:
    for prepared, runs in (fleet_day, azure):
        slo = prepared.scenario.slo.queue_delay
        by_name = {r.strategy.name: summarise(r.workloads, slo) for r in runs}
        assert by_name["oracle"].slo_attainment >= by_name["predictive"].slo_attainment


def test_a_seed_gives_the_same_run(tmp_path: Path) -> None:
    loaded = cut(load_scenario(SCENARIOS / "mixed-fleet.yaml"), 4 * 3600.0)

    def once(seed: int) -> str:
        prepared = prepare(loaded, seed=seed)
        runs = simulate(prepared, ["default", "predictive"])
        return to_json(build("t", 10.0, prepared.duration_s, runs))

    first = once(3)
    assert once(3) == first
    assert once(4) != first  # the seed reaches demand and placement


def test_json_has_exactly_the_figures(azure: tuple[Prepared, list[RunResult]]) -> None:
    prepared, runs = azure
    doc = json.loads(to_json(build("t", prepared.scenario.slo.queue_delay, prepared.duration_s, runs)))
    assert list(doc) == ["default", "cache-aware", "predictive", "oracle"]
    for figures in doc.values():
        assert tuple(figures) == (*FIGURES, WORKLOADS_KEY)
        assert list(figures[WORKLOADS_KEY]) == [w.profile.name for w in prepared.workloads]
        for per in figures[WORKLOADS_KEY].values():
            assert tuple(per) == FIGURES


def test_the_upper_covers_the_mean_demand_over_its_grid_step(fleet_day: tuple[Prepared, list[RunResult]]) -> None:
    # the policy's forecast grid is 5 minutes: a forecast is of the mean over the step around its time.
    # Checked against the one tick at its time instead (a 15 s rate, far noisier), the same uppers
    # covered 81-84% of a day; against the step's mean, about the 95% they are asked for
    prepared, runs = fleet_day
    assert prepared.policy.scaling.step == 300.0
    predictive = next(r for r in runs if r.strategy.name == "predictive")
    for w in predictive.workloads:
        assert w.upper_checked > 1000, w.name  # a forecast every four ticks of a day
        assert 0.9 <= w.upper_covered / w.upper_checked <= 0.99, w.name
    assert all(w.upper_checked == 0 for r in runs if r.strategy.name != "predictive" for w in r.workloads)


@pytest.fixture(scope="module")
def flagship_hours() -> tuple[Prepared, list[RunResult]]:
    """Two hours of the flagship: autoscaled pools, so provisioned GPUs are the cost."""
    prepared = prepare(cut(load_scenario(SCENARIOS / "flagship.yaml"), 2 * 3600.0))
    return prepared, simulate(prepared, ["default", "predictive"])


@pytest.fixture(scope="module")
def flagship_hours_drained() -> tuple[Prepared, list[RunResult]]:
    """The same two hours with every pool consolidating under-used nodes: pods are disrupted."""
    loaded = cut(load_scenario(SCENARIOS / "flagship.yaml"), 2 * 3600.0)
    nodes = tuple(g.model_copy(update={"consolidation_policy": "WhenEmptyOrUnderutilized"})
                  for g in loaded.scenario.cluster.nodes)
    cluster = loaded.scenario.cluster.model_copy(update={"nodes": nodes})
    scenario = loaded.scenario.model_copy(update={"cluster": cluster})
    prepared = prepare(LoadedScenario(scenario, loaded.policy, loaded.source, loaded.base_dir))
    return prepared, simulate(prepared, ["default", "predictive"])


@pytest.mark.parametrize("world", ["fleet_day", "flagship_hours", "flagship_hours_drained"])
def test_per_workload_figures_combine_to_the_totals(world: str, request: pytest.FixtureRequest) -> None:
    prepared, runs = request.getfixturevalue(world)
    if world.startswith("flagship_hours"):
        assert all(r.fleet_gpu_seconds is not None for r in runs)  # the case this row is for
    if world == "flagship_hours_drained":
        assert all(r.nodes_consolidated > 0 for r in runs)  # and this one's
    doc = json.loads(to_json(build("t", prepared.scenario.slo.queue_delay, prepared.duration_s, runs)))
    for strategy, totals in doc.items():
        per = list(totals[WORKLOADS_KEY].values())
        assert len(per) >= 2, strategy
        rounding = 1e-3 * len(per)  # each figure is rounded to 3 decimals in the JSON
        for figure in ("requests", "pods_started", "pods_ready", "cold_starts", "disrupted_pods"):
            assert totals[figure] == pytest.approx(sum(w[figure] for w in per), abs=rounding), (strategy, figure)
        # nodes drained are the fleet's, as unheld GPU time: no workload's
        assert all(w["consolidated_nodes"] == 0 for w in per), strategy
        # the GPU cost: what each workload's pods hold, plus what provisioned nodes hold for nobody
        assert all(w["unheld_gpu_hours"] == 0 for w in per), strategy
        for figure in ("gpu_hours", "idle_gpu_hours"):
            owned = sum(w[figure] for w in per) + totals["unheld_gpu_hours"]
            assert totals[figure] == pytest.approx(owned, abs=rounding), (strategy, figure)
        # shares: weighted by requests; the mean startup: by pods started
        met = sum(w["slo_attainment"] * w["requests"] for w in per) / totals["requests"]
        assert totals["slo_attainment"] == pytest.approx(met, abs=1e-5), strategy
        started = [w for w in per if w["pods_started"]]
        mean = sum(w["mean_startup_s"] * w["pods_started"] for w in started) / totals["pods_started"]
        assert totals["mean_startup_s"] == pytest.approx(mean, abs=rounding), strategy
        # the mean pod created -> Ready: weighted by the pods that became Ready
        ready = [w for w in per if w["pods_ready"]]
        assert ready, strategy
        mean = sum(w["mean_ready_s"] * w["pods_ready"] for w in ready) / totals["pods_ready"]
        assert totals["mean_ready_s"] == pytest.approx(mean, abs=rounding), strategy
        assert totals["pods_ready"] <= totals["pods_started"], strategy
        # the upper's coverage: over the scaler's forecasts, which only the predictive scaler makes
        assert totals["upper_checks"] == sum(w["upper_checks"] for w in per), strategy
        checked = [w for w in per if w["upper_checks"]]
        assert bool(checked) == (strategy == "predictive"), strategy
        if checked:
            covered = sum(w["upper_coverage"] * w["upper_checks"] for w in checked) / totals["upper_checks"]
            assert totals["upper_coverage"] == pytest.approx(covered, abs=rounding), strategy
        else:
            assert totals["upper_coverage"] is None, strategy
        # a percentile of the whole lies between the workloads' own
        for figure in ("p50_delay_s", "p95_delay_s", "p99_delay_s", "p95_startup_s", "p95_ready_s"):
            values = [w[figure] for w in per if w[figure] is not None]
            assert min(values) - rounding <= totals[figure] <= max(values) + rounding, (strategy, figure)


# ---------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------


def cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="extender")
    commands.register(parser.add_subparsers())
    args = parser.parse_args(["simulate", *argv])
    result: int = args.handler(args)
    return result


def test_cli_prints_the_table_and_writes_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert cli(str(write_tiny(tmp_path)), "--out", str(out), "--strategies", "default,predictive") == 0
    text = capsys.readouterr().out
    assert "default" in text and "SLO met" in text
    assert {p.name for p in out.iterdir()} == {"report.md", "summary.json", "capacity-svc.png", "gpus.png",
                                               "startup.png"}
    report = (out / "report.md").read_text()
    assert "![" in report
    summary = json.loads((out / "summary.json").read_text())
    checks = {k: v["upper_checks"] for k, v in summary.items() if isinstance(v, dict) and "upper_checks" in v}
    for strategy, n in checks.items():  # the upper's coverage is said for the strategies that forecast
        assert (f"`{strategy}`: the forecast's upper quantile covered" in report) == (n > 0), strategy
    assert any(checks.values())
    assert "forecasts, asked 95 %)." in report  # read against the policy's level (the default quantile)
    assert (out / "startup.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_json_strategies_and_trace_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = write_tiny(tmp_path)
    flat = tmp_path / "flat.csv"
    flat.write_text("timestamp,rate\n0,0.5\n300,0.5\n")
    assert cli(str(scenario), "--json", "--strategies", "default,cache-aware", "--trace", str(flat)) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc) == ["default", "cache-aware"]
    assert doc["default"]["slo_attainment"] == 1.0  # half a replica's capacity: nobody waits


def two_workloads(tmp_path: Path) -> Path:
    """The tiny scenario with a second workload ``api`` (its own profile, synthetic demand)."""
    scenario = write_tiny(tmp_path)
    api = TINY_POLICY.split("profiles:\n")[1].replace("name: svc", "name: api").replace("app: svc", "app: api")
    (tmp_path / "policy.yaml").write_text(TINY_POLICY + api)
    scenario.write_text(TINY_SCENARIO.replace("strategies:", "  - name: api\n    minReplicas: 1\n    maxReplicas: 1\n"
                                              "    demand: {synthetic: {duration: 5m, base: 0.2}}\nstrategies:"))
    return scenario


#: A rate file whose columns the reader does not know: 600 s steps, 3,600 requests in 30 min.
ISSUE_RATES = "timestamp_s,arrival_rate\n0,2\n600,3\n1200,1\n"


def test_cli_trace_per_workload_with_column_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = two_workloads(tmp_path)
    flat = tmp_path / "flat.csv"
    flat.write_text("timestamp,rate\n0,0.5\n300,0.5\n")
    rates = tmp_path / "rates.csv"
    rates.write_text(ISSUE_RATES)
    setup_logging()  # the demand lines in text, whatever an earlier test set up
    assert cli(str(scenario), "--json", "--trace", f"svc={flat}",
               "--trace", f"api={rates},timeColumn=timestamp_s,rateColumn=arrival_rate") == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    per = doc["default"][WORKLOADS_KEY]
    # svc: 0.5/s for 600 s (two rows, the last holding for the median interval: 300 s each);
    # api: 2, 3, 1 /s for 600 s each, cut at the end of the run (the longest trace: 1,800 s)
    assert per["svc"]["requests"] == pytest.approx(300.0)
    assert per["api"]["requests"] == pytest.approx(3600.0)
    assert f"demand api: 3,600 requests over 30.0 min, mean 2/s, peak 3/s (busiest minute); from trace {rates}, " \
           "read as rows of rates" in captured.err
    # the same through the options that apply to every --trace file
    assert cli(str(scenario), "--json", "--strategies", "default", "--trace", f"api={rates}",
               "--time-column", "timestamp_s", "--rate-column", "arrival_rate") == 0
    assert json.loads(capsys.readouterr().out)["default"][WORKLOADS_KEY]["api"]["requests"] == pytest.approx(3600.0)


class BadTraceArg(NamedTuple):
    name: str
    args: tuple[str, ...]
    error: type[Exception]
    message: str


BAD_TRACE_ARGS = [
    BadTraceArg("unknown workload", ("--trace", "nope={rates}"), UnknownNameError,
                "no workload 'nope' (known: svc, api)"),
    BadTraceArg("two traces for one workload", ("--trace", "api={rates}", "--trace", "api={rates}"),
                InvalidValueError, "two traces for workload 'api'"),
    # an unknown field, a value its field refuses and an empty file name are usage errors now:
    # tests/test_cli_conventions.py; options without a trace: test_cli_trace_options_without_a_trace
    # the issue's file with the time column only: read as requests it would be 3 requests
    BadTraceArg("ambiguous trace", ("--trace", "api={rates}", "--time-column", "timestamp_s"), TraceError,
                "read as requests (one per row) the file is 3 requests over 20.0 min"),
    # Path.exists() raised OSError (ENAMETOOLONG) on Python 3.11: a traceback instead of the file's problem
    BadTraceArg("a name too long for the system", ("--trace", "api=" + "a" * 5000), TraceError,
                "cannot read: File name too long"),
    BadTraceArg("a FIFO", ("--trace", "api={fifo}"), TraceError, "not a regular file"),
]


@pytest.mark.parametrize("case", BAD_TRACE_ARGS, ids=[c.name for c in BAD_TRACE_ARGS])
def test_cli_bad_trace_arguments(tmp_path: Path, case: BadTraceArg) -> None:
    scenario = two_workloads(tmp_path)
    rates = tmp_path / "rates.csv"
    rates.write_text(ISSUE_RATES)
    fifo = tmp_path / "fifo.csv"
    os.mkfifo(fifo)
    with pytest.raises(case.error) as info:
        cli(str(scenario), *(a.format(rates=rates, fifo=fifo) for a in case.args))
    assert case.message in str(info.value)


@pytest.mark.parametrize(("args", "message"), [
    # exit 1 with "--time-scale only apply to a --trace file": a usage error, and not grammatical
    pytest.param(("--time-scale", "2"), "--time-scale applies only to a --trace file", id="one option"),
    pytest.param(("--time-column", "ts", "--load-scale", "2"), "--time-column and --load-scale apply only to a "
                 "--trace file", id="two options"),
])
def test_cli_trace_options_without_a_trace_are_a_usage_error(tmp_path: Path, args: tuple[str, ...], message: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(str(write_tiny(tmp_path)), *args) == 2
    assert f"extender simulate: {message}" in capsys.readouterr().err


class BadSeed(NamedTuple):
    name: str
    seed: str
    message: str


BAD_SEEDS = [
    # numpy's generators take seeds >= 0: a negative one was a traceback once the demand was drawn
    BadSeed("negative", "-1", "'-1' must be >= 0"),
    BadSeed("not a number", "x", "'x' is not a whole number"),
]


@pytest.mark.parametrize("case", BAD_SEEDS, ids=[c.name for c in BAD_SEEDS])
def test_cli_bad_seed_is_a_usage_error(tmp_path: Path, case: BadSeed, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli(str(write_tiny(tmp_path)), "--seed", case.seed)
    assert info.value.code == 2
    assert f"argument --seed: {case.message}" in capsys.readouterr().err


def test_cli_logs_the_demand_before_simulating(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = two_workloads(tmp_path)
    try:
        setup_logging("info", "text")
        assert cli(str(scenario), "--strategies", "default") == 0
        text = capsys.readouterr().err.splitlines()
        setup_logging("info", "json")
        assert cli(str(scenario), "--strategies", "default") == 0
        records = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    finally:
        setup_logging()
    # svc: the step trace, 1/s for 60 s then 2/s for 240 s: 540 requests over 300 s, busiest minute 2/s
    assert text[0] == ("demand svc: 540 requests over 5.0 min, mean 1.8/s, peak 2/s (busiest minute); "
                       "from trace step.csv, read as rows of rates")
    assert text[1].startswith("demand api: ") and "from synthetic" in text[1]
    by_workload = {r["workload"]: r for r in records if "demand_kind" in r}
    assert set(by_workload) == {"svc", "api"}
    svc = by_workload["svc"]
    assert (svc["requests"], svc["duration_s"], svc["mean_rps"], svc["peak_rps"]) == (540.0, 300.0, 1.8, 2.0)
    assert svc["demand_kind"] == "rate" and svc["message"] == text[0] and svc["level"] == "INFO"
    # the api workload's synthetic 0.2/s for 5 min
    assert by_workload["api"]["mean_rps"] == pytest.approx(0.2, rel=0.3)


def test_gap_closed_is_the_share_of_the_oracle_gap(azure: tuple[Prepared, list[RunResult]]) -> None:
    prepared, runs = azure
    report = build("t", prepared.scenario.slo.queue_delay, prepared.duration_s, runs)
    s = report.summaries
    expected = (s["predictive"].slo_attainment - s["default"].slo_attainment) / (
        s["oracle"].slo_attainment - s["default"].slo_attainment)
    assert report.gap is not None and math.isclose(report.gap, expected)


def _attaining(slo: float) -> Summary:
    nan = math.nan
    return Summary(slo, nan, nan, nan, 0, nan, nan, nan, nan, 0.0, 0.0, 0.0, 1.0, 0, 0, nan, 0)


@pytest.mark.parametrize(("default", "predictive", "oracle", "gap"), [
    pytest.param(0.90, 0.95, 1.00, 0.5, id="half-the-gap"),
    pytest.param(0.90, 1.00, 0.95, 2.0, id="predictive-above-the-oracle"),
    pytest.param(0.848, 0.902, 0.837, None, id="oracle-below-default-has-no-gap"),
    pytest.param(0.90, 0.95, 0.90, None, id="oracle-equal-to-default-has-no-gap"),
])
def test_gap_closed_only_when_the_oracle_is_above_default(default: float, predictive: float, oracle: float,
                                                         gap: float | None) -> None:
    report = Report("t", 10.0, 60.0, {"default": _attaining(default), "predictive": _attaining(predictive),
                                      "oracle": _attaining(oracle)}, {}, None, (), ())
    got = gap_closed(report.summaries)
    assert got == (None if gap is None else pytest.approx(gap))
    line = gap_line(dataclasses.replace(report, gap=got))
    assert ("n/a" in line) == (gap is None) and "recovers -" not in line


def test_the_horizon_startup_is_the_production_scalers() -> None:
    from extender.core.placement import next_replica
    from extender.sim.simulation import Run
    from extender.sim.strategies import STRATEGIES

    prepared = prepare(cut(load_scenario(SCENARIOS / "mixed-fleet.yaml"), 3 * 3600.0))
    run = Run(prepared, STRATEGIES["predictive"])
    run.run()
    now = prepared.duration_s
    for w in run.w:
        w.next_startup = None
        ours = run._startup_next(w.setup.index, now)
        theirs = next_replica(prepared.policy, w.setup.profile, run.cluster.planning_snapshot(now), now)
        assert ours == pytest.approx(theirs.startup_s)


def test_lora_tenants_the_warmer_stages_adapters_before_the_replicas_need_them() -> None:
    # Every node starts with the image, weights and compile cache, none with an adapter: a start is
    # cold only for lacking adapters, and the only thing the warmer can stage is adapters.
    prepared = prepare(cut(load_scenario(SCENARIOS / "lora-tenants.yaml"), 6 * 3600.0))
    default, predictive = simulate(prepared, ["default", "predictive"])
    cold_default = sum(int(w.cold.sum()) for w in default.workloads)
    cold_predictive = sum(int(w.cold.sum()) for w in predictive.workloads)
    assert default.warm_actions == 0 and cold_default > 0
    assert predictive.warm_actions > 0 and cold_predictive < cold_default


# ---------------------------------------------------------------------------------------------
# Plots' data
# ---------------------------------------------------------------------------------------------


class Axis(NamedTuple):
    name: str
    n_ticks: int
    tick_s: float
    label: str
    last: float


AXES = [
    Axis("an hour in hours", 240, 15.0, "hours", 239 * 15 / 3600),
    Axis("two days in hours", 11_520, 15.0, "hours", 11_519 * 15 / 3600),
    Axis("14 days in days", 80_640, 15.0, "days", 80_639 * 15 / 86400),
]


@pytest.mark.parametrize("case", AXES, ids=[c.name for c in AXES])
def test_long_runs_are_plotted_in_days(case: Axis) -> None:
    from extender.sim.plots import time_axis

    x, label = time_axis(case.n_ticks, case.tick_s)
    assert label == case.label and len(x) == case.n_ticks
    assert x[0] == 0.0 and x[-1] == pytest.approx(case.last)


def test_a_startup_plot_without_pods_writes_no_warning(tmp_path: Path) -> None:
    """With no pod placed matplotlib warned (plain text on stderr, even with --log-format json) that the
    legend had nothing to show."""
    from extender.sim.plots import startup_plot

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = startup_plot([], tmp_path / "startup.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_gpu_plot_data_is_the_gpu_hours(fleet_day: tuple[Prepared, list[RunResult]]) -> None:
    from extender.sim.plots import used_gpus

    prepared, runs = fleet_day
    fleet = commands.fleet_gpus(prepared)
    # mixed-fleet's node groups, GPUs per node from the policy's classes
    assert fleet == sum(g.count * prepared.policy.node_class(g.node_class).gpu.count
                        for g in prepared.scenario.cluster.nodes)
    for run in runs:
        used = used_gpus(run)
        # the GPUs pods hold, per tick, integrate to the GPU-hours the report counts
        assert used.sum() * run.tick_s == pytest.approx(sum(w.gpu_seconds for w in run.workloads))
        provisioned, tracked = commands.provisioned_gpus(run, fleet)
        assert np.all(used <= provisioned)
        if not tracked:
            assert np.all(provisioned == fleet)


class BadOut(NamedTuple):
    name: str
    out: str  # {tmp}: the test's directory
    message: str


BAD_OUTS = [
    # the directory was created after the simulation: a traceback (FileExistsError) minutes later
    BadOut("an existing file", "{tmp}/tiny.yaml", "--out {tmp}/tiny.yaml: exists and is not a directory"),
    BadOut("below a file", "{tmp}/tiny.yaml/report", "--out {tmp}/tiny.yaml/report: cannot create the directory: "
           "Not a directory"),
    BadOut("where nothing can be created", "/proc/extender-report", "--out /proc/extender-report: cannot create "
           "the directory: No such file or directory"),
]


@pytest.mark.parametrize("case", BAD_OUTS, ids=[c.name for c in BAD_OUTS])
def test_cli_an_out_that_cannot_be_a_directory_is_refused_before_simulating(
        tmp_path: Path, case: BadOut, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = write_tiny(tmp_path)
    with pytest.raises(InvalidValueError) as info:
        cli(str(scenario), "--out", case.out.format(tmp=tmp_path), "--strategies", "default")
    assert str(info.value) == case.message.format(tmp=tmp_path)
    assert capsys.readouterr().out == ""  # refused before the simulation, which prints its table


# ---- an interrupted run leaves no directory it created ---------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
#: A run of about a minute: the interrupt lands while it simulates.
LONG_SCENARIO = ROOT / "scenarios" / "flagship.yaml"


@pytest.mark.parametrize(("out", "existed"), [
    pytest.param("report", False, id="a-directory-it-created"),
    pytest.param("new/deeper/report", False, id="a-directory-and-its-parents-it-created"),
    pytest.param("report", True, id="a-directory-that-was-there-stays"),
])
def test_ctrl_c_during_a_run_leaves_no_directory_it_created(tmp_path: Path, out: str, existed: bool) -> None:
    # --out was created up front (so a bad one is refused before minutes of simulating), and an
    # interrupted run left it there, empty
    target = tmp_path / out
    if existed:
        target.mkdir()
        (target / "notes.txt").write_text("mine\n")
    child = subprocess.Popen(
        # SIGINT as a terminal's Ctrl-C finds it: a shell's background job (a CI runner's, say) starts
        # with SIGINT ignored, and Python then installs no KeyboardInterrupt for it
        [sys.executable, "-c", "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
         "from extender.cli import main; sys.exit(main(sys.argv[1:]))",
         "simulate", str(LONG_SCENARIO), "--out", str(target), "--log-format", "json", "--log-level", "info"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        assert child.stderr is not None
        for line in child.stderr:  # the demand is logged just before the simulation starts
            if "demand_source" in line:
                break
        else:
            pytest.fail(f"simulate ended before it simulated: {child.wait()}")
        assert target.is_dir()
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 130, err
    assert "extender: interrupted" in err
    if existed:
        assert [p.name for p in target.iterdir()] == ["notes.txt"]
    else:
        assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == []


def test_a_run_that_fails_before_it_writes_leaves_no_directory_it_created(tmp_path: Path) -> None:
    scenario = tmp_path / "bad.yaml"
    scenario.write_text("apiVersion: extender.io/v1alpha1\nkind: Scenario\n")
    out = tmp_path / "made" / "report"
    with pytest.raises(ExtenderError):
        cli(str(scenario), "--out", str(out))
    assert not (tmp_path / "made").exists()


def test_a_run_that_fails_while_it_writes_takes_back_what_it_wrote(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    out = tmp_path / "report"
    monkeypatch.setattr(commands, "markdown", interrupted)  # the plots are written, report.md is not
    with pytest.raises(KeyboardInterrupt):
        cli(str(write_tiny(tmp_path)), "--out", str(out), "--strategies", "default")
    assert not out.exists()
