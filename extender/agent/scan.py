"""Scan a node cache root into what it holds (the layout is in :mod:`extender.layout`).

The scan reads the filesystem and nothing else; the result is a plain value. It never raises for
what it finds: a corrupt manifest, a directory it may not read, a file that vanishes between
listing and ``lstat`` (a download finishing or a cache being evicted) each become a
:class:`Problem` naming the path, and the rest of the tree is reported.

Cost: one ``scandir`` per directory and one ``lstat`` per file below ``weights/``; compile-cache
directories (often tens of thousands of small Triton files) are entered only until their first
file is found, or, when they hold vLLM's own tree, only down to the level of vLLM's index files
(:mod:`extender.agent.vllm_cache`). Symbolic links are neither followed nor counted, at any level below the root (the
top-level ``weights``, ``compile`` and ``snapshots`` too): a link's target is someone else's bytes,
and following links invites loops. Numbers are in BENCHMARKS.md.

Usage, for the cache warmer's evictions (``NodeState.last_used`` and ``cache_bytes``, keyed by
cache id): an entry's last use is the newest of the access, modification and change times of its
files (the change time too, because copy tools set the modification time to the source's, while
the change time is when the file landed here). Weights get it from the ``lstat`` the scan already
does. Compile and snapshot entries are measured in full (size and newest time) only with a
:class:`SizeCache`, at most every ``refresh_s`` per directory, so the usual scan still stops at a
compile directory's first file; without one, their last use is the directory's own times and
their size is left to the policy's declared size. With ``relatime`` mounts an access time can lag
by up to a day; the warmer's other protections (pods on the node, tracked workloads, the idle
threshold) do not depend on it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, assert_never

from pydantic import ValidationError

from extender.agent.disk import disk_usage
from extender.agent.vllm_cache import vllm_state
from extender.core.caches import NVME_KINDS, KindSpec, cache_id, weights_key
from extender.core.schema import read_stored
from extender.files import read_regular
from extender.layout import (
    COMPLETE,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    Manifest,
    is_metadata,
    marked_complete,
)

#: ``unstorable``: found, but a record cannot hold it (a name with control characters, too many
#: entries; :func:`extender.core.reports.fit_agent_report`), so it is left out of the report.
ProblemKind = Literal["unreadable", "vanished", "corrupt", "inconsistent", "unstorable"]


@dataclass(frozen=True)
class Problem:
    """Something in the cache root the scan could not use as it is."""

    path: str
    kind: ProblemKind
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


@dataclass(frozen=True)
class WeightsEntry:
    """One ``weights/<workload>/<version>/`` directory."""

    workload: str
    version: str
    #: Bytes present (all of them when complete; never the manifest's total when not).
    bytes: int
    complete: bool
    #: The manifest's total, when a readable manifest exists.
    expected_bytes: int | None
    #: Newest access, modification or change time of its files (unix seconds); usage, not content.
    last_used: float | None = field(default=None, compare=False)

    @property
    def key(self) -> str:
        return weights_key(self.workload, self.version)


@dataclass(frozen=True)
class CacheScan:
    """Everything one scan found."""

    weights: tuple[WeightsEntry, ...] = ()
    compile_keys: tuple[str, ...] = ()
    snapshots: tuple[str, ...] = ()
    adapters: tuple[str, ...] = ()
    problems: tuple[Problem, ...] = ()
    #: Regular files looked at (``lstat`` calls), for logs and benchmarks.
    files: int = 0
    #: Last use per cache id (weights, compile, snapshot entries); see the module docstring.
    last_used: dict[str, float] = field(default_factory=dict, compare=False)
    #: Bytes of compile and snapshot entries by cache id, when measured (a :class:`SizeCache`).
    cache_bytes: dict[str, int] = field(default_factory=dict, compare=False)

    @property
    def weights_bytes(self) -> dict[str, int]:
        return {w.key: w.bytes for w in self.weights}

    @property
    def complete_workloads(self) -> frozenset[str]:
        """Workloads with at least one complete weights version."""
        return frozenset(w.workload for w in self.weights if w.complete)


@dataclass
class Walk:
    problems: list[Problem] = field(default_factory=list)
    files: int = 0
    #: Count a file's allocated blocks (at most its length) instead of its length: see :func:`scan_cache`.
    allocated: bool = False

    def size_of(self, st: os.stat_result) -> int:
        return min(st.st_size, st.st_blocks * 512) if self.allocated else st.st_size

    def problem(self, path: str | os.PathLike[str], kind: ProblemKind, message: str) -> None:
        self.problems.append(Problem(os.fspath(path), kind, message))

    def os_problem(self, path: str | os.PathLike[str], exc: OSError) -> None:
        if isinstance(exc, FileNotFoundError):
            self.problem(path, "vanished", "vanished during the scan")
        else:
            self.problem(path, "unreadable", f"cannot read: {exc.strerror or exc}")

    def entries(self, directory: Path, *, missing_ok: bool = False) -> list[os.DirEntry[str]]:
        """The entries of a directory, sorted by name; [] (and a problem) if it cannot be listed."""
        try:
            with os.scandir(directory) as it:
                return sorted(it, key=lambda e: e.name)
        except FileNotFoundError as exc:
            if not missing_ok:
                self.os_problem(directory, exc)
            return []
        except OSError as exc:
            self.os_problem(directory, exc)
            return []

    def top(self, root: Path, name: str) -> Path | None:
        """``root/name`` when it is a real directory inside the root; ``None`` (and a problem if it exists) otherwise.

        The cache root itself may be a link (the operator chose it), but nothing below it is
        followed: ``compile -> /etc`` once reported every file of /etc as compile caches.
        """
        path = root / name
        return path if self.real_dir(path, inside="its cache root") else None

    def real_dir(self, path: Path, *, inside: str) -> bool:
        """Is ``path`` a directory and not a symbolic link? Missing: silently ``False``; anything else a problem."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            self.os_problem(path, exc)
            return False
        if stat.S_ISLNK(st.st_mode):
            self.problem(path, "unreadable", f"a symbolic link, not followed: the agent stays inside {inside}")
            return False
        if not stat.S_ISDIR(st.st_mode):
            self.problem(path, "unreadable", "not a directory")
            return False
        return True

    def subdirs(self, directory: Path, *, missing_ok: bool = False) -> list[os.DirEntry[str]]:
        """Sub-directories that are not staging areas (names starting with '.')."""
        out = []
        for entry in self.entries(directory, missing_ok=missing_ok):
            try:
                if not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False):
                    out.append(entry)
            except OSError as exc:
                self.os_problem(entry.path, exc)
        return out

    def file_sizes(self, top: str) -> tuple[dict[str, int], set[str], bool, float]:
        """``(relative path -> size, top-level names, complete listing?, newest file time)`` below ``top``.

        Iterative (no recursion limit for deep trees). A directory that cannot be listed makes the
        listing incomplete; a file that vanishes is simply not there. The newest time is the
        largest access, modification or change time of the files (0 without files).
        """
        sizes: dict[str, int] = {}
        top_names: set[str] = set()
        whole = True
        newest = 0.0
        stack: list[tuple[str, str]] = [(top, "")]
        while stack:
            path, prefix = stack.pop()
            try:
                it = os.scandir(path)
            except OSError as exc:
                self.os_problem(path, exc)
                whole = False
                continue
            with it:
                for entry in it:
                    if not prefix:
                        top_names.add(entry.name)
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append((entry.path, f"{prefix}{entry.name}/"))
                        elif entry.is_file(follow_symlinks=False):
                            if not prefix and is_metadata(entry.name):
                                continue
                            self.files += 1
                            st = entry.stat(follow_symlinks=False)
                            sizes[prefix + entry.name] = self.size_of(st)
                            newest = max(newest, st.st_atime, st.st_mtime, st.st_ctime)
                    except OSError as exc:
                        self.os_problem(entry.path, exc)
                        if not isinstance(exc, FileNotFoundError):
                            whole = False
        return sizes, top_names, whole, newest

    def files_below(self, top: str) -> Generator[os.DirEntry[str], None, None]:
        """Every regular file below ``top``, depth first, symlinks not followed; an unreadable
        directory is logged and skipped."""
        stack = [top]
        while stack:
            path = stack.pop()
            try:
                with os.scandir(path) as it:
                    for entry in it:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        elif entry.is_file(follow_symlinks=False):
                            yield entry
            except OSError as exc:
                self.os_problem(path, exc)

    def usage(self, top: str) -> tuple[int, float]:
        """``(bytes of every regular file below top, newest file time)``; unreadable parts are skipped."""
        total, newest = 0, 0.0
        for entry in self.files_below(top):
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as exc:  # vanished or unreadable since the listing
                self.os_problem(entry.path, exc)
                continue
            total += self.size_of(st)
            newest = max(newest, st.st_atime, st.st_mtime, st.st_ctime)
        return total, newest

    def has_file(self, top: str) -> bool:
        """Does any regular file exist below ``top`` (stops at the first one)?"""
        files = self.files_below(top)
        try:
            return next(files, None) is not None
        finally:
            files.close()  # releases the open scandir handle now, not at garbage collection

