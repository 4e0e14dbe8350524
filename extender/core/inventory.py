"""What each node holds, as stored in the inventory, and the columnar view the hot path reads.

:class:`NodeState` is one node's record (written by the agent, by cluster sync or by
``extender inventory load``). :class:`InventorySnapshot` turns a list of them into numpy columns
once, so that a scheduling request is index lookups and vector arithmetic, never a Python loop
over node records.

Freshness: every record carries the time of its last report (``heartbeat``, unix seconds, on the
writer's clock) and a ``ttl``. A record is fresh at the reader's time ``now`` while the heartbeat
lies within the TTL of ``now`` in either direction::

    fresh(now)  <=>  heartbeat - ttl <= now <= heartbeat + ttl      (|now - heartbeat| <= ttl)

A record outside that window is *unknown*, and unknown means cold: the estimator sees no image, no
weights, no compile cache and no snapshot on that node, and the scorer never gives it a warm score
on stale news. Node class and free resources of a stale record are still used (they change slowly
and are better than nothing), but nothing that would make it look warm.

Why both directions: a heartbeat ahead of the reader's clock (an agent whose clock runs fast) would
otherwise stay fresh until the reader's clock caught up, however long after the agent died; with the
window, a dead agent's record goes stale at most one TTL after its last report by either clock. The
price is that a live agent whose clock runs more than a TTL ahead is stale too ("stale ahead" in
``extender inventory show``): its reports cannot be told from a dead agent's, so clocks must agree
to within the TTL (NTP does, by orders of magnitude). A record ahead by more than its TTL turns
fresh as the reader's clock reaches ``heartbeat - ttl``, and stale again after ``heartbeat + ttl``;
:func:`next_freshness_change` gives the first such instant, for readers that keep results until
freshness changes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Annotated, Any

import numpy as np
from numpy.typing import NDArray
from pydantic import Field

from extender.core.caches import adapter_keys, compile_key, keeps_weights, snapshot_key, weights_key
from extender.core.estimate import CacheState, ClassTable, CompileCache
from extender.core.images import names_for, normalise_all
from extender.core.k8snames import DNS_SUBDOMAIN_PATTERN
from extender.core.policy import UNKNOWN_CLASS, NodeClass, Policy, Profile
from extender.core.schema import Schema, Text
from extender.core.units import Bytes, Duration, format_bytes

#: Seconds an agent report stays valid when the record does not say (agents report every 15 s by
#: default, so four missed reports in a row make a node unknown).
DEFAULT_TTL_S = 60.0

# ---- bounds of a record ---------------------------------------------------------------------------
# Every writer (agents, sync, ``inventory load``, anything with Redis access) is checked against the
# same model on write and on read. The bounds keep one record from stopping every worker's snapshot
# build (2**64 GPUs overflowed the int64 column), from pinning a node warm forever (an infinite
# heartbeat), from growing a reader's memory without limit, and from writing terminal escapes
# through ``inventory show``. They are far above anything a real node reports.

#: A node name is a Kubernetes object name: a DNS subdomain (RFC 1123) of at most 253 characters.
MAX_NAME_LENGTH = 253
#: GPUs on one node (the largest machines today have 72 in one NVLink domain).
MAX_GPUS = 4096
#: Any size in bytes (one exbibyte); float64 columns hold it exactly enough, int64 would too.
MAX_BYTES = 2**60
#: Unix seconds: year 5138. Finite, so a heartbeat can never keep a node fresh forever.
MAX_TIMESTAMP = 1e11
#: A record's TTL: finite, but long enough for "never stale" in tests and hand-written files.
MAX_TTL_S = MAX_TIMESTAMP
#: Entries of one list or map in a record (images, weights, keys, labels, usage).
MAX_ENTRIES = 4096
#: The stored JSON of one record; larger ones are refused on write and skipped on read.
MAX_RECORD_BYTES = 1 << 20

NodeName = Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=DNS_SUBDOMAIN_PATTERN)]
Count = Annotated[int, Field(ge=0, le=MAX_GPUS)]
StoredBytes = Annotated[Bytes, Field(ge=0, le=MAX_BYTES)]
Timestamp = Annotated[float, Field(ge=0, le=MAX_TIMESTAMP, allow_inf_nan=False)]
Ttl = Annotated[Duration, Field(gt=0, le=MAX_TTL_S, allow_inf_nan=False)]
Texts = Annotated[tuple[Text, ...], Field(max_length=MAX_ENTRIES)]
TextMap = Annotated[dict[Text, Text], Field(max_length=MAX_ENTRIES)]
BytesMap = Annotated[dict[Text, StoredBytes], Field(max_length=MAX_ENTRIES)]
TimeMap = Annotated[dict[Text, Timestamp], Field(max_length=MAX_ENTRIES)]


class NodeState(Schema):
    """One node's cache and capacity state."""

    name: NodeName
    #: Node class name; empty: classify by ``labels`` against the policy.
    node_class: Text = ""
    labels: TextMap = {}
    gpus: Count = 0
    gpus_free: Count = 0
    nvme_total: StoredBytes = 0
    nvme_free: StoredBytes = 0
    #: Every name of every image present (tags and digests), as in ``status.images[].names``.
    images: Texts = ()
    #: Bytes present per ``weights_key(workload, version)``; complete when equal to the profile's.
    weights: BytesMap = {}
    #: Compile-cache keys present on the node (``extender.core.cachekey``).
    compile_keys: Texts = ()
    #: Process snapshots on this node, ``<workload>/<weights version>`` (valid for the node's class).
    snapshots: Texts = ()
    #: LoRA adapters on this node, complete, as ``<workload>/<adapter>`` (extender.core.caches).
    adapters: Texts = ()
    #: Bytes other pulls (starting pods, warm jobs) still have to bring onto this node.
    pulling_bytes: StoredBytes = 0
    heartbeat: Timestamp = 0.0
    ttl: Ttl = DEFAULT_TTL_S
    # Usage, for the cache warmer's evictions (extender.core.warming). Keys are cache ids
    # (:func:`cache_id`). A record without them is still valid; its caches are then never evicted,
    # because nothing says whether a pod needs them.
    #: Unix seconds each cache entry was last used by a pod (or staged, if no pod used it yet).
    #: Only entries listed here are eviction candidates.
    last_used: TimeMap = {}
    #: Cache ids that running or starting pods on this node use (node agent); never evicted.
    in_use: Texts = ()
    #: Workloads with a running or starting pod on this node (cluster sync). Their current compile
    #: cache and snapshot, and their weights of every version, count as in use.
    pod_workloads: Texts = ()
    #: Bytes of compile-cache, snapshot and adapter entries by cache id (weights bytes are in ``weights``);
    #: where missing, the size the policy declares for the matching profile is used.
    cache_bytes: BytesMap = {}

    def fresh(self, now: float) -> bool:
        """Is the heartbeat within the TTL of ``now``: ``heartbeat - ttl <= now <= heartbeat + ttl``?

        That is ``|now - heartbeat| <= ttl`` (module docstring: a heartbeat ahead of ``now`` by more
        than the TTL is stale too), written with the two bounds because they are the instants a
        reader's cached freshness expires at (:func:`next_freshness_change`), computed the same way.
        """
        return self.heartbeat - self.ttl <= now <= self.heartbeat + self.ttl


