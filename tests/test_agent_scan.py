"""The cache-root scanner on real directory trees (sparse files stand in for hundreds of GiB).

One named row per situation a node's disk can be in; the expected bytes are worked out beside each.
Errors the root user cannot provoke with chmod (tests run as root in CI) are injected at the one
syscall the scanner makes, with a real tree around them.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from extender.agent import scan as scan_module
from extender.agent.scan import CacheScan, ManifestCache, WeightsEntry, scan_cache
from extender.layout import (
    COMPLETE,
    MANIFEST,
    LayoutError,
    Manifest,
    ManifestFile,
    adapter_dir,
    compile_dir,
    delete_at,
    finish_from_disk,
    mark_complete,
    snapshot_dir,
    walk_at,
    weights_dir,
    write_manifest,
)

GiB = 2**30


def sparse(path: Path, size: int) -> None:
    """A file of ``size`` bytes that occupies (almost) no disk."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)


def make_weights(
    root: Path,
    workload: str,
    version: str,
    files: dict[str, int],
    *,
    present: dict[str, int] | None = None,
    manifest: bool = True,
    complete: bool = True,
) -> Path:
    """A weights directory whose manifest lists ``files``; ``present`` says what is on disk (default: all)."""
    directory = weights_dir(root, workload, version)
    directory.mkdir(parents=True, exist_ok=True)
    for rel, size in (files if present is None else present).items():
        sparse(directory / rel, size)
    if manifest:
        write_manifest(directory, sorted(files.items()))
    if complete:
        mark_complete(directory)
    return directory


SHARDS = {f"model-{i:05d}-of-00017.safetensors": 4 * GiB for i in range(1, 17)} | {
    "model-00017-of-00017.safetensors": 2 * GiB, "config.json": 700, "tokenizer/tokenizer.json": 9_000_000}
SHARDS_TOTAL = 16 * 4 * GiB + 2 * GiB + 700 + 9_000_000


@dataclass(frozen=True)
class Case:
    id: str
    build: Callable[[Path], Any]
    weights: tuple[WeightsEntry, ...] = ()
    compile_keys: tuple[str, ...] = ()
    snapshots: tuple[str, ...] = ()
    adapters: tuple[str, ...] = ()
    problems: tuple[tuple[str, str], ...] = ()  # (path relative to the root, kind)
    extra: dict[str, Any] = field(default_factory=dict)


def _corrupt_manifest(root: Path) -> None:
    d = make_weights(root, "w", "v1", {"a": 100, "b": 50}, manifest=False, complete=False)
    (d / MANIFEST).write_text("{not json")


def _manifest_with_escape(root: Path) -> None:
    d = make_weights(root, "w", "v1", {"a": 100}, manifest=False, complete=False)
    (d / MANIFEST).write_text(json.dumps({"files": [{"path": "../../etc/passwd", "size": 1}]}))


def _symlinks(root: Path) -> None:
    d = make_weights(root, "w", "v1", {"a": 100})
    sparse(root / "elsewhere" / "big", 10 * GiB)
    os.symlink(root / "elsewhere" / "big", d / "link-to-big")
    os.symlink(root / "elsewhere", d / "link-to-dir")


def _manifest_listing_a_link(root: Path) -> None:
    """What ``finish_from_disk`` wrote before it refused links: the link listed at its target's size."""
    d = make_weights(root, "w", "v1", {"a": 100}, manifest=False, complete=False)
    sparse(root / "elsewhere" / "big", 10 * GiB)
    os.symlink(root / "elsewhere" / "big", d / "big")
    write_manifest(d, [("a", 100), ("big", 10 * GiB)])
    mark_complete(d)


def _staging(root: Path) -> None:
    make_weights(root, "w", ".v2-partial", {"a": 100})
    make_weights(root, ".staging", "v1", {"a": 100})
    sparse(root / "weights" / "README", 10)


def _compile(root: Path) -> None:
    sparse(compile_dir(root, "ck1-full") / "inductor" / "fx" / "ab.py", 100)  # a file deep inside
    compile_dir(root, "ck1-empty").mkdir(parents=True)
    (compile_dir(root, "ck1-dirs-only") / "a" / "b").mkdir(parents=True)
    sparse(compile_dir(root, ".ck1-staging") / "x", 1)


