"""Fault and abuse suite, files part: policy documents and weights manifests built to hurt the reader.

Each file here once cost a reader minutes, gigabytes or forever: a 5 KB YAML alias bomb, a symlink
to /dev/zero, a FIFO nobody writes to, nesting deeper than Python's stack. Every one must now be a
located problem (a policy error, a scan problem), found without reading more than the size limit.
Tests that would hang without the fix run the read in a daemon thread joined with a generous bound
(a bound on a hang, not an assertion about speed).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from extender import files
from extender.agent.scan import scan_cache
from extender.core.document import MAX_DEPTH, MAX_VALUES
from extender.core.errors import PolicyError
from extender.files import MAX_DOCUMENT_BYTES, PolicyFile, load_policy
from extender.layout import MANIFEST, weights_dir
from tests.test_agent_scan import make_weights
from tests.test_scoring import POLICY

#: Bound on a read that must not hang (generous: CI machines stall); never asserted on.
HANG_BOUND_S = 60.0


def alias_bomb() -> str:
    """Nine levels of nine aliases: 9**9 (387 million) leaves from about 1 KB of YAML."""
    lines = ['a0: &a0 ["lol"]']
    for i in range(1, 10):
        refs = ",".join([f"*a{i - 1}"] * 9)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return POLICY + "\n".join(f"x-{line}" for line in lines) + "\n"


def merge_bomb() -> str:
    """The same through merge keys (``<<``), which PyYAML flattens by copying pairs."""
    lines = ["m0: &m0 {k: v}"]
    for i in range(1, 25):
        lines.append(f"m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}], k{i}: v}}")
    return "\n".join(lines) + "\n"


def in_thread(call: Callable[[], Any]) -> BaseException | None:
    """Run ``call`` in a daemon thread; the exception it raised (None if none). Fails on a hang."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_BOUND_S)
    assert outcome, "the read never returned"
    return outcome[0]


def _write(text: str) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        path.write_text(text)

    return write


def _write_bytes(data: bytes) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        path.write_bytes(data)

    return write


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _symlink_to(target: str) -> Callable[[Path], None]:
    return lambda path: path.symlink_to(target)


def _huge(path: Path) -> None:
    with path.open("wb") as f:  # sparse: no disk used
        f.truncate(MAX_DOCUMENT_BYTES + 1)


POLICY_ABUSE: list[tuple[str, Callable[[Path], None], str]] = [
    # (id, how the file is made, words in the problem)
    ("alias bomb", _write(alias_bomb()), f"more than {MAX_VALUES:,} values"),
    ("merge-key bomb", _write(merge_bomb()), f"more than {MAX_VALUES:,} values"),
    ("recursive alias", _write("a: &a [*a]\n"), "refers to itself"),
    ("nested 100,000 levels", _write("[" * 100_000 + "]" * 100_000), "nested deeper"),
    ("nested past the limit", _write("a: " + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + "\n"), "nested deeper"),
    ("alias as a mapping key", _write("a: &a [1, 2]\n? *a\n: x\n"), "plain scalars"),
    ("larger than the limit", _huge, "larger than"),
    ("symlink to /dev/zero", _symlink_to("/dev/zero"), "not a regular file"),
    ("FIFO", _fifo, "not a regular file"),
    ("a directory", lambda path: path.mkdir(), "not a regular file"),
    ("an unknown tag", _write(POLICY + "xtag: {name: !custom x}\n"), "xtag.name: unsupported YAML tag"),
    ("an integer of 5000 digits", _write(POLICY + f"xdigits: {'9' * 5000}\n"), "xdigits: an integer of thousands"),
    # PyYAML's reader error: two lines ('in "<unicode string>", position 0') and no line number
    ("a NUL byte", _write_bytes(b"apiVersion: v1\nkind: \x00\n"), ":2: YAML syntax: the character U+0000 at column 7"),
    ("a control character in a quoted value", _write_bytes(b'a: "x\x1b[2J"\n'),
     ":1: YAML syntax: the character U+001B"),
    ("a control character after lines ended by CR alone", _write_bytes(b"a: 1\rb: x\x01\r"),
     ":2: YAML syntax: the character U+0001 at column 5"),
    # "not UTF-8 text: invalid start byte", with no line: a Latin-1 byte in a 300-line file
    ("a byte that is not UTF-8", _write_bytes(b"apiVersion: v1\nkind: caf\xe9\n"),
     ":2: not UTF-8 text: byte 0xe9 at column 10"),
    ("a file saved as UTF-16", _write_bytes(POLICY.encode("utf-16")), "not UTF-8 text: it is UTF-16"),
]