def within_totals(state: NodeState) -> tuple[NodeState, tuple[str, ...]]:
    """``state`` with free GPUs and free NVMe cut to their totals, and a phrase for each value cut.

    ``gpus_free <= gpus`` and ``nvme_free <= nvme_total`` hold in every record this project writes
    (:func:`extender.core.reports.merge` cuts them, ``extender inventory load`` refuses a file that
    breaks them), but another writer may store a record that does not. Read as stored, its node
    would be scored with more free space than it has, and ``inventory show --json`` would print
    what ``inventory load`` refuses, so a backup could not be restored. Readers take
    ``free = min(free, total)`` instead, the same cut merge makes, and say what they cut.
    """
    cut: dict[str, Any] = {}
    said: list[str] = []
    if state.gpus_free > state.gpus:
        cut["gpus_free"] = state.gpus
        said.append(f"gpusFree {state.gpus_free} above gpus {state.gpus}")
    if state.nvme_free > state.nvme_total:
        cut["nvme_free"] = state.nvme_total
        said.append(f"nvmeFree {format_bytes(state.nvme_free)} above nvmeTotal {format_bytes(state.nvme_total)}")
    return (state.model_copy(update=cut) if cut else state), tuple(said)


class InventoryDocument(Schema):
    """A file of node states for ``extender inventory load`` (YAML or JSON)."""

    api_version: str = Field(default="extender.io/v1alpha1", pattern=r"^extender\.io/v1alpha1$")
    kind: str = Field(default="Inventory", pattern=r"^Inventory$")
    nodes: tuple[NodeState, ...] = ()
    #: Compile-cache keys published to the cluster's registry (fetchable by any node).
    compile_registry: tuple[str, ...] = ()


