"""Model hub caches that serving pods fill themselves, read without any marker of ours.

A vLLM pod started with ``--model ORG/NAME`` downloads the weights into the Hugging Face hub cache
(``HF_HUB_CACHE``; default ``~/.cache/huggingface/hub``, or ``$HF_HOME/hub``). When that directory
is a hostPath, the weights outlive the pod, and the next pod on the node reads them locally. This
module finds them and reports them under our weights key ``<workload>/<version>``, so the
estimator, the extender and the warmer see them like weights our warm Jobs wrote.

The layout (upstream: ``huggingface/hub-docs`` ``docs/hub/local-cache.md``, the reference for
reimplementing the cache; written by ``huggingface/huggingface_hub``
``src/huggingface_hub/file_download.py``; measured by ``src/huggingface_hub/utils/_cache_manager.py``)::

    <hub root>/
        models--<org>--<name>/           one model repository: "/" in the repo id becomes "--"
            refs/<branch or tag>         a text file holding the 40-hex commit the name resolved to
            blobs/<etag>                 file contents, named by etag (SHA-256 for LFS files, else SHA-1)
            blobs/<etag>.incomplete      a download in progress; renamed onto blobs/<etag> when whole
            snapshots/<commit>/<path>    a symbolic link ../../blobs/<etag>, made after the rename
            .no_exist/<commit>/<path>    empty markers for files known not to exist upstream (ignored)
        .locks/                          download locks (ignored)

Mapping to profiles (the policy's ``weights`` section, :class:`extender.core.policy.Weights`): a
profile whose ``weights.source`` is ``hf://<org>/<name>`` (or ``hf://<name>``) is looked up in
``models--<org>--<name>``; its ``weights.version`` is the revision: a 40-hex commit is used as is,
anything else is a branch or tag read from ``refs/<version>`` (upstream's own resolution order).
The snapshot of that commit is reported under ``<profile>/<version>``.

Complete, without a manifest. Nothing in the hub cache lists what a revision should hold, so a
snapshot is complete only when every test we *can* make passes:

1. every file of the snapshot is a symbolic link that resolves to a regular file directly inside
   the repository's own ``blobs/`` (a link to a missing blob, to an ``.incomplete`` file or out of
   ``blobs/`` fails, and the last two are reported as problems and never followed further);
2. every shard named by a sharded checkpoint's index (``*.safetensors.index.json``,
   ``*.bin.index.json``: its ``weight_map`` values, relative to the index) is there;
3. every numbered shard series (``<stem>-00002-of-00004.safetensors``) is whole, 1 to N;
4. it holds at least one weights file (``.safetensors``, ``.bin``, ``.pt``, ``.pth``, ``.gguf``),
   so a snapshot holding only ``config.json`` fetched before the weights is not complete;
5. no download into the repository is in progress (no ``blobs/*.incomplete``): the snapshot's
   link for a file appears only once its blob is whole, so a snapshot missing a file still being
   downloaded looks like a smaller complete one. Which snapshot an ``.incomplete`` belongs to
   cannot be known, so every snapshot of the repository waits; an abandoned ``.incomplete``
   keeps them partial (one byte short, see below) until it is resumed or deleted.

What "complete" cannot mean without a manifest: files the downloader never started and no index
or shard numbering names (a tokenizer file, say) are not known to be missing; a repository fetched
with ``allow_patterns`` is complete for what it holds; blob contents are not hashed against their
etag (that would read every byte on every scan). A snapshot of files *copied* in (upstream's
degraded mode where symbolic links are unavailable) counts its bytes but is never complete: a
finished copy cannot be told from one in progress.

Bytes: each distinct blob reachable from the snapshot once (two names linking one blob count once),
the way upstream measures a revision's size on disk. A blob shared by two snapshots counts in the
entry of each: each entry says how much of *that* version is on the node. The ``.incomplete``
bytes never count. A snapshot that is not complete reports at most the profile's declared bytes
less one, so it can never pass for complete (the rule of our own layout, :mod:`extender.layout`).

Eviction: hub entries are reported without a last-use time, and the warmer never evicts an entry
without one (:mod:`extender.core.warming`): it deletes only what it wrote, in our layout. When our
layout holds the same key too, the better of the two is reported (complete first, then bytes) and
the entry loses its last-use time, so our copy is not evicted while the hub copy backs the key
either: the warmer would count the freed bytes, and the hub's would still be there.

Symbolic links below the hub root are never followed out of the repository: ``models--*``,
``snapshots/<commit>`` and ``blobs`` must be real directories, and a snapshot link must land in
its repository's ``blobs/``. Links are read, not followed: their target is worked out from the
link's text (relative links, as upstream writes them, resolve anywhere the hub root is mounted;
absolute ones only where the agent mounts the hub at the writer's path), and only a regular file
there counts.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from extender.agent.scan import CacheScan, Problem, Walk, WeightsEntry
from extender.core.caches import cache_id
from extender.core.policy import Policy
from extender.files import PolicyFile, read_regular

log = logging.getLogger(__name__)

HUB_SCHEME = "hf://"
MODELS_PREFIX = "models--"
INCOMPLETE_SUFFIX = ".incomplete"
#: Files whose presence makes a snapshot hold weights (rule 4).
WEIGHTS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
#: Indexes of sharded checkpoints (rule 2).
INDEX_SUFFIXES = (".safetensors.index.json", ".bin.index.json")
#: Largest index read: a checkpoint with a million tensors, at about 60 bytes an entry.
MAX_INDEX_BYTES = 64 << 20
#: Largest ref file read: it holds one commit hash.
MAX_REF_BYTES = 4096

_REPO_ID = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*")
_COMMIT = re.compile(r"[0-9a-f]{40}")
#: A shard's name as the hub's writers give it: ASCII digits only (``\d`` would take another script's
#: digits, and such a file, which no loader opens, would fill a missing shard's place).
_SHARD = re.compile(r"(?P<stem>.+)-(?P<index>[0-9]{5})-of-(?P<total>[0-9]{5})(?P<ext>\.[A-Za-z0-9]+)")


def repo_id_of(source: str) -> str | None:
    """The model repository a weights source names (``hf://<org>/<name>`` or ``hf://<name>``); ``None`` otherwise.

    Dataset and space paths (``hf://datasets/...``) and ids upstream refuses (``--`` or ``..``
    inside) name no model repository.
    """
    if not source.startswith(HUB_SCHEME):
        return None
    repo = source[len(HUB_SCHEME):].rstrip("/")
    if not _REPO_ID.fullmatch(repo) or "--" in repo or ".." in repo or repo.split("/")[0] in ("datasets", "spaces"):
        return None
    return repo


def repo_folder(repo_id: str) -> str:
    """The repository's folder in a hub root: ``models--`` and the id with ``/`` written ``--``."""
    return MODELS_PREFIX + repo_id.replace("/", "--")


@dataclass(frozen=True)
class Target:
    """One profile's weights as the hub cache would hold them."""

    workload: str
    version: str
    #: The profile's ``weights.bytes``: a partial snapshot reports at most one byte less.
    declared_bytes: int

    @property
    def key(self) -> str:
        return f"{self.workload}/{self.version}"


@dataclass(frozen=True)
class HubMap:
    """Which repository folders the policy's profiles read, and which hub sources name none."""

    targets: Mapping[str, tuple[Target, ...]] = field(default_factory=dict)
    #: Profiles whose ``hf://`` source is not a model repository id (logged at each policy load).
    unusable: tuple[str, ...] = ()


def hub_map(policy: Policy) -> HubMap:
    """Map every profile with an ``hf://`` weights source to its repository folder."""
    targets: dict[str, list[Target]] = {}
    unusable: list[str] = []
    for p in policy.profiles:
        if not p.weights.source.startswith(HUB_SCHEME):
            continue
        repo = repo_id_of(p.weights.source)
        if repo is None:
            unusable.append(p.name)
            continue
        targets.setdefault(repo_folder(repo), []).append(Target(p.name, p.weights.version, p.weights.bytes))
    return HubMap({k: tuple(v) for k, v in targets.items()}, tuple(unusable))


class _ShardIndex(BaseModel):
    """The part of a sharded checkpoint's index we read (upstream's format; other fields ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    weight_map: dict[str, str]


@dataclass(frozen=True)
class SnapshotState:
    """What one snapshot directory holds."""

    #: Bytes of the distinct complete blobs it reaches.
    bytes: int
    complete: bool
    #: Why it is not complete (``None`` when it is): for logs and tests.
    why: str | None


@dataclass(frozen=True)
class HubScan:
    """Everything one look at the hub roots found."""

    #: One entry per (profile, version) found, the best over the roots.
    weights: tuple[WeightsEntry, ...] = ()
    problems: tuple[Problem, ...] = ()
    #: ``models--*`` folders no profile maps to (reported in logs only).
    unmapped: tuple[str, ...] = ()
    #: Why each entry that is not complete falls short, by weights key (reported in logs only).
    partial: Mapping[str, str] = field(default_factory=dict)
    #: Snapshot files looked at.
    files: int = 0


class IndexCache:
    """Parsed checkpoint indexes kept between scans. A blob never changes content (it is named by its
    etag), so an index is parsed again only when its blob's identity changes."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[tuple[int, int, int], tuple[str, ...] | str]] = {}
        self._seen: set[str] = set()

    def get(self, path: str, stamp: tuple[int, int, int]) -> tuple[str, ...] | str | None:
        self._seen.add(path)
        hit = self._entries.get(path)
        return hit[1] if hit is not None and hit[0] == stamp else None

    def put(self, path: str, stamp: tuple[int, int, int], value: tuple[str, ...] | str) -> None:
        self._entries[path] = (stamp, value)

    def end_scan(self) -> None:
        for path in self._entries.keys() - self._seen:
            del self._entries[path]
        self._seen = set()


@dataclass(frozen=True)
class _Blob:
    ident: tuple[int, int]
    size: int
    path: str


#: Where the agent stays while it reads a hub cache (the wording of a refused link).
HUB = "the hub cache"


class _Reader(Walk):
    """One scan of the hub roots: collects problems (as the cache-root scan does), never raises for what it finds."""

    def __init__(self, indexes: IndexCache | None) -> None:
        super().__init__()
        self.indexes = indexes

    def names(self, directory: Path) -> list[str]:
        try:
            return sorted(os.listdir(directory))
        except FileNotFoundError:
            return []
        except OSError as exc:
            self.os_problem(directory, exc)
            return []

    def commit(self, repo: Path, version: str) -> str | None:
        """The commit ``version`` names in ``repo``: itself when 40 hex digits, else what ``refs/<version>`` holds."""
        if _COMMIT.fullmatch(version):
            return version
        ref = repo / "refs" / version
        if not self.real_dir(repo / "refs", inside=HUB):
            return None
        try:
            text = read_regular(ref, MAX_REF_BYTES, follow_symlinks=False).decode("ascii", "replace").strip()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.problem(ref, "unreadable", f"cannot read: {exc.strerror or exc}")
            return None
        if not _COMMIT.fullmatch(text):
            self.problem(ref, "corrupt", f"not a 40-hex commit hash: {text[:60]!r}")
            return None
        return text

    def blob(self, link: str, blobs: str | None) -> _Blob | None:
        """The complete blob a snapshot link resolves to, or ``None`` (with a problem when something is wrong)."""
        if blobs is None:  # no usable blobs/ (a link in its place was reported once): nothing resolves
            return None
        try:
            target = os.path.normpath(os.path.join(os.path.dirname(link), os.readlink(link)))
        except OSError as exc:
            self.os_problem(link, exc)
            return None
        # lexical ".." is exact here: every directory from the link up to the repository is a real one
        # (checked, or never entered when a link), and a blob that is itself a link is refused below
        if os.path.dirname(target) != blobs:
            self.problem(link, "unreadable", "links outside its repository's blobs/, not followed")
            return None
        if target.endswith(INCOMPLETE_SUFFIX):
            self.problem(link, "inconsistent", "links to a download in progress")
            return None
        try:
            st = os.lstat(target)
        except FileNotFoundError:
            self.problem(link, "inconsistent", f"links to a missing blob ({os.path.basename(target)})")
            return None
        except OSError as exc:
            self.os_problem(target, exc)
            return None
        if not stat.S_ISREG(st.st_mode):
            self.problem(link, "unreadable", "links to something that is not a regular file")
            return None
        return _Blob((st.st_dev, st.st_ino), st.st_size, target)

    def shards(self, blob: _Blob) -> tuple[str, ...] | str:
        """The shard files an index names, or why it cannot be read."""
        try:
            st = os.lstat(blob.path)
        except OSError as exc:
            return f"cannot read: {exc.strerror or exc}"
        stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        if self.indexes is not None and (hit := self.indexes.get(blob.path, stamp)) is not None:
            return hit
        value: tuple[str, ...] | str
        try:
            index = _ShardIndex.model_validate_json(read_regular(blob.path, MAX_INDEX_BYTES, follow_symlinks=False))
        except OSError as exc:
            value = f"cannot read: {exc.strerror or exc}"
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(p) for p in first["loc"])
            value = f"corrupt index: {where + ': ' if where else ''}{first['msg']}"
        else:
            value = tuple(sorted(set(index.weight_map.values())))
        if self.indexes is not None:
            self.indexes.put(blob.path, stamp, value)
        return value

    def downloading(self, blobs: Path) -> str | None:
        """The name of an ``.incomplete`` blob in the repository, if any."""
        return next((n for n in self.names(blobs) if n.endswith(INCOMPLETE_SUFFIX)), None)

    def snapshot(self, repo: Path, commit: str) -> SnapshotState | None:
        """The state of ``snapshots/<commit>`` (rules in the module docstring); ``None`` when it is not there."""
        snap = repo / "snapshots" / commit
        if not (self.real_dir(repo / "snapshots", inside=HUB) and self.real_dir(snap, inside=HUB)):
            return None
        blobs_dir = repo / "blobs"
        blobs = os.path.normpath(blobs_dir) if self.real_dir(blobs_dir, inside=HUB) else None
        files: dict[str, _Blob | None] = {}
        copied = False
        stack: list[tuple[str, str]] = [(str(snap), "")]
        while stack:
            path, prefix = stack.pop()
            try:
                it = os.scandir(path)
            except OSError as exc:
                self.os_problem(path, exc)
                files[prefix or "."] = None  # an unreadable part: not complete
                continue
            with it:
                for entry in it:
                    rel = prefix + entry.name
                    try:
                        if entry.is_symlink():
                            self.files += 1
                            files[rel] = self.blob(entry.path, blobs)
                        elif entry.is_dir(follow_symlinks=False):
                            stack.append((entry.path, rel + "/"))
                        elif entry.is_file(follow_symlinks=False):
                            self.files += 1
                            st = entry.stat(follow_symlinks=False)
                            files[rel] = _Blob((st.st_dev, st.st_ino), st.st_size, entry.path)
                            copied = True
                        else:
                            self.problem(entry.path, "unreadable", "neither a file, a link nor a directory")
                            files[rel] = None
                    except OSError as exc:
                        self.os_problem(entry.path, exc)
                        files[rel] = None
        present = {rel: b for rel, b in files.items() if b is not None}
        size = sum({b.ident: b.size for b in present.values()}.values())
        why = self._incomplete(snap, files, present, copied) or (
            f"a download into the repository is in progress ({name})"
            if blobs is not None and (name := self.downloading(blobs_dir)) else None)
        return SnapshotState(size, why is None, why)

    def _incomplete(self, snap: Path, files: Mapping[str, _Blob | None], present: Mapping[str, _Blob],
                    copied: bool) -> str | None:
        """Why the snapshot's own files fall short (rules 1 to 4), or ``None``."""
        missing = sorted(rel for rel, b in files.items() if b is None)
        if missing:
            return f"{len(missing)} file(s) do not resolve to a complete blob ({missing[0]}, ...)"
        if copied:
            return "files are copies, not links to blobs: a finished copy cannot be told from one in progress"
        for rel, blob in sorted(present.items()):
            if not rel.endswith(INDEX_SUFFIXES):
                continue
            listed = self.shards(blob)
            if isinstance(listed, str):
                self.problem(snap / rel, "corrupt", listed)
                return f"{rel} is unusable"
            base = rel.rpartition("/")[0]
            absent = [s for s in listed if _join(base, s) not in present]
            if absent:
                return f"{rel} lists {len(absent)} shard(s) not present ({absent[0]}, ...)"
        series: dict[tuple[str, str, str], set[int]] = {}
        for rel in present:
            m = _SHARD.fullmatch(rel)
            if m is not None:
                series.setdefault((m["stem"], m["total"], m["ext"]), set()).add(int(m["index"]))
        for (stem, total, ext), have in sorted(series.items()):
            gap = next((i for i in range(1, int(total) + 1) if i not in have), None)
            if gap is not None:
                return f"shard {stem}-{gap:05d}-of-{total}{ext} is not present"
        if not any(rel.endswith(WEIGHTS_SUFFIXES) for rel in present):
            return "no weights file yet (" + ", ".join(WEIGHTS_SUFFIXES) + ")"
        return None


