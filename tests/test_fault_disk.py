"""Fault and abuse suite, disk and log part: what the sync reads of an engine's log and the agent of its cache root.

Engine logs (:func:`extender.core.enginelog.parse_engine_log`): its contract is to read any text and
never raise; a line it cannot use is ignored. A hypothesis fuzzer feeds it random text, the real log
lines of tests/test_enginelog.py with their numbers swapped for garbage, their rank and worker tags
garbled, cut at any byte (then decoded as the sync decodes a reply: undecodable bytes become
U+FFFD), repeated, and with their line endings mixed. On every example: it returns, each phase is
finite and in ``(0, MAX_PHASE_S]``, and the result does not depend on the line endings. A log is read
from the sync's writer thread, so a pattern that backtracks over a long line stalls every write:
long adversarial lines are parsed in a child process with a bound on the wait (a regex search holds
the GIL for as long as it runs, so a thread's ``join(timeout)`` would not return before it).

Bounded in count (``max_examples``); no assertion on time.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.core.enginelog import MAX_PHASE_S, EnginePhases, parse_engine_log
from tests import test_enginelog as real_logs

#: Examples per property: each is one parse of a few KB, so a few hundred stay well under a second each.
EXAMPLES = 200
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

#: Bound on a parse that must not hang (generous: CI machines stall); never asserted on.
HANG_BOUND_S = 60.0

#: Every line of the real-format logs the enginelog tests hold (vLLM and SGLang, every version).
REAL_LINES: tuple[str, ...] = tuple(sorted({
    line for name, value in vars(real_logs).items()
    if name.isupper() and isinstance(value, str) for line in re.split(r"[\r\n]+", value) if line
}))

PHASES = ("weights_load", "compile", "graph_capture", "init_engine")

#: Numbers an engine never writes but a garbled or hostile line can hold.
BAD_NUMBERS = st.one_of(
    st.sampled_from(["nan", "NaN", "-nan", "inf", "-inf", "Infinity", "-1", "-0.0", "0", "0.000", "1e400",
                     "-1e400", "1e-400", "1e7", "10000001", "1e308", "0x10", "1_000", "\u0661\u0662", "\uff11",
                     "12,5", "1..2", "", "+", "e", "\ufffd", "4\ufffd2"]),
    st.integers(min_value=300, max_value=5000).map(lambda n: "9" * n),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(2**80), max_value=2**80).map(str),
)
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


@st.composite
def mutated_line(draw: st.DrawFn) -> str:
    """A real log line, its numbers (some or all) replaced, its units or tag garbled, maybe cut."""
    line = draw(st.sampled_from(REAL_LINES))
    spans = [m.span() for m in _NUMBER.finditer(line)]
    for start, end in reversed(spans):
        if draw(st.booleans()):
            line = line[:start] + draw(BAD_NUMBERS) + line[end:]
    for word, other in (("seconds", "secs"), (" s", " ms"), ("GiB", "TiB"), ("pid=", "pid:"), ("TP", "tp"),
                        ("elapsed=", "elapsed:"), ("(", "(("), ("]", "")):
        if word in line and draw(st.integers(0, 7)) == 0:
            line = line.replace(word, other, 1)
    if draw(st.integers(0, 3)) == 0:
        line = line[: draw(st.integers(0, len(line)))]
    return line


ODD = st.sampled_from(["\r", "\n", "\r\n", "\n\r", "\x00", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\ufffd",
                       "\udcff", "\U0001f600", " ", "\t", "(", ")", "[", "]", "pid=1", " TP1", "Capture ",
                       "graph end. ", "Compiling a graph for ", " takes ", " s", " seconds", "elapsed=", "took "])
NOISE = st.lists(st.one_of(ODD, st.text(max_size=12)), max_size=20).map("".join)

LOGS = st.lists(st.one_of(mutated_line(), st.sampled_from(REAL_LINES), NOISE), max_size=25)
ENDINGS = st.sampled_from(["\n", "\r\n", "\r", "\n\n", "\r\r\n"])


def _joined(lines: list[str], endings: list[str]) -> str:
    return "".join(line + endings[i % len(endings)] for i, line in enumerate(lines)) if endings else "\n".join(lines)


def assert_valid(phases: EnginePhases) -> None:
    """What any log must give: each phase unknown, or finite in ``(0, MAX_PHASE_S]``."""
    for name in PHASES:
        value = getattr(phases, name)
        assert value is None or (math.isfinite(value) and 0 < value <= MAX_PHASE_S), (name, value)
    assert phases.compile_cached in (None, True, False)
    engine = phases.engine_s
    assert engine is None or (math.isfinite(engine) and engine > 0)


@FUZZ
@given(lines=LOGS, endings=st.lists(ENDINGS, min_size=1, max_size=4))
def test_any_log_gives_valid_phases_whatever_its_line_endings(lines: list[str], endings: list[str]) -> None:
    lf = parse_engine_log("\n".join(lines))
    assert_valid(lf)
    # lines that hold no line break of their own: only the way they are joined changes
    if not any(c in line for line in lines for c in "\r\n"):
        assert parse_engine_log(_joined(lines, endings)) == lf


@FUZZ
@given(text=st.text(max_size=400))
def test_random_text_gives_valid_phases(text: str) -> None:
    assert_valid(parse_engine_log(text))


@FUZZ
@given(lines=LOGS, junk=st.binary(max_size=40), at=st.integers(min_value=0), copies=st.integers(1, 3))
def test_a_log_as_the_sync_reads_it_gives_valid_phases(lines: list[str], junk: bytes, at: int, copies: int) -> None:
    """Bytes that are not UTF-8 anywhere, cut at any byte (mid-character, mid-line) and decoded as
    :meth:`extender.kube.client.KubeClient.read_pod_log` decodes them."""
    raw = ("\n".join(lines) * copies).encode("utf-8", "surrogatepass") + junk
    cut = raw[: at % (len(raw) + 1)]
    assert_valid(parse_engine_log(cut.decode("utf-8", "replace")))


@FUZZ
@given(line=st.sampled_from(REAL_LINES), at=st.integers(min_value=0))
def test_a_real_line_cut_at_any_byte_reads_its_own_number_or_nothing(line: str, at: int) -> None:
    """A line cut short (a log's last, when the engine is killed mid-write) never reads as another
    number: each phase is the whole line's or unknown."""
    raw = line.encode()
    cut = parse_engine_log(raw[: at % (len(raw) + 1)].decode("utf-8", "replace"))
    whole = parse_engine_log(line)
    assert_valid(cut)
    for name in PHASES:
        assert getattr(cut, name) in (None, getattr(whole, name)), name


@settings(max_examples=15, deadline=None, derandomize=True)
@given(line=mutated_line(), copies=st.integers(1000, 3000))
def test_a_line_repeated_thousands_of_times_gives_valid_phases(line: str, copies: int) -> None:
    assert_valid(parse_engine_log((line + "\n") * copies))


# ---- long adversarial lines: the parse stays linear ------------------------------------------------------

#: 2 MiB (engineLog.limitBytes allows 64): quadratic in it is minutes of one regex search.
LONG = 2 << 20


def _parse_in_child(head: str, unit: str, length: int) -> subprocess.CompletedProcess[str]:
    code = ("from extender.core.enginelog import parse_engine_log; "
            f"unit = {unit!r}; text = {head!r} + unit * ({length} // len(unit)); "
            "phases = parse_engine_log(text); print(phases.model_dump_json())")
    return subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                          timeout=HANG_BOUND_S)


