"""The simulator's inputs: trace files (edge cases, located errors), synthetic demand, scenario validation,
and the FIFO queue against a slow per-request reference.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from extender.sim.errors import ScenarioError, TraceError
from extender.sim.queueing import FifoQueue
from extender.sim.scenario import SyntheticSpec, TraceSpec, load_scenario
from extender.sim.synthetic import rate_trace
from extender.sim.traces import (
    AZURE_CREDIT,
    Arrivals,
    RateTrace,
    RequestTrace,
    arrivals_from,
    demand_summary,
    read_trace,
)

ROOT = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------------------------
# Traces
# ---------------------------------------------------------------------------------------------


def trace(tmp_path: Path, text: str, **spec: object) -> RequestTrace | RateTrace:
    path = tmp_path / "t.csv"
    path.write_text(text)
    return read_trace(path, TraceSpec.model_validate({"path": str(path), **spec}))


def test_azure_format_loads_as_is_and_is_credited() -> None:
    t = read_trace(ROOT / "scenarios/traces/azure-code-slice.csv", TraceSpec(path="x"))
    assert isinstance(t, RequestTrace)
    assert len(t.times) == 700
    assert t.times[0] == 0.0 and np.all(np.diff(t.times) >= 0)
    # first two rows: 18:17:03.9799600 and 18:17:04.0319600 -> 0.052 s apart (7 fractional digits kept)
    assert t.times[1] == pytest.approx(0.052)
    assert t.credit == AZURE_CREDIT


def test_bundled_rates_are_the_whole_trace_binned_as_the_script_bins_it(tmp_path: Path) -> None:
    """``azure-code-rates.csv`` (the whole trace, made with scripts/trace_rates.py) starts with the
    slice's requests: the script run on the slice gives the same rows for every second the slice
    covers whole, and no more than the bundled row for the second it ends in."""
    out = tmp_path / "slice-rates.csv"
    subprocess.run([sys.executable, str(ROOT / "scripts/trace_rates.py"),
                    str(ROOT / "scenarios/traces/azure-code-slice.csv"), str(out)], check=True, capture_output=True)
    part = read_trace(out, TraceSpec(path="x"))
    whole = read_trace(ROOT / "scenarios/traces/azure-code-rates.csv", TraceSpec(path="x"))
    assert isinstance(part, RateTrace) and isinstance(whole, RateTrace)
    assert part.rates.sum() == 700  # every request of the slice, in 1 s bins
    assert whole.rates.sum() == 8819 and whole.end == len(whole.rates) == 3436  # 57 minutes
    assert np.array_equal(part.starts, whole.starts[:len(part.starts)])
    assert np.array_equal(part.rates[:-1], whole.rates[:len(part.rates) - 1])
    assert 0 < part.rates[-1] <= whole.rates[len(part.rates) - 1]


def test_trace_rates_at_a_coarser_step_are_the_one_second_rows_summed(tmp_path: Path) -> None:
    """``--step 5`` gives each 5 s the mean of its five 1 s rows: the same requests, binned coarser."""
    script, slice_csv = str(ROOT / "scripts/trace_rates.py"), str(ROOT / "scenarios/traces/azure-code-slice.csv")
    fine, coarse = tmp_path / "1s.csv", tmp_path / "5s.csv"
    subprocess.run([sys.executable, script, slice_csv, str(fine)], check=True, capture_output=True)
    subprocess.run([sys.executable, script, slice_csv, str(coarse), "--step", "5"], check=True, capture_output=True)
    one, five = (read_trace(f, TraceSpec(path="x")) for f in (fine, coarse))
    assert isinstance(one, RateTrace) and isinstance(five, RateTrace)
    padded = np.pad(one.rates, (0, -len(one.rates) % 5))
    assert five.starts.tolist() == [5.0 * k for k in range(len(five.rates))]
    assert np.allclose(five.rates, padded.reshape(-1, 5).mean(axis=1))
    assert five.rates.sum() * 5 == pytest.approx(700)


class Credited(NamedTuple):
    id: str
    suffix: str  # what follows the file in --trace
    shown: str | None  # the "demand data:" line of the report, None: no such line


CREDITED = [
    # docs/simulator.md's command for the bundled rates file
    Credited("rates with a credit", ",credit=Azure Public Dataset (Microsoft) CC-BY 4.0",
             "demand data: Azure Public Dataset (Microsoft) CC-BY 4.0"),
    # a rate file carries no credit of its own (scenarios/traces/README.md)
    Credited("rates without one", "", None),
]


@pytest.mark.parametrize("case", CREDITED, ids=[c.id for c in CREDITED])
def test_a_trace_credit_given_on_the_command_line_is_shown(case: Credited,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from extender import cli
    rates, scenario = ROOT / "scenarios/traces/azure-code-rates.csv", ROOT / "scenarios/azure-code-sample.yaml"
    assert cli.main(["simulate", str(scenario), "--trace", f"{rates}{case.suffix}"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("demand data:")]
    assert lines == ([] if case.shown is None else [case.shown])


def test_seconds_and_iso_timestamps_give_the_same_trace(tmp_path: Path) -> None:
    iso = trace(tmp_path, "time,x\n2024-01-01T00:00:10Z,a\n2024-01-01T00:00:12.5Z,b\n2024-01-01 00:01:10,c\n")
    secs = trace(tmp_path, "ts\n1000\n1002.5\n1060\n")
    assert isinstance(iso, RequestTrace) and isinstance(secs, RequestTrace)
    assert iso.times.tolist() == secs.times.tolist() == [0.0, 2.5, 60.0]


def test_unsorted_requests_are_sorted(tmp_path: Path) -> None:
    t = trace(tmp_path, "timestamp\n30\n10\n20\n10\n")
    assert isinstance(t, RequestTrace)
    assert t.times.tolist() == [0.0, 0.0, 10.0, 20.0]


def test_rate_trace_steps_and_scales(tmp_path: Path) -> None:
    raw = trace(tmp_path, "timestamp,rate\n0,2\n60,4\n120,1\n")
    assert isinstance(raw, RateTrace)
    t = raw.scaled(TraceSpec.model_validate({"path": "x", "loadScale": 3, "timeScale": 2}))
    # time x 2: starts 0, 120, 240; the last holds for the (scaled) median interval: end 360
    assert t.starts.tolist() == [0.0, 120.0, 240.0] and t.end == 360.0
    # rate x 3 / 2: the same requests over a clock twice as long, three times the load
    assert t.rates.tolist() == [3.0, 6.0, 1.5]
    a = arrivals_from(t, bin_s=60.0)
    # 60 s bins: 180 / 180 / 360 / 360 / 90 / 90; total = 3 x (2 + 4 + 1) x 60 = 1260
    assert a.weights.tolist() == [180.0, 180.0, 360.0, 360.0, 90.0, 90.0]
    assert a.total == pytest.approx(1260.0)


def test_request_load_scale_thins_and_replicates_with_a_seed(tmp_path: Path) -> None:
    t = trace(tmp_path, "t\n" + "\n".join(str(i) for i in range(1000)) + "\n")
    assert isinstance(t, RequestTrace)
    spec = TraceSpec.model_validate({"path": "x", "loadScale": 2.5})
    a = t.scaled(spec, np.random.default_rng(1))
    b = t.scaled(spec, np.random.default_rng(1))
    assert a.times.tolist() == b.times.tolist()
    assert 2400 < len(a.times) < 2600  # 2 copies each + a third with probability 0.5
    assert np.all(np.diff(a.times) >= 0)


class BadTrace(NamedTuple):
    name: str
    text: str
    line: int | None
    message: str


BAD_TRACES = [
    BadTrace("empty file", "", None, "the file is empty"),
    BadTrace("header only", "timestamp,rate\n", None, "no rows"),
    # it held for 1 s, a made-up interval: five requests of a 5 req/s trace
    BadTrace("one rate row", "timestamp,rate\n0,5\n", 2, "a rate trace needs at least two rows"),
    BadTrace("no time column", "when,rate\n1,2\n", 1, "no time column"),
    BadTrace("bad timestamp", "timestamp\n1\n2\nlater\n4\n", 4, "'later' is not a number"),
    BadTrace("bad iso timestamp", "timestamp\n2024-01-01T00:00:00\n2024-13-45T00:00:00\n", 3, "not an ISO-8601"),
    BadTrace("missing column", "timestamp,rate\n0,1\n60\n", 3, "the row has 1 columns, the header has 2"),
    BadTrace("bad rate", "timestamp,rate\n0,1\n60,fast\n", 3, "rate 'fast' is not a number"),
    BadTrace("negative rate", "timestamp,rate\n0,1\n\n60,-2\n", 4, "must be a finite number >= 0"),
    BadTrace("duplicate interval", "timestamp,rate\n0,1\n60,2\n0,3\n", 4, "same time as line 2"),
    BadTrace("request row missing a column", "timestamp,tokens\n0,12\n\n# note\n7\n9,3\n", 5,
             "the row has 1 columns, the header has 2"),
    BadTrace("request row with an extra column", "timestamp,tokens\n0,12\n7,1,1\n", 3,
             "the row has 3 columns, the header has 2"),
    BadTrace("ISO request row missing a column", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
             "2023-11-16 18:17:03.97,10,2\n2023-11-16 18:17:04.03,8\n", 3, "the row has 2 columns, the header has 3"),
    # bounds: a span the simulation cannot cover used to allocate one bin per second of it, or overflow to inf
    BadTrace("span of a thousand years", "timestamp\n0\n3e10\n", 3, "the trace spans 3e+10 s from its earliest row"),
    BadTrace("span past float64", "timestamp\n-1e308\n1e308\n", 3, "beyond float64's range"),
    BadTrace("span over 366 days", "timestamp,rate\n0,1\n31708800,1\n", 3, "more than the 366.0 d"),
    # numpy reads '5' as the year 5: a number among ISO times was a silent span of two millennia
    BadTrace("a number among ISO times", "timestamp\n2024-01-01T00:00:00\n5\n", 3,
             "timestamp '5' is outside the times a trace may hold"),
    # datetime64[ns] ends in 1677 and 2262, and numpy wrapped a time beyond without a word
    BadTrace("an ISO time past 2262", "timestamp\n9999-01-01T00:00:00\n9999-01-01T00:01:00\n", 2,
             "timestamp '9999-01-01T00:00:00' is outside the times a trace may hold, 1677-09-21T00:12:44 to"),
    BadTrace("an ISO time before 1677", "timestamp,rate\n2024-01-01,1\n1500-01-01,1\n", 3,
             "'1500-01-01' is outside the times a trace may hold"),
    BadTrace("the last second datetime64[ns] holds", "timestamp\n2262-04-11T23:47:14\n2262-04-11T23:47:16.5\n",
             3, "outside the times a trace may hold"),
    BadTrace("a rate past the bound", "timestamp,rate\n0,1\n60,1e308\n", 3, "rate 1e+308 is more than"),
    BadTrace("duplicate column", "ts,rate,Rate\n0,1,2\n", 1, "column 'Rate' is in the header twice"),
    # numpy read the column as 64-byte strings: a padded timestamp lost its last digits (3000 read as 30)
    BadTrace("timestamp padded past 64 characters", "timestamp\n0\n" + " " * 62 + "3000\n", 3,
             "the timestamp field is 66 characters long, more than the 64"),
    # numpy's "Found an unquoted embedded newline", without a line: the slow path splits at a bare CR too
    BadTrace("rows ended by CR alone after an LF header", "timestamp\n1\r2\r3\r4\n", 2, "CR alone"),
    BadTrace("lines ended by CR alone", "timestamp,rate\r0,1\r60,2\r", 1, "CR alone"),
    # Python's float() reads these, numpy does not: "cannot parse the rows from line 2: could not convert
    # string '１' to float64 at row 1, column 2.", without the line
    BadTrace("a full-width digit in a rate", "timestamp,rate\n0,1\n60,１\n", 3, "rate '１' is not a number"),
    BadTrace("an underscore in a rate", "timestamp,rate\n0,1\n60,1_000\n", 3, "rate '1_000' is not a number"),
    BadTrace("an Arabic-Indic digit in a timestamp", "t\n0\n٣\n", 3, "timestamp '٣' is not a number"),
]


@pytest.mark.parametrize("case", BAD_TRACES, ids=[c.name for c in BAD_TRACES])
def test_bad_traces_name_the_line(tmp_path: Path, case: BadTrace) -> None:
    with pytest.raises(TraceError) as info:
        trace(tmp_path, case.text)
    (problem,) = info.value.problems
    assert problem.line == case.line
    assert case.message in problem.message
    assert str(problem).startswith(str(tmp_path / "t.csv"))


class BadScale(NamedTuple):
    name: str
    text: str
    spec: dict[str, object]
    line: int | None
    message: str


BAD_SCALES = [
    # a trace within the bounds that timeScale or loadScale takes past them
    BadScale("stretched past 366 days", "timestamp\n0\n86400\n", {"timeScale": 1000}, 3,
             "with timeScale 1000 from its earliest row"),
    BadScale("rate scaled past the bound", "timestamp,rate\n0,1\n60,2\n", {"loadScale": 1e9}, 3,
             "rate 2 (x loadScale / timeScale = 1e+09)"),
    # np.repeat of 1e9 copies per request: tens of GiB before anything else happened
    BadScale("requests replicated past the bound", "timestamp\n0\n1\n", {"loadScale": 2e8}, None,
             "2 requests x loadScale 2e+08"),
    # the product overflowed to inf: refused, but numpy's "RuntimeWarning: overflow" lines went to stderr first
    BadScale("a rate near float64's largest, scaled", "timestamp,rate\n0,1\n60,1e308\n", {"loadScale": 10}, 3,
             "rate 1e+308 (x loadScale / timeScale = 10) is more than"),
]


@pytest.mark.parametrize("case", BAD_SCALES, ids=[c.name for c in BAD_SCALES])
def test_scales_past_the_bounds_are_refused(tmp_path: Path, case: BadScale) -> None:
    with pytest.raises(TraceError) as info, warnings.catch_warnings():
        warnings.simplefilter("error")  # one located line, and nothing else printed
        trace(tmp_path, case.text, **case.spec)
    (problem,) = info.value.problems
    assert problem.line == case.line
    assert case.message in problem.message


class Blank(NamedTuple):
    name: str
    text: str


#: Lines every reader skips but numpy.loadtxt read as a row of one blank field: the trace was refused
#: with "cannot parse the rows from line 2: invalid column index 1 at row 2 with 1 columns", no line.
BLANK_LINES = [
    Blank("a line of spaces", "timestamp,rate\n0,1\n   \n60,2\n"),
    Blank("a line of a tab, CRLF", "timestamp,rate\r\n0,1\r\n\t\r\n60,2\r\n"),
    Blank("an indented comment", "timestamp,rate\n0,1\n  # a gap in the logs\n60,2\n"),
    Blank("a line of spaces in a request trace", "t\n0\n \n5\n7\n"),
    Blank("spaces as the last line", "t\n0\n5\n7\n  "),
]


@pytest.mark.parametrize("case", BLANK_LINES, ids=[c.name for c in BLANK_LINES])
def test_a_line_of_blanks_is_skipped_like_an_empty_one(tmp_path: Path, case: Blank) -> None:
    padded = trace(tmp_path, case.text)
    lines = case.text.replace("\r\n", "\n").split("\n")
    plain = trace(tmp_path, "\n".join(line for line in lines if line.strip() and not line.strip().startswith("#")))
    assert type(padded) is type(plain)
    if isinstance(padded, RateTrace):
        assert isinstance(plain, RateTrace)
        assert (padded.starts.tolist(), padded.rates.tolist()) == (plain.starts.tolist(), plain.rates.tolist())
    else:
        assert isinstance(plain, RequestTrace)
        assert padded.times.tolist() == plain.times.tolist()


def test_milliseconds_within_the_bound_load(tmp_path: Path) -> None:
    """The span bound is on the simulation clock: a day in milliseconds (86,400,000 'seconds') loads
    with timeScale 0.001."""
    t = trace(tmp_path, "epoch_ms\n1700000000000\n1700086400000\n", timeColumn="epoch_ms", timeScale=0.001)
    assert isinstance(t, RequestTrace) and t.times[-1] == 86_400_000.0


class Unreadable(NamedTuple):
    name: str
    make: Callable[[Path], Path]
    line: int | None
    message: str


def _fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo.csv"
    os.mkfifo(path)
    return path


def _written(data: bytes) -> Callable[[Path], Path]:
    def make(tmp_path: Path) -> Path:
        path = tmp_path / "t.csv"
        path.write_bytes(data)
        return path
    return make


UNREADABLE = [
    # opening a FIFO for reading waited for a writer forever
    Unreadable("a FIFO", _fifo, None, "not a regular file"),
    Unreadable("a directory", lambda tmp_path: tmp_path, None, "not a regular file"),
    # readline() without a limit read /dev/zero until memory ran out
    Unreadable("a device", lambda tmp_path: Path("/dev/zero"), None, "not a regular file"),
    # a regular file whose read fails once open (as on a failing disk): an OSError traceback from `simulate`
    Unreadable("a file whose read fails", lambda tmp_path: Path("/proc/self/mem"), None,
               "cannot read: Input/output error"),
    Unreadable("a header without a line end", _written(b"t" * (2 << 20)), 1, "does not end within 1048576 bytes"),
    Unreadable("a row without a line end", _written(b"timestamp\n1\n2\n" + b"3" * (3 << 20)), 4,
               "does not end within 1048576 bytes"),
]


@pytest.mark.parametrize("case", UNREADABLE, ids=[c.name for c in UNREADABLE])
def test_what_is_not_a_csv_file_is_refused_without_waiting(tmp_path: Path, case: Unreadable,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from extender.sim import traces

    monkeypatch.setattr(traces, "BLOCK_BYTES", 1 << 20)  # a block smaller than the long line
    path = case.make(tmp_path)
    with pytest.raises(TraceError) as info:
        read_trace(path, TraceSpec(path="x"))
    (problem,) = info.value.problems
    assert problem.source == str(path) and problem.line == case.line
    assert case.message in problem.message


def test_many_rows_load_without_a_python_loop(tmp_path: Path) -> None:
    # 200,000 ISO rows across several blocks of the reader: a per-row loop would still pass, but the
    # result must be exact at the block seams
    n = 200_000
    base = np.datetime64("2024-03-01T00:00:00", "us")
    stamps = np.datetime_as_string(base + (np.arange(n) * 250_000).astype("timedelta64[us]"), unit="us")
    path = tmp_path / "big.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(f"{s},1,1\n" for s in stamps))
    from extender.sim import traces

    old = traces.BLOCK_BYTES
    traces.BLOCK_BYTES = 1 << 20  # force several blocks
    try:
        t = read_trace(path, TraceSpec(path="x"))
    finally:
        traces.BLOCK_BYTES = old
    assert isinstance(t, RequestTrace)
    assert len(t.times) == n and t.times[-1] == pytest.approx((n - 1) * 0.25)


def test_synthetic_demand_is_seeded_and_follows_its_cycle() -> None:
    spec = SyntheticSpec.model_validate({"duration": "2d", "step": "1h", "base": 10,
                                         "daily": {"amplitude": 0.5, "peak": "14h"}})
    a = rate_trace(spec, np.random.default_rng(1))
    # no noise, no bursts: rate(t) = 10 (1 + 0.5 cos(2 pi (t - 14h) / 1d)): 15 at 14:00, 5 at 02:00
    assert a.rates[14] == pytest.approx(15.0) and a.rates[2] == pytest.approx(5.0)
    noisy = spec.model_copy(update={"noise": 0.2, "bursts": spec.bursts.model_copy(update={"per_day": 4.0})})
    r1, r2 = rate_trace(noisy, np.random.default_rng(9)), rate_trace(noisy, np.random.default_rng(9))
    assert r1.rates.tolist() == r2.rates.tolist()
    assert r1.rates.tolist() != rate_trace(noisy, np.random.default_rng(10)).rates.tolist()


# ---------------------------------------------------------------------------------------------
# Scenario validation
# ---------------------------------------------------------------------------------------------

POLICY = (ROOT / "scenarios/mixed-fleet-policy.yaml").read_text()


class BadScenario(NamedTuple):
    name: str
    text: str
    line: int
    path: str
    message: str


GOOD = """\
apiVersion: extender.io/v1alpha1
kind: Scenario
policy: policy.yaml
slo: {queueDelay: 10s}
cluster:
  nodes:
    - nodeClass: g5.xlarge
      count: 2
