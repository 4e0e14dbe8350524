"""Fault and abuse suite, disk and log part: what the sync reads of an engine's log and the agent of its cache root.

Engine logs (:func:`extender.core.enginelog.parse_engine_log`): its contract is to read any text and
never raise; a line it cannot use is ignored. A hypothesis fuzzer feeds it random text, the real log
lines of tests/test_enginelog.py with their numbers swapped for garbage, their rank and worker tags
garbled, cut at any byte (then decoded as the sync decodes a reply: undecodable bytes become
U+FFFD), repeated, and with their line endings mixed. On every example: it returns, each phase is
finite and in ``(0, MAX_PHASE_S]``, and the result does not depend on the line endings. A log is read
from the sync's writer thread, so a pattern that backtracks over a long line stalls every write:
long adversarial lines are parsed in a child process with a bound on the wait (a regex search holds
the GIL for as long as it runs, so a thread's ``join(timeout)`` would not return before it). What a
client sends, logged after the server is up, is never read.

The agent's scan (:func:`extender.agent.scan.scan_cache`): random cache roots (garbage manifests,
markers of every kind, links out of the root, FIFOs, sockets, sealed directories, names that are not
UTF-8, sparse files past the disk), and the same roots changing under the scan (paths deleted or
swapped, syscalls failing: tests may run as root, which chmod cannot stop, so permission errors are
injected at the syscall). On every example: it returns (a thread joined with a bound: a FIFO opened
blocking waits in a syscall, which lets the join return), changes nothing, and what it reports is
inside the root and within what the manifests allow.

Bounded in count (``max_examples``); no assertion on time.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.agent.scan import CacheScan, ManifestCache, SizeCache, scan_cache
from extender.core.caches import cache_id
from extender.core.enginelog import MAX_PHASE_S, EnginePhases, parse_engine_log
from extender.core.reports import fit_agent_report
from extender.layout import COMPLETE, MANIFEST
from tests import test_enginelog as real_logs
from tests.test_agent_scan import make_weights
from tests.test_fault_files import in_thread

#: Examples per property: each is one parse of a few KB, so a few hundred stay well under a second each.
EXAMPLES = 150
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


@settings(max_examples=10, deadline=None, derandomize=True)
@given(line=mutated_line(), copies=st.integers(1000, 2000))
def test_a_line_repeated_thousands_of_times_gives_valid_phases(line: str, copies: int) -> None:
    assert_valid(parse_engine_log((line + "\n") * copies))



#: A client's prompt as the engines log requests (vLLM ``--enable-log-requests``, SGLang ``--log-requests``),
#: written to look like every phase line.
PROMPT = ("Model loading took 1 GiB memory and 9000 seconds; torch.compile takes 5000 s in total; "
          "Graph capturing finished in 7000 secs; Load weight end. elapsed=9000 s, type=X; "
          "Capture cuda graph end. Time elapsed: 7000 s. ; init engine (profile, create kv cache, warmup model) "
          "took 9999 seconds")
UVICORN_UP = ("INFO:     Started server process [7]\nINFO:     Waiting for application startup.\n"
              "INFO:     Application startup complete.\n")


@pytest.mark.parametrize(("startup", "after"), [
    pytest.param(real_logs.V1_TP1_COLD,
                 f"(APIServer pid=700) INFO 11-02 09:16:00 [logger.py:43] Received request cmpl-1: prompt: {PROMPT!r}, "
                 "params: SamplingParams(n=1)\n", id="vllm-v1-a-prompt-after-starting-the-api-server"),
    pytest.param(real_logs.V0_TP2 + UVICORN_UP,
                 f"INFO 01-20 08:02:00 logger.py:36] Received request cmpl-1: prompt: {PROMPT!r}, params: x\n",
                 id="vllm-v0-a-prompt-after-uvicorn-started"),
    pytest.param(real_logs.SGL_OLD_ONE_GPU + UVICORN_UP,
                 f"[2025-03-10 08:01:00] Receive: obj=GenerateReqInput(text={PROMPT!r}, sampling_params={{}})\n",
                 id="sglang-a-request-after-uvicorn-started-before-fired-up"),
])
def test_what_clients_send_after_the_server_is_up_writes_no_phase_time(startup: str, after: str) -> None:
    """The phase lines are all written before the server listens; a prompt the engine logs later set
    calibration's weights load to 9000 s."""
    assert parse_engine_log(startup + after) == parse_engine_log(startup)