def _join(base: str, name: str) -> str:
    """``name`` relative to the directory ``base`` of the snapshot, normalised; never leaves the snapshot."""
    parts: list[str] = [p for p in base.split("/") if p]
    for part in name.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return "\0outside"  # matches no snapshot file
            parts.pop()
        else:
            parts.append(part)
    return "/".join(parts)


def _better(a: WeightsEntry, b: WeightsEntry) -> WeightsEntry:
    """The entry that says more is on the node: complete first, then more bytes."""
    return a if (a.complete, a.bytes) >= (b.complete, b.bytes) else b


def scan_hub(roots: Sequence[Path], mapping: HubMap, *, indexes: IndexCache | None = None) -> HubScan:
    """Look for every mapped profile's snapshot in every hub root (rules in the module docstring)."""
    reader = _Reader(indexes)
    found: dict[str, WeightsEntry] = {}
    why: dict[str, str] = {}
    unmapped: set[str] = set()
    for root in map(Path, map(os.path.abspath, roots)):
        if not os.path.isdir(root):
            reader.problem(root, "unreadable", "hub cache does not exist or is not a directory")
            continue
        unmapped |= {n for n in reader.names(root) if n.startswith(MODELS_PREFIX) and n not in mapping.targets}
        for folder, targets in mapping.targets.items():
            repo = root / folder
            if not reader.real_dir(repo, inside=HUB):
                continue
            states: dict[str, SnapshotState | None] = {}
            for t in targets:
                commit = reader.commit(repo, t.version)
                if commit is None:
                    continue
                if commit not in states:
                    states[commit] = reader.snapshot(repo, commit)
                state = states[commit]
                if state is None:
                    continue
                size = state.bytes if state.complete else min(state.bytes, max(0, t.declared_bytes - 1))
                entry = WeightsEntry(t.workload, t.version, size, complete=state.complete, expected_bytes=None)
                found[t.key] = _better(found[t.key], entry) if t.key in found else entry
                if found[t.key] is entry and state.why is not None:
                    why[t.key] = f"{repo / 'snapshots' / commit}: {state.why}"
    if indexes is not None:
        indexes.end_scan()
    partial = {k: why[k] for k in sorted(found) if not found[k].complete}
    return HubScan(weights=tuple(found[k] for k in sorted(found)), problems=tuple(reader.problems),
                   unmapped=tuple(sorted(unmapped)), files=reader.files, partial=partial)


