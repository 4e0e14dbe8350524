"""Demand traces: CSV files of requests or of rates, read with numpy, and the arrivals they become.

Two kinds of file, both CSV with a header line:

* **requests**: one row per request, a timestamp column (ISO-8601, e.g. ``2023-11-16
  18:17:03.9799600`` or ``...T...Z``, or seconds as a number) and any other columns (ignored). The
  Azure LLM inference trace format (``TIMESTAMP,ContextTokens,GeneratedTokens``) loads as is.
* **rate**: one row per interval, a timestamp (the interval's start) and a rate in requests/s. The
  rate holds until the next row; the last row holds for the median interval (two rows at least).

``format: auto`` picks *rate* when the header has a rate column (``rate``, ``rps``, ``qps``,
``requests_per_second``, or ``rateColumn``), else *requests*, unless it cannot be sure: the file
then is an error that names both readings (how many requests each gives) and how to choose. It is
not sure when another column's name has a word that suggests a rate (``rate``, ``rps``, ``qps``,
``count``, ``requests``, ``arrivals``, ``throughput``, ``per s``/``per min``...; words split at ``_``,
digits and camelCase), or when the rows are evenly spaced in time and another column holds numbers,
unless a column's name marks per-request data (a word starting with ``token``, ``prompt``,
``context``, ``generated``, ``input``, ``output``, ``latency``, or ``id``: the Azure trace).
``format: requests`` or ``format: rate`` (with ``rateColumn``) is always taken as said. The time
column is ``timeColumn`` or the first of ``timestamp``, ``time``, ``ts``, ``t`` (any letter case).

A column name may appear once in the header (any letter case). Every data row must have as many
columns as the header (blank lines, lines of blanks and ``#`` comments, indented or not, are
skipped); a row with fewer or more is an error at its line, in both kinds of file. A timestamp
field is at most :data:`MAX_TIME_FIELD` (64) characters, padding included: a longer one is an error
at its line, never read cut.

Reading is vectorised: the file is read in blocks of about 32 MiB and each block is parsed by
``numpy.loadtxt`` and converted with ``astype`` (``datetime64[ns]`` or ``float64``); there is no
Python loop over rows, so tens of millions of requests load in seconds. Only when a block fails to
parse are its lines scanned one by one, to name the first bad line.

Rows need not be sorted: request logs merged from several frontends interleave, so requests are
sorted by time (stable). An interval trace with two rows for one start is an error.

Scaling (``loadScale``, ``timeScale``)::

    requests: t' = t x timeScale; each request kept floor(s) times plus once more with
              probability frac(s), s = loadScale (seeded)
    rate:     t' = t x timeScale; rate' = rate x loadScale / timeScale   (same requests, longer clock)

Every trace starts at t = 0 on the simulation clock (its first row).

Bounds (each an error naming the file, and the line or field): the path must be a regular file (a
FIFO, device or directory is refused without waiting on it); a line may be at most
:data:`MAX_LINE_BYTES` long, so memory stays within a block and a line however the file is made; a
trace may span at most :data:`MAX_SPAN_S` (366 days) once ``timeScale`` is applied; a rate, once
``loadScale`` and ``timeScale`` are applied, at most :data:`MAX_RATE` requests/s; a request trace,
with ``loadScale``, at most :data:`MAX_REQUESTS` requests.
"""

from __future__ import annotations

import csv
import io
import itertools
import math
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO, Literal

import numpy as np
from numpy.typing import NDArray

from extender.core.errors import ExtenderError, InvalidValueError, Problem
from extender.files import open_regular
from extender.sim.errors import TraceError
from extender.sim.scenario import TraceSpec

F64 = NDArray[np.float64]

TIME_COLUMNS = ("timestamp", "time", "ts", "t")
RATE_COLUMNS = ("rate", "rps", "qps", "requests_per_second")
#: The Azure LLM inference trace header; a file with it is credited to its source.
AZURE_COLUMNS = ("timestamp", "contexttokens", "generatedtokens")
AZURE_CREDIT = "Azure Public Dataset (Microsoft), CC-BY 4.0"
#: Words of a column name that suggest it holds a rate (module docstring).
RATE_HINTS = frozenset({"rate", "rates", "rps", "qps", "persec", "count", "counts", "requests", "reqs", "arrivals",
                        "throughput"})