def _manifest_listing_a_path_twice(root: Path) -> None:
    """A 1,000-byte file listed three times: counted once it would read 3,000 bytes, complete."""
    d = make_weights(root, "w", "v1", {"a": 1000}, manifest=False, complete=True)
    entry = {"path": "a", "size": 1000}
    (d / MANIFEST).write_text(json.dumps({"files": [entry, entry, entry]}))


def _manifest_listing_no_files(root: Path) -> None:
    """Another writer's empty manifest and its marker, beside a file it does not list: whole weights
    of 0 bytes, ready to the node labels, until the manifest said that much was corrupt."""
    d = make_weights(root, "w", "v1", {"a": 100}, manifest=False, complete=True)
    (d / MANIFEST).write_text(json.dumps({"files": []}))


def _manifest_being_written(root: Path) -> None:
    """The shards are whole and the loader is between writing the manifest and renaming it."""
    make_weights(root, "w", "v1", {"a": 100, "b": 50}, manifest=False, complete=False)
    sparse(weights_dir(root, "w", "v1") / f".{MANIFEST}.tmp", 604)
    sparse(weights_dir(root, "w", "v1") / f".{COMPLETE}.tmp", 0)


def _snapshots(root: Path) -> None:
    sparse(snapshot_dir(root, "llama3-8b", "main") / "pages.img", 20 * GiB)
    mark_complete(snapshot_dir(root, "llama3-8b", "main"))
    sparse(snapshot_dir(root, "qwen", "v1") / "pages.img", 1 * GiB)  # being written: no marker


def _linked_markers(root: Path) -> None:
    """Every kind's ``.complete`` a symbolic link, dangling or to a regular file: none counts."""
    real = root / "elsewhere" / "marker"
    sparse(real, 0)
    d = make_weights(root, "w", "dangling", {"a": 100}, complete=False)
    os.symlink("/nonexistent", d / COMPLETE)
    d = make_weights(root, "w", "to-a-file", {"a": 100}, complete=False)
    os.symlink(real, d / COMPLETE)
    for i, (entry, target) in enumerate([(snapshot_dir(root, "s", "dangling"), Path("/nonexistent")),
                                         (snapshot_dir(root, "s", "to-a-file"), real),
                                         (adapter_dir(root, "a", "dangling"), Path("/nonexistent")),
                                         (adapter_dir(root, "a", "to-a-file"), real)]):
        sparse(entry / f"file-{i}", 10)
        os.symlink(target, entry / COMPLETE)
    sparse(snapshot_dir(root, "s", "real") / "pages.img", 10)  # the control row: a regular marker counts
    mark_complete(snapshot_dir(root, "s", "real"))
    sparse(adapter_dir(root, "a", "real") / "adapter.safetensors", 10)
    mark_complete(adapter_dir(root, "a", "real"))


def _marker_is_a_directory(root: Path) -> None:
    d = make_weights(root, "w", "v1", {"a": 100}, complete=False)
    (d / COMPLETE).mkdir()
    sparse(snapshot_dir(root, "s", "v1") / "pages.img", 10)
    (snapshot_dir(root, "s", "v1") / COMPLETE).mkdir()