@pytest.mark.parametrize(("head", "unit"), [
    pytest.param("", "Compiling a graph for ", id="compiling-a-graph-for-repeated-on-one-line"),
    pytest.param("", "Directly load the compiled graph(s) for ", id="directly-load-the-compiled-graph-repeated"),
    pytest.param("", "Compiling a graph for x takes ", id="compiling-and-takes-without-a-time"),
    pytest.param("", "init engine (profile, create kv cache, warmup model) took ", id="init-engine-repeated"),
    pytest.param("(Worker_TP0", " pid=1", id="process-tag-never-closed"),
    pytest.param("[2025-01-01 00:00:00", " TP1", id="rank-tags-never-closed"),
    pytest.param("Load weight end. elapsed=", "1", id="one-endless-number"),
])
def test_a_long_adversarial_line_is_parsed_in_linear_time(head: str, unit: str) -> None:
    """Without a bound on what a per-graph line names, a 2 MiB line repeating ``Compiling a graph for``
    held the sync's writer in one regex search for about six minutes (a 1 MiB one, the default
    limitBytes, for one and a half)."""
    try:
        done = _parse_in_child(head, unit, LONG)
    except subprocess.TimeoutExpired:
        pytest.fail(f"parsing {LONG} bytes of {unit!r} did not end within {HANG_BOUND_S} s")
    assert done.returncode == 0, done.stderr
    assert_valid(EnginePhases.model_validate_json(done.stdout))