#: ``per <unit>`` in a column name also suggests a rate.
PER_UNITS = frozenset({"s", "sec", "second", "min", "minute"})
#: Word stems of a column name that mark one row per request (module docstring).
REQUEST_HINTS = ("token", "prompt", "context", "generated", "input", "output", "latency", "id")


def _words(name: str) -> list[str]:
    """A column name's words: ``ContextTokens`` -> context, tokens; ``requests_per_s`` -> requests, per, s."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return re.findall(r"[a-z]+|[0-9]+", spaced.lower())


def _rate_named(name: str) -> bool:
    w = _words(name)
    return bool(RATE_HINTS.intersection(w)) or any(a == "per" and b in PER_UNITS for a, b in itertools.pairwise(w))


def _request_named(name: str) -> bool:
    return any(word == "id" or (word.startswith(REQUEST_HINTS) and word != "id") for word in _words(name))
#: Bytes read per block: large enough that per-block overhead vanishes, small enough for memory.
BLOCK_BYTES = 32 * 2**20
#: The longest line read (the header, or a row): beyond it the file is not a trace (binary, CR-only lines).
MAX_LINE_BYTES = 2**20
#: The longest a trace may span on the simulation clock (after ``timeScale``): 366 days.
MAX_SPAN_S = 366 * 86400.0
#: What a file with lines ended by CR alone is told, at the first such line.
CR_ALONE = "the lines end with CR alone: save the file with LF (or CRLF) line ends"
#: The longest timestamp field (characters, blanks and padding included, quotes not): numpy reads the
#: column into fixed-width strings, so a longer field is refused at its line rather than cut.
MAX_TIME_FIELD = 64
#: The highest rate (requests/s) a rate trace may give after ``loadScale`` and ``timeScale``.
MAX_RATE = 1e9
#: The most requests a request trace may give after ``loadScale`` (2 GiB of arrival times).
MAX_REQUESTS = 2**28


class _LineTooLongError(ExtenderError):
    """A line that does not end within :data:`MAX_LINE_BYTES` of where its block ends."""


@dataclass(frozen=True)
class RequestTrace:
    """Request arrival times in seconds from the first request (sorted)."""

    times: F64
    credit: str = ""

    def scaled(self, spec: TraceSpec, rng: np.random.Generator) -> RequestTrace:
        """The trace with ``timeScale`` and ``loadScale`` applied (module docstring)."""
        times = self.times * spec.time_scale
        s = spec.load_scale
        if s != 1.0:
            whole = math.floor(s)
            counts = np.full(len(times), whole, dtype=np.int64) + (rng.random(len(times)) < s - whole)
            times = np.repeat(times, counts)
        return RequestTrace(times, self.credit)


@dataclass(frozen=True)
class RateTrace:
    """A piecewise-constant rate (requests/s): ``rates[i]`` from ``starts[i]`` to the next start (or ``end``)."""

    starts: F64
    rates: F64
    end: float
    credit: str = ""

    def scaled(self, spec: TraceSpec) -> RateTrace:
        """The trace with ``timeScale`` and ``loadScale`` applied (module docstring)."""
        k = spec.time_scale
        return RateTrace(self.starts * k, self.rates * spec.load_scale / k, self.end * k, self.credit)

    def cumulative(self, t: F64) -> F64:
        """Requests arrived by each time ``t``: the integral of the step rate, exact (it is piecewise linear)."""
        knots = np.append(self.starts, self.end)
        area = np.concatenate(([0.0], np.cumsum(self.rates * np.diff(knots))))
        return np.asarray(np.interp(t, knots, area, left=0.0, right=float(area[-1])), dtype=np.float64)


Trace = RequestTrace | RateTrace


@dataclass(frozen=True)
class Arrivals:
    """A workload's demand on the simulation clock, as packets in time order.

    ``fluid=False``: packet j is one request (weight 1) arriving at ``times[j]``. ``fluid=True``:
    packet j is ``weights[j]`` requests arriving uniformly over ``[times[j], times[j] + bin_s)``
    (rate traces and the synthetic generator). ``span_s``: how long the demand lasts.
    """

    times: F64
    weights: F64
    fluid: bool
    bin_s: float
    span_s: float
    description: str = ""
    credit: str = ""

    @property
    def total(self) -> float:
        """Requests in the whole demand."""
        return float(self.weights.sum())

    def __len__(self) -> int:
        return len(self.times)

    def split(self, at: float) -> tuple[Arrivals, Arrivals]:
        """The packets before ``at``, and those from ``at`` on on a clock moved back by ``at`` (a
        fluid packet is not cut: ``at`` is a multiple of ``bin_s`` where it is used)."""
        cut = int(np.searchsorted(self.times, at, side="left"))
        before = replace(self, times=self.times[:cut], weights=self.weights[:cut], span_s=min(at, self.span_s))
        after = replace(self, times=self.times[cut:] - at, weights=self.weights[cut:],
                        span_s=max(0.0, self.span_s - at))
        return before, after


def arrivals_from(trace: Trace, *, bin_s: float, description: str = "", duration_s: float | None = None) -> Arrivals:
    """The packets of a trace: requests as they are; a rate integrated over bins of ``bin_s`` seconds.

    A rate trace's bins cover ``[0, duration)`` (default: the trace's end, rounded up to a bin).
    """
    if isinstance(trace, RequestTrace):
        span = float(trace.times[-1]) if len(trace.times) else 0.0
        times = trace.times if duration_s is None else trace.times[trace.times < duration_s]
        return Arrivals(times, np.ones(len(times)), False, bin_s, span, description, trace.credit)
    end = trace.end if duration_s is None else duration_s
    n = max(1, math.ceil(end / bin_s - 1e-9))
    edges = np.arange(n + 1, dtype=np.float64) * bin_s
    weights = np.diff(trace.cumulative(edges))
    return Arrivals(edges[:-1], np.maximum(weights, 0.0), True, bin_s, trace.end, description, trace.credit)


# ---------------------------------------------------------------------------------------------
# CSV parsing
# ---------------------------------------------------------------------------------------------


def _header(line: str) -> list[str]:
    return [c.strip().strip('"').strip() for c in line.rstrip("\r\n").split(",")]


def _pick(columns: list[str], wanted: str | None, candidates: tuple[str, ...]) -> int | None:
    lowered = [c.lower() for c in columns]
    if wanted is not None:
        return lowered.index(wanted.lower()) if wanted.lower() in lowered else None
    return next((lowered.index(c) for c in candidates if c in lowered), None)


@dataclass(frozen=True)
class _Layout:
    kind: Literal["requests", "rate"]
    time_col: int
    rate_col: int | None
    ncols: int
    credit: str


def _layout(columns: list[str], spec: TraceSpec, source: str) -> _Layout:
    listed = ", ".join(columns)
    lowered = [c.lower() for c in columns]
    twice = next((c for i, c in enumerate(columns) if c and c.lower() in lowered[:i]), None)
    if twice is not None:
        raise TraceError([Problem(source, 1, "", f"column {twice!r} is in the header twice (the header has {listed})")])
    time_col = _pick(columns, spec.time_column, TIME_COLUMNS)
    if time_col is None:
        wanted = repr(spec.time_column) if spec.time_column else f"one of {', '.join(TIME_COLUMNS)}"
        raise TraceError([Problem(source, 1, "", f"no time column: expected {wanted} (the header has {listed})")])
    rate_col = _pick(columns, spec.rate_column, RATE_COLUMNS)
    if spec.rate_column is not None and rate_col is None:
        raise TraceError([Problem(source, 1, "", f"no rate column {spec.rate_column!r} (the header has {listed})")])
    auto: Literal["requests", "rate"] = "rate" if rate_col is not None else "requests"
    kind = auto if spec.format == "auto" else spec.format
    if kind == "rate" and rate_col is None:
        raise TraceError([Problem(source, 1, "", f"a rate trace needs a rate column: one of {', '.join(RATE_COLUMNS)} "
                                                 f"or rateColumn (the header has {listed})")])
    azure = tuple(c.lower() for c in columns) == AZURE_COLUMNS
    credit = spec.credit or (AZURE_CREDIT if azure else "")
    return _Layout(kind, time_col, rate_col if kind == "rate" else None, len(columns), credit)


def _blocks(f: BinaryIO) -> Iterator[bytes]:
    """The rest of the file in blocks of whole lines: a block, then at most :data:`MAX_LINE_BYTES` to
    finish its last line. A line that does not end within that raises :class:`_LineTooLongError` after
    the whole lines before it are yielded."""
    while True:
        block = f.read(BLOCK_BYTES)
        if not block:
            return
        if not block.endswith(b"\n"):
            block += f.readline(MAX_LINE_BYTES)
            cut = block.rfind(b"\n") + 1
            if len(block) - cut >= MAX_LINE_BYTES:
                if cut:
                    yield block[:cut]
                raise _LineTooLongError
        yield block


#: Blanks that start a line holding nothing else, or only a comment. numpy.loadtxt reads such a line
#: as a row of one blank field, where every other reader of the file skips it as blank: a line of
#: spaces in a trace was refused with numpy's words and no line. Removed before numpy reads a block
#: (the line stays, empty).
_BLANK_LINE_PAD = re.compile(rb"^[ \t\f\v]+(?=#|\r?$)", re.MULTILINE)


def _data_lines(text: str, first_line: int) -> Iterator[tuple[int, str]]:
    """(line number, line) for the lines numpy.loadtxt reads as rows: not blank, not a comment."""
    for i, line in enumerate(text.splitlines()):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            yield first_line + i, line


def _is_number(text: str, *, underscores: bool = False) -> bool:
    """Whether numpy reads ``text`` as a number, as the fast path does: ASCII only (Python's ``float``
    also takes full-width and other scripts' digits, numpy does not), and ``1_000`` only for a
    timestamp (``astype`` takes it, ``loadtxt`` does not). Where this and numpy disagreed, a bad row
    was reported without its line."""
    if not text.isascii() or (not underscores and "_" in text):
        return False
    try:
        float(text)
    except ValueError:
        return False
    return True


def _is_iso(text: str) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = np.datetime64(text.strip(), "ns")
    except ValueError:
        return False
    return not np.isnat(value)


#: The ISO times a trace may hold: those ``datetime64[ns]`` (int64 nanoseconds since 1970) can, less
#: a second at either end. numpy wraps a time outside them without a word: 9999-01-01 read as
#: 1815-03-31, 1500-01-01 as 2084-07-20.
ISO_RANGE = ("1677-09-21T00:12:44", "2262-04-11T23:47:15")


def _iso_in_range(text: NDArray[np.bytes_] | str) -> NDArray[np.bool_]:
    """Per time: is it within :data:`ISO_RANGE` (read to the second, where nothing wraps)."""
    first, last = (np.datetime64(t, "s") for t in ISO_RANGE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # timezone offsets warn
        seconds = np.asarray(text).astype("datetime64[s]")
    in_range: NDArray[np.bool_] = (seconds >= first) & (seconds <= last)
    return in_range


def _unquoted(field: str) -> str:
    """A field as numpy.loadtxt stores it: without its quotes (``_fields`` already drops them when the
    line has any, so only a split field may still have them)."""
    return field[1:-1] if len(field) >= 2 and field[0] == field[-1] == '"' else field


def _fields(line: str) -> list[str]:
    """A row's fields (quotes honoured only when the line has one: the common case stays a split)."""
    if '"' not in line:
        return line.split(",")
    return next(csv.reader([line]), [])


def _columns_ok(block: bytes, ncols: int) -> bool:
    """Whether every line of a block has ``ncols - 1`` commas (vectorised; False sends the block to
    :func:`_bad_line`, which skips blank and comment lines and honours quotes)."""
    if b'"' in block:
        return False
    k = ncols - 1
    lines = block.count(b"\n") + (0 if block.endswith(b"\n") else 1)
    if block.count(b",") != k * lines:  # bytes.count: C speed, and most bad blocks stop here
        return False
    if k == 0:
        return True
    a = np.frombuffer(block, dtype=np.uint8)
    ends = np.flatnonzero(a == 10)
    if len(ends) < lines:
        ends = np.append(ends, len(a))
    commas = np.flatnonzero(a == 44).reshape(lines, k)
    # line i's commas lie after line i - 1's end and before its own
    starts = np.concatenate(([-1], ends[:-1]))
    return bool(np.all(commas[:, 0] > starts) and np.all(commas[:, -1] < ends))


def _bad_line(text: str, first_line: int, layout: _Layout, numeric: bool, source: str) -> Problem | None:
    """The first line of a block that cannot be read, with what is wrong with it (the slow path)."""
    for line_no, line in _data_lines(text, first_line):
        fields = _fields(line)
        if len(fields) != layout.ncols:
            return Problem(source, line_no, "", f"the row has {len(fields)} columns, the header has {layout.ncols}")
        field = fields[layout.time_col]
        if len(field) > MAX_TIME_FIELD and len(_unquoted(field)) > MAX_TIME_FIELD:
            return Problem(source, line_no, "", f"the timestamp field is {len(_unquoted(field))} characters long, "
                                                f"more than the {MAX_TIME_FIELD} a timestamp may have")
        ts = field.strip().strip('"')
        if numeric and not _is_number(ts, underscores=True):
            return Problem(source, line_no, "", f"timestamp {ts!r} is not a number of seconds (like the first row's)")
        if not numeric and not _is_iso(ts):
            return Problem(source, line_no, "", f"timestamp {ts!r} is not an ISO-8601 time (like the first row's)")
        if not numeric and not _iso_in_range(ts).all():
            return Problem(source, line_no, "", f"timestamp {ts!r} is outside the times a trace may hold, "
                                                f"{ISO_RANGE[0]} to {ISO_RANGE[1]}")
        if layout.rate_col is not None:
            rate = fields[layout.rate_col].strip().strip('"')
            if not _is_number(rate):
                return Problem(source, line_no, "", f"rate {rate!r} is not a number")
            if not math.isfinite(float(rate)) or float(rate) < 0:
                return Problem(source, line_no, "", f"rate {rate!r} must be a finite number >= 0")
        if numeric and not math.isfinite(float(ts)):
            return Problem(source, line_no, "", f"timestamp {ts!r} is not finite")
    return None


def _bare_cr(text: str, first_line: int, source: str) -> Problem | None:
    """The line of the first CR not followed by LF in a block, said as a CR-only header is: the slow
    path splits lines at a bare CR too, so it would find nothing wrong and numpy's words had no line."""
    at = re.search(r"\r(?!\n)", text)
    if at is None:
        return None
    return Problem(source, first_line + text.count("\n", 0, at.start()), "", CR_ALONE)


def _parse_block(text: str, first_line: int, layout: _Layout, numeric: bool,
                 source: str) -> tuple[NDArray[np.int64] | F64, F64 | None]:
    """Timestamps (int64 ns for ISO, float seconds for numbers) and rates of one block of rows."""
    cols = (layout.time_col,) if layout.rate_col is None else (layout.time_col, layout.rate_col)
    time = ("t", f"S{MAX_TIME_FIELD}")
    dtype = [time] if layout.rate_col is None else [time, ("r", "f8")]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an empty block warns; timezone offsets warn
            rows = np.loadtxt(io.StringIO(text), delimiter=",", usecols=cols, dtype=dtype, ndmin=1,
                              quotechar='"')
            if len(rows) and int(np.char.str_len(rows["t"]).max()) >= MAX_TIME_FIELD:  # perhaps cut: look
                long = _bad_line(text, first_line, layout, numeric, source)
                if long is not None:
                    raise TraceError([long])
            raw = np.char.strip(rows["t"])
            ts: NDArray[np.int64] | F64
            if numeric:
                ts = raw.astype(np.float64)
                ok = bool(np.isfinite(ts).all())
            else:
                stamps = raw.astype("datetime64[ns]")
                ok = not bool(np.isnat(stamps).any()) and bool(_iso_in_range(raw).all())
                ts = stamps.astype(np.int64)
            rates = rows["r"].astype(np.float64) if layout.rate_col is not None else None
            if rates is not None and not bool((np.isfinite(rates) & (rates >= 0)).all()):
                ok = False
        if not ok:
            raise InvalidValueError("non-finite or negative value")
    except ValueError as exc:
        problem = _bare_cr(text, first_line, source) or _bad_line(text, first_line, layout, numeric, source)
        if problem is None:  # numpy disagreed with the slow path: report numpy's words, without a line
            problem = Problem(source, None, "", f"cannot parse the rows from line {first_line}: {exc}")
        raise TraceError([problem]) from exc
    return ts, rates


def _line_of_row(path: str | Path, row: int) -> int:
    """The line number of data row ``row`` (0-based), counting as numpy.loadtxt does (error path only)."""
    with Path(path).open(encoding="utf-8-sig") as f:
        f.readline()
        seen = -1
        for line_no, line in enumerate(f, start=2):
            stripped = line.strip()
            if stripped and not stripped.startswith("#"):
                seen += 1
                if seen == row:
                    return line_no
    return 0


def _too_long(source: str, line: int) -> TraceError:
    return TraceError([Problem(source, line, "", f"the line does not end within {MAX_LINE_BYTES} bytes: not a "
                                                 "CSV trace (binary or compressed data, or lines ended by CR "
                                                 "alone?)")])


def read_trace(path: str | Path, spec: TraceSpec) -> Trace:
    """Read a CSV trace (rules and bounds in the module docstring); :class:`TraceError` names the file and line."""
    source = str(path)
    try:
        f = open_regular(path)
    except OSError as exc:
        raise TraceError([Problem(source, None, "", f"cannot read: {exc.strerror or exc}")]) from exc
    try:
        with f:
            header_bytes = f.readline(MAX_LINE_BYTES)
            if len(header_bytes) >= MAX_LINE_BYTES and not header_bytes.endswith(b"\n"):
                raise _too_long(source, 1)
            try:
                header = header_bytes.decode("utf-8-sig")
            except UnicodeDecodeError as exc:
                raise TraceError([Problem(source, 1, "", f"not UTF-8 text: {exc.reason}")]) from exc
            if not header.strip():
                raise TraceError([Problem(source, None, "", "the file is empty: expected a header line and rows")])
            if "\r" in header.rstrip("\r\n"):
                raise TraceError([Problem(source, 1, "", CR_ALONE)])
            columns = _header(header)
            layout = _layout(columns, spec, source)
            times: list[NDArray[np.int64] | F64] = []
            rates: list[F64] = []
            numeric: bool | None = None
            first_fields: list[str] = []
            line = 2
            blocks = _blocks(f)
            while True:
                try:
                    block = next(blocks, None)
                except _LineTooLongError:
                    raise _too_long(source, line) from None
                if block is None:
                    break
                if block[:1].isspace() or any(b"\n" + c in block for c in (b" ", b"\t", b"\f", b"\v")):  # rare
                    block = _BLANK_LINE_PAD.sub(b"", block)
                try:
                    text = block.decode("utf-8")
                except UnicodeDecodeError as exc:
                    where = line + block[: exc.start].count(b"\n")
                    raise TraceError([Problem(source, where, "", f"not UTF-8 text: {exc.reason}")]) from exc
                if numeric is None:
                    first = next(_data_lines(text, line), None)
                    if first is not None:
                        fields = _fields(first[1])
                        first_fields = fields
                        value = fields[layout.time_col].strip().strip('"') if layout.time_col < len(fields) else ""
                        numeric = _is_number(value, underscores=True)
                if not _columns_ok(block, layout.ncols):
                    problem = _bad_line(text, line, layout, bool(numeric), source)
                    if problem is not None and problem.message.startswith("the row has"):
                        raise TraceError([problem])
                if numeric is not None:
                    ts, rs = _parse_block(text, line, layout, numeric, source)
                    times.append(ts)
                    if rs is not None:
                        rates.append(rs)
                line += text.count("\n")
    except OSError as exc:  # a read that fails once the file is open (EIO: a failing disk, a lost NFS server)
        raise TraceError([Problem(source, None, "", f"cannot read: {exc.strerror or exc}")]) from exc
    if numeric is None or sum(len(t) for t in times) == 0:
        raise TraceError([Problem(source, None, "", "the trace has a header but no rows")])
    raw = np.concatenate(times)
    order = np.argsort(raw, kind="stable")
    if numeric:
        with np.errstate(over="ignore"):  # a span past float64 is inf, refused below
            seconds = raw[order] - raw[order[0]]
        span = float(seconds[-1])
    else:
        ns = raw[order]
        seconds = (ns - ns[0]).astype(np.float64) / 1e9
        span = (float(ns[-1]) - float(ns[0])) / 1e9  # in float: the int64 difference wraps past 292 years
    _check_span(path, spec, span, order)
    if layout.kind == "requests":
        requests = RequestTrace(np.ascontiguousarray(seconds, dtype=np.float64), layout.credit)
        _check_count(source, spec, len(seconds))
        if spec.format == "auto":
            _refuse_if_ambiguous(path, spec, columns, first_fields, layout=layout, requests=requests)
        return requests
    rate = np.concatenate(rates)[order]
    same = np.flatnonzero(np.diff(seconds) == 0)
    if len(same):
        pair = sorted((int(order[same[0]]), int(order[same[0] + 1])))
        earlier, later = (_line_of_row(path, r) for r in pair)
        raise TraceError([Problem(source, later, "", f"this interval starts at the same time as line {earlier}; "
                                                      "an interval trace needs one row per start")])
    _check_rates(path, spec, rate, order)
    if len(seconds) < 2:
        raise TraceError([Problem(source, _line_of_row(path, int(order[0])), "", (
            "a rate trace needs at least two rows: each rate holds until the next row, and the last "
            "for the median interval between rows (one row has none)"))])
    step = float(np.median(np.diff(seconds)))
    return RateTrace(np.ascontiguousarray(seconds, dtype=np.float64), rate, float(seconds[-1]) + step, layout.credit)


def _check_span(path: str | Path, spec: TraceSpec, raw_span: float, order: NDArray[np.intp]) -> None:
    """Refuse a trace that spans more than :data:`MAX_SPAN_S` on the simulation clock (``raw_span``
    seconds in the file, times ``timeScale``), naming its earliest and latest rows."""
    span = raw_span * spec.time_scale
    if span <= MAX_SPAN_S:
        return
    first, last = _line_of_row(path, int(order[0])), _line_of_row(path, int(order[-1]))
    scaled = f" with timeScale {spec.time_scale:g}" if spec.time_scale != 1.0 else ""
    shown = span_text(span) if span < 1e9 else f"{span:.3g} s" if math.isfinite(span) else "beyond float64's range"
    raise TraceError([Problem(str(path), last, "", (
        f"the trace spans {shown}{scaled} from its earliest row (line {first}) to this one, more than the "
        f"{span_text(MAX_SPAN_S)} a simulation covers (timestamps in milliseconds? timeScale: 0.001)"))])


def _check_count(source: str, spec: TraceSpec, rows: int) -> None:
    """Refuse a request trace that ``loadScale`` would make more than :data:`MAX_REQUESTS` requests."""
    if rows * spec.load_scale > MAX_REQUESTS:
        raise TraceError([Problem(source, None, "loadScale", (
            f"{rows} requests x loadScale {spec.load_scale:g} is more than the {MAX_REQUESTS} requests a "
            "request trace may give"))])


def _check_rates(path: str | Path, spec: TraceSpec, rates: F64, order: NDArray[np.intp]) -> None:
    """Refuse a rate above :data:`MAX_RATE` requests/s once scaled, naming its line."""
    factor = spec.load_scale / spec.time_scale
    with np.errstate(over="ignore"):  # a rate near float64's largest times a factor is inf, refused here
        high = np.flatnonzero(rates * factor > MAX_RATE)
    if not len(high):
        return
    row = int(order[high[0]])
    scaled = f" (x loadScale / timeScale = {factor:g})" if factor != 1.0 else ""
    raise TraceError([Problem(str(path), _line_of_row(path, row), "", (
        f"rate {float(rates[high[0]]):g}{scaled} is more than the {MAX_RATE:g} requests/s a rate trace "
        "may give"))])


# ---------------------------------------------------------------------------------------------
# Requests or rates? (module docstring)
# ---------------------------------------------------------------------------------------------


def _rate_candidate(columns: list[str], first_fields: list[str], layout: _Layout,
                    seconds: F64) -> str | None:
    """The column a rate reading would use, when the file may well be a rate file; else None."""
    others = [(i, c) for i, c in enumerate(columns) if i != layout.time_col]
    named = [c for _, c in others if _rate_named(c)]
    if named:
        return named[0]
    if any(_request_named(c) for _, c in others):
        return None
    numeric = [c for i, c in others if i < len(first_fields) and _is_number(first_fields[i].strip().strip('"'))]
    if not numeric or len(seconds) < 3:
        return None
    steps = np.diff(seconds)
    step = float(np.median(steps))
    even = step > 0 and bool(np.all(np.abs(steps - step) <= 1e-6 * step))
    return numeric[0] if even else None


def span_text(seconds: float) -> str:
    """A duration for people: ``40 s``, ``2.5 h``, ``14.0 d``."""
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.1f} d"
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"