SERVING = st.sampled_from(["(APIServer pid=1) INFO 01-01 00:00:00 [api_server.py:1] Starting vLLM API server 0 on x",
                           "INFO 01-01 00:00:00 api_server.py:1] Starting vLLM API server on http://0.0.0.0:8000",
                           "INFO:     Started server process [7]", "INFO:     Application startup complete.",
                           "INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)",
                           "[2026-01-01 00:00:00] The server is fired up and ready to roll!"])


@settings(FUZZ, max_examples=60)
@given(startup=LOGS, up=SERVING, later=LOGS)
def test_nothing_after_the_server_is_up_changes_the_phases(startup: list[str], up: str, later: list[str]) -> None:
    before = "\n".join(line for line in startup if "server" not in line.lower())
    assert parse_engine_log(f"{before}\n{up}\n" + "\n".join(later)) == parse_engine_log(before)

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
def test_a_long_adversarial_line_does_not_stall_the_parser(head: str, unit: str) -> None:
    """Without a bound on what a per-graph line names, a 2 MiB line repeating ``Compiling a graph for``
    held the sync's writer in one regex search for about six minutes (a 1 MiB one, the default
    limitBytes, for one and a half)."""
    try:
        done = _parse_in_child(head, unit, LONG)
    except subprocess.TimeoutExpired:
        pytest.fail(f"parsing {LONG} bytes of {unit!r} did not end within {HANG_BOUND_S} s")
    assert done.returncode == 0, done.stderr
    assert_valid(EnginePhases.model_validate_json(done.stdout))


# ---- the agent's scan of its cache root ----------------------------------------------------------------------
#
# A tree is a spec: ("file", size) | ("bytes", content) | ("dir", {name: spec}) | ("sealed", {name: spec}) (a
# directory made unreadable with mode 000: effective only for a user other than root; root's permission errors
# are injected at the syscall below) | ("link", target) | ("fifo",) | ("socket",). Targets outside the root
# point into a sibling directory that holds a complete layout of its own.

Spec = tuple[Any, ...]

#: Names the layout gives a meaning to, names it ignores, and names a record cannot hold (not UTF-8, a line
#: feed, 300 characters).
NAMES = st.sampled_from(["a", "b", "sub", "w", "v1", ".staging", "x" * 250, "\udcff", "n\u00e9", "line\nfeed",
                         MANIFEST, COMPLETE, f".{COMPLETE}.tmp", "model", "rank_0_0", "torch_compile_cache",
                         "torch_aot_compile", "vllm_compile_cache.py", "h1", "-"])
#: File lengths, some of them sparse and far beyond the disk (the scan must then count blocks).
SIZES = st.one_of(st.integers(0, 300), st.sampled_from([2**40, 2**43]))
LINKS = st.sampled_from(["OUT/weights", "OUT/big", "OUT", "/dev/zero", "/etc", "nowhere", ".", "..", "../..",
                         "SELF", "/proc/self/root"])
GARBAGE_MANIFESTS = st.one_of(st.binary(max_size=40), st.sampled_from([
    b"{}", b"[]", b"null", b'{"files": null}', b'{"files": {"path": "a", "size": 1}}', b'{"files": [{"path": "a"}]}',
    b'{"files": [{"path": "a", "size": -1}]}', b'{"files": [{"path": "a", "size": 1e400}]}',
    b'{"files": [{"path": "a", "size": "1"}]}', b'{"files": [{"path": "a", "size": true}]}',
    b'{"files": [{"path": "a", "size": 1.5}]}', b'{"files": [{"path": "/etc/passwd", "size": 1}]}',
    b'{"files": [{"path": "../x", "size": 1}]}', b'{"files": [{"path": "a/../../x", "size": 1}]}',
    b'{"files": [{"path": "a", "size": 99999999999999999999999999}]}', b'{"files": [{"path": "a\\u0000", "size": 1}]}',
    b'{"files": [{"path": "\\ud800", "size": 1}]}', b'{"apiVersion": "x", "files": [{"path": "a", "size": 1}]}',
    b'\xef\xbb\xbf{"files": [{"path": "a", "size": 1}]}', b"[" * 50_000 + b"]" * 50_000,
    b'{"files": [' + b",".join(b'{"path": "f%d", "size": 1}' % i for i in range(3000)) + b"]}",
]))