@dataclass(frozen=True)
class Lookup:
    """Positions of requested node names in a snapshot; unknown names point at the cold sentinel."""

    index: NDArray[np.intp]
    known: NDArray[np.bool_]


@dataclass(frozen=True)
class Delta:
    """How a snapshot made by :meth:`InventorySnapshot.update` relates to the one it was made from.

    ``carried[i]`` is the row of the previous snapshot that row ``i`` was copied from unchanged, or
    -1 when row ``i`` was written since (replaced or new). ``removed`` names the rows that are gone.
    Consumers (the engine's score tables) redo only the rows with ``carried == -1``.
    """

    carried: NDArray[np.intp]
    removed: tuple[str, ...]


@dataclass
class InventorySnapshot:
    """Columnar, read-only view of every node record at one store version.

    Arrays have ``n + 1`` rows: row ``n`` is a sentinel for names the inventory does not know
    (unknown class, cold, no free resources), so requests can gather without branching.

    Two ways to make one: :meth:`build` indexes every record (cost in proportion to the fleet);
    :meth:`update` patches the rows of the records written since (cost in proportion to the
    change, plus a few O(n) array copies that numpy does in microseconds). The two agree: updating
    a snapshot equals building one from the same records in the same row order
    (``tests/test_inventory_update.py``).
    """

    version: int
    taken_at: float
    nodes: tuple[NodeState, ...]
    registry: frozenset[str]
    classes: tuple[NodeClass, ...]
    class_index: NDArray[np.intp]
    heartbeat: NDArray[np.float64]
    ttl: NDArray[np.float64]
    gpus_free: NDArray[np.int64]
    nvme_free: NDArray[np.float64]
    pulling_bytes: NDArray[np.float64]
    positions: dict[str, int]
    _per_profile: dict[str, tuple[CacheState, ClassTable]] = field(default_factory=dict, repr=False)
    #: Set by :meth:`update`: what changed relative to the snapshot it was made from.
    delta: Delta | None = field(default=None, repr=False, compare=False)

    @classmethod
    def build(
        cls,
        policy: Policy,
        nodes: Iterable[NodeState],
        *,
        version: int = 0,
        taken_at: float = 0.0,
        registry: Iterable[str] = (),
    ) -> InventorySnapshot:
        """Index the records against the policy's node classes (done once per store version)."""
        records = tuple(nodes)
        classes = (*policy.node_classes, UNKNOWN_CLASS)
        unknown = len(classes) - 1
        columns = _columns(policy, classes, records)
        return cls(
            version=version,
            taken_at=taken_at,
            nodes=records,
            registry=frozenset(registry),
            classes=classes,
            class_index=np.array([*columns[0], unknown], dtype=np.intp),
            heartbeat=np.array([*columns[1], 0.0], dtype=np.float64),
            ttl=np.array([*columns[2], 1.0], dtype=np.float64),
            gpus_free=np.array([*columns[3], 0], dtype=np.int64),
            nvme_free=np.array([*columns[4], 0], dtype=np.float64),
            pulling_bytes=np.array([*columns[5], 0], dtype=np.float64),
            positions={s.name: i for i, s in enumerate(records)},
        )

    def update(
        self,
        policy: Policy,
        changed: Mapping[str, NodeState | None],
        *,
        version: int,
        taken_at: float,
        registry: Iterable[str] | None = None,
    ) -> InventorySnapshot:
        """A new snapshot with ``changed`` applied (``None``: the node is gone); this one is untouched.

        ``policy`` must be the one this snapshot was built with. A replaced record keeps its row, a
        new one is appended (before the sentinel), a deleted one's row is removed and the rows after
        it move up. Each memoised per-profile cache state is patched for the changed rows only,
        unless the compile registry changed (a registry key changes every row's compile state; the
        state is then recomputed on first use).
        """
        reg = self.registry if registry is None else frozenset(registry)
        n = len(self.nodes)
        replaced: dict[int, NodeState] = {}
        removed: list[int] = []
        added: dict[str, NodeState] = {}
        for name, record in changed.items():
            row = self.positions.get(name)
            if row is None:
                if record is not None:
                    added[name] = record
            elif record is None:
                removed.append(row)
            else:
                replaced[row] = record
        rows = np.fromiter(replaced, dtype=np.intp, count=len(replaced))
        nodes = list(self.nodes)
        for row, record in replaced.items():
            nodes[row] = record
        carried = np.arange(n, dtype=np.intp)
        carried[rows] = -1
        new_records = tuple(added.values())
        patch = _columns(policy, self.classes, tuple(replaced.values()))
        extra = _columns(policy, self.classes, new_records)
        keep: NDArray[np.bool_] | None = None
        if removed:
            keep = np.ones(n + 1, dtype=np.bool_)
            keep[removed] = False
            gone = set(removed)
            nodes = [s for i, s in enumerate(nodes) if i not in gone]
            carried = carried[keep[:n]]
        nodes.extend(new_records)
        carried = np.concatenate([carried, np.full(len(new_records), -1, dtype=np.intp)])

        def patched(column: NDArray[Any], values: list[Any], tail: list[Any]) -> NDArray[Any]:
            out = column.copy()
            out[rows] = values
            if keep is not None:
                out = out[keep]
            if tail:
                out = np.concatenate([out[:-1], np.array(tail, dtype=column.dtype), out[-1:]])
            return out

        arrays = [patched(col, patch[k], extra[k]) for k, col in enumerate(
            (self.class_index, self.heartbeat, self.ttl, self.gpus_free, self.nvme_free, self.pulling_bytes))]
        if removed:
            positions = {s.name: i for i, s in enumerate(nodes)}
        elif added:
            positions = dict(self.positions)
            positions.update((name, n + k) for k, name in enumerate(added))
        else:
            positions = self.positions
        snapshot = InventorySnapshot(
            version=version,
            taken_at=taken_at,
            nodes=tuple(nodes),
            registry=reg,
            classes=self.classes,
            class_index=arrays[0],
            heartbeat=arrays[1],
            ttl=arrays[2],
            gpus_free=arrays[3],
            nvme_free=arrays[4],
            pulling_bytes=arrays[5],
            positions=positions,
            delta=Delta(carried, tuple(self.nodes[i].name for i in removed)),
        )
        if reg != self.registry:
            return snapshot
        profiles = {p.name: p for p in policy.profiles}
        stale_rows = np.flatnonzero(carried < 0)
        for name, (state, table) in self._per_profile.items():
            profile = profiles.get(name)
            if profile is None:
                continue
            parts = []
            for f in fields(CacheState):
                column = getattr(state, f.name)
                if keep is not None:
                    column = column[keep]
                if added:
                    pad = np.zeros((len(added), *column.shape[1:]), dtype=column.dtype)
                    column = np.concatenate([column[:-1], pad, column[-1:]])
                elif keep is None:
                    column = column.copy()
                parts.append(column)
            fresh = CacheState(*parts)
            if len(stale_rows):
                rows_state = snapshot._rows_state(profile, stale_rows)
                for f in fields(CacheState):
                    getattr(fresh, f.name)[stale_rows] = getattr(rows_state, f.name)
            snapshot._per_profile[name] = (fresh, table)
        return snapshot

    def with_heartbeats(self, beats: Mapping[str, float], *, taken_at: float) -> InventorySnapshot:
        """This snapshot with later heartbeats (node name -> unix seconds); this one is untouched.

        Only the heartbeat column changes, and only upward (an older heartbeat than the row's is
        ignored, as is a name the snapshot does not hold). Records and rows are shared, and the
        memoised cache states carried over (copied as a map, so neither snapshot's additions disturb
        the other): a cache state is computed as if every record were fresh, so it does not depend
        on heartbeats. The records in :attr:`nodes` keep the heartbeat they were read with;
        the column is what freshness is judged by. Cost: one lookup per heartbeat and one copy of
        the column. The result's :attr:`delta` maps every row to itself.
        """
        get = self.positions.get
        found = [(row, beat) for name, beat in beats.items() if (row := get(name)) is not None]
        heartbeat = self.heartbeat.copy()
        if found:
            rows = np.fromiter((r for r, _ in found), dtype=np.intp, count=len(found))
            values = np.fromiter((b for _, b in found), dtype=np.float64, count=len(found))
            heartbeat[rows] = np.maximum(heartbeat[rows], values)
        return replace(self, taken_at=taken_at, heartbeat=heartbeat, _per_profile=dict(self._per_profile),
                       delta=Delta(np.arange(len(self.nodes), dtype=np.intp), ()))

    def __len__(self) -> int:
        return len(self.nodes)

    def lookup(self, names: Sequence[str]) -> Lookup:
        """Rows of ``names``; names the inventory does not know map to the cold sentinel row."""
        sentinel = len(self.nodes)
        get = self.positions.get
        index = np.fromiter((get(n, sentinel) for n in names), dtype=np.intp, count=len(names))
        return Lookup(index=index, known=index != sentinel)

    def fresh(self, now: float) -> NDArray[np.bool_]:
        """Per row: ``heartbeat - ttl <= now <= heartbeat + ttl``, as :meth:`NodeState.fresh` (the
        sentinel never is fresh). The heartbeat column is what counts, not the records' own."""
        ok = (self.heartbeat - self.ttl <= now) & (now <= self.heartbeat + self.ttl)
        ok[-1] = False
        return ok

    def cache_state(self, profile: Profile) -> tuple[CacheState, ClassTable]:
        """Every row's cache state for ``profile`` as if every record were fresh, plus its class table.

        Computed once per (snapshot, profile) and memoised; callers mask stale rows with
        :meth:`state_for`.
        """
        cached = self._per_profile.get(profile.name)
        if cached is not None:
            return cached
        rows = np.arange(len(self.nodes) + 1, dtype=np.intp)
        result = (self._rows_state(profile, rows), ClassTable.build(profile, self.classes))
        self._per_profile[profile.name] = result
        return result

    def rows_state(self, profile: Profile) -> CacheState:
        """Every row's cache state for ``profile``, as :meth:`cache_state` gives it, made anew each
        call and without the class table (for a caller that only reads the rows it changed)."""
        return self._rows_state(profile, np.arange(len(self.nodes) + 1, dtype=np.intp))

    def _rows_state(self, profile: Profile, rows: NDArray[np.intp]) -> CacheState:
        """The cache state of some rows for ``profile`` (a row equal to ``len(self)`` is the sentinel)."""
        digest = profile.compile.key.image_digest if profile.compile.key is not None else None
        image_names = names_for(profile.image.reference, digest)
        wkey = weights_key(profile.name, profile.weights.version)
        ckey = [compile_key(profile, c) for c in self.classes]
        akeys = adapter_keys(profile)
        sentinel = len(self.nodes)
        picked = [self.nodes[i] if i != sentinel else None for i in rows.tolist()]
        image = np.array([s is not None and not image_names.isdisjoint(normalise_all(s.images)) for s in picked],
                         dtype=np.bool_)
        weights = np.array([float(s.weights.get(wkey, 0)) if s is not None else 0.0 for s in picked],
                           dtype=np.float64)
        compile_state = np.zeros(len(picked), dtype=np.int8)
        for j, (i, s) in enumerate(zip(rows.tolist(), picked, strict=True)):
            if s is None:
                continue
            key = ckey[self.class_index[i]]
            if key is None:
                continue
            if key in s.compile_keys:
                compile_state[j] = CompileCache.LOCAL
            elif key in self.registry:
                compile_state[j] = CompileCache.REGISTRY
        snap_key = snapshot_key(profile)
        snapshot = np.array([s is not None and snap_key in s.snapshots for s in picked], dtype=np.bool_)
        adapters = np.array([[s is not None and k in s.adapters for k in akeys] for s in picked],
                            dtype=np.bool_).reshape(len(picked), len(akeys))
        # weights and adapters left on a node whose class does not keep them (weights.cache: none, a
        # class without NVMe, the unknown class) are not read by a replica: it streams them
        keeps = keeps_weights(profile, self.classes, self.class_index[rows])
        return CacheState(image, np.where(keeps, weights, 0.0), compile_state, snapshot,
                          self.pulling_bytes[rows].copy(), adapters & keeps[:, None])

    def state_for(self, profile: Profile, rows: NDArray[np.intp], now: float) -> tuple[CacheState, ClassTable]:
        """Cache state of the given rows for ``profile``, with stale and unknown rows made cold."""
        full, table = self.cache_state(profile)
        return full.take(rows).cold_where(~self.fresh(now)[rows]), table