def _refuse_if_ambiguous(path: str | Path, spec: TraceSpec, columns: list[str], first_fields: list[str], *,
                         layout: _Layout, requests: RequestTrace) -> None:
    """Raise :class:`TraceError` naming both readings when a file read as requests may be a rate file."""
    column = _rate_candidate(columns, first_fields, layout, requests.times)
    if column is None:
        return
    try:
        rate = read_trace(path, spec.model_copy(update={"format": "rate", "rate_column": column}))
    except TraceError:
        return  # the column cannot be read as rates: one reading only
    assert isinstance(rate, RateTrace)
    n = len(requests.times)
    span = float(requests.times[-1])
    total = float(rate.cumulative(np.array([rate.end]))[0])
    as_requests = f"{n} requests over {span_text(span)}" + (f" ({n / span:.3g}/s)" if span > 0 else "")
    as_rate = f"{total:.0f} requests over {span_text(rate.end)} ({total / rate.end:.3g}/s)"
    raise TraceError([Problem(str(path), 1, "", (
        f"cannot tell whether each row is one request or an interval with a rate: read as requests (one per "
        f"row) the file is {as_requests}; read as rates from column {column!r} it is {as_rate}. Say which: "
        f"format: requests, or format: rate with rateColumn: {column} (on the command line "
        f"--trace-format requests, or --rate-column {column})"))])