def merge_into(scan: CacheScan, hub: HubScan) -> CacheScan:
    """``scan`` with the hub's entries added (the better one where a key is in both) and its problems.

    A key the hub holds loses its last-use time: see "Eviction" in the module docstring.
    """
    if not hub.weights and not hub.problems:
        return scan
    ours = {w.key: w for w in scan.weights}
    theirs = {w.key: w for w in hub.weights}
    weights = [_better(w, theirs[w.key]) if w.key in theirs else w for w in scan.weights]
    weights += [w for k, w in theirs.items() if k not in ours]
    held = {cache_id("weights", k) for k in theirs}
    return dataclasses.replace(
        scan,
        weights=tuple(weights),
        problems=(*scan.problems, *hub.problems),
        files=scan.files + hub.files,
        last_used={k: v for k, v in scan.last_used.items() if k not in held},
    )


class HubCaches:
    """The hub roots an agent watches and the policy that maps them, reloaded when the file changes.

    Without a policy the roots are not scanned (there is nothing to map repositories to), which is
    logged once. :meth:`add_to` is the agent's one call per scan: a ``stat`` of the policy file,
    then :func:`scan_hub`.
    """

    def __init__(self, roots: Iterable[Path], policy: Policy | None = None, watch: PolicyFile | None = None) -> None:
        self.roots = tuple(roots)
        self.watch = watch
        self.mapping = HubMap()
        self.indexes = IndexCache()
        self.last: HubScan | None = None
        self._have_policy = False
        self._said_no_policy = False
        self._unmapped: tuple[str, ...] | None = None
        self._partial: dict[str, str] = {}
        if policy is not None:
            self.set_policy(policy)

    def set_policy(self, policy: Policy) -> None:
        self.mapping = hub_map(policy)
        self._have_policy = True
        for name in self.mapping.unusable:
            log.warning("profile %s: weights.source is hf:// but names no model repository (hf://ORG/NAME); "
                        "its hub caches are not looked for", name)
        log.info("hub caches: %d profile(s) in %d repositories looked for in %s",
                 sum(len(t) for t in self.mapping.targets.values()), len(self.mapping.targets),
                 ", ".join(map(str, self.roots)) or "no hub root (give --hub-cache)")

    def scan(self) -> HubScan | None:
        """Reload the policy if it changed, then scan; ``None`` while there is no policy."""
        if self.watch is not None:
            polled = self.watch.poll()
            if polled.policy is not None:
                self.set_policy(polled.policy)
        if not self._have_policy:
            if not self._said_no_policy and self.roots:
                log.warning("hub caches %s are not scanned: give --policy to map their repositories to profiles",
                            ", ".join(map(str, self.roots)))
            self._said_no_policy = True
            return None
        hub = scan_hub(self.roots, self.mapping, indexes=self.indexes)
        if hub.unmapped != self._unmapped:
            self._unmapped = hub.unmapped
            if hub.unmapped:
                log.info("hub caches: %d repositories no profile maps (skipped): %s", len(hub.unmapped),
                         ", ".join(hub.unmapped[:10]) + (", ..." if len(hub.unmapped) > 10 else ""))
        for key, why in sorted(hub.partial.items()):
            if self._partial.get(key) != why:
                log.info("hub caches: %s is partial: %s", key, why)
        self._partial = dict(hub.partial)
        self.last = hub
        return hub

    def add_to(self, scan: CacheScan) -> CacheScan:
        """The cache-root ``scan`` with what the hub roots hold added (:func:`merge_into`)."""
        hub = self.scan()
        return scan if hub is None else merge_into(scan, hub)