workloads:
  - name: llama3-8b
    demand:
      synthetic: {duration: 1h, base: 1}
"""

BAD_SCENARIOS = [
    BadScenario("unknown field", GOOD.replace("slo:", "sloo: 1\nslo:"), 4, "sloo", "unknown field"),
    BadScenario("negative count", GOOD.replace("count: 2", "count: -1"), 8, "cluster.nodes[0].count", "must be >= 0"),
    BadScenario("unknown node class", GOOD.replace("g5.xlarge", "g6.xlarge"), 7, "cluster.nodes[0].nodeClass",
                "no node class 'g6.xlarge'"),
    BadScenario("unknown workload", GOOD.replace("llama3-8b", "llama9"), 10, "workloads[0].name",
                "no profile 'llama9'"),
    BadScenario("both demands", GOOD.replace("      synthetic:", "      trace: {path: t.csv}\n      synthetic:"), 11,
                "workloads[0].demand", "exactly one of trace and synthetic"),
    BadScenario("bad duration", GOOD.replace("1h", "1 fortnight"), 12, "workloads[0].demand.synthetic.duration",
                "not a duration"),
    # it ran nothing and printed an empty table (and `{}` with --json), exit 0; --strategies '' is refused
    BadScenario("no strategy", GOOD + "strategies: []\n", 13, "strategies", "should have at least 1 item"),
    BadScenario("unknown strategy", GOOD + "strategies: [default, psychic]\n", 13, "strategies[1]",
                "no strategy 'psychic'"),
    BadScenario("missing trace file", GOOD.replace("synthetic: {duration: 1h, base: 1}", "trace: {path: gone.csv}"),
                12, "workloads[0].demand.trace.path", "no trace file 'gone.csv'"),
    BadScenario("empty replica range", GOOD.replace("  - name: llama3-8b\n", "  - name: llama3-8b\n    minReplicas: 5\n"
                                                                     "    maxReplicas: 2\n"),
                10, "workloads[0]", "minReplicas 5 is larger than maxReplicas 2"),
    BadScenario("warm node out of range", GOOD.replace("count: 2", "count: 2\n      warm: [{workload: llama3-8b, "
                                                                     "nodes: [5]}]"),
                9, "cluster.nodes[0].warm[0].nodes[0]", "node 5 does not exist"),
    # numpy's generators take seeds >= 0: a negative one was a traceback when the run started
    BadScenario("negative seed", GOOD.replace("slo:", "seed: -1\nslo:"), 4, "seed", "must be >= 0"),
    BadScenario("boolean count", GOOD.replace("count: 2", "count: yes"), 8, "cluster.nodes[0].count",
                "got a boolean"),
    # an infinite capacity or loadScale was a traceback (OverflowError, NaN) in the HPA's arithmetic
    BadScenario("infinite capacity", GOOD.replace("  - name: llama3-8b\n", "  - name: llama3-8b\n    capacity: .inf\n"),
                11, "workloads[0].capacity", "expected a finite number"),
    BadScenario("infinite loadScale", GOOD.replace("synthetic: {duration: 1h, base: 1}",
                                                   "trace: {path: policy.yaml, loadScale: .inf}"),
                12, "workloads[0].demand.trace.loadScale", "expected a finite number"),
    BadScenario("infinite base rate", GOOD.replace("base: 1", "base: .inf"), 12, "workloads[0].demand.synthetic.base",
                "expected a finite number"),
    BadScenario("infinite bursts", GOOD.replace("base: 1", "base: 1, bursts: {perDay: .inf}"), 12,
                "workloads[0].demand.synthetic.bursts.perDay", "expected a finite number"),
    # the HPA's target (capacity x targetUtilization) rounded to 0 milli-units: ZeroDivisionError in the run
    BadScenario("capacity below a milli-unit",
                GOOD.replace("  - name: llama3-8b\n", "  - name: llama3-8b\n    capacity: 1e-300\n"),
                11, "workloads[0].capacity", "must be >= 0.001"),
    BadScenario("targetUtilization below a milli-unit", GOOD + "hpa: {targetUtilization: 1e-13}\n", 13,
                "hpa.targetUtilization", "must be >= 0.001"),
    # a run of 100,000 days, or of 1 ms ticks, allocated past memory or ran for hours before failing
    BadScenario("duration over 366 days", GOOD.replace("slo:", "duration: 100000d\nslo:"), 4, "duration",
                "must be <= 31622400"),
    # each group was capped, the sum was not: five full groups took 16 s and 2 GB before the run began
    BadScenario("more nodes than a scenario may hold in all",
                GOOD.replace("      count: 2\n", "      count: 60000\n    - nodeClass: g5.xlarge\n"
                                                 "      name: pool\n      count: 1\n      maxCount: 40001\n"),
                12, "cluster.nodes[1].maxCount", "can hold 100001 nodes, more than the 100000"),
    BadScenario("millisecond tick", GOOD.replace("slo:", "tick: 1ms\nslo:"), 4, "tick", "must be >= 1"),
    # every replica the HPA asks for is a pod object at once, placed or not: with maxReplicas 1e15 and
    # a demand past the cluster a 10-minute run on 2 nodes created pods until memory ran out
    BadScenario("maxReplicas past the bound", GOOD.replace("  - name: llama3-8b\n",
                                                           "  - name: llama3-8b\n    maxReplicas: 1000000000000000\n"),
                11, "workloads[0].maxReplicas", "must be <= 100000"),
    BadScenario("more replicas than a scenario may have in all",
                GOOD.replace("  - name: llama3-8b\n", "  - name: llama3-8b\n    maxReplicas: 60000\n")
                + "  - name: mixtral-61g\n    maxReplicas: 40001\n    demand: {synthetic: {duration: 1h, base: 1}}\n",
                15, "workloads[1].maxReplicas", "can have 100001 replicas, more than the 100000"),
    BadScenario("history over 366 days", GOOD.replace("slo:", "history: 400d\nslo:"), 4, "history",
                "must be <= 31622400"),
    BadScenario("synthetic demand over 366 days", GOOD.replace("duration: 1h", "duration: 1000d"), 12,
                "workloads[0].demand.synthetic.duration", "must be <= 31622400"),
    BadScenario("millisecond synthetic step", GOOD.replace("duration: 1h", "duration: 1h, step: 1ms"), 12,
                "workloads[0].demand.synthetic.step", "must be >= 1"),
    # both were "no policy file" / "no trace file": a path that is there, only of the wrong kind
    BadScenario("the policy is a device", GOOD.replace("policy: policy.yaml", "policy: /dev/null"), 3, "policy",
                "'/dev/null' is not a regular file (a directory, FIFO or device"),
    BadScenario("the trace is a directory", GOOD.replace("synthetic: {duration: 1h, base: 1}", "trace: {path: .}"),
                12, "workloads[0].demand.trace.path", "'.' is not a regular file (a directory, FIFO or device)"),
]


@pytest.mark.parametrize("case", BAD_SCENARIOS, ids=[c.name for c in BAD_SCENARIOS])
def test_scenario_errors_are_located(tmp_path: Path, case: BadScenario) -> None:
    (tmp_path / "policy.yaml").write_text(POLICY)
    assert_scenario_error(tmp_path / "s.yaml", case.text, case.path, case.line, case.message)


def assert_scenario_error(path: Path, text: str, where: str, line: int, message: str) -> None:
    """Loading ``text`` from ``path`` fails with a problem at ``path:line: where: ...`` saying ``message``."""
    path.write_text(text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    found = [p for p in info.value.problems if p.path == where]
    # that one problem only: a list with one invalid item is not also "too short" (pydantic's count)
    assert found == list(info.value.problems), [str(p) for p in info.value.problems]
    assert found[0].line == line
    assert message in found[0].message
    assert str(found[0]).startswith(f"{path}:{line}: {where}: ")


def test_the_good_scenario_and_the_bundled_ones_load(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text(POLICY)
    (tmp_path / "s.yaml").write_text(GOOD)
    assert load_scenario(tmp_path / "s.yaml").scenario.workloads[0].name == "llama3-8b"
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        if path.name.endswith("-policy.yaml"):
            continue
        assert load_scenario(path).scenario.strategies


def test_a_profile_capacity_below_a_milli_unit_is_refused_in_the_scenario(tmp_path: Path) -> None:
    """The profile's capacity stands in for the workload's: below 0.001 requests/s the HPA's target rounded
    to 0 milli-units (ZeroDivisionError once the run started)."""
    (tmp_path / "policy.yaml").write_text(POLICY.replace("perReplica: 4,", "perReplica: 1e-300,", 1))
    assert_scenario_error(tmp_path / "s.yaml", GOOD, "workloads[0]", 10, "capacity.perReplica of 1e-300 requests/s")


def test_a_policy_error_is_reported_in_the_policy_file(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text(POLICY.replace("count: 4", "count: 0"))
    (tmp_path / "s.yaml").write_text(GOOD)
    with pytest.raises(ScenarioError) as info:
        load_scenario(tmp_path / "s.yaml")
    assert any(str(p).startswith(f"{tmp_path / 'policy.yaml'}:") for p in info.value.problems)


# ---------------------------------------------------------------------------------------------
# The queue against a slow reference
# ---------------------------------------------------------------------------------------------


def reference_delays(times: list[float], rates: list[float], dt: float) -> list[float]:
    """Per request, one at a time: position x_j = max(C(a_j), x_{j-1} + 1) on the capacity clock; service
    begins when C first exceeds x_j, found by walking the ticks."""
    def clock(t: float) -> float:
        c, k = 0.0, 0
        while (k + 1) * dt <= t:
            c += rates[k] * dt
            k += 1
        return c + (rates[k] * (t - k * dt) if k < len(rates) else 0.0)

    out: list[float] = []
    prev = -math.inf
    for a in times:
        x = max(clock(a), prev + 1)
        prev = x
        c, start = 0.0, math.nan
        for k, r in enumerate(rates):
            if c + r * dt > x:
                start = k * dt + (x - c) / r
                break
            c += r * dt
        out.append(start - a)
    return out


def test_queue_delays_match_the_reference() -> None:
    rng = np.random.default_rng(3)
    dt, n = 15.0, 40
    times = np.sort(rng.uniform(0, n * dt, 500))
    rates = rng.choice([0.0, 0.5, 1.0, 2.0], n).tolist()
    from extender.sim.traces import Arrivals

    q = FifoQueue(Arrivals(times, np.ones(len(times)), False, 5.0, float(times[-1])), n, dt)
    for k, r in enumerate(rates):
        q.serve(k, r)
    got = q.delays().delay_s
    want = np.array(reference_delays(times.tolist(), rates, dt))
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.allclose(got[~np.isnan(got)], want[~np.isnan(want)])
    # served by the end = requests whose service began: arrived - queued
    assert q.served(n) == int((~np.isnan(got)).sum())


# ---------------------------------------------------------------------------------------------
# Requests or rates: a file the reader cannot be sure about is an error naming both readings
# ---------------------------------------------------------------------------------------------


class Ambiguous(NamedTuple):
    name: str
    text: str
    spec: dict[str, object]
    #: Both readings, as the message words them.
    readings: tuple[str, ...]
    column: str


AMBIGUOUS = [
    # the case: a rate file named with timeColumn only; 600 s steps, 3 rows
    Ambiguous("rate-like column name", "timestamp_s,arrival_rate\n0,2\n600,3\n1200,1\n",
              {"timeColumn": "timestamp_s"}, ("3 requests over 20.0 min", "3600 requests over 30.0 min"),
              "arrival_rate"),
    Ambiguous("per-second column name", "t,requestsPerSec\n0,1\n5,1\n60,1\n", {},
              ("3 requests over 60 s", "90 requests over 90 s"), "requestsPerSec"),
    Ambiguous("evenly spaced numbers", "ts,value\n0,5\n60,5\n120,5\n", {},
              ("3 requests over 2.0 min", "900 requests over 3.0 min"), "value"),
]


@pytest.mark.parametrize("case", AMBIGUOUS, ids=[c.name for c in AMBIGUOUS])
def test_an_ambiguous_trace_is_an_error_naming_both_readings(tmp_path: Path, case: Ambiguous) -> None:
    with pytest.raises(TraceError) as info:
        trace(tmp_path, case.text, **case.spec)
    (problem,) = info.value.problems
    assert problem.line == 1
    for reading in case.readings:
        assert reading in problem.message
    assert f"rateColumn: {case.column}" in problem.message and "format: requests" in problem.message
    assert f"--rate-column {case.column}" in problem.message


class Sure(NamedTuple):
    name: str
    text: str
    spec: dict[str, object]
    kind: type
    total: float


SURE = [
    Sure("said requests", "timestamp_s,arrival_rate\n0,2\n600,3\n1200,1\n",
         {"timeColumn": "timestamp_s", "format": "requests"}, RequestTrace, 3),
    Sure("said rate column", "timestamp_s,arrival_rate\n0,2\n600,3\n1200,1\n",
         {"timeColumn": "timestamp_s", "rateColumn": "arrival_rate"}, RateTrace, 3600),
    Sure("known rate column", "timestamp,rps\n0,2\n600,3\n", {}, RateTrace, 3000),
    Sure("uneven rows with numbers", "ts,value\n0,5\n1,5\n7,5\n", {}, RequestTrace, 3),
    Sure("evenly spaced token counts", "ts,tokens\n0,5\n60,5\n120,5\n", {}, RequestTrace, 3),
    Sure("evenly spaced, nothing else", "ts\n0\n60\n120\n", {}, RequestTrace, 3),
    Sure("generated is not a rate", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
         "2023-11-16 18:00:00,1,1\n2023-11-16 18:00:01,1,1\n2023-11-16 18:00:02,1,1\n", {}, RequestTrace, 3),
    Sure("quoted commas", 'ts,prompt\n0,"a, b"\n3,"c"\n', {}, RequestTrace, 2),
]


@pytest.mark.parametrize("case", SURE, ids=[c.name for c in SURE])
def test_a_trace_read_one_way_only_loads(tmp_path: Path, case: Sure) -> None:
    t = trace(tmp_path, case.text, **case.spec)
    assert isinstance(t, case.kind)
    total = len(t.times) if isinstance(t, RequestTrace) else float(t.cumulative(np.array([t.end]))[0])
    assert total == pytest.approx(case.total)


# ---------------------------------------------------------------------------------------------
# The demand line printed before a run
# ---------------------------------------------------------------------------------------------


class DemandCase(NamedTuple):
    name: str
    arrivals: Arrivals
    duration_s: float
    line: str


DEMANDS = [
    # 4 requests in 120 s; the busiest minute (60-120 s) has 3
    DemandCase("requests", Arrivals(np.array([0.0, 61.0, 62.0, 119.0]), np.ones(4), False, 5.0, 119.5, "trace r.csv"),
               120.0, "demand w: 4 requests over 2.0 min, mean 0.0333/s, peak 0.05/s (busiest minute); "
                      "from trace r.csv, read as one request per row"),
    # 5 s bins of 10 requests for 10 minutes of a 20-minute trace: the run cuts it
    DemandCase("cut rate",
               Arrivals(np.arange(120, dtype=np.float64) * 5, np.full(120, 10.0), True, 5.0, 1200.0, "trace q.csv"),
               600.0, "demand w: 1,200 requests over 10.0 min, mean 2/s, peak 2/s (busiest minute); "
                      "from trace q.csv, read as rows of rates; the run cuts it from 20.0 min"),
    # 20-minute blocks (a 1 h tick) of 2, 4, 2 requests/s: a block counted whole in the minute it starts
    # said 80/s
    DemandCase("blocks longer than a minute",
               Arrivals(np.arange(3, dtype=np.float64) * 1200, np.array([2400.0, 4800.0, 2400.0]), True, 1200.0,
                        3600.0, "synthetic"),
               3600.0, "demand w: 9,600 requests over 60.0 min, mean 2.67/s, peak 4/s (busiest minute); "
                       "from synthetic"),
    # 40 s blocks of a constant 2/s: a minute holding two block starts said 2.67/s
    DemandCase("blocks across minute boundaries",
               Arrivals(np.arange(90, dtype=np.float64) * 40, np.full(90, 80.0), True, 40.0, 3600.0, "synthetic"),
               3600.0, "demand w: 7,200 requests over 60.0 min, mean 2/s, peak 2/s (busiest minute); from synthetic"),
    DemandCase("short synthetic",
               Arrivals(np.arange(12, dtype=np.float64) * 5, np.full(12, 1.0), True, 5.0, 60.0, "synthetic"),
               600.0, "demand w: 12 requests over 10.0 min, mean 0.02/s, peak 0.2/s (busiest minute); "
                      "from synthetic; it ends after 60 s, and the run goes on without demand"),
]


@pytest.mark.parametrize("case", DEMANDS, ids=[c.name for c in DEMANDS])
def test_the_demand_line_says_what_was_loaded(case: DemandCase) -> None:
    d = demand_summary("w", case.arrivals, case.duration_s)
    assert d.requests == case.arrivals.total and d.mean_rps == pytest.approx(d.requests / case.duration_s)
    assert d.line() == case.line
