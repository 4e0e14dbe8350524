"""The simulated cluster: nodes with their caches and GPUs, pods from creation to deletion, and pulls.

Truth lives in one :class:`~extender.core.inventory.NodeState` per node, the record the inventory
would hold if every agent reported instantly; the estimator's per-profile columns are derived from
those records by the inventory's own :meth:`InventorySnapshot.cache_state` (rebuilt for the rows
that changed), so the simulator reads caches exactly as the extender and the warmer do.

Lifecycle of a pod::

    created (pending) --placed on a node--> starting --after the estimated startup--> ready
           \\______________________ deleted (scale-down) at any point ___________________/

* **Placed**: its GPUs are taken and its startup is the estimator's total *on that node at that
  moment* (``extender.core.estimate``), including the wait for bytes other pulls still have in
  flight to the node. What it downloads (image if absent, remote weights, a compile artifact from
  the registry) is in flight from placement until the end of its download phases, shrinking
  linearly; other starts and warm actions on the node wait behind it.
* **Ready**: it serves from the first tick at or after its ready time, and its node keeps what it
  brought: the image (images are not evicted: they live in the container runtime's store, which
  the class's NVMe reserve is for), the weights when the profile caches them and the class has
  NVMe, the compile artifacts when the profile has a compile-cache key (the inventory cannot name
  them otherwise). Weights and artifacts need free NVMe above the class reserve; when there is too
  little, caches no pod on the node uses and idle for ``warming.evictAfterIdle`` are evicted,
  least recently used first, and if that is not enough the pod runs without caching.
* **Deleted**: its GPUs are freed; its caches stay (last used now); a start cut short leaves nothing.

Warm actions (``extender.core.warming``) are pulls too while they run, and their result is applied
with the warmer's own :func:`extender.core.warming.apply` when they finish.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields

import numpy as np
from numpy.typing import NDArray

from extender.core.caches import (
    SPECS,
    adapter_keys,
    cache_id,
    caches_weights,
    compile_key,
    nvme_entries,
    parse_cache_id,
    replica_ids,
    weights_key,
    with_entries,
)
from extender.core.estimate import CacheState, ClassTable, CompileCache, Estimate, estimate
from extender.core.inventory import MAX_TTL_S, InventorySnapshot, NodeState
from extender.core.policy import UNKNOWN_CLASS, NodeClass, Policy, Profile
from extender.core.warming import Action, apply

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

#: Records never go stale in the simulation: the inventory is assumed to be current (the longest
#: TTL a record may carry, some 3,000 years of simulated time).
_TTL_S = MAX_TTL_S


@dataclass
class Pod:
    """One replica. Times in simulation seconds; ``node`` is -1 while pending."""

    id: int
    workload: int
    created_s: float
    node: int = -1
    placed_s: float = math.nan
    startup_s: float = math.nan
    ready_s: float = math.inf
    cold: bool = False
    deleted_s: float = math.inf

    @property
    def pending(self) -> bool:
        """Not placed yet (no node had room)."""
        return self.node < 0

    def is_ready(self, now: float) -> bool:
        """Placed and past its startup."""
        return self.node >= 0 and self.ready_s <= now


@dataclass
class _Pull:
    node: int
    bytes: float
    start_s: float
    end_s: float
    owner: int  # pod id, or -1 for a warm action


@dataclass(frozen=True)
class NodeSpec:
    """A node at t = 0: name, class and what it holds."""

    name: str
    node_class: str
    #: (cache id, bytes) of every cache on the node (extender.core.caches).
    caches: tuple[tuple[str, int], ...] = ()
    #: The node exists at t = 0 (a slot of an autoscaled pool may not).
    present: bool = True
    #: Index of its autoscaled pool (the scenario's node group), -1 for a fixed group.
    pool: int = -1


@dataclass
class Start:
    """What placing a pod on a node costs: the estimator's phases and whether it was fully warm."""

    estimate: Estimate
    cold: bool
    download_bytes: float
    download_s: float