@dataclass(frozen=True)
class DemandSummary:
    """The demand a workload will replay, as loaded (printed before a run so a misread trace shows).

    ``requests`` = the sum of the packets' weights; ``mean_rps`` = requests / ``duration_s``;
    ``peak_rps`` = the most requests in one minute of the simulation clock / 60 (a request counted
    at its arrival, a fluid packet spread evenly over the minutes it covers). ``span_s``: how long the
    demand itself lasts (a trace's span), which the line mentions when the run cuts it or outlasts it.
    """

    workload: str
    source: str
    kind: Literal["requests", "rate"]
    requests: float
    duration_s: float
    mean_rps: float
    peak_rps: float
    span_s: float

    def line(self) -> str:
        """One line for people."""
        how = "one request per row" if self.kind == "requests" else "rows of rates"
        read = f", read as {how}" if self.source.startswith("trace") else ""
        return (f"demand {self.workload}: {self.requests:,.0f} requests over {span_text(self.duration_s)}, "
                f"mean {self.mean_rps:.3g}/s, peak {self.peak_rps:.3g}/s (busiest minute); "
                f"from {self.source or 'synthetic'}{read}{self._span_note()}")

    def _span_note(self) -> str:
        if self.span_s > self.duration_s * 1.001:
            return f"; the run cuts it from {span_text(self.span_s)}"
        if self.span_s < self.duration_s * 0.99:
            return f"; it ends after {span_text(self.span_s)}, and the run goes on without demand"
        return ""