ManifestResult = tuple[Manifest | None, str | None]


@dataclass(frozen=True)
class _Measured:
    stamp: tuple[int, int]
    at: float
    bytes: int
    newest: float


class SizeCache:
    """Sizes and newest file times of compile and snapshot directories, kept between scans.

    A compile cache can hold tens of thousands of files, and walking all of them every scan would
    multiply the agent's cost; its size changes only while an engine compiles. So a directory is
    measured when first seen, when its own identity or modification time changes (an entry added
    or removed at its top), and otherwise at most every ``refresh_s`` seconds. Entries of
    directories not seen in the latest scan are dropped.
    """

    def __init__(self, refresh_s: float = 300.0, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.refresh_s = refresh_s
        self.clock = clock
        self._entries: dict[str, _Measured] = {}
        self._seen: set[str] = set()
        #: Full walks done (tests and logs).
        self.walks = 0

    def measure(self, walk: Walk, path: str, stamp: tuple[int, int]) -> tuple[int, float]:
        """``(bytes, newest time)`` of the tree at ``path``, from the cache when still current."""
        self._seen.add(path)
        now = self.clock()
        hit = self._entries.get(path)
        if hit is not None and hit.stamp == stamp and now - hit.at < self.refresh_s:
            return hit.bytes, hit.newest
        size, newest = walk.usage(path)
        self.walks += 1
        self._entries[path] = _Measured(stamp, now, size, newest)
        return size, newest

    def end_scan(self) -> None:
        for path in self._entries.keys() - self._seen:
            del self._entries[path]
        self._seen = set()


class ManifestCache:
    """Parsed manifests kept between scans, keyed by the file's identity and change stamp.

    Manifests change only when a writer rewrites them (via rename, which changes the inode), and
    parsing one that lists thousands of files costs more than ``lstat``-ing them all, so a steady
    agent parses each manifest once. Entries of manifests not seen in the latest scan are dropped.
    """

    def __init__(self) -> None:
        self._entries: dict[str, tuple[tuple[int, int, int], ManifestResult]] = {}
        self._seen: set[str] = set()

    def get(self, path: str, stamp: tuple[int, int, int]) -> ManifestResult | None:
        self._seen.add(path)
        hit = self._entries.get(path)
        return hit[1] if hit is not None and hit[0] == stamp else None

    def put(self, path: str, stamp: tuple[int, int, int], result: ManifestResult) -> None:
        self._entries[path] = (stamp, result)

    def end_scan(self) -> None:
        for path in self._entries.keys() - self._seen:
            del self._entries[path]
        self._seen = set()

    def __len__(self) -> int:
        return len(self._entries)


def _parse_manifest(raw: bytes) -> ManifestResult:
    """A manifest's bytes, parsed; fields this release does not know are ignored.

    The warm Job's helper (``warming.helperImage``, a release of its own) writes manifests and they
    stay on disk: one a newer helper wrote must not read as corrupt to an older agent (a rolling
    update, a rollback), or its complete weights would count as partial (not warm) for as long as it
    stays.
    """
    try:
        return read_stored(Manifest, raw), None
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        return None, f"corrupt manifest: {where + ': ' if where else ''}{first['msg']}"
    except (ValueError, json.JSONDecodeError) as exc:
        return None, f"corrupt manifest: {exc}"


def read_manifest(directory: Path, cache: ManifestCache | None = None) -> ManifestResult:
    """``(manifest, None)``, ``(None, None)`` when there is none, or ``(None, why it is unusable)``."""
    path = os.path.join(directory, MANIFEST)
    try:
        st = os.lstat(path)
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if cache is not None and (hit := cache.get(path, stamp)) is not None:
            return hit
        # a regular file inside the root, bounded: a FIFO hung the agent (deaf to SIGTERM), a
        # symlink to /dev/zero crashed it, a symlink elsewhere read a file outside the root
        raw = read_regular(path, MAX_MANIFEST_BYTES, follow_symlinks=False)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"cannot read: {exc.strerror or exc}"
    result = _parse_manifest(raw)
    if cache is not None:
        cache.put(path, stamp, result)
    return result


def scan_weights(
    walk: Walk, directory: Path, workload: str, version: str, manifests: ManifestCache | None = None
) -> WeightsEntry | None:
    """One weights version directory (rules in :mod:`extender.layout`); ``None`` if it vanished."""
    sizes, top_names, whole, newest = walk.file_sizes(str(directory))
    if not whole and not sizes and not os.path.isdir(directory):
        return None  # evicted while we looked: reported as a problem, not as an empty entry
    last_used = newest or None
    manifest, why = read_manifest(directory, manifests) if MANIFEST in top_names else (None, None)
    marked = COMPLETE in top_names and _marked(walk, str(directory))
    if why is not None:
        walk.problem(directory / MANIFEST, "corrupt", why)
    if manifest is None:
        if marked:
            walk.problem(directory, "inconsistent", "marked complete but has no readable manifest; counted as partial")
        return WeightsEntry(workload, version, sum(sizes.values()), complete=False, expected_bytes=None,
                            last_used=last_used)
    total = manifest.total_bytes
    present = sum(min(sizes.get(f.path, 0), f.size) for f in manifest.files)
    mismatched = next((f.path for f in manifest.files if sizes.get(f.path) != f.size), None)
    complete = marked and whole and mismatched is None
    if marked and not complete:
        detail = f"{mismatched} is missing or not {_size_of(manifest, mismatched)} bytes" if mismatched else \
            "part of it could not be read"
        walk.problem(directory, "inconsistent", f"marked complete but {detail}; counted as partial")
    if not complete:
        present = min(present, max(0, total - 1))
    return WeightsEntry(workload, version, present, complete=complete, expected_bytes=total, last_used=last_used)


def _size_of(manifest: Manifest, path: str | None) -> int:
    return next((f.size for f in manifest.files if f.path == path), 0)


def _dir_times(walk: Walk, path: str) -> tuple[tuple[int, int], float] | None:
    """``((inode, mtime ns), newest of the directory's modification and change times)``, or ``None``.

    Not its access time: the scan itself lists the directory, which moves it, and the agent's own
    reads must not make a cache look used.
    """
    try:
        st = os.lstat(path)
    except OSError as exc:
        walk.os_problem(path, exc)
        return None
    return (st.st_ino, st.st_mtime_ns), max(st.st_mtime, st.st_ctime)


def scan_cache(root: Path, *, manifests: ManifestCache | None = None, sizes: SizeCache | None = None,
               disk_bytes: int | None = None) -> CacheScan:
    """Scan ``root`` (see the module docstring); a missing root is a problem, not an error.

    ``manifests`` keeps parsed manifests between scans (the agent passes one; a single scan needs
    none); ``sizes``, when given, measures compile and snapshot entries (see :class:`SizeCache`);
    ``disk_bytes``: the filesystem's size when the caller measured it already (the agent does),
    else it is measured here.

    File lengths are believed while they fit the filesystem: a download in progress may be sparse,
    and transparent compression makes allocated blocks undercount real data. Lengths that add up
    to more than the filesystem's size cannot all be data (11.5 PB of sparse files on a 270 GB disk
    were once reported), so the scan is then redone counting each file's allocated blocks, and a
    problem says so.
    """
    scan = _scan(root, manifests, sizes, allocated=False)
    if disk_bytes is None:
        try:
            disk_bytes = disk_usage(root).total_bytes
        except OSError:
            return scan
    disk = disk_bytes
    claimed = sum(w.bytes for w in scan.weights) + sum(scan.cache_bytes.values())
    if claimed <= disk:
        return scan
    recount = _scan(root, manifests, SizeCache(refresh_s=0.0) if sizes is not None else None, allocated=True)
    note = Problem(os.fspath(root), "inconsistent", f"files claim {claimed} bytes on a {disk} byte filesystem "
                                                    "(sparse files): counted by allocated blocks")
    return dataclasses.replace(recount, problems=(*recount.problems, note))


def _scan(root: Path, manifests: ManifestCache | None, sizes: SizeCache | None, *, allocated: bool) -> CacheScan:
    walk = Walk(allocated=allocated)
    if not os.path.isdir(root):
        walk.problem(root, "unreadable", "cache root does not exist or is not a directory")
        return CacheScan(problems=tuple(walk.problems))
    weights: list[WeightsEntry] = []
    last_used: dict[str, float] = {}
    cache_bytes: dict[str, int] = {}
    found: dict[str, list[str]] = {spec.kind: [] for spec in NVME_KINDS}

    def usage(ident: str, path: str) -> None:
        times = _dir_times(walk, path)
        if times is None:
            return
        stamp, newest = times
        if sizes is not None:
            size, files_newest = sizes.measure(walk, path, stamp)
            cache_bytes[ident] = size
            newest = max(newest, files_newest)
        last_used[ident] = newest

    for spec in NVME_KINDS:
        top = walk.top(root, spec.directory) if spec.directory else None
        if top is None:
            continue
        match spec.kind:
            case "weights":
                for workload in walk.subdirs(top, missing_ok=True):
                    for version in walk.subdirs(Path(workload.path)):
                        entry = scan_weights(walk, Path(version.path), workload.name, version.name, manifests)
                        if entry is not None:
                            weights.append(entry)
                if manifests is not None:
                    manifests.end_scan()
                last_used.update({cache_id("weights", w.key): w.last_used for w in weights
                                  if w.last_used is not None})
            case "compile":  # present once the engine wrote a file (vLLM's own tree: once it saved a compile)
                for d in walk.subdirs(top, missing_ok=True):
                    vllm = vllm_state(d.path, walk.os_problem)
                    if vllm if vllm is not None else walk.has_file(d.path):
                        found[spec.kind].append(d.name)
                        usage(cache_id(spec.kind, d.name), d.path)
            case "snapshot" | "adapter":  # present once the writer's completion marker is there
                for name, path in _entries(walk, top, spec):
                    if _marked(walk, path):
                        found[spec.kind].append(name)
                        usage(cache_id(spec.kind, name), path)
            case "image":  # pragma: no cover - images live in the container runtime, not on NVMe
                pass
            case _:
                assert_never(spec.kind)
    if sizes is not None:
        sizes.end_scan()
    return CacheScan(
        weights=tuple(weights),
        compile_keys=tuple(found["compile"]),
        snapshots=tuple(found["snapshot"]),
        adapters=tuple(found["adapter"]),
        problems=tuple(walk.problems),
        files=walk.files,
        last_used=last_used,
        cache_bytes=cache_bytes,
    )


def _entries(walk: Walk, top: Path, spec: KindSpec) -> Iterator[tuple[str, str]]:
    """(name, path) of every entry of a kind: directories ``len(spec.parts)`` levels below its top."""
    level: list[tuple[str, str]] = [("", str(top))]
    for depth in range(len(spec.parts)):
        level = [(f"{prefix}/{d.name}" if prefix else d.name, d.path)
                 for prefix, path in level for d in walk.subdirs(Path(path), missing_ok=depth == 0)]
    yield from level


def _marked(walk: Walk, path: str) -> bool:
    """Does the entry carry its completion marker (:func:`extender.layout.marked_complete`: a regular
    file, never a link followed, a directory or a FIFO)? A failure to look is a problem, and no marker."""
    try:
        return marked_complete(path)
    except OSError as exc:
        walk.os_problem(path, exc)
        return False
