"""What a warm Job does on its node, around the team's fetch command: evict, stage, finish.

The cache layout (:mod:`extender.layout`) has one rule that makes warming safe to run next
to the agent and the serving pods: names starting with ``.`` are staging areas nobody reads. So a
warm Job never writes where a reader looks:

    prepare   evict each planned victim: rename it to ``.<name>.evicting-<pid>-<hex>`` (one atomic step:
              the agent stops reporting it at once), then delete the tree; then make the staging
              directory ``.<name>.warming`` beside the destination. For weights, an existing
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

import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import Sequence
from pathlib import Path, PurePath
from typing import TypeVar, assert_never

from extender.core import caches
from extender.core.caches import SPECS, CacheKind, split_name
from extender.core.errors import ExtenderError, InvalidValueError, UnknownNameError
from extender.layout import COMPLETE, MANIFEST, finish_from_disk, mark_complete

#: Where the warm Job's containers see the node's cache root.
CACHE_MOUNT = "/cache"
STAGING_SUFFIX = ".warming"
EVICTING_SUFFIX = ".evicting"
#: The environment variable that gives ``extender warm prepare`` its ``--abandoned-after`` (the warm
#: Job sets it: a helper of an older release ignores a variable, where an unknown flag fails).
ABANDONED_AFTER_ENV = "WARM_ABANDONED_AFTER"
#: A tomb's name: ``.<name>.evicting-<pid>-<hex>`` (an older helper wrote ``-<pid>`` alone). A staging
#: name ends in ``.warming`` and a cache entry's name never starts with ``.``, so neither matches.
TOMB = re.compile(rf"\..+{re.escape(EVICTING_SUFFIX)}-[0-9]+(-[0-9a-f]+)?")

P = TypeVar("P", bound=PurePath)
log = logging.getLogger(__name__)


class StepError(ExtenderError):
    """A warm step cannot do what it was asked (an unsafe cache id, nothing fetched)."""


def _safe(name: str, what: str) -> str:
    # a cache id becomes a path below the cache root: it must never climb out of it or hide in a
    # staging name the agent ignores
    if not name or "/" in name or "\0" in name or name.startswith(".") or len(name) > 255:
        raise StepError(f"{what} {name!r} is not a plain directory name")
    return name


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
    return dest.with_name(f".{dest.name}{STAGING_SUFFIX}")


def on_node(root: Path, cache_id: str) -> Path:
    """:func:`cache_path` on the node, refused when it or a directory between the root and it is a
    symbolic link.

    The steps rename, write and delete below that path; through a link (``compile -> /etc``, or the
    entry ``weights/llm/v1 -> /etc`` itself) they would rename, write and delete outside the cache
    root. The agent does not follow such links either. A link at the entry is not ours to remove
    (someone put it there): the step fails and says where.
    """
    dest = cache_path(root, cache_id)
    current = root
    for part in dest.relative_to(root).parts:
        current = current / part
        if current.is_symlink():
            raise StepError(f"{current} is a symbolic link: the warmer does not leave the cache root {root}")
    return dest


def _no_link(staging: Path) -> Path:
    """The staging directory, never through a link: one there (a staging name is ours alone) is
    removed, the link itself and not what it points to, so the fetch writes below the cache root."""
    if staging.is_symlink():
        staging.unlink()
    return staging


def evict(root: Path, cache_id: str) -> bool:
    """Delete one cache entry; ``False`` if it was not there.

    Renamed out of sight first: a scan running meanwhile must not report a half-deleted tree as
    a partial cache, and the rename is atomic where the deletion of many files is not.
    """
    return _remove(on_node(root, cache_id))


def _remove(path: Path) -> bool:
    # the tomb's name is unique: every warm step runs as PID 1 of its container, so a pid alone would
    # name the tomb a killed step left behind, and renaming a directory onto a non-empty one fails
    tomb = path.with_name(f".{path.name}{EVICTING_SUFFIX}-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        os.replace(path, tomb)
    except FileNotFoundError:
        return False
    _delete_tree(tomb)
    return True


def _delete_tree(path: Path) -> None:
    """Delete ``path`` and everything below it, alongside another step deleting the same tomb.

    Two Jobs on one node may sweep the same tomb at once: a file the other deleted first stops
    :func:`shutil.rmtree` with ``FileNotFoundError``, so it lists again until the tree is gone
    (each pass deletes what is left; nobody writes into a tomb).
    """
    while os.path.lexists(path):
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            continue


def sweep(root: Path, *, abandoned_after: float | None = None, keep: Path | None = None,
          now: float | None = None) -> list[Path]:
    """Delete what killed or abandoned steps left in the cache root; returns what was deleted.

    Every tomb goes. With ``abandoned_after`` (seconds), so does every staging directory other than
    ``keep`` whose modification time (stamped by :func:`prepare`) is older than that: renamed to a
    tomb first, so a Job resuming it at that very moment finds no staging and fails (to be retried)
    instead of writing into a tree being deleted. Tombs and staging directories sit beside the
    entries, so the search is one listing of each kind's directory and of each directory between it
    and the entries (``weights/<w>/``), never a walk of the entries themselves; symbolic links are
    not entered.
    """
    swept: list[Path] = []
    cutoff = (time.time() if now is None else now) - abandoned_after if abandoned_after is not None else None
    for spec in caches.NVME_KINDS:
        assert spec.directory is not None
        top = root / spec.directory
        if top.is_symlink():  # scandir would list, and the sweep delete, wherever it points
            log.warning("%s is a symbolic link: not swept (the warmer does not leave the cache root %s)", top, root)
            continue
        parents = [top]
        for _ in spec.parts[:-1]:  # down to the directories that hold the entries
            parents = [entry for parent in parents for entry in _subdirectories(parent)
                       if not entry.name.startswith(".")]
        for parent in parents:
            for entry in _subdirectories(parent):
                if TOMB.fullmatch(entry.name):
                    _delete_tree(entry)
                    swept.append(entry)
                elif cutoff is not None and entry != keep and entry.name.startswith(".") \
                        and entry.name.endswith(STAGING_SUFFIX) and _older(entry, cutoff):
                    _remove(entry)
                    swept.append(entry)
    return swept


def _older(path: Path, cutoff: float) -> bool:
    try:
        return path.lstat().st_mtime < cutoff
    except FileNotFoundError:
        return False


def _subdirectories(directory: Path) -> list[Path]:
    try:
        with os.scandir(directory) as it:
            return [Path(e.path) for e in it if e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []


def prepare(root: Path, cache_id: str, evictions: Sequence[str] = (), *,
            abandoned_after: float | None = None) -> Path:
    """Sweep what killed or abandoned steps left (:func:`sweep`), evict ``evictions``, then return the
    staging directory for ``cache_id`` (created, or resumed), its modification time stamped now."""
    targets = [on_node(root, e) for e in evictions]  # validate every id before deleting anything
    kind, _ = parse_cache_id(cache_id)
    dest = on_node(root, cache_id)
    staging = staging_path(root, cache_id)
    sweep(root, abandoned_after=abandoned_after, keep=staging)
    for victim in targets:
        _remove(victim)
    _no_link(staging)
    if not staging.is_dir():
        staging.parent.mkdir(parents=True, exist_ok=True)
        if kind == "weights" and dest.is_dir():
            os.replace(dest, staging)  # keep the partial download: a resumable copy fetches only the rest
            for name in (COMPLETE, MANIFEST):
                (staging / name).unlink(missing_ok=True)
        else:
            staging.mkdir()
    os.utime(staging)  # in use from now on (resumed or new): no sweep deletes it while a Job may write it
    return staging


def _has_file(directory: Path) -> bool:
    return any(p.is_file() and not p.is_symlink() for p in directory.rglob("*"))


def finish(root: Path, cache_id: str, *, source: str = "") -> Path:
    """Seal the staging directory of ``cache_id`` and rename it into place; returns the destination.

    Raises :class:`StepError` when the fetch left nothing: an empty cache entry would make the
    agent report a compile key (any file counts) or weights that are not there.
    """
    kind, _ = parse_cache_id(cache_id)
    dest, staging = on_node(root, cache_id), staging_path(root, cache_id)
    if staging.is_symlink():
        raise StepError(f"{staging} is a symbolic link: the warmer does not leave the cache root {root}")
    if not staging.is_dir() or not _has_file(staging):
        raise StepError(f"{staging}: the fetch step left no files")
    match kind:
        case "weights":
            (staging / COMPLETE).unlink(missing_ok=True)
            finish_from_disk(staging, source=source)  # manifest of what is there, then the marker
        case "snapshot" | "adapter":
            mark_complete(staging)
        case "compile" | "image":  # a compile cache is present once it holds a file; images never get here
            pass
        case _:
            assert_never(kind)
    if dest.exists():
        _remove(dest)  # a partial entry written meanwhile: ours is whole
    os.replace(staging, dest)
    return dest