#: The window :attr:`DemandSummary.peak_rps` is measured over.
PEAK_WINDOW_S = 60.0


def _fluid_per_window(times: F64, weights: F64, bin_s: float, window_s: float) -> F64:
    """Requests per window ``[k window_s, (k + 1) window_s)`` of fluid packets, each ``weights[j]`` spread
    evenly over ``[times[j], times[j] + bin_s)``: a packet longer than a window (a tick over 3 minutes)
    counted whole in the window it starts in made the busiest minute several times the rate."""
    first = np.floor(times / window_s).astype(np.int64)
    n = int(np.floor((float(times.max()) + bin_s) / window_s)) + 2
    out = np.zeros(n)
    ends = times + bin_s
    for k in range(math.ceil(bin_s / window_s) + 1):  # the k-th window each packet reaches; no loop over packets
        lo = np.maximum(times, (first + k) * window_s)
        hi = np.minimum(ends, (first + k + 1) * window_s)
        out += np.bincount(first + k, weights=weights * (np.clip(hi - lo, 0.0, None) / bin_s), minlength=n)[:n]
    return out


def demand_summary(workload: str, arrivals: Arrivals, duration_s: float) -> DemandSummary:
    """What :class:`DemandSummary` says about ``arrivals`` over ``[0, duration_s)``."""
    total = arrivals.total
    if not len(arrivals.times):
        peak = 0.0
    elif arrivals.fluid and arrivals.bin_s > 0:
        peak = float(_fluid_per_window(arrivals.times, arrivals.weights, arrivals.bin_s, PEAK_WINDOW_S).max()) \
            / PEAK_WINDOW_S
    else:
        minute = np.floor(arrivals.times / PEAK_WINDOW_S).astype(np.int64)
        peak = float(np.bincount(minute, weights=arrivals.weights).max()) / PEAK_WINDOW_S
    kind: Literal["requests", "rate"] = "rate" if arrivals.fluid else "requests"
    mean = total / duration_s if duration_s > 0 else math.nan
    return DemandSummary(workload, arrivals.description, kind, total, duration_s, mean, peak, arrivals.span_s)
