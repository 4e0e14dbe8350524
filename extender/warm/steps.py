"""What a warm Job does on its node, around the team's fetch command: evict, stage, finish.

The cache layout (:mod:`extender.layout`) has one rule that makes warming safe to run next
to the agent and the serving pods: names starting with ``.`` are staging areas nobody reads. So a
warm Job never writes where a reader looks:

    prepare   evict each planned victim: rename it to ``.<name>.evicting-<pid>-<hex>`` (one atomic step:
              the agent stops reporting it at once), then delete the tree; then make the staging
              directory ``.<name>.warming`` beside the destination (both shortened when the name is
              too long for them to fit a directory entry: :func:`derived_name`). For weights, an existing
              partial destination is moved into staging first, so a resumable copy tool (``aws s3
              sync``, ``gsutil rsync``) fetches only the missing bytes.
    fetch     the team's template writes into ``{{staging}}``.
    finish    weights: list what was fetched in ``.manifest.json`` and write ``.complete`` (the
              manifest is written last, after every file is whole); snapshots and adapters: write
              ``.complete``;
              then rename staging onto the destination, so the agent's next scan sees the whole
              entry or nothing.

A half-finished Job leaves only a staging directory, which the next attempt resumes, or a tomb
(``.<name>.evicting-...``) whose deletion it did not finish. Neither is seen by the agent, so
nothing would ever free their bytes: every ``prepare`` first sweeps the cache root (:func:`sweep`).
A tomb is garbage by definition and always deleted; each eviction names its tomb uniquely (the step
runs as PID 1 of its container every time, and a second tomb of the same name would make the
rename fail at every retry). A staging directory is deleted once no Job can still write it or
resume it: ``prepare`` stamps its modification time when it creates or resumes it, a Job runs at
most ``activeDeadline`` and a failed one is retried within ``retry.max``, so one untouched for
longer than their sum (``--abandoned-after``, which the Job sets through the environment) was
abandoned (its action is no longer planned: a new weights version, demand gone). Runs inside
the Job's helper containers (``extender warm prepare`` / ``extender warm finish``); the paths are
those of the container, where the node's cache root is mounted at :data:`CACHE_MOUNT`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import re
import secrets
import stat
import time
from collections.abc import Sequence
from pathlib import Path, PurePath
from typing import TypeVar, assert_never

from extender.core import caches
from extender.core.caches import SPECS, CacheKind, split_name
from extender.core.errors import ExtenderError, InvalidValueError, UnknownNameError
from extender.core.quoting import quote
from extender.layout import (
    COMPLETE,
    MANIFEST,
    LayoutError,
    delete_at,
    finish_from_disk,
    mark_complete,
    marked_complete,
    walk_at,
)

#: Where the warm Job's containers see the node's cache root.
CACHE_MOUNT = "/cache"
STAGING_SUFFIX = ".warming"
EVICTING_SUFFIX = ".evicting"
#: The environment variable that gives ``extender warm prepare`` its ``--abandoned-after`` (the warm
#: Job sets it: a helper of an older release ignores a variable, where an unknown flag fails).
ABANDONED_AFTER_ENV = "WARM_ABANDONED_AFTER"
#: A tomb's name: ``.<name>.evicting-<pid>-<hex>`` (an older helper wrote ``-<pid>`` alone), or its
#: shortened form ``..<start of name>~<digest>.evicting-<pid>-<hex>`` (:func:`derived_name`). A staging
#: name ends in ``.warming`` and a cache entry's name never starts with ``.``, so neither matches.
TOMB = re.compile(rf"\..+{re.escape(EVICTING_SUFFIX)}-[0-9]+(-[0-9a-f]+)?")
#: The longest name of one directory entry, in bytes of the file system's encoding (``NAME_MAX`` of
#: ext4, XFS, btrfs and the other file systems a cache root lives on).
NAME_MAX = 255
#: Hex digits of SHA-256 over the whole name that a shortened derived name carries (64 bits).
DIGEST_HEX = 16

P = TypeVar("P", bound=PurePath)
log = logging.getLogger(__name__)


class StepError(ExtenderError):
    """A warm step cannot do what it was asked (an unsafe cache id, nothing fetched)."""


def _safe(name: str, what: str) -> str:
    # a cache id becomes a path below the cache root: it must never climb out of it or hide in a
    # staging name the agent ignores, and it must fit one directory entry (counted in bytes, as the
    # file system counts: 'é' takes two)
    if not name or "/" in name or "\0" in name or name.startswith("."):
        raise StepError(f"{what} {name!r} is not a plain directory name")
    shown = quote(name, 64)
    try:
        size = len(os.fsencode(name))
    except UnicodeEncodeError:
        raise StepError(f"{what} {shown} is no file name: it cannot be encoded as one") from None
    if size > NAME_MAX:
        raise StepError(f"{what} {shown} takes {size} bytes: a directory name takes at most {NAME_MAX}")
    return name


def derived_name(name: str, suffix: str) -> str:
    """The name beside the entry ``name`` that ends in ``suffix`` (its staging directory, its tomb),
    made to fit in :data:`NAME_MAX` bytes, so that every name :func:`cache_path` accepts can be
    staged, evicted and swept.

    ``.<name><suffix>`` when that fits, as every release wrote it. Otherwise
    ``..<start>~<digest><suffix>``: ``<digest>`` is the first :data:`DIGEST_HEX` hex digits of SHA-256
    over the name's bytes, and ``<start>`` the longest start of the name, in whole characters, that
    leaves the whole at most :data:`NAME_MAX` bytes (``255 - len("..~") - 16 - len(suffix)`` bytes or
    a little less). Two long names that share their start still get different names, and the
    leading ``..`` keeps the two forms apart: an entry's name never starts with ``.``, so the whole
    form of one entry is never the shortened form of another. Both forms start with ``.`` (the
    agent ignores them) and end in ``suffix`` (the sweep recognises them by it).
    """
    whole = f".{name}{suffix}"
    if len(os.fsencode(whole)) <= NAME_MAX:
        return whole
    tail = f"~{hashlib.sha256(os.fsencode(name)).hexdigest()[:DIGEST_HEX]}{suffix}"
    room = NAME_MAX - len(os.fsencode(f"..{tail}"))
    end = 0
    for ch in name:
        room -= len(os.fsencode(ch))
        if room < 0:
            break
        end += 1
    return f"..{name[:end]}{tail}"


def staging_name(name: str) -> str:
    """The staging directory's name beside the entry ``name``: ``.<name>.warming``, or its shortened
    form (:func:`derived_name`)."""
    return derived_name(name, STAGING_SUFFIX)


def tomb_name(name: str) -> str:
    """A unique name to rename ``name`` to before deleting it: ``.<name>.evicting-<pid>-<hex>``, or its
    shortened form (:func:`derived_name`)."""
    # unique: every warm step runs as PID 1 of its container, so a pid alone would name the tomb a
    # killed step left behind, and renaming a directory onto a non-empty one fails
    return derived_name(name, f"{EVICTING_SUFFIX}-{os.getpid()}-{secrets.token_hex(4)}")


def parse_cache_id(cache_id: str) -> tuple[CacheKind, str]:
    """``(kind, name)`` of ``kind:name``; raises :class:`StepError` for anything else."""
    try:
        return caches.parse_cache_id(cache_id)
    except (InvalidValueError, UnknownNameError) as exc:
        raise StepError(str(exc)) from None


def cache_path(root: P, cache_id: str) -> P:
    """Where the entry ``cache_id`` lives below ``root`` (images live in the runtime, not here)."""
    kind, name = parse_cache_id(cache_id)
    spec = SPECS[kind]
    if spec.directory is None:
        raise StepError(f"{cache_id!r}: {kind}s are not stored in the cache root")
    try:
        parts = split_name(kind, name)
    except InvalidValueError as exc:
        raise StepError(str(exc)) from None
    return root.joinpath(spec.directory, *(_safe(value, what) for value, what in zip(parts, spec.parts, strict=True)))


def staging_path(root: P, cache_id: str) -> P:
    """The staging directory an action fills before it is renamed onto :func:`cache_path`."""
    dest = cache_path(root, cache_id)
    return dest.with_name(staging_name(dest.name))


def on_node(root: Path, cache_id: str) -> Path:
    """:func:`cache_path` on the node, refused when it or a directory between the root and it is a
    symbolic link.

    The steps rename, write and delete below that path; through a link (``compile -> /etc``, or the
    entry ``weights/llm/v1 -> /etc`` itself) they would rename, write and delete outside the cache
    root. The agent does not follow such links either. A link at the entry is not ours to remove
    (someone put it there): the step fails and says where. This is the early check, made before
    anything is done; the steps themselves then only act through directories they opened one
    component at a time without following a link (:class:`_Entry`), so a directory swapped for a
    link after this check is refused too, never followed.
    """
    dest = cache_path(root, cache_id)
    current = root
    for part in dest.relative_to(root).parts:
        current = current / part
        if current.is_symlink():
            raise StepError(f"{current} is a symbolic link: the warmer does not leave the cache root {root}")
    return dest


_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_root(root: Path) -> int:
    # the root itself is the mount the Job was given (it may be reached through links of its own)
    try:
        return os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise StepError(f"the cache root {root} does not exist") from None
    except NotADirectoryError:
        raise StepError(f"the cache root {root} is not a directory") from None


def _open_below(dir_fd: int, name: str, shown: Path, root: Path) -> int | None:
    """``name`` in the open directory ``dir_fd``, opened as a directory without following a link;
    ``None`` when nothing is there. A link (or anything else that is no directory) is refused."""
    try:
        return os.open(name, _DIRECTORY, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        st = _lstat(dir_fd, name)
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise StepError(f"{shown} is a symbolic link: the warmer does not leave the cache root {root}") from None
        raise StepError(f"{shown} is not a directory") from None


def _lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


class _Entry:
    """The directory that holds a cache entry (``weights/llm/`` of ``weights:llm/v1``), opened from
    the root one component at a time, none of them through a link; every step acts on names in it
    (``rename``, ``unlink``, :func:`extender.layout.delete_at`), so a directory swapped for a link
    meanwhile cannot send a rename or a deletion outside the cache root.

    ``fd`` is ``None`` when a directory on the way does not exist (and ``create`` was not asked).
    """

    def __init__(self, root: Path, cache_id: str, *, create: bool = False) -> None:
        self.root, self.dest = root, cache_path(root, cache_id)
        self.name = self.dest.name
        self.staging = staging_name(self.name)
        fd: int | None = _open_root(root)
        shown = root
        for part in self.dest.parent.relative_to(root).parts:
            assert fd is not None
            shown = shown / part
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            below = _open_below(fd, part, shown, root)
            os.close(fd)
            fd = below
            if fd is None:
                break
        self.fd = fd

    def __enter__(self) -> _Entry:
        return self

    def __exit__(self, *_: object) -> None:
        if self.fd is not None:
            os.close(self.fd)

    def refuse_link(self, name: str) -> os.stat_result | None:
        """What is at ``name`` (``None``: nothing); a link there is refused, not ours to remove."""
        assert self.fd is not None
        st = _lstat(self.fd, name)
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise StepError(f"{self.dest.parent / name} is a symbolic link: "
                            f"the warmer does not leave the cache root {self.root}")
        return st


def evict(root: Path, cache_id: str) -> bool:
    """Delete one cache entry; ``False`` if it was not there.

    Renamed out of sight first: a scan running meanwhile must not report a half-deleted tree as
    a partial cache, and the rename is atomic where the deletion of many files is not.
    """
    on_node(root, cache_id)
    return _evict(root, cache_id)


def _evict(root: Path, cache_id: str) -> bool:
    with _Entry(root, cache_id) as entry:
        if entry.fd is None or entry.refuse_link(entry.name) is None:
            return False
        return _remove(entry.fd, entry.name)


def _remove(dir_fd: int, name: str) -> bool:
    tomb = tomb_name(name)
    try:
        os.rename(name, tomb, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    delete_at(dir_fd, tomb)
    return True


def sweep(root: Path, *, abandoned_after: float | None = None, keep: Path | None = None,
          now: float | None = None) -> list[Path]:
    """Delete what killed or abandoned steps left in the cache root; returns what was deleted.

    Every tomb goes. With ``abandoned_after`` (seconds), so does every staging directory other than
    ``keep`` whose modification time (stamped by :func:`prepare`) is older than that: renamed to a
    tomb first, so a Job resuming it at that very moment finds no staging and fails (to be retried)
    instead of writing into a tree being deleted. Tombs and staging directories sit beside the
    entries, so the search is one listing of each kind's directory and of each directory between it
    and the entries (``weights/<w>/``), never a walk of the entries themselves; symbolic links are
    not entered (a kind's directory that is one is skipped, and said so).
    """
    swept: list[Path] = []
    cutoff = (time.time() if now is None else now) - abandoned_after if abandoned_after is not None else None
    root_fd = _open_root(root)
    try:
        for spec in caches.NVME_KINDS:
            assert spec.directory is not None
            top = root / spec.directory
            try:
                top_fd = _open_below(root_fd, spec.directory, top, root)
            except StepError as exc:  # scandir would list, and the sweep delete, wherever a link points
                log.warning("%s: not swept", exc)
                continue
            if top_fd is None:
                continue
            parents = [(top_fd, top)]
            for _ in spec.parts[:-1]:  # down to the directories that hold the entries
                below: list[tuple[int, Path]] = []
                for fd, path in parents:
                    for name in _subdirectories(fd):
                        if not name.startswith("."):
                            try:
                                sub = _open_below(fd, name, path / name, root)
                            except StepError:  # swapped for a link since the listing: not entered
                                sub = None
                            if sub is not None:
                                below.append((sub, path / name))
                    os.close(fd)
                parents = below
            for fd, path in parents:
                try:
                    swept += _sweep_one(fd, path, cutoff, keep)
                finally:
                    os.close(fd)
    finally:
        os.close(root_fd)
    return swept


def _sweep_one(dir_fd: int, path: Path, cutoff: float | None, keep: Path | None) -> list[Path]:
    swept: list[Path] = []
    with os.scandir(dir_fd) as it:
        entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
    for name, is_dir in entries:
        if TOMB.fullmatch(name):  # a tomb file too: an evicted entry may have been a file
            delete_at(dir_fd, name)
            swept.append(path / name)
        elif cutoff is not None and is_dir and path / name != keep and name.startswith(".") \
                and name.endswith(STAGING_SUFFIX) and _older(dir_fd, name, cutoff):
            _remove(dir_fd, name)
            swept.append(path / name)
    return swept


def _older(dir_fd: int, name: str, cutoff: float) -> bool:
    st = _lstat(dir_fd, name)
    return st is not None and st.st_mtime < cutoff


def _subdirectories(dir_fd: int) -> list[str]:
    with os.scandir(dir_fd) as it:
        return [e.name for e in it if e.is_dir(follow_symlinks=False)]


def prepare(root: Path, cache_id: str, evictions: Sequence[str] = (), *,
            abandoned_after: float | None = None) -> Path:
    """Sweep what killed or abandoned steps left (:func:`sweep`), evict ``evictions``, then return the
    staging directory for ``cache_id`` (created, or resumed), its modification time stamped now."""
    for e in evictions:  # validate every id before deleting anything
        on_node(root, e)
    kind, _ = parse_cache_id(cache_id)
    on_node(root, cache_id)
    staging = staging_path(root, cache_id)
    sweep(root, abandoned_after=abandoned_after, keep=staging)  # a missing root is refused there, never created
    for victim in evictions:
        _evict(root, victim)
    with _Entry(root, cache_id, create=True) as entry:
        assert entry.fd is not None
        st = _lstat(entry.fd, entry.staging)
        if st is not None and not stat.S_ISDIR(st.st_mode):
            # a link or a file at the staging name (ours alone): removed, the link and not its target
            os.unlink(entry.staging, dir_fd=entry.fd)
            st = None
        if st is None:
            if kind == "weights" and _is_dir(entry.refuse_link(entry.name)) and _movable(entry, root):
                # keep the partial download: a resumable copy fetches only the rest
                os.rename(entry.name, entry.staging, src_dir_fd=entry.fd, dst_dir_fd=entry.fd)
                staged = _open_below(entry.fd, entry.staging, staging, root)
                assert staged is not None
                try:  # whatever is at their names: a '.complete' that is no marker may be a directory
                    for name in (COMPLETE, MANIFEST):
                        delete_at(staged, name)
                finally:
                    os.close(staged)
            else:
                os.mkdir(entry.staging, 0o755, dir_fd=entry.fd)
        # in use from now on (resumed or new): no sweep deletes it while a Job may write it
        os.utime(entry.staging, dir_fd=entry.fd, follow_symlinks=False)
    return staging


def _movable(entry: _Entry, root: Path) -> bool:
    """Whether the weights entry may be moved into staging: not while it carries its marker (it is
    in service; moving it would take it away for the whole fetch). Such an entry stays in place, the
    fetch fills an empty staging directory, and ``finish`` replaces the entry in one rename.

    The marker is judged as the agent judges it (:func:`extender.layout.marked_complete`): a
    ``.complete`` that is a link, a directory or a FIFO is none, the agent reports the entry partial,
    and so it is moved and resumed like any partial download."""
    assert entry.fd is not None
    dest = _open_below(entry.fd, entry.name, entry.dest, root)
    if dest is None:
        return False
    try:
        if not marked_complete(".", dir_fd=dest):  # as the agent judges it: only a regular file is a marker
            return True
    finally:
        os.close(dest)
    log.warning("%s carries %s: left in place, in service; the fetch starts in an empty staging directory",
                entry.dest, COMPLETE)
    return False


def _is_dir(st: os.stat_result | None) -> bool:
    return st is not None and stat.S_ISDIR(st.st_mode)


def _has_file(dir_fd: int) -> bool:
    return any(_is_file(walked, name) for _, _, files, walked in walk_at(dir_fd) for name in files)


def _is_file(dir_fd: int, name: str) -> bool:
    st = _lstat(dir_fd, name)
    return st is not None and stat.S_ISREG(st.st_mode)


def finish(root: Path, cache_id: str, *, source: str = "") -> Path:
    """Seal the staging directory of ``cache_id`` and rename it into place; returns the destination.

    Raises :class:`StepError` when the fetch left nothing: an empty cache entry would make the
    agent report a compile key (any file counts) or weights that are not there.
    """
    kind, _ = parse_cache_id(cache_id)
    dest, staging = on_node(root, cache_id), staging_path(root, cache_id)
    with _Entry(root, cache_id) as entry:
        st = None if entry.fd is None else _lstat(entry.fd, entry.staging)
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise StepError(f"{staging} is a symbolic link: the warmer does not leave the cache root {root}")
        staged = None if entry.fd is None or not _is_dir(st) else _open_below(entry.fd, entry.staging, staging, root)
        if entry.fd is None or staged is None:
            raise StepError(f"{staging}: the fetch step left no files")
        try:
            if not _has_file(staged):
                raise StepError(f"{staging}: the fetch step left no files")
            match kind:
                case "weights":
                    delete_at(staged, COMPLETE)  # what the fetch left there, a directory too
                    try:  # manifest, then the marker; a link in the fetched tree is refused, naming it
                        finish_from_disk(staging, source=source, dir_fd=staged)
                    except LayoutError as exc:
                        raise StepError(str(exc)) from None
                case "snapshot" | "adapter":
                    mark_complete(staging, dir_fd=staged)
                case "compile" | "image":  # a compile cache is present once it holds a file; images never get here
                    pass
                case _:
                    assert_never(kind)
        finally:
            os.close(staged)
        if entry.refuse_link(entry.name) is not None:
            _remove(entry.fd, entry.name)  # a partial entry written meanwhile: ours is whole
        os.rename(entry.staging, entry.name, src_dir_fd=entry.fd, dst_dir_fd=entry.fd)
    return dest