def next_freshness_change(snapshot: InventorySnapshot, now: float) -> float:
    """The first unix second at or after which a row's freshness may differ from what it is at ``now``.

    ``min(min over fresh rows of heartbeat + ttl, min over rows ahead of heartbeat - ttl)``, where a
    row is ahead when ``now < heartbeat - ttl`` (a heartbeat more than a TTL in the future: it turns
    fresh at ``heartbeat - ttl``). A row stale because its heartbeat is older than ``now - ttl`` never
    turns fresh by the clock alone, only by a new heartbeat. ``inf`` when no row will change. At
    ``heartbeat + ttl`` the row is still fresh (the bound is inclusive), so a reader that recomputes
    then recomputes a little early, never late; at ``heartbeat - ttl`` the row is fresh already.
    """
    n = len(snapshot)
    beat, ttl = snapshot.heartbeat[:n], snapshot.ttl[:n]
    opens, closes = beat - ttl, beat + ttl
    fresh = (opens <= now) & (now <= closes)
    ahead = now < opens
    changes = np.concatenate([closes[fresh], opens[ahead]])
    return float(changes.min()) if len(changes) else math.inf


def _columns(policy: Policy, classes: tuple[NodeClass, ...],
             records: Sequence[NodeState]) -> tuple[list[Any], list[Any], list[Any], list[Any], list[Any], list[Any]]:
    """The per-row values of ``records``: class position, heartbeat, ttl, free GPUs, free NVMe, pulling bytes."""
    by_name = {c.name: i for i, c in enumerate(classes)}
    unknown = len(classes) - 1

    def class_of(s: NodeState) -> int:
        if s.node_class:
            return by_name.get(s.node_class, unknown)
        return by_name[policy.classify_node(s.labels).name]

    return ([*map(class_of, records)], [s.heartbeat for s in records], [s.ttl for s in records],
            [s.gpus_free for s in records], [s.nvme_free for s in records], [s.pulling_bytes for s in records])
