"""The node cache layout: where weights, compile caches and snapshots live under one cache root.

One root per node (a hostPath on local NVMe), shared by the agent (reads), the serving pods and
the cache warmer (write)::

    <root>/weights/<workload>/<version>/      model files, any tree below
        .manifest.json                        every file with its size (the writer's promise)
        .complete                             empty marker, written last, after every file is whole
    <root>/compile/<cache-key>/               torch.compile / Triton / vLLM cache of one key
                                              (VLLM_CACHE_ROOT, TORCHINDUCTOR_CACHE_DIR and
                                              TRITON_CACHE_DIR can point inside it)
    <root>/snapshots/<workload>/<version>/    a process snapshot for this node's class, of the
                                              workload on its weights version <version>
        .complete                             written last, as for weights
    <root>/adapters/<workload>/<adapter>/     one LoRA adapter's files
        .complete                             written last, as for weights

Rules the agent relies on:

* A weights directory is complete only when ``.complete`` is a regular file (:func:`marked_complete`:
  a link, a directory or a FIFO of that name is no marker), the manifest parses and every
  listed file is on disk with exactly its listed size. Anything less counts the bytes actually
  present (each file's length, capped at its listed size) and is never reported complete, even if
  the bytes add up (the cap is one byte short of the manifest's total).
* A manifest lists each path once; one that repeats a path is corrupt (its sizes would count twice).
  One that lists no files is corrupt too: marked complete, it would be whole weights of 0 bytes, so
  :func:`finish_from_disk` refuses to seal a directory that holds no file to list.
* A weights directory holds regular files and directories only. The agent neither follows nor
  counts a symbolic link (to a file or a directory, or dangling) or any other special file, so
  :func:`finish_from_disk` refuses to seal a directory holding one, naming it: listed, it would
  read as missing at every scan and the entry would never be complete; left out, the entry would
  be complete while a reader follows the link out of it.
* A writer that preallocates files must write under a name the manifest does not list and rename
  when done: the agent counts a listed file's length as present bytes.
* Names starting with ``.`` at the workload, version, key or snapshot level are staging areas and
  are ignored (write there, then rename into place: a rename is atomic on one filesystem).
* A compile-cache key counts as present once its directory holds a file: engines fill it
  incrementally while they compile, and a partial cache still saves most of the work. When the key
  directory holds vLLM's own tree (``VLLM_CACHE_ROOT`` pointed inside it), only once vLLM saved a
  finished compile (:mod:`extender.agent.vllm_cache`).

Caches in other tools' layouts (Hugging Face hub caches that pods fill themselves) are read by
:mod:`extender.agent.hub` and reported under the names above; nothing here writes them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, ConfigDict, Field, field_validator

from extender.core.errors import ExtenderError, InvalidValueError
from extender.core.schema import Schema

WEIGHTS = "weights"
COMPILE = "compile"
SNAPSHOTS = "snapshots"
ADAPTERS = "adapters"
MANIFEST = ".manifest.json"
#: Largest manifest read: 100,000 files of about 100 bytes each, with room to spare.
MAX_MANIFEST_BYTES = 32 << 20
COMPLETE = ".complete"
#: Our own files inside a weights directory; never counted as model bytes.
METADATA = frozenset({MANIFEST, COMPLETE})


class LayoutError(ExtenderError):
    """A directory holds what the layout does not allow where a writer seals it (a symbolic link in a
    weights directory)."""


def _temporary(name: str) -> str:
    """The name :func:`_write_durably` writes ``name`` under before renaming it into place."""
    return f".{name}.tmp"


_METADATA_NAMES = METADATA | {_temporary(name) for name in METADATA}


def is_metadata(name: str) -> bool:
    """Whether a top-level file name of a weights directory is ours, finished or still being written."""
    return name in _METADATA_NAMES


class _Model(Schema):
    model_config = ConfigDict(populate_by_name=True)


def _json_number(value: object) -> object:
    """``value`` unless it is a boolean or a string (pydantic would read ``true`` as 1 and ``"5"`` as 5)."""
    if isinstance(value, bool | str):
        shown = f"a boolean ({str(value).lower()})" if isinstance(value, bool) else f"a string ({value!r})"
        raise InvalidValueError(f"expected a number of bytes, got {shown}")
    return value


class ManifestFile(_Model):
    """One file of a weights directory."""

    path: str = Field(min_length=1, description="relative to the version directory, '/'-separated")
    #: Bytes: a JSON number with no fraction. A boolean or a string is a writer's bug, and corrupt
    #: (``true`` was read as a file of 1 byte, which a 1-byte file then made whole).
    size: Annotated[int, BeforeValidator(_json_number), Field(ge=0)]
    sha256: str | None = None

    @field_validator("path")
    @classmethod
    def _relative(cls, value: str) -> str:
        # plain string checks: a manifest lists thousands of files and this runs for each
        parts = value.split("/")
        if "" in parts or "." in parts or ".." in parts or value in METADATA or "\0" in value:
            raise InvalidValueError(f"{value!r} is not a plain relative path inside the directory")
        return value


class Manifest(_Model):
    """``.manifest.json`` of a weights directory."""

    api_version: Literal["extender.io/v1alpha1"] = "extender.io/v1alpha1"
    kind: Literal["WeightsManifest"] = "WeightsManifest"
    #: Where the files came from (informational).
    source: str = ""
    files: tuple[ManifestFile, ...]

    @field_validator("files")
    @classmethod
    def _each_path_once(cls, value: tuple[ManifestFile, ...]) -> tuple[ManifestFile, ...]:
        """Refuse a path listed twice: its size would count twice toward the total (and toward the
        bytes present), so a directory could be reported complete at a multiple of its real size."""
        seen: set[str] = set()
        for f in value:
            if f.path in seen:
                raise InvalidValueError(f"{f.path!r} is listed more than once")
            seen.add(f.path)
        return value

    @field_validator("files")
    @classmethod
    def _some_file(cls, value: tuple[ManifestFile, ...]) -> tuple[ManifestFile, ...]:
        """Refuse an empty list: with its marker it would read as whole weights of 0 bytes (ready to
        the node labels, and preferred to a hub cache that holds the real files)."""
        if not value:
            raise InvalidValueError("lists no files; weights of 0 bytes are never complete")
        return value

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def weights_dir(root: Path, workload: str, version: str) -> Path:
    return root / WEIGHTS / workload / version


def compile_dir(root: Path, key: str) -> Path:
    return root / COMPILE / key


def snapshot_dir(root: Path, workload: str, version: str) -> Path:
    return root / SNAPSHOTS / workload / version


def adapter_dir(root: Path, workload: str, adapter: str) -> Path:
    return root / ADAPTERS / workload / adapter


def delete_at(dir_fd: int, name: str) -> None:
    """Delete ``name`` in the open directory ``dir_fd`` and everything below it; a file (or a link:
    the link itself, never what it points to) is unlinked. Nothing there is fine.

    Each directory is opened relative to its parent as :func:`walk_at` opens it (``O_DIRECTORY |
    O_NOFOLLOW | O_NONBLOCK``): a link is never followed, and a FIFO swapped in for a directory is
    unlinked at once. (:func:`shutil.rmtree` of CPython 3.11 looks at an entry, then opens it with
    plain ``O_RDONLY``: a FIFO put there in between made it wait for a writer that never comes.)
    Two warm steps on one node may delete the same tree at once: whatever the other deleted first
    is simply gone; an entry swapped between a file and a directory under us is looked at again.
    """
    while True:
        try:
            _delete_below(dir_fd, name)
            return
        except (IsADirectoryError, NotADirectoryError):  # it changed kind under us: look again
            continue


def _delete_below(dir_fd: int, name: str) -> None:
    try:
        fd = os.open(name, _WALKED, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):  # ELOOP: a link, which O_NOFOLLOW refuses
            raise
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)  # a file, a link itself, a FIFO, a socket
        return
    try:
        with os.scandir(fd) as entries:
            names = [e.name for e in entries]
        for below in names:
            _delete_below(fd, below)
    finally:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(name, dir_fd=dir_fd)


#: How :func:`walk_at` opens every directory it enters, relative to its parent: only a directory
#: (``O_DIRECTORY``), never through a link (``O_NOFOLLOW``), and never waiting (``O_NONBLOCK``).
_WALKED = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

#: One directory of a walk: ``(its path from ".", names of directories, names of the rest, its fd)``.
Walked = tuple[str, list[str], list[str], int]


def walk_at(dir_fd: int, *, on_error: Callable[[str, OSError], None] | None = None) -> Iterator[Walked]:
    """Walk the tree of the open directory ``dir_fd`` top-down, as ``os.fwalk(".", dir_fd=dir_fd)``
    does, but opening no directory that could make it wait.

    Yields what ``os.fwalk`` yields: the path from ``"."`` (``"./sub"``), the names of the entries
    that are directories (a link to a directory among them, as ``os.fwalk`` lists it, though it is
    never entered), the names of the rest (files, links, special files), and an fd of the directory,
    open until the walk moves on. Removing a name from the directory names in place skips it.

    ``os.fwalk`` (CPython 3.11) opened each directory with plain ``O_RDONLY``: a FIFO put in place of
    a directory between the listing and the open made the open wait for a writer that never comes
    (the warm Job hung until its deadline). Here each directory is opened relative to its parent
    with ``O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK``, so a FIFO, a file or a link swapped in fails at
    once (``ENOTDIR``, ``ELOOP``). Such a directory, or one that vanished or cannot be opened, is
    skipped, as ``os.fwalk`` skips it, after ``on_error(its path from ".", the error)`` if given
    (which may raise to end the walk). Recursive, holding one fd per level, as ``os.fwalk`` does.
    """
    top = os.open(".", _WALKED, dir_fd=dir_fd)
    try:
        yield from _walk_below(".", top, on_error)
    finally:
        os.close(top)


def _walk_below(path: str, fd: int, on_error: Callable[[str, OSError], None] | None) -> Iterator[Walked]:
    directories, rest = _listing(fd)
    yield path, directories, rest, fd
    for name in directories:
        try:
            below = os.open(name, _WALKED, dir_fd=fd)
        except OSError as exc:  # vanished, unreadable, or no directory any more (a FIFO, a file, a link)
            if on_error is not None:
                on_error(os.path.join(path, name), exc)
            continue
        try:
            yield from _walk_below(os.path.join(path, name), below, on_error)
        finally:
            os.close(below)


def _listing(fd: int) -> tuple[list[str], list[str]]:
    """``(directory names, other names)`` of the open directory ``fd``, told apart as ``os.fwalk``
    tells them: a link to a directory among the directories, a dangling link among the rest, and an
    entry that vanished before it could be told apart left out."""
    directories: list[str] = []
    rest: list[str] = []
    with os.scandir(fd) as entries:
        for entry in entries:
            try:
                (directories if entry.is_dir() else rest).append(entry.name)
            except OSError:
                with contextlib.suppress(OSError):
                    if entry.is_symlink():
                        rest.append(entry.name)
    return directories, rest


def _write_durably(path: Path, data: bytes, *, dir_fd: int | None = None) -> None:
    """Write via a temporary name, fsync, rename: a reader sees the old file or the whole new one.

    The directory may be writable by others (serving pods share the cache root): whatever sits at
    the temporary name is removed first (a link planted there, the link and not its target) and the
    temporary is created afresh, never through a link (``O_EXCL | O_NOFOLLOW``). A name planted
    again in between makes the write fail rather than write anywhere else. ``dir_fd``: the open
    directory ``path`` names a file of (its ``path.parent`` then only names it in messages).
    """
    tmp = _temporary(path.name)
    parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) if dir_fd is None else dir_fd
    try:
        delete_at(parent, tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                     dir_fd=parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path.name, src_dir_fd=parent, dst_dir_fd=parent)
    finally:
        if dir_fd is None:
            os.close(parent)


def write_manifest(directory: Path, files: Iterable[tuple[str, int]], *, source: str = "",
                   dir_fd: int | None = None) -> Manifest:
    """Write ``.manifest.json`` listing ``(relative path, size)`` pairs (before or while downloading).
    ``dir_fd``: ``directory`` already open (then never looked up by its path again)."""
    manifest = Manifest.model_validate(
        {"source": source, "files": [{"path": p, "size": s} for p, s in files]}
    )
    _write_durably(directory / MANIFEST, manifest.model_dump_json(by_alias=True, exclude_none=True).encode(),
                   dir_fd=dir_fd)
    return manifest


def marked_complete(directory: str | os.PathLike[str], *, dir_fd: int | None = None) -> bool:
    """Does the entry ``directory`` carry its completion marker, ``.complete`` as a regular file?

    The one test of the marker, for the agent (is the entry whole?) and the warmer (is it in
    service?). The marker is looked at, never followed: a symbolic link at its name (dangling, or to
    a regular file), a directory, a FIFO or any other kind of file is no marker. ``dir_fd``: the
    directory ``directory`` is relative to (``"."`` for the open entry itself). Nothing at the name
    is ``False``; any other failure to look (the entry vanished, permission) raises ``OSError``.
    """
    try:
        st = os.stat(os.path.join(directory, COMPLETE), dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return stat.S_ISREG(st.st_mode)


def mark_complete(directory: Path, *, dir_fd: int | None = None) -> None:
    """Write the ``.complete`` marker: call only after every listed file is whole and synced."""
    _write_durably(directory / COMPLETE, b"", dir_fd=dir_fd)


def finish_from_disk(directory: Path, *, source: str = "", dir_fd: int | None = None) -> Manifest:
    """List the files now in ``directory`` in a manifest and mark it complete (for writers and tests).

    Each file's size is its own (``lstat``): nothing is followed. A symbolic link anywhere below (to a
    file, to a directory, dangling) or a special file (FIFO, socket, device) raises
    :class:`LayoutError` naming it, before anything is written: the agent would not count it (see
    the module docstring). So does a file whose path is not UTF-8: a manifest (JSON text) cannot
    list it, a directory with no file to list (only our own files, or empty directories), and a
    directory below that cannot be entered (unreadable, or swapped for something else after it was
    listed): a manifest sealed without its files would be whole weights with files missing. Our
    own files at the top (:func:`is_metadata`) are neither listed nor checked: the writes replace
    whatever is at their names, a link itself.

    ``dir_fd``: ``directory`` already open (the walk and the writes then go through it, and the path
    only names it in messages); otherwise it is opened once here, so the walk and the writes act on
    one directory.
    """
    if dir_fd is None:
        opened = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            return finish_from_disk(directory, source=source, dir_fd=opened)
        finally:
            os.close(opened)
    def unentered(rel: str, exc: OSError) -> None:  # its files would be left out of a manifest sealed whole
        raise _not_sealable(directory, os.path.normpath(rel), f"cannot be entered ({exc.strerror})",
                            "the manifest would leave out what it holds; the tree changed or is unreadable")

    files: list[tuple[str, int]] = []
    for dirpath, dirnames, filenames, walked_fd in walk_at(dir_fd, on_error=unentered):
        # top-down: a link to a directory is listed among the directories, refused before the walk
        # would come to it (it would not enter it, and the link would stay out of the manifest)
        for name in dirnames:
            if stat.S_ISLNK(os.stat(name, dir_fd=walked_fd, follow_symlinks=False).st_mode):
                raise _not_sealable(directory, os.path.normpath(os.path.join(dirpath, name)),
                                    "is a symbolic link (to a directory)")
        for name in filenames:
            rel = os.path.normpath(os.path.join(dirpath, name))
            if is_metadata(rel):  # ours: replaced by the writes below, whatever is there (a link: itself)
                continue
            if not _is_text(rel):
                raise _not_sealable(directory, rel, "is not a UTF-8 name",
                                    "a manifest is JSON text and cannot list it; rename it")
            st = os.stat(name, dir_fd=walked_fd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                raise _not_sealable(directory, rel, "is a symbolic link" if stat.S_ISLNK(st.st_mode)
                                    else "is not a regular file")
            files.append((rel, st.st_size))
    if not files:  # an empty manifest is corrupt (see the module docstring): never written
        raise _not_sealable(directory, ".", "holds no file to list",
                            "a manifest listing none would be whole weights of 0 bytes")
    manifest = write_manifest(directory, sorted(files), source=source, dir_fd=dir_fd)
    mark_complete(directory, dir_fd=dir_fd)
    return manifest


def _is_text(name: str) -> bool:
    """Is ``name`` (as the OS gave it: bytes that are not UTF-8 are lone surrogates) UTF-8 text?"""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_ONLY_FILES = ("a weights directory holds regular files and directories only, and the agent neither follows nor "
               "counts this")


def _not_sealable(directory: Path, rel: str, what: str, why: str = _ONLY_FILES) -> LayoutError:
    # a name that is not UTF-8 is shown by its bytes (\xff), so the message stays printable text
    shown = os.fsencode(directory / rel).decode("utf-8", "backslashreplace")
    return LayoutError(f"{shown} {what}: {why}")