@dataclass
class _PlanRows:
    """What the last planning snapshot's rows were made from (:meth:`Cluster.planning_snapshot`):
    per present node, the identity of its record, its free GPUs, pulling bytes and pod changes, the
    record itself (``held``: kept alive, so its identity is not reused) and the planning record."""

    present: bytes
    rows: NDArray[np.intp]
    sources: NDArray[np.uint64]
    gpus_free: I64
    pulling: I64
    pods: I64
    held: list[NodeState | None]
    records: list[NodeState]

    @classmethod
    def empty(cls, present: bytes, rows: NDArray[np.intp]) -> _PlanRows:
        """Rows that all differ from any node (every one is made on first use)."""
        n = len(rows)
        return cls(present, rows, np.zeros(n, dtype=np.uint64), np.full(n, -1, dtype=np.int64),
                   np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64), [None] * n, [None] * n)  # type: ignore[list-item]


@dataclass
class Cluster:
    """Nodes, pods and pulls of one simulation run (see the module docstring)."""

    policy: Policy
    profiles: tuple[Profile, ...]
    records: list[NodeState]
    compile_registry: bool = False
    classes: tuple[NodeClass, ...] = ()
    class_index: NDArray[np.intp] = field(default_factory=lambda: np.zeros(0, dtype=np.intp))
    gpus: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    gpus_used: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    registry: set[str] = field(default_factory=set)
    pods_on: list[dict[int, Pod]] = field(default_factory=list)
    pulls: list[_Pull] = field(default_factory=list)
    in_flight: list[tuple[float, Action]] = field(default_factory=list)
    #: Bumped on every change a planner or placement could see.
    version: int = 0
    index: dict[str, int] = field(default_factory=dict)
    #: Per node slot: it exists (joined and not removed); its class's GPUs; its pool (-1: fixed).
    present: NDArray[np.bool_] = field(default_factory=lambda: np.zeros(0, dtype=np.bool_))
    class_gpus: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    pool: NDArray[np.intp] = field(default_factory=lambda: np.zeros(0, dtype=np.intp))
    _bare: list[NodeState] = field(default_factory=list)
    _allowed: list[NDArray[np.bool_]] = field(default_factory=list)
    _columns: list[CacheState] = field(default_factory=list)
    _tables: list[ClassTable] = field(default_factory=list)
    _compile_keys: list[list[str | None]] = field(default_factory=list)
    #: Memos that follow the profiles (cleared by :meth:`set_profile`): cache ids a replica reads per
    #: (workload, class); (in_use, pod_workloads) per (class, workloads with a pod on the node).
    _replica_ids: dict[tuple[int, int], frozenset[str]] = field(default_factory=dict)
    _usage: dict[tuple[int, frozenset[int]], tuple[tuple[str, ...], tuple[str, ...]]] = field(default_factory=dict)
    #: The incremental planning snapshot (:meth:`planning_snapshot`): what each row was made from
    #: (``_plan_rows``), and the last snapshot with the planner's policy, the present nodes and the
    #: registry it was made for (``_plan_snap``).
    _plan_rows: _PlanRows | None = None
    _nvme_free: tuple[int, F64] | None = None
    #: Per node: bumped whenever a pod is placed on it or leaves it.
    _pods_changes: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    _plan_snap: tuple[Policy, bytes, frozenset[str], InventorySnapshot] | None = None

    @classmethod
    def build(cls, policy: Policy, profiles: Sequence[Profile], nodes: Sequence[NodeSpec], *,
              compile_registry: bool = False) -> Cluster:
        """The cluster at t = 0 (caches as given, last used at t = 0, nothing running)."""
        classes = (*policy.node_classes, UNKNOWN_CLASS)
        by_name = {c.name: i for i, c in enumerate(classes)}
        records: list[NodeState] = []
        bares: list[NodeState] = []
        for spec in nodes:
            c = classes[by_name[spec.node_class]]
            bare = NodeState.model_validate({
                "name": spec.name, "nodeClass": c.name, "gpus": c.gpu.count, "gpusFree": c.gpu.count,
                "nvmeTotal": c.nvme.capacity, "nvmeFree": c.nvme.capacity, "heartbeat": 0.0, "ttl": _TTL_S,
            })
            bares.append(bare)
            if not spec.present:
                records.append(bare)
                continue
            held = dict(spec.caches)
            updates = with_entries(bare, add=held)
            on_nvme = {i: b for i, b in held.items() if SPECS[parse_cache_id(i)[0]].on_nvme}
            updates["last_used"] = dict.fromkeys(on_nvme, 0.0)
            records.append(bare.model_copy(update={**updates,
                                                   "nvme_free": max(c.nvme.capacity - sum(on_nvme.values()), 0)}))
        cluster = cls(policy=policy, profiles=tuple(profiles), records=records, compile_registry=compile_registry)
        cluster.classes = classes
        cluster.class_index = np.array([by_name[r.node_class] for r in records], dtype=np.intp)
        cluster.class_gpus = np.array([r.gpus for r in records], dtype=np.int64)
        cluster.present = np.array([spec.present for spec in nodes], dtype=np.bool_)
        cluster.pool = np.array([spec.pool for spec in nodes], dtype=np.intp)
        cluster.gpus = np.where(cluster.present, cluster.class_gpus, 0).astype(np.int64)
        cluster._bare = bares
        cluster.gpus_used = np.zeros(len(records), dtype=np.int64)
        cluster.pods_on = [{} for _ in records]
        cluster._pods_changes = np.zeros(len(records), dtype=np.int64)
        cluster.index = {r.name: i for i, r in enumerate(records)}
        snap = cluster.snapshot_of(records)
        for p in cluster.profiles:
            state, table = snap.cache_state(p)
            cluster._columns.append(state.take(slice(0, len(records))))
            cluster._tables.append(table)
            cluster._compile_keys.append([compile_key(p, c) for c in classes])
        return cluster

    def __len__(self) -> int:
        return len(self.records)

    # ---- views ---------------------------------------------------------------------------

    def snapshot_of(self, records: Sequence[NodeState]) -> InventorySnapshot:
        """An inventory snapshot of the given records (with the compile registry)."""
        return InventorySnapshot.build(self.policy, records, registry=self.registry)

    def queued_bytes(self, now: float) -> F64:
        """Per node: bytes other pulls still have to bring (each pull shrinks linearly to its end)."""
        n = len(self.records)
        if not self.pulls:
            return np.zeros(n)
        self.pulls = [p for p in self.pulls if p.end_s > now]
        if not self.pulls:
            return np.zeros(n)
        node = np.array([p.node for p in self.pulls], dtype=np.intp)
        size = np.array([p.bytes for p in self.pulls])
        start = np.array([p.start_s for p in self.pulls])
        end = np.array([p.end_s for p in self.pulls])
        left = size * np.clip((end - now) / np.maximum(end - start, 1e-9), 0.0, 1.0)
        return np.bincount(node, weights=left, minlength=n).astype(np.float64)

    def state(self, w: int, now: float, rows: NDArray[np.intp] | None = None) -> CacheState:
        """The cache state of workload ``w``'s profile on every node (or ``rows``), pulls included."""
        col = self._columns[w]
        queued = self.queued_bytes(now)
        if rows is None:
            return col.with_queue(queued)
        return col.take(rows).with_queue(queued[rows])

    def table(self, w: int) -> ClassTable:
        """The class table of workload ``w``'s profile (for :func:`extender.core.estimate.estimate`)."""
        return self._tables[w]

    def nvme_free(self) -> F64:
        """Free NVMe bytes per node, from the records (read-only; memoised while :attr:`version`
        stands: every change of a record is followed by a bump before anything reads again)."""
        if self._nvme_free is None or self._nvme_free[0] != self.version:
            column = np.fromiter((r.nvme_free for r in self.records), dtype=np.float64, count=len(self.records))
            column.flags.writeable = False
            self._nvme_free = (self.version, column)
        return self._nvme_free[1]

    def gpus_free(self) -> I64:
        """Free GPUs per node."""
        return np.asarray(self.gpus - self.gpus_used, dtype=np.int64)

    def allowed(self, w: int) -> NDArray[np.bool_]:
        """Nodes of a class workload ``w``'s profile may run on (present or not; read-only, memoised:
        node slots keep their class and a rollout keeps the profile's classes)."""
        while len(self._allowed) <= w:
            p = self.profiles[len(self._allowed)]
            if not p.node_classes:
                mask = np.asarray(self.class_index < len(self.classes) - 1, dtype=np.bool_)
            else:
                ok = [i for i, c in enumerate(self.classes) if c.name in p.node_classes]
                mask = np.isin(self.class_index, ok)
            mask.flags.writeable = False
            self._allowed.append(mask)
        return self._allowed[w]

    def feasible(self, w: int) -> NDArray[np.bool_]:
        """Nodes where a replica of workload ``w`` fits now (class allowed, GPUs free)."""
        return self.allowed(w) & (self.gpus_free() >= self.profiles[w].parallelism.gpus)

    # ---- pods ----------------------------------------------------------------------------

    def cost(self, w: int, node: int, now: float, state: CacheState | None = None) -> Start:
        """What starting workload ``w`` on ``node`` now takes, from the estimator. ``state``: the
        caller's ``state(w, now, [node])`` of this moment, when it has it (read, not changed)."""
        p = self.profiles[w]
        rows = np.array([node], dtype=np.intp)
        if state is None:
            state = self.state(w, now, rows)
        est = estimate(p, self.classes, self.class_index[rows], state, self._tables[w])
        cls = self.classes[int(self.class_index[node])]
        keeps_weights = caches_weights(p, cls)
        missing = not bool(state.image[0]) or not bool(state.adapters[0].all())
        missing |= keeps_weights and float(state.weights_bytes[0]) < p.weights.bytes
        has_key = self._compile_keys[w][int(self.class_index[node])] is not None
        missing |= has_key and int(state.compile[0]) != CompileCache.LOCAL
        cold = missing and float(est.restore_s[0]) == 0.0
        remote = p.weights.bytes - min(max(float(state.weights_bytes[0]), 0.0), float(p.weights.bytes))
        image = 0.0 if bool(state.image[0]) else float(p.image.size)
        artifact = float(p.compile.artifact_bytes) if int(state.compile[0]) == CompileCache.REGISTRY else 0.0
        restoring = float(est.restore_s[0]) > 0
        adapters = sum(a.bytes for a, here in zip(p.preloaded_adapters, state.adapters[0], strict=True) if not here)
        download = image + adapters + (0.0 if restoring else remote + artifact)
        seconds = float(est.queue_s[0] + est.image_s[0] + est.weights_s[0] + (est.adapters_s[0] if adapters else 0.0))
        if artifact and not restoring:
            seconds += float(est.compile_s[0])
        return Start(est, cold, download, seconds)

    def place(self, pod: Pod, node: int, now: float, state: CacheState | None = None) -> Start:
        """Bind ``pod`` to ``node`` now: take its GPUs, time its start, register its downloads
        (``state``: as for :meth:`cost`)."""
        start = self.cost(pod.workload, node, now, state)
        pod.node = node
        pod.placed_s = now
        pod.startup_s = float(start.estimate.total_s[0])
        pod.ready_s = now + pod.startup_s
        pod.cold = start.cold
        self.gpus_used[node] += self.profiles[pod.workload].parallelism.gpus
        self.pods_on[node][pod.id] = pod
        self._pods_changes[node] += 1
        if start.download_bytes > 0 and start.download_s > 0:
            self.pulls.append(_Pull(node, start.download_bytes, now, now + start.download_s, pod.id))
        self.version += 1
        return start

    def delete(self, pod: Pod, now: float) -> None:
        """Remove ``pod``: free its GPUs, cancel its downloads; its node's caches were used until now."""
        pod.deleted_s = now
        if pod.node < 0:
            return
        self.gpus_used[pod.node] -= self.profiles[pod.workload].parallelism.gpus
        del self.pods_on[pod.node][pod.id]
        self._pods_changes[pod.node] += 1
        self.pulls = [p for p in self.pulls if p.owner != pod.id]
        if pod.ready_s <= now:
            self._touch(pod.node, self._ids(pod.workload, pod.node), now)
        self.version += 1

    def ready(self, pod: Pod) -> None:
        """``pod`` became ready at its ``ready_s``: its node keeps the caches it brought."""
        node, w, now = pod.node, pod.workload, pod.ready_s
        p = self.profiles[w]
        record = self.records[node]
        cls = self.classes[int(self.class_index[node])]
        self._keep(node, cache_id("image", p.image.reference), 0, now)
        if caches_weights(p, cls):
            wkey = weights_key(p.name, p.weights.version)
            lacking = p.weights.bytes - min(record.weights.get(wkey, 0), p.weights.bytes)
            if lacking > 0:
                self._keep(node, cache_id("weights", wkey), lacking, now)
            for akey, adapter in zip(adapter_keys(p), p.preloaded_adapters, strict=True):
                if akey not in record.adapters:
                    self._keep(node, cache_id("adapter", akey), adapter.bytes, now)
        key = self._compile_keys[w][int(self.class_index[node])]
        if key is not None and key not in self.records[node].compile_keys:
            if cls.nvme.capacity > 0:
                self._keep(node, cache_id("compile", key), p.compile.artifact_bytes, now)
            if self.compile_registry and key not in self.registry:
                self.registry.add(key)  # every node of the class can now fetch it: refresh them all
                self._touch(node, self._ids(w, node), now)
                self.refresh(np.flatnonzero(self.class_index == self.class_index[node]))
                return
        self._touch(node, self._ids(w, node), now)
        self.refresh([node])

    def _keep(self, node: int, ident: str, size: int, now: float) -> bool:
        """Store the cache ``ident`` of ``size`` NVMe bytes on ``node``, making room first; False: no room."""
        if size > 0 and not self._make_room(node, size, now):
            return False
        record = self.records[node]
        self.records[node] = record.model_copy(update={**with_entries(record, add={ident: size}),
                                                       "nvme_free": record.nvme_free - size})
        return True

    def _ids(self, w: int, node: int) -> frozenset[str]:
        """Cache ids (other than the image) a replica of workload ``w`` uses on ``node`` (memoised per
        workload and class)."""
        c = int(self.class_index[node])
        got = self._replica_ids.get((w, c))
        if got is None:
            got = self._replica_ids[(w, c)] = frozenset(replica_ids(self.profiles[w], self.classes[c]))
        return got

    def _touch(self, node: int, ids: Iterable[str], now: float) -> None:
        """Record a use of the caches ``ids`` that the node holds."""
        record = self.records[node]
        held = nvme_entries(record)
        last_used = dict(record.last_used)
        for i in ids:
            if i in held:
                last_used[i] = now
        self.records[node] = record.model_copy(update={"last_used": last_used})
        self.version += 1

    def in_use(self, node: int) -> set[str]:
        """Cache ids the pods on ``node`` (starting or ready) read."""
        out: set[str] = set()
        for pod in self.pods_on[node].values():
            out.update(self._ids(pod.workload, node))
        return out

    def _pod_usage(self, node: int, workloads: frozenset[int]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """``(in_use, pod_workloads)`` of a planning record: the sorted cache ids that pods of
        ``workloads`` read on ``node`` (:meth:`in_use`) and their workloads' names, sorted (memoised
        per class and set of workloads)."""
        key = (int(self.class_index[node]), workloads)
        got = self._usage.get(key)
        if got is None:
            ids: set[str] = set()
            for w in workloads:
                ids.update(self._ids(w, node))
            got = self._usage[key] = (tuple(sorted(ids)), tuple(sorted({self.profiles[w].name for w in workloads})))
        return got

    def _make_room(self, node: int, need: int, now: float) -> bool:
        """Free ``need`` NVMe bytes above the reserve, evicting idle unused caches LRU first."""
        record = self.records[node]
        reserve = self.classes[int(self.class_index[node])].nvme.reserve
        room = record.nvme_free - reserve
        if need <= room:
            return True
        busy = self.in_use(node)
        idle_after = self.policy.warming.evict_after_idle
        sizes = {ident: size for ident, size in nvme_entries(record).items() if size is not None}
        candidates = sorted((used, ident) for ident, used in record.last_used.items()
                            if ident in sizes and ident not in busy and now - used >= idle_after)
        chosen: list[str] = []
        for _, ident in candidates:
            chosen.append(ident)
            room += sizes[ident]
            if need <= room:
                break
        if need > room:
            return False
        freed = sum(sizes[ident] for ident in chosen)
        self.records[node] = record.model_copy(update={**with_entries(record, remove=chosen),
                                                       "nvme_free": record.nvme_free + freed})
        return True

    # ---- warm actions --------------------------------------------------------------------

    def start_action(self, action: Action, now: float) -> None:
        """Run a planned warm action: a pull on its node until it finishes."""
        node = self.index[action.node]
        done = now + action.duration_s
        if action.bytes > 0 and action.duration_s > 0:
            self.pulls.append(_Pull(node, float(action.bytes), now, done, -1))
        self.in_flight.append((done, action))
        self.version += 1

    def finish_actions(self, now: float) -> int:
        """Apply the warm actions done by ``now`` (in finishing order); returns how many."""
        done = sorted((a for a in self.in_flight if a[0] <= now), key=lambda a: a[0])
        if not done:
            return 0
        self.in_flight = [a for a in self.in_flight if a[0] > now]
        rows: list[int] = []
        for at, action in done:
            node = self.index[action.node]
            self.records[node] = apply(self.records[node], action, now=at)
            rows.append(node)
        self.refresh(rows)
        return len(done)

    def planning_snapshot(self, now: float, policy: Policy | None = None) -> InventorySnapshot:
        """The inventory the warmer plans on: records with free GPUs, pulls and pod usage filled in.

        Made incrementally, equal to :meth:`full_planning_snapshot` (tests/test_sim_snapshot.py): a
        node's planning record is remade only when its record, free GPUs or pulling bytes changed
        since the last call or a pod came or went, and with ``policy`` (the planner's) the
        snapshot is the previous one updated with the remade rows (:meth:`InventorySnapshot.update`,
        which also patches the cache states the planner memoised on it), as long as the planner's
        policy (whose profiles those states were made for), the present nodes and the compile
        registry are the same; otherwise it is built anew. Without ``policy`` it is built anew and
        not kept, so callers that memoise other profiles on it do not disturb the planner's.
        """
        queued = self.queued_bytes(now)
        free = self.gpus_free()
        present = self.present.tobytes()
        kept = self._plan_rows
        if kept is None or kept.present != present:
            kept = self._plan_rows = _PlanRows.empty(present, np.flatnonzero(self.present))
        rows = kept.rows
        sources = np.fromiter(map(id, self.records), dtype=np.uint64, count=len(self.records))[rows]
        gpus_free = free[rows]
        pulling = queued[rows].astype(np.int64)  # int(): towards zero, as astype
        pods = self._pods_changes[rows]
        dirty = np.flatnonzero((sources != kept.sources) | (gpus_free != kept.gpus_free) | (pulling != kept.pulling)
                               | (pods != kept.pods))
        for j in dirty.tolist():
            i = int(rows[j])
            r = self.records[i]
            in_use, names = self._pod_usage(i, frozenset(p.workload for p in self.pods_on[i].values()))
            record = r.model_copy(update={"gpus_free": int(gpus_free[j]), "pulling_bytes": int(pulling[j]),
                                          "in_use": in_use, "pod_workloads": names})
            kept.records[j], kept.held[j] = record, r
        kept.sources, kept.gpus_free, kept.pulling, kept.pods = sources, gpus_free, pulling, pods
        records = kept.records
        if policy is None:
            return self.snapshot_of(records)
        registry = frozenset(self.registry)
        last = self._plan_snap
        if last is not None and last[0] is policy and last[1] == present and last[2] == registry:
            snap = last[3]
            changed = {new.name: new for new, old in zip(records, snap.nodes, strict=True) if new is not old}
            if changed:
                snap = snap.update(policy, changed, version=snap.version, taken_at=snap.taken_at)
        else:
            snap = self.snapshot_of(records)
        self._plan_snap = (policy, present, registry, snap)
        return snap

    def full_planning_snapshot(self, now: float) -> InventorySnapshot:
        """:meth:`planning_snapshot` made from scratch: every record copied, every state computed
        (the reference the incremental one is tested against)."""
        queued = self.queued_bytes(now)
        free = self.gpus_free()
        records = []
        for i, r in enumerate(self.records):
            if not self.present[i]:
                continue
            pods = self.pods_on[i].values()
            cls = self.classes[int(self.class_index[i])]
            in_use: set[str] = set()
            for p in pods:
                in_use |= replica_ids(self.profiles[p.workload], cls)
            records.append(r.model_copy(update={
                "gpus_free": int(free[i]), "pulling_bytes": int(queued[i]),
                "in_use": tuple(sorted(in_use)),
                "pod_workloads": tuple(sorted({self.profiles[p.workload].name for p in pods})),
            }))
        return self.snapshot_of(records)

    def set_profile(self, w: int, profile: Profile) -> None:
        """Workload ``w`` now runs ``profile`` (a rollout): its cache columns are re-derived, so caches
        of the old weights version (weights and process snapshots, both named by it) or image no
        longer count."""
        profiles = list(self.profiles)
        profiles[w] = profile
        self.profiles = tuple(profiles)
        state, table = self.snapshot_of(self.records).cache_state(profile)
        self._columns[w] = state.take(slice(0, len(self.records)))
        self._tables[w] = table
        self._compile_keys[w] = [compile_key(profile, c) for c in self.classes]
        self._replica_ids.clear()
        self._usage.clear()
        self._plan_rows = None
        self._plan_snap = None
        self.version += 1

    # ---- node autoscaling ----------------------------------------------------------------

    def join(self, node: int) -> None:
        """A provisioned node becomes Ready: empty and cold (no image, weights or compile cache)."""
        self.present[node] = True
        self.gpus[node] = self.class_gpus[node]
        self.records[node] = self._bare[node]
        self.refresh([node])

    def remove(self, node: int) -> None:
        """An empty node is deleted: its GPUs and caches go with it (its warm actions are cancelled)."""
        assert not self.pods_on[node], "only empty nodes are removed"
        name = self.records[node].name
        self.present[node] = False
        self.gpus[node] = 0
        self.records[node] = self._bare[node]
        self.in_flight = [(t, a) for t, a in self.in_flight if a.node != name]
        self.pulls = [p for p in self.pulls if p.node != node]
        self.refresh([node])

    def pod_changes(self, node: int) -> int:
        """How many times a pod was placed on ``node`` or left it (a count that only grows)."""
        return int(self._pods_changes[node])

    def warming(self, node: int) -> bool:
        """A warm action is running on ``node``."""
        name = self.records[node].name
        return any(a.node == name for _, a in self.in_flight)

    def in_flight_actions(self) -> list[Action]:
        """Warm actions started and not finished."""
        return [a for _, a in self.in_flight]

    # ---- derived columns -----------------------------------------------------------------

    def refresh(self, rows: Iterable[int] | NDArray[np.intp]) -> None:
        """Re-derive the estimator's columns of ``rows`` from their records (the inventory's own code)."""
        idx = sorted({int(r) for r in rows})
        if not idx:
            return
        snap = self.snapshot_of([self.records[i] for i in idx])
        for w, p in enumerate(self.profiles):
            state = snap.rows_state(p)
            col = self._columns[w]
            for name in _CACHE_COLUMNS:
                getattr(col, name)[idx] = getattr(state, name)[:-1]
        self.version += 1


#: The columns of a :class:`CacheState` that follow the records (queued bytes follow the pulls).
_CACHE_COLUMNS = tuple(f.name for f in fields(CacheState) if f.name != "queued_bytes")