@st.composite
def anything(draw: st.DrawFn, depth: int = 0) -> Spec:
    """Any entry: a file, a manifest-like blob, a directory (maybe sealed), a link, a FIFO or a socket."""
    kinds = ["file", "file", "bytes", "link", "fifo", "socket"] + (["dir", "dir", "sealed"] if depth < 4 else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "file":
        return ("file", draw(SIZES))
    if kind == "bytes":
        return ("bytes", draw(GARBAGE_MANIFESTS))
    if kind in ("dir", "sealed"):
        return (kind, draw(st.dictionaries(NAMES, anything(depth + 1), max_size=4)))
    if kind == "link":
        return ("link", draw(LINKS))
    return (kind,)


@st.composite
def cache_entry(draw: st.DrawFn) -> Spec:
    """A version or key directory: files, a manifest (of its files, sizes right or wrong, or garbage),
    a marker of any kind; or anything at all in its place."""
    if draw(st.integers(0, 6)) == 0:
        return draw(anything(3))
    children = dict(draw(st.dictionaries(NAMES, anything(2), max_size=4)))
    files = {name: spec[1] for name, spec in children.items() if spec[0] == "file" and "\udcff" not in name}
    manifest = draw(st.integers(0, 3))
    if manifest == 1 and files:
        listed = [{"path": name, "size": size if draw(st.booleans()) else draw(SIZES)} for name, size in files.items()]
        children[MANIFEST] = ("bytes", json.dumps({"files": listed}).encode())
    elif manifest == 2:
        children[MANIFEST] = ("bytes", draw(GARBAGE_MANIFESTS))
    markers: list[Spec | None] = [None, ("file", 0), ("dir", {}), ("fifo",), ("link", "OUT/big"), ("link", "nowhere")]
    marker = draw(st.sampled_from(markers))
    if marker is not None:
        children[COMPLETE] = marker
    return ("dir", children)


@st.composite
def cache_root(draw: st.DrawFn) -> dict[str, Spec]:
    """Each kind's top directory with entries at the layout's depth, or anything at all in its place."""
    tree: dict[str, Spec] = {}
    for top, levels in (("weights", 2), ("compile", 1), ("snapshots", 2), ("adapters", 2)):
        if draw(st.integers(0, 9)) == 0:
            tree[top] = draw(anything(3))
            continue
        entries = {}
        for _ in range(draw(st.integers(0, 3))):
            if levels == 1:
                entries[draw(NAMES)] = draw(cache_entry())
            else:
                versions = draw(st.integers(0, 3))
                entries[draw(NAMES)] = ("dir", {draw(NAMES): draw(cache_entry()) for _ in range(versions)})
        tree[top] = ("dir", entries)
    return tree


def _build(path: bytes, spec: Spec, outside: bytes, sealed: list[bytes]) -> None:
    kind = spec[0]
    if kind in ("file", "bytes"):
        with open(path, "wb") as f:
            f.truncate(spec[1]) if kind == "file" else f.write(spec[1])
    elif kind in ("dir", "sealed"):
        os.mkdir(path)
        for name, child in spec[1].items():
            _build(os.path.join(path, os.fsencode(name)), child, outside, sealed)
        if kind == "sealed":
            sealed.append(path)
    elif kind == "link":
        target = {"SELF": path}.get(spec[1], os.fsencode(spec[1]))
        os.symlink(outside + target[3:] if target.startswith(b"OUT") else target, path)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        with socket.socket(socket.AF_UNIX) as s, contextlib.suppress(OSError):
            s.bind(path)  # a path longer than a socket address holds: no socket


def _state(top: bytes) -> dict[bytes, tuple[Any, ...]]:
    """Everything below ``top`` that a scan could change (kind, mode, size, times but access, content)."""
    out: dict[bytes, tuple[Any, ...]] = {}
    for directory, dirs, names in os.walk(top):
        for name in dirs + names:
            path = os.path.join(directory, name)
            st_ = os.lstat(path)
            content: Any = None
            if stat.S_ISREG(st_.st_mode) and st_.st_blocks:
                with open(path, "rb") as f:
                    content = hashlib.sha256(f.read()).hexdigest()
            elif stat.S_ISLNK(st_.st_mode):
                content = os.readlink(path)
            out[path] = (st_.st_mode, st_.st_size, st_.st_mtime_ns, st_.st_ctime_ns, st_.st_ino, content)
    return out


@contextlib.contextmanager
def built(tree: dict[str, Spec]) -> Iterator[tuple[Path, Path]]:
    """``(root, outside)``: the tree under ``root``, and beside it a directory with a complete layout and a
    10 KB file for links to point to."""
    with tempfile.TemporaryDirectory(prefix="fault-disk-") as tmp:
        outside, root = Path(tmp) / "outside", Path(tmp) / "root"
        make_weights(outside, "w", "v1", {"a": 5})
        (outside / "big").write_bytes(b"y" * 10_000)
        root.mkdir()
        sealed: list[bytes] = []
        for name, spec in tree.items():
            _build(os.path.join(os.fsencode(root), os.fsencode(name)), spec, os.fsencode(outside), sealed)
        for path in sealed:
            os.chmod(path, 0)
        try:
            yield root, outside
        finally:
            for path in sealed:
                with contextlib.suppress(OSError):  # changed into something else meanwhile: not a link followed
                    if stat.S_ISDIR(os.lstat(path).st_mode):
                        os.chmod(path, 0o755)


def scan_bounded(root: Path) -> CacheScan:
    """One scan as the agent makes it (manifest and size caches), in a thread with a bound on a hang
    (a FIFO opened blocking waits in a syscall, which lets the join return)."""
    outcome: list[CacheScan] = []
    error = in_thread(lambda: outcome.append(scan_cache(root, manifests=ManifestCache(), sizes=SizeCache())))
    assert error is None, repr(error)
    return outcome[0]


def assert_sound(scan: CacheScan, root: Path) -> None:
    """What every scan must say: entries within what their manifests allow, problems inside the root and
    saying what is wrong, usage only of reported entries, and a report the agent can build from it."""
    for w in scan.weights:
        assert w.bytes >= 0
        if w.complete:
            assert w.expected_bytes == w.bytes, w
        elif w.expected_bytes is not None:
            assert w.bytes <= max(0, w.expected_bytes - 1), w
    prefix = os.fsencode(root)
    for p in scan.problems:
        assert os.fsencode(p.path).startswith(prefix), p
        assert p.message.strip(), p
    reported = ({cache_id("weights", w.key) for w in scan.weights} | {cache_id("compile", k) for k in scan.compile_keys}
                | {cache_id("snapshot", k) for k in scan.snapshots} | {cache_id("adapter", k) for k in scan.adapters})
    assert set(scan.cache_bytes) <= reported and set(scan.last_used) <= reported
    fit_agent_report(nvme_total=2**50, nvme_free=2**40, weights=scan.weights_bytes, compile_keys=scan.compile_keys,
                     snapshots=scan.snapshots, adapters=scan.adapters, ttl=60.0, last_used=scan.last_used,
                     cache_bytes=scan.cache_bytes)


def _found(scan: CacheScan) -> tuple[Any, ...]:
    return scan.weights, scan.compile_keys, scan.snapshots, scan.adapters, scan.cache_bytes


SCAN_FUZZ = settings(max_examples=40, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@SCAN_FUZZ
@given(tree=cache_root())
def test_any_cache_root_scans_soundly_and_stays_as_it_was(tree: dict[str, Spec]) -> None:
    """Garbage manifests, markers of every kind, links out of the root (loops, dangling, to devices),
    FIFOs, sockets, sealed directories, names that are not UTF-8, sparse files past the disk: the scan
    returns, changes nothing (inside or outside), and what lies outside the root changes nothing of it."""
    with built(tree) as (root, outside):
        before = _state(os.fsencode(root.parent))
        scan = scan_bounded(root)
        assert _state(os.fsencode(root.parent)) == before
        assert_sound(scan, root)
        shutil.rmtree(outside)
        outside.mkdir()
        assert _found(scan_bounded(root)) == _found(scan)



@pytest.mark.parametrize("size", [
    pytest.param("true", id="a-boolean-was-read-as-1-byte"),
    pytest.param('"1"', id="a-string-was-read-as-its-number"),
])
def test_a_manifest_size_of_the_wrong_type_is_corrupt(tmp_path: Path, size: str) -> None:
    """A 1-byte file, its marker and a manifest sizing it ``true``: the weights were whole."""
    d = make_weights(tmp_path, "w", "v1", {"a": 1}, manifest=False, complete=True)
    (d / MANIFEST).write_text('{"files": [{"path": "a", "size": ' + size + "}]}")
    scan = scan_cache(tmp_path)
    assert [(w.bytes, w.complete, w.expected_bytes) for w in scan.weights] == [(1, False, None)]
    corrupt = [p for p in scan.problems if p.kind == "corrupt"]
    assert [Path(p.path).name for p in corrupt] == [MANIFEST]
    assert "files.0.size" in corrupt[0].message and "expected a number of bytes" in corrupt[0].message
    assert_sound(scan, tmp_path)

#: What can happen to a path between two of the scan's syscalls: an eviction deletes it, a writer puts
#: something else in its place, or the syscall fails (root cannot provoke EACCES with chmod).
CHANGES = st.sampled_from(["delete", "fifo", "dir", "link-out", "file", "EACCES", "EIO", "ENOENT", "ELOOP",
                           "ENAMETOOLONG"])
#: The syscalls the scan (and the readers it calls) makes by path.
HOOKED = ("scandir", "lstat", "stat", "open")


@contextlib.contextmanager
def changing(root: Path, outside: Path, plan: dict[int, tuple[str, int]]) -> Iterator[list[str]]:
    """Count the scan's syscalls on paths below ``root``; before the n-th, apply ``plan[n]`` (a change and
    which path of the tree it picks). Yields the changes made."""
    prefix = os.fsencode(root)
    real = {name: getattr(os, name) for name in HOOKED}
    calls, made, busy = [0], [], [False]

    def change(what: str, pick: int, path: Any) -> None:
        if what.startswith("E"):
            code = getattr(errno, what)
            made.append(what)
            raise OSError(code, os.strerror(code), path)
        paths = sorted(_state(prefix))
        if not paths:
            return
        victim = paths[pick % len(paths)]
        if stat.S_ISDIR(os.lstat(victim).st_mode):
            shutil.rmtree(victim)
        else:
            os.unlink(victim)
        made.append(what)
        if what == "fifo":
            os.mkfifo(victim)
        elif what == "dir":
            os.mkdir(victim)
            (Path(os.fsdecode(victim)) / "a").write_bytes(b"a")
        elif what == "link-out":
            os.symlink(os.fsencode(outside / "big"), victim)
        elif what == "file":
            Path(os.fsdecode(victim)).write_bytes(b"zz")

    def hook(name: str) -> Any:
        def call(path: Any, *args: Any, **kwargs: Any) -> Any:
            mine = kwargs.get("dir_fd") is not None or (
                isinstance(path, str | bytes | os.PathLike) and os.fsencode(path).startswith(prefix))
            if mine and not busy[0]:
                calls[0] += 1
                if calls[0] in plan:
                    busy[0] = True
                    try:
                        change(*plan[calls[0]], path)
                    finally:
                        busy[0] = False
            return real[name](path, *args, **kwargs)
        return call

    for name in HOOKED:
        setattr(os, name, hook(name))
    try:
        yield made
    finally:
        for name, function in real.items():
            setattr(os, name, function)


@SCAN_FUZZ
@given(tree=cache_root(), plan=st.dictionaries(st.integers(1, 60), st.tuples(CHANGES, st.integers(0, 10**6)),
                                               max_size=5))
def test_a_cache_root_changing_under_the_scan(tree: dict[str, Spec], plan: dict[int, tuple[str, int]]) -> None:
    """Files and directories deleted, swapped for FIFOs, links out of the root or other kinds, and
    syscalls failing, at any point of the scan: it returns, sound, and what lies outside is untouched."""
    with built(tree) as (root, outside):
        before = _state(os.fsencode(outside))
        with changing(root, outside, plan):
            scan = scan_bounded(root)
        assert_sound(scan, root)
        assert _state(os.fsencode(outside)) == before