@pytest.mark.parametrize(("make", "words"), [(m, w) for _, m, w in POLICY_ABUSE], ids=[i for i, _, _ in POLICY_ABUSE])
def test_an_abusive_policy_file_is_a_located_problem(tmp_path: Path, make: Callable[[Path], None],
                                                     words: str) -> None:
    path = tmp_path / "policy.yaml"
    make(path)
    error = in_thread(lambda: load_policy(path))
    assert isinstance(error, PolicyError), repr(error)
    assert words in str(error)
    assert all("\n" not in str(problem) for problem in error.problems)  # one line each


def test_a_real_policy_with_anchors_and_merge_keys_still_loads(tmp_path: Path) -> None:
    text = POLICY + "x-defaults: &d {a: 1}\nx-use: {<<: *d, b: 2}\n"
    path = tmp_path / "policy.yaml"
    path.write_text(text.replace("x-defaults", "xdefaults").replace("x-use", "xuse"))
    error = in_thread(lambda: load_policy(path))
    # extra top-level keys are refused by the schema, but only after a normal parse
    assert isinstance(error, PolicyError) and "unknown field" in str(error) and "xdefaults" in str(error)


@pytest.mark.parametrize("make", [_fifo, _symlink_to("/dev/zero")], ids=["FIFO", "symlink to /dev/zero"])
def test_policy_check_answers_for_an_unreadable_file(tmp_path: Path, make: Callable[[Path], None]) -> None:
    path = tmp_path / "policy.yaml"
    make(path)
    done = subprocess.run([sys.executable, "-m", "extender.cli", "policy", "check", str(path)],
                          check=False, capture_output=True, text=True, timeout=HANG_BOUND_S)
    assert done.returncode == 1
    assert "not a regular file" in done.stderr + done.stdout and "Traceback" not in done.stderr


class BadEdit(NamedTuple):
    id: str
    text: str


#: Edits a running process must survive: PolicyFile.poll() keeps the last good policy, never raises.
BAD_EDITS = [
    BadEdit("an unknown tag", POLICY + "xtag: {name: !custom x}\n"),
    BadEdit("an integer of 5000 digits", POLICY + f"xdigits: {'9' * 5000}\n"),
    BadEdit("an infinite tick", POLICY + "scaling: {tick: .inf}\n"),
    BadEdit("two documents", POLICY + "---\n" + POLICY),
]


@pytest.mark.parametrize("case", BAD_EDITS, ids=[c.id for c in BAD_EDITS])
def test_a_bad_edit_is_an_invalid_poll_not_an_exception(tmp_path: Path, case: BadEdit) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    watched = PolicyFile(path, None)
    assert watched.poll().outcome == "reloaded"
    path.write_text(case.text)
    assert watched.poll().outcome == "invalid"
    path.write_text(POLICY.replace("secondsPerPoint: 30s", "secondsPerPoint: 100s"))
    assert watched.poll().outcome == "reloaded"  # and the next good edit is taken