CASES = [
    Case("empty root", lambda root: None),
    Case("complete weights, 17 shards of 64 GiB, nested tokenizer",
         lambda root: make_weights(root, "llama", "rev-1", SHARDS),
         weights=(WeightsEntry("llama", "rev-1", SHARDS_TOTAL, True, SHARDS_TOTAL),)),
    Case("partial download: one shard whole, one half, one absent",
         lambda root: make_weights(root, "w", "v1", {"a": 4 * GiB, "b": 4 * GiB, "c": 2 * GiB},
                                   present={"a": 4 * GiB, "b": 2 * GiB}, complete=False),
         weights=(WeightsEntry("w", "v1", 6 * GiB, False, 10 * GiB),)),  # 4 + 2 of 10 GiB
    Case("every byte there but no marker: one byte short of complete",
         lambda root: make_weights(root, "w", "v1", {"a": 100, "b": 50}, complete=False),
         weights=(WeightsEntry("w", "v1", 149, False, 150),)),  # min(150, 150 - 1)
    Case("marked complete with a shard missing: partial, and said so",
         lambda root: make_weights(root, "w", "v1", {"a": 100, "b": 50}, present={"a": 100}),
         weights=(WeightsEntry("w", "v1", 100, False, 150),),
         problems=(("weights/w/v1", "inconsistent"),)),
    Case("marked complete with a shard longer than listed: capped, partial",
         lambda root: make_weights(root, "w", "v1", {"a": 100}, present={"a": 120}),
         weights=(WeightsEntry("w", "v1", 99, False, 100),),  # min(120, 100) capped at 100 - 1
         problems=(("weights/w/v1", "inconsistent"),)),
    Case("files beyond the manifest are not weights",
         lambda root: make_weights(root, "w", "v1", {"a": 100}, present={"a": 100, "extra.bin": 5000}),
         weights=(WeightsEntry("w", "v1", 100, True, 100),)),
    Case("no manifest: the bytes present, never complete",
         lambda root: make_weights(root, "w", "v1", {"a": 100, "b": 50}, manifest=False, complete=False),
         weights=(WeightsEntry("w", "v1", 150, False, None),)),
    Case("a manifest still being written is not counted as model bytes",
         _manifest_being_written,
         weights=(WeightsEntry("w", "v1", 150, False, None),)),
    Case("marker without a manifest: partial, and said so",
         lambda root: make_weights(root, "w", "v1", {"a": 100}, manifest=False, complete=True),
         weights=(WeightsEntry("w", "v1", 100, False, None),),
         problems=(("weights/w/v1", "inconsistent"),)),
    Case("corrupt manifest: bytes present, a problem",
         _corrupt_manifest,
         weights=(WeightsEntry("w", "v1", 150, False, None),),
         problems=(("weights/w/v1/.manifest.json", "corrupt"),)),
    Case("a manifest path escaping the directory is corrupt",
         _manifest_with_escape,
         weights=(WeightsEntry("w", "v1", 100, False, None),),
         problems=(("weights/w/v1/.manifest.json", "corrupt"),)),
    Case("a manifest listing a path twice is corrupt, never complete at a multiple of its size",
         _manifest_listing_a_path_twice,
         weights=(WeightsEntry("w", "v1", 1000, False, None),),
         problems=(("weights/w/v1/.manifest.json", "corrupt"), ("weights/w/v1", "inconsistent"))),
    Case("a manifest listing no files is corrupt, never complete at 0 bytes",
         _manifest_listing_no_files,
         weights=(WeightsEntry("w", "v1", 100, False, None),),
         problems=(("weights/w/v1/.manifest.json", "corrupt"), ("weights/w/v1", "inconsistent"))),
    Case("symbolic links are neither followed nor counted",
         _symlinks,
         weights=(WeightsEntry("w", "v1", 100, True, 100),)),
    Case("a manifest listing a symbolic link: the link is not followed, so never complete",
         _manifest_listing_a_link,
         weights=(WeightsEntry("w", "v1", 100, False, 100 + 10 * GiB),),
         problems=(("weights/w/v1", "inconsistent"),)),
    Case("staging directories and stray files are ignored", _staging),
    Case("two versions of one workload, two workloads",
         lambda root: [make_weights(root, "a", "v1", {"x": 10}), make_weights(root, "a", "v2", {"x": 20}),
                       make_weights(root, "b", "v1", {"x": 30}, complete=False)],
         weights=(WeightsEntry("a", "v1", 10, True, 10), WeightsEntry("a", "v2", 20, True, 20),
                  WeightsEntry("b", "v1", 29, False, 30))),
    Case("compile keys: present once a file exists anywhere inside", _compile, compile_keys=("ck1-full",)),
    Case("snapshots: present only with the marker", _snapshots, snapshots=("llama3-8b/main",)),
    Case("a marker that is a symbolic link never counts, dangling or not",
         _linked_markers,
         weights=(WeightsEntry("w", "dangling", 99, False, 100), WeightsEntry("w", "to-a-file", 99, False, 100)),
         snapshots=("s/real",), adapters=("a/real",)),
    Case("a marker that is a directory never counts",
         _marker_is_a_directory,
         weights=(WeightsEntry("w", "v1", 99, False, 100),)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_scan(tmp_path: Path, case: Case) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    case.build(root)
    result = scan_cache(root)
    assert result.weights == case.weights
    assert result.compile_keys == case.compile_keys
    assert result.snapshots == case.snapshots
    assert result.adapters == case.adapters
    assert sorted((str(Path(p.path).relative_to(root)), p.kind) for p in result.problems) == sorted(case.problems)


def test_missing_root_is_a_problem_not_an_error(tmp_path: Path) -> None:
    result = scan_cache(tmp_path / "absent")
    assert result == CacheScan(problems=result.problems)
    assert [p.kind for p in result.problems] == ["unreadable"]


def test_complete_workloads_and_bytes_by_key(tmp_path: Path) -> None:
    make_weights(tmp_path, "a", "v1", {"x": 10})
    make_weights(tmp_path, "b", "v1", {"x": 10}, complete=False)
    result = scan_cache(tmp_path)
    assert result.complete_workloads == {"a"}
    assert result.weights_bytes == {"a/v1": 10, "b/v1": 9}
    assert result.files == 2


def test_finish_from_disk_writes_a_manifest_of_what_is_there(tmp_path: Path) -> None:
    d = weights_dir(tmp_path, "w", "v1")
    sparse(d / "a.safetensors", 3 * GiB)
    sparse(d / "sub" / "b.json", 10)
    manifest = finish_from_disk(d, source="s3://bucket/w/")
    assert manifest.total_bytes == 3 * GiB + 10
    assert (d / COMPLETE).exists()
    assert Manifest.model_validate_json((d / MANIFEST).read_bytes()) == manifest
    assert scan_cache(tmp_path).weights == (WeightsEntry("w", "v1", 3 * GiB + 10, True, 3 * GiB + 10),)


@pytest.mark.parametrize(("at", "make", "said"), [
    pytest.param("secret", lambda p, out: p.symlink_to(out / "big"), "is a symbolic link",
                 id="a link to a file outside the directory"),
    pytest.param("gone", lambda p, out: p.symlink_to(out / "absent"), "is a symbolic link", id="a dangling link"),
    pytest.param("sub/models", lambda p, out: p.symlink_to(out, target_is_directory=True),
                 "is a symbolic link (to a directory)", id="a link to a directory"),
    pytest.param("pipe", lambda p, out: os.mkfifo(p), "is not a regular file", id="a FIFO"),
    # pydantic's ValidationError escaped the warm Job's finish as a traceback
    pytest.param("tok\udcff.json", lambda p, out: p.write_bytes(b"{}"), "is not a UTF-8 name",
                 id="a file name that is not UTF-8"),
    pytest.param("sub\udcfe/b", lambda p, out: p.write_bytes(b"b"), "is not a UTF-8 name",
                 id="a directory name that is not UTF-8"),
])
def test_finish_from_disk_refuses_what_the_agent_would_not_count(tmp_path: Path, at: str,
                                                                 make: Callable[[Path, Path], object],
                                                                 said: str) -> None:
    """It stat-ed through a link: the manifest recorded the target's size (``/etc/shadow``, a huge file
    elsewhere), which the scan, never following a link, then found missing at every pass."""
    outside = tmp_path / "elsewhere"
    sparse(outside / "big", 10 * GiB)
    d = weights_dir(tmp_path / "cache", "w", "v1")
    sparse(d / "a", 100)
    (d / at).parent.mkdir(parents=True, exist_ok=True)
    make(d / at, outside)
    with pytest.raises(LayoutError) as refused:
        finish_from_disk(d)
    shown = os.fsencode(d / at).decode("utf-8", "backslashreplace")  # the bytes of a name no text holds
    assert str(refused.value).startswith(f"{shown} {said}: ")
    assert not (d / MANIFEST).exists() and not (d / COMPLETE).exists()  # nothing sealed
    (d / at).unlink()
    assert finish_from_disk(d).files == (ManifestFile(path="a", size=100),)
    assert scan_cache(tmp_path / "cache").weights == (WeightsEntry("w", "v1", 100, True, 100),)


@pytest.mark.parametrize("make", [
    pytest.param(lambda d: None, id="an empty directory"),
    pytest.param(lambda d: (d / "sub" / "deeper").mkdir(parents=True), id="empty directories only"),
    pytest.param(lambda d: (d / MANIFEST).write_text('{"files": []}'), id="only a manifest of its own"),
    pytest.param(lambda d: (d / f".{COMPLETE}.tmp").write_bytes(b""), id="only a marker being written"),
])
def test_finish_from_disk_refuses_a_directory_with_no_file_to_list(tmp_path: Path,
                                                                   make: Callable[[Path], object]) -> None:
    """It sealed an empty manifest with its marker: the agent reported whole weights of 0 bytes."""
    d = weights_dir(tmp_path, "w", "v1")
    d.mkdir(parents=True)
    make(d)
    with pytest.raises(LayoutError, match=f"^{d} holds no file to list: "):
        finish_from_disk(d)
    assert not (d / COMPLETE).exists()
    assert scan_cache(tmp_path).complete_workloads == frozenset()


def test_finish_from_disk_through_a_path_lists_and_writes_one_directory(tmp_path: Path) -> None:
    """Given a path that is a link to the directory, the walk did not enter it while the writes went
    through it: an empty manifest marked complete, which the agent reported as whole weights of 0 bytes."""
    real = weights_dir(tmp_path, "w", "v1")
    sparse(real / "a", 100)
    (tmp_path / "named").symlink_to(real, target_is_directory=True)
    assert finish_from_disk(tmp_path / "named").files == (ManifestFile(path="a", size=100),)
    assert scan_cache(tmp_path).weights == (WeightsEntry("w", "v1", 100, True, 100),)


# ---- the walk of a tree through open directories ----------------------------------------------


def _nested(d: Path) -> None:
    sparse(d / "a", 1)
    sparse(d / "sub" / "b", 1)
    sparse(d / "sub" / "deeper" / "c", 1)
    (d / "empty").mkdir()


def _links(d: Path) -> None:
    _nested(d)
    (d / "to-dir").symlink_to(d / "sub", target_is_directory=True)
    (d / "to-file").symlink_to(d / "a")
    (d / "dangling").symlink_to(d / "absent")
    (d / "sub" / "up").symlink_to(d, target_is_directory=True)  # a loop, were it followed


def _special(d: Path) -> None:
    _nested(d)
    os.mkfifo(d / "sub" / "pipe")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(d / "sock"))


Walk = list[tuple[str, list[str], list[str]]]


@pytest.mark.parametrize("build", [
    pytest.param(lambda d: None, id="an empty directory"),
    pytest.param(_nested, id="files and nested directories"),
    pytest.param(_links, id="links to a directory, a file, nothing, and up the tree"),
    pytest.param(_special, id="a FIFO and a socket"),
])
@pytest.mark.parametrize("prune", [pytest.param(False, id="whole"), pytest.param(True, id="'sub' pruned")])
def test_walk_at_yields_what_os_fwalk_yields(tmp_path: Path, build: Callable[[Path], object], prune: bool) -> None:
    """The walk replaced ``os.fwalk`` under ``finish_from_disk`` and the warm steps: the same tree, told
    apart the same way (a link to a directory among the directories, never entered)."""
    d = tmp_path / "tree"
    d.mkdir()
    build(d)

    def walked(walk: Iterator[tuple[str, list[str], list[str], int]]) -> Walk:
        seen = []
        for path, dirs, files, _ in walk:
            if prune and "sub" in dirs:
                dirs.remove("sub")
            seen.append((path, sorted(dirs), sorted(files)))
        return sorted(seen)

    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert walked(walk_at(fd)) == walked(os.fwalk(".", dir_fd=fd))
    finally:
        os.close(fd)


T = TypeVar("T")


class _Listed:
    """A listing read whole before the directory changed, handed out afterwards."""

    def __init__(self, entries: list[os.DirEntry[str]]) -> None:
        self._entries = entries

    def __iter__(self) -> Iterator[os.DirEntry[str]]:
        return iter(self._entries)

    def __enter__(self) -> _Listed:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def close(self) -> None:
        pass


def fifo_after_listing(monkeypatch: pytest.MonkeyPatch, directory: Path, name: str) -> Path:
    """The next listing of ``directory`` (by path or fd, by anyone: ``os.fwalk`` lists through
    ``os.scandir`` too) is read whole, and then its subdirectory ``name`` becomes a FIFO: a walk
    that opens what it listed meets the FIFO where it saw a directory. Returns the FIFO's path."""
    real = os.scandir
    target = os.stat(directory)
    fifo = directory / name
    swapped: list[bool] = []

    def scandir(path: Any = ".") -> Any:
        try:
            st = os.fstat(path) if isinstance(path, int) else os.stat(path)
        except OSError:
            return real(path)
        if swapped or not os.path.samestat(st, target):
            return real(path)
        swapped.append(True)
        with real(path) as it:
            entries = list(it)
        shutil.rmtree(fifo)
        os.mkfifo(fifo)
        return _Listed(entries)

    monkeypatch.setattr(os, "scandir", scandir)
    return fifo


def without_hanging(call: Callable[[], T], fifo: Path) -> T:
    """``call()``, in a thread: a hang detector, not a timing test. Still running after 10 s, it is
    blocked opening ``fifo`` for reading; a writer opening it lets it go, and the test fails."""
    returned: list[T] = []
    raised: list[BaseException] = []

    def run() -> None:
        try:
            returned.append(call())
        except BaseException as exc:  # handed to the test's thread
            raised.append(exc)

    t = threading.Thread(target=run, name="walk", daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # the reader waiting in open() goes on
        t.join(10)
        pytest.fail(f"blocked opening {fifo}, a FIFO found where a directory was listed")
    if raised:
        raise raised[0]
    return returned[0]


def test_finish_from_disk_refuses_a_directory_swapped_for_a_fifo(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``os.fwalk`` opened each directory with plain O_RDONLY: a FIFO put in place of one after the
    listing blocked the open, and the warm Job with it until its deadline. Now the open fails at
    once, and nothing is sealed: a manifest without ``sub/b`` would be whole weights missing a file."""
    d = weights_dir(tmp_path, "w", "v1")
    sparse(d / "a", 100)
    sparse(d / "sub" / "b", 10)
    fifo = fifo_after_listing(monkeypatch, d, "sub")
    with pytest.raises(LayoutError, match=r"/sub cannot be entered \(Not a directory\): the manifest would leave out"):
        without_hanging(lambda: finish_from_disk(d), fifo)
    assert not (d / MANIFEST).exists() and not (d / COMPLETE).exists()



def _tree(root: Path, more: Callable[[Path], object] = lambda sub: None) -> None:
    """Files, a nested and an empty directory; ``more(root / "sub")`` adds to it."""
    sparse(root / "a", 10)
    sparse(root / "sub" / "deeper" / "b", 10)
    (root / "empty").mkdir()
    more(root / "sub")


DELETED: list[Any] = [
    pytest.param(_tree, id="a-tree"),
    pytest.param(lambda p: sparse(p, 10), id="a-file"),
    pytest.param(os.mkfifo, id="a-fifo"),
    pytest.param(lambda p: p.symlink_to(p.parent / "outside"), id="a-link-to-a-directory"),
    pytest.param(lambda p: p.symlink_to(p.parent / "nowhere"), id="a-dangling-link"),
    pytest.param(lambda p: _tree(p, lambda sub: (sub / "out").symlink_to(p.parent / "outside")), id="a-link-below"),
    pytest.param(lambda p: _tree(p, lambda sub: os.mkfifo(sub / "pipe")), id="a-fifo-below"),
    pytest.param(lambda p: None, id="nothing-there"),
]


@pytest.mark.parametrize("build", DELETED)
def test_delete_at_deletes_the_entry_and_nothing_a_link_points_to(tmp_path: Path,
                                                                  build: Callable[[Path], object]) -> None:
    sparse(tmp_path / "outside" / "kept", 10)
    build(tmp_path / "entry")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        delete_at(fd, "entry")
    finally:
        os.close(fd)
    assert not os.path.lexists(tmp_path / "entry")
    assert (tmp_path / "outside" / "kept").stat().st_size == 10


def test_delete_at_does_not_hang_on_a_directory_swapped_for_a_fifo(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``shutil.rmtree`` (CPython 3.11) looked at each entry, then opened it with plain O_RDONLY: a FIFO
    put in place of a directory in between blocked the open, and the warm Job until its deadline."""
    _tree(tmp_path / "entry")
    fifo = tmp_path / "entry" / "sub"
    real = os.open
    swapped: list[bool] = []

    def open_(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if path == "sub" and not swapped:  # the look said directory; a FIFO is there by the open
            swapped.append(True)
            shutil.rmtree(fifo)
            os.mkfifo(fifo)
        return real(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", open_)
    fd = real(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        without_hanging(lambda: delete_at(fd, "entry"), fifo)
    finally:
        os.close(fd)
    assert swapped and not os.path.lexists(tmp_path / "entry")


# ---- errors injected at the syscall, on real trees ---------------------------------------------


@pytest.fixture
def scandir_hook(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Callable[[str], None]]]:
    """Run a callback just before the scanner lists a given directory (path -> callback)."""
    hooks: dict[str, Callable[[str], None]] = {}
    real = os.scandir

    class _Os:
        def __getattr__(self, name: str) -> Any:
            return getattr(os, name)

        @staticmethod
        def scandir(path: Any) -> Any:
            p = os.fspath(path)
            if p in hooks:
                hooks[p](p)
            return real(path)

    monkeypatch.setattr(scan_module, "os", _Os())
    yield hooks


def test_permission_denied_is_reported_and_the_rest_scanned(
    tmp_path: Path, scandir_hook: dict[str, Callable[[str], None]]
) -> None:
    make_weights(tmp_path, "w", "v1", {"a": 100, "sub/b": 50})
    make_weights(tmp_path, "ok", "v1", {"a": 7})

    def deny(path: str) -> None:
        raise PermissionError(13, "Permission denied", path)

    scandir_hook[str(weights_dir(tmp_path, "w", "v1") / "sub")] = deny
    result = scan_cache(tmp_path)
    # the readable part counts; the directory cannot be complete since part of it is unknown
    assert result.weights == (WeightsEntry("ok", "v1", 7, True, 7), WeightsEntry("w", "v1", 100, False, 150))
    assert [(p.kind, Path(p.path).name) for p in result.problems] == [("unreadable", "sub"),
                                                                        ("inconsistent", "v1")]


def test_files_vanishing_mid_scan(tmp_path: Path, scandir_hook: dict[str, Callable[[str], None]]) -> None:
    d = make_weights(tmp_path, "w", "v1", {"a": 100, "b": 50}, complete=False)
    sparse(compile_dir(tmp_path, "ck1-x") / "f", 1)
    real = os.scandir

    def delete_after_listing(path: str) -> None:
        # the listing is taken first, then the files go (an eviction running concurrently): the
        # scanner's lstat of each entry then fails with ENOENT
        entries = list(real(path))
        for e in entries:
            if e.name == "b":
                os.remove(e.path)
        scandir_hook.pop(path)

    scandir_hook[str(d)] = delete_after_listing
    result = scan_cache(tmp_path)
    assert result.weights == (WeightsEntry("w", "v1", 100, False, 150),)
    assert result.compile_keys == ("ck1-x",)


def test_a_directory_vanishing_mid_scan(tmp_path: Path, scandir_hook: dict[str, Callable[[str], None]]) -> None:
    make_weights(tmp_path, "gone", "v1", {"a": 100})
    make_weights(tmp_path, "kept", "v1", {"a": 5})
    target = weights_dir(tmp_path, "gone", "v1")

    def evict(path: str) -> None:
        for p in sorted(Path(path).rglob("*"), reverse=True):
            p.unlink() if p.is_file() else p.rmdir()
        Path(path).rmdir()

    scandir_hook[str(target)] = evict
    result = scan_cache(tmp_path)
    assert result.weights == (WeightsEntry("kept", "v1", 5, True, 5),)
    assert [p.kind for p in result.problems if Path(p.path) == target] == ["vanished"]


def test_the_manifest_cache_sees_every_change(tmp_path: Path) -> None:
    cache = ManifestCache()
    d = make_weights(tmp_path, "w", "v1", {"a": 100, "b": 50})
    assert scan_cache(tmp_path, manifests=cache).weights == (WeightsEntry("w", "v1", 150, True, 150),)
    assert scan_cache(tmp_path, manifests=cache).weights == (WeightsEntry("w", "v1", 150, True, 150),)
    assert len(cache) == 1
    write_manifest(d, [("a", 100), ("b", 50), ("c", 25)])  # rewritten (by rename): parsed again
    assert scan_cache(tmp_path, manifests=cache).weights == (WeightsEntry("w", "v1", 150, False, 175),)
    (d / MANIFEST).write_text("{broken")  # rewritten in place: new size and mtime
    result = scan_cache(tmp_path, manifests=cache)
    assert result.weights == (WeightsEntry("w", "v1", 150, False, None),)
    assert [p.kind for p in result.problems] == ["corrupt", "inconsistent"]
    shutil.rmtree(d)
    scan_cache(tmp_path, manifests=cache)
    assert len(cache) == 0  # entries of vanished directories are dropped