def test_a_parser_failure_is_an_invalid_poll_not_an_exception(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # whatever a future parser bug raises, the scaler's and the workers' threads must live on
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    watched = PolicyFile(path, None)

    def broken(text: str, source: str) -> None:
        raise OverflowError("cannot convert float infinity to integer")

    monkeypatch.setattr(files, "parse_policy", broken)
    assert watched.poll().outcome == "invalid"


@pytest.mark.parametrize("command", [["policy", "check"], ["policy", "show"], ["estimate", "--policy"]],
                         ids=["policy check", "policy show", "estimate"])
def test_the_commands_report_a_bad_value_without_a_traceback(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY + f"xbad: {{name: !custom x, description: {'9' * 5000}}}\n")
    done = subprocess.run([sys.executable, "-m", "extender.cli", *command, str(path)],
                          check=False, capture_output=True, text=True, timeout=HANG_BOUND_S)
    assert done.returncode == 1
    assert "unsupported YAML tag '!custom'" in done.stderr and "thousands of digits" in done.stderr
    assert "Traceback" not in done.stderr


# ---- the node agent's manifests ---------------------------------------------------------------------

MANIFEST_ABUSE: list[tuple[str, Callable[[Path], None], str]] = [
    ("symlink to /dev/zero", _symlink_to("/dev/zero"), "not a regular file"),
    ("FIFO", _fifo, "not a regular file"),
    ("symlink to a file outside the root", _symlink_to("/etc/hostname"), "not a regular file"),
    ("larger than the limit", _huge, "larger than"),
]


@pytest.mark.parametrize(("make", "words"), [(m, w) for _, m, w in MANIFEST_ABUSE],
                         ids=[i for i, _, _ in MANIFEST_ABUSE])
def test_an_abusive_manifest_is_a_scan_problem(tmp_path: Path, make: Callable[[Path], None], words: str) -> None:
    root = tmp_path / "cache"
    make_weights(root, "w", "v1", {"a": 100}, manifest=False, complete=False)
    make(weights_dir(root, "w", "v1") / MANIFEST)
    outcome: list[Any] = []
    error = in_thread(lambda: outcome.append(scan_cache(root)))
    assert error is None, repr(error)
    (scan,) = outcome
    assert [(w.workload, w.bytes, w.complete) for w in scan.weights] == [("w", 100, False)]
    (problem,) = scan.problems
    assert (Path(problem.path).name, problem.kind) == (MANIFEST, "corrupt")
    assert words in problem.message


# ---- the node agent stays inside its cache root -------------------------------------------------------


@pytest.mark.parametrize("top", ["weights", "compile", "snapshots"])
def test_a_top_level_directory_that_is_a_symlink_is_not_followed(tmp_path: Path, top: str) -> None:
    # compile -> /etc once reported 50 compile keys: the link's target is someone else's directory
    outside = tmp_path / "outside"
    make_weights(outside, "w", "v1", {"a": 100})  # outside/weights/w/v1, complete
    (outside / "compile" / "ck1-x").mkdir(parents=True)
    (outside / "compile" / "ck1-x" / "f").write_text("x")
    (outside / "snapshots" / "s").mkdir(parents=True)
    (outside / "snapshots" / "s" / ".complete").write_text("")
    root = tmp_path / "cache"
    root.mkdir()
    (root / top).symlink_to(outside / top)
    scan = scan_cache(root)
    assert (scan.weights, scan.compile_keys, scan.snapshots) == ((), (), ())
    (problem,) = scan.problems
    assert (Path(problem.path).name, problem.kind) == (top, "unreadable")
    assert "symbolic link" in problem.message


def test_sparse_files_larger_than_the_disk_are_counted_by_their_blocks(tmp_path: Path) -> None:
    # 11.5 PB of sparse files on a 270 GB disk were believed. Sizes that add up to more than the
    # filesystem holds cannot all be data: the scan then counts allocated blocks instead.
    from extender.agent.scan import SizeCache
    from extender.layout import compile_dir, write_manifest

    root = tmp_path / "cache"
    st = os.statvfs(tmp_path)
    disk = st.f_blocks * st.f_frsize
    directory = weights_dir(root, "w", "v1")
    directory.mkdir(parents=True)
    with (directory / "shard").open("wb") as f:
        f.write(b"x" * 8192)  # real data at the start, then a hole past the disk's size
        f.truncate(2 * disk)
    write_manifest(directory, [("shard", 2 * disk)])
    (directory / ".complete").write_text("")
    key_dir = compile_dir(root, "ck1-x")
    key_dir.mkdir(parents=True)
    with (key_dir / "blob").open("wb") as f:
        f.truncate(disk)
    scan = scan_cache(root, sizes=SizeCache())
    (entry,) = scan.weights
    assert entry.complete is False
    assert 8192 <= entry.bytes < 1 << 20  # the data written, in whole blocks; never the holes
    assert scan.cache_bytes["compile:ck1-x"] < 1 << 20
    assert any(p.kind == "inconsistent" and "sparse" in p.message for p in scan.problems)


def test_sparse_files_within_the_disk_keep_their_sizes(tmp_path: Path) -> None:
    # the common case (and every other test's fixtures): apparent sizes that fit the disk are believed
    root = tmp_path / "cache"
    make_weights(root, "w", "v1", {"a": 1 << 30})
    (entry,) = scan_cache(root).weights
    assert (entry.bytes, entry.complete) == (1 << 30, True)


@pytest.mark.parametrize("step", ["evict", "prepare", "finish"])
def test_the_warm_steps_do_not_follow_a_top_level_symlink_out_of_the_root(tmp_path: Path, step: str) -> None:
    # evict renamed and deleted compile/<key> through compile -> elsewhere: outside the cache root
    from extender.warm.steps import StepError, evict, finish, prepare

    outside = tmp_path / "outside"
    (outside / "ck1-x").mkdir(parents=True)
    (outside / "ck1-x" / "precious").write_text("not a cache")
    root = tmp_path / "cache"
    root.mkdir()
    (root / "compile").symlink_to(outside)
    steps: dict[str, Callable[[], object]] = {
        "evict": lambda: evict(root, "compile:ck1-x"), "prepare": lambda: prepare(root, "compile:ck1-y"),
        "finish": lambda: finish(root, "compile:ck1-x")}
    with pytest.raises(StepError, match="symbolic link"):
        steps[step]()
    assert (outside / "ck1-x" / "precious").read_text() == "not a cache"
    assert sorted(p.name for p in outside.iterdir()) == ["ck1-x"]
