"""Startup-time estimator: seconds until a pod of a profile is ready on each node, phase by phase.

One call estimates any number of nodes at once (numpy arrays, no Python loop over nodes): the
extender scores thousands of candidates per request with it, the scaler takes its look-ahead from
it and the simulator times every pod start with it.

The model (README.md, "Startup-time estimate"). For a pod of profile *w* on node *n* of class *c*, in seconds::

    T          = T_queue + T_image + T_weights + T_compile + T_graph + T_init + T_adapters
    T_image    = 0 if the image is on n, else image_bytes / image_pull_bps(c)
    T_weights  = local_bytes / local_bps + remote_bytes / remote_bps
    remote_bps = min(nic_bps(c), streams(w) * stream_bps(w, c))
    streams    = min(shard_files(w), loader_concurrency(w))   one serial stream per file
    local_bps  = max(nvme_read_bps(c), remote_bps)             a cache slower than the network is
                                                               not read (a loader would stream)
    T_compile  = warm_s                                         key cached on n
               = fetch_s = artifact_bytes / min(nic_bps, stream_bps) + warm_s
                                                               key in the registry (one stream),
                                                               when fetching beats compiling
               = cold_s                                        otherwise
    T_graph, T_init: per-profile constants, per-class overrides
    T_adapters = sum over the preloaded LoRA adapters a of
                   a.bytes / local_bps_a (on n) or a.bytes / min(nic_bps, stream_bps) (fetched, one
                   stream each), + load_s           local_bps_a = max(nvme_read_bps, that stream)
    T_queue    = queued_bytes / nic_bps(c)                     bytes other pulls already have
                                                               in flight to n; paid only when
                                                               this pod downloads anything itself
                                                               (image, weights or an adapter)

The registry fetch is chosen when ``extra_queue + fetch_s < cold_s``, where ``extra_queue`` is the
queue wait the fetch alone would add (zero when the pod downloads its image or weights anyway): a
small archive stuck behind 100 GB of other pulls is slower than compiling.

Snapshot path, when the profile has a snapshot and node n holds one for it::

    T_snap = T_queue' + T_image + snapshot_bytes / nvme_read_bps(c) + restore_s + T_adapters
    T      = min(T, T_snap)   (the restore replaces weights, compile, graph capture and init)

where ``T_queue'`` counts only when the restore path downloads anything: the image, or a preloaded
adapter missing from n (it reads no weights and no compile cache). Adapters are loaded after a
restore as after a normal start (a snapshot is of the base model; tenants' adapters change more
often), so ``T_adapters`` is added to both paths. Taking the minimum encodes that a node
operator would not restore a snapshot that is slower than a normal start; it also makes the
estimate monotone: more cache never makes a start slower (a property test holds us to it).

Units: bytes, bytes per second, seconds. Every phase is finite and non-negative for a valid policy
(bandwidths are validated at least 0.001 bytes/s, sizes at most 2^60 bytes).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from enum import IntEnum

import numpy as np
from numpy.typing import NDArray

from extender.core.errors import InvalidValueError
from extender.core.policy import NodeClass, PhaseOverride, Policy, Profile

F64 = NDArray[np.float64]

#: Phase columns, in the order a pod goes through them.
PHASES = ("queue_s", "image_s", "weights_s", "compile_s", "graph_s", "init_s", "restore_s", "adapters_s")


class CompileCache(IntEnum):
    """Where the compile artifacts for the pod's cache key are."""

    ABSENT = 0
    REGISTRY = 1
    LOCAL = 2


@dataclass(frozen=True)
class CacheState:
    """Cache state of n nodes for one profile; every field is an array of length n.

    ``adapters`` is n x A: column j says whether the profile's j-th preloaded LoRA adapter is on
    the node (A = 0 for a profile without adapters).
    """

    image: NDArray[np.bool_]
    weights_bytes: F64
    compile: NDArray[np.int8]
    snapshot: NDArray[np.bool_]
    queued_bytes: F64
    adapters: NDArray[np.bool_]

    @classmethod
    def uniform(
        cls,
        n: int,
        *,
        image: bool = False,
        weights_bytes: float = 0.0,
        compile: CompileCache = CompileCache.ABSENT,
        snapshot: bool = False,
        queued_bytes: float = 0.0,
        adapters: int = 0,
        adapters_present: bool = False,
    ) -> CacheState:
        """n nodes in the same state (a cold cluster by default), ``adapters`` adapter columns."""
        return cls(
            image=np.full(n, image, dtype=np.bool_),
            weights_bytes=np.full(n, weights_bytes, dtype=np.float64),
            compile=np.full(n, int(compile), dtype=np.int8),
            snapshot=np.full(n, snapshot, dtype=np.bool_),
            queued_bytes=np.full(n, queued_bytes, dtype=np.float64),
            adapters=np.full((n, adapters), adapters_present, dtype=np.bool_),
        )

    def __len__(self) -> int:
        return len(self.image)

    def take(self, rows: NDArray[np.intp] | slice) -> CacheState:
        """Writable copies of some rows (the planner and the simulator mark caches on them)."""
        return CacheState(*(np.array(getattr(self, f.name)[rows]) for f in fields(self)))

    def cold_where(self, stale: NDArray[np.bool_]) -> CacheState:
        """The state with every cache absent on the ``stale`` rows (queued bytes are kept)."""
        keep = ~stale
        return replace(
            self,
            image=self.image & keep,
            weights_bytes=np.where(keep, self.weights_bytes, 0.0),
            compile=np.where(keep, self.compile, np.int8(CompileCache.ABSENT)).astype(np.int8),
            snapshot=self.snapshot & keep,
            adapters=self.adapters & keep[:, None],
        )

    def with_queue(self, queued_bytes: F64) -> CacheState:
        """The same caches with other pulls' bytes replaced."""
        return replace(self, queued_bytes=queued_bytes)


#: The compile states as array scalars (reading an enum member costs more than the comparison).
_LOCAL = np.int8(CompileCache.LOCAL)
_REGISTRY = np.int8(CompileCache.REGISTRY)


@dataclass(frozen=True)
class ClassTable:
    """Per-class parameters for one profile (arrays indexed by class position)."""

    nvme_bps: F64
    nic_bps: F64
    stream_bps: F64
    pull_bps: F64
    compile_cold_s: F64
    compile_warm_s: F64
    graph_s: F64
    init_s: F64
    restore_s: F64

    @classmethod
    def build(cls, profile: Profile, classes: Sequence[NodeClass]) -> ClassTable:
        """Resolve profile values, per-class overrides and class bandwidths into arrays."""
        snapshot_restore = profile.snapshot.restore if profile.snapshot else 0.0
        rows: list[dict[str, float]] = []
        for c in classes:
            o = profile.overrides.get(c.name) or PhaseOverride()

            def pick(override: float | None, default: float) -> float:
                return default if override is None else override

            cold = pick(o.compile_cold, profile.compile.cold)
            rows.append({
                "nvme_bps": pick(o.nvme_read, c.nvme.read_bandwidth),
                "nic_bps": c.network.nic,
                "stream_bps": pick(o.stream_bandwidth, profile.weights.stream_bandwidth
                                   or c.network.object_store_per_stream),
                "pull_bps": pick(o.image_pull, c.network.image_pull),
                "compile_cold_s": cold,
                # a cache hit is never slower than compiling
                "compile_warm_s": min(pick(o.compile_warm, profile.compile.warm), cold),
                "graph_s": pick(o.graph_capture, profile.graph_capture),
                "init_s": pick(o.engine_init, profile.engine_init),
                "restore_s": pick(o.snapshot_restore, snapshot_restore),
            })
        return cls(**{f.name: np.array([r[f.name] for r in rows], dtype=np.float64) for f in fields(cls)})

    @functools.cached_property
    def stacked(self) -> F64:
        """Every column as one (columns x classes) array, in field order (one gather serves all)."""
        return np.stack([getattr(self, f.name) for f in fields(self)])


@dataclass(frozen=True)
class Estimate:
    """Per-node seconds for each phase and in total (arrays of length n)."""

    queue_s: F64
    image_s: F64
    weights_s: F64
    compile_s: F64
    graph_s: F64
    init_s: F64
    restore_s: F64
    adapters_s: F64
    total_s: F64

    def __len__(self) -> int:
        return len(self.total_s)

    def row(self, i: int) -> dict[str, float]:
        """Phases and total of node ``i`` as plain floats."""
        return {f.name: float(getattr(self, f.name)[i]) for f in fields(self)}

    def scaled(self, factor: F64) -> Estimate:
        """Every phase and the total of node i multiplied by ``factor[i]`` (per-node calibration:
        :mod:`extender.core.calibration`, "Per-node factors"), so the phases still add up."""
        return Estimate(*(np.asarray(getattr(self, f.name) * factor, dtype=np.float64) for f in fields(self)))


def estimate(
    profile: Profile,
    classes: Sequence[NodeClass],
    class_index: NDArray[np.intp],
    state: CacheState,
    table: ClassTable | None = None,
) -> Estimate:
    """Estimate the startup of ``profile`` on n nodes.

    ``classes`` lists the node classes; ``class_index[i]`` is the position in it of node i's class.
    ``table`` may be passed in when the same (profile, classes) is estimated repeatedly.
    """
    t = table if table is not None else ClassTable.build(profile, classes)
    idx = np.asarray(class_index, dtype=np.intp)
    # the table's columns gathered at once, rows in ClassTable's field order
    nvme, nic, stream, pull, cold, warm, graph_s, init_s, class_restore = t.stacked[:, idx]

    image_bytes = float(profile.image.size)
    image_s = np.where(state.image, 0.0, image_bytes / pull)

    total_bytes = float(profile.weights.bytes)
    local = np.clip(state.weights_bytes, 0.0, total_bytes)
    remote = total_bytes - local
    remote_bps = np.minimum(nic, profile.weights.streams * stream)
    local_bps = np.maximum(nvme, remote_bps)
    weights_s = local / local_bps + remote / remote_bps

    adapters_s, adapters_fetched = _adapters(profile, state.adapters, nvme, nic, stream)

    waiting_s = np.maximum(state.queued_bytes, 0.0) / nic
    downloads = ~state.image | (remote > 0) | adapters_fetched
    fetch_s = float(profile.compile.artifact_bytes) / np.minimum(nic, stream) + warm
    extra_queue_s = np.where(downloads, 0.0, waiting_s)
    use_fetch = (state.compile == _REGISTRY) & (extra_queue_s + fetch_s < cold)
    # np.select([local, use_fetch], [warm, fetch_s], default=cold), without its per-call overhead
    compile_s = np.where(state.compile == _LOCAL, warm, np.where(use_fetch, fetch_s, cold))

    queue_s = np.where(downloads | use_fetch, waiting_s, 0.0)
    restore_s = np.zeros(len(idx))
    total_s = queue_s + image_s + weights_s + compile_s + graph_s + init_s + adapters_s

    if profile.snapshot is not None:
        snap_restore = float(profile.snapshot.bytes) / nvme + class_restore
        snap_queue = np.where(state.image & ~adapters_fetched, 0.0, waiting_s)
        snap_total = snap_queue + image_s + snap_restore + adapters_s
        use = state.snapshot & (snap_total < total_s)
        zero = np.zeros(len(idx))
        queue_s = np.where(use, snap_queue, queue_s)
        weights_s = np.where(use, zero, weights_s)
        compile_s = np.where(use, zero, compile_s)
        graph_s = np.where(use, zero, graph_s)
        init_s = np.where(use, zero, init_s)
        restore_s = np.where(use, snap_restore, zero)
        total_s = np.where(use, snap_total, total_s)

    return Estimate(queue_s, image_s, weights_s, compile_s, graph_s, init_s, restore_s, adapters_s, total_s)


def _adapters(
    profile: Profile, present: NDArray[np.bool_], nvme: F64, nic: F64, stream: F64
) -> tuple[F64, NDArray[np.bool_]]:
    """``T_adapters`` per node, and whether the node fetches any adapter (module docstring)."""
    preloaded = profile.preloaded_adapters
    n = len(nvme)
    if not preloaded:
        return np.zeros(n), np.zeros(n, dtype=np.bool_)
    sizes = np.array([a.bytes for a in preloaded], dtype=np.float64)
    remote_bps = np.minimum(nic, stream)
    local_bytes = present.astype(np.float64) @ sizes
    remote_bytes = float(sizes.sum()) - local_bytes
    assert profile.lora is not None  # preloaded adapters come from the lora section
    seconds = local_bytes / np.maximum(nvme, remote_bps) + remote_bytes / remote_bps + profile.lora.load * len(sizes)
    fetched = np.asarray(~present.all(axis=1), dtype=np.bool_)
    return seconds, fetched


def cold_by_class(profile: Profile, classes: Sequence[NodeClass]) -> Estimate:
    """The profile's fully cold start on one node of each class, in class order."""
    n = len(classes)
    cold = CacheState.uniform(n, adapters=len(profile.preloaded_adapters))
    return estimate(profile, classes, np.arange(n, dtype=np.intp), cold)


@dataclass(frozen=True)
class NamedState:
    """A whole-node cache state by name: which caches the node holds for the profile."""

    image: bool = False
    weights: bool = False
    compile: CompileCache = CompileCache.ABSENT
    snapshot: bool = False
    adapters: bool = False


#: Named cache states shown by ``extender estimate``: what a node holds, from nothing to everything.
STATES: dict[str, NamedState] = {
    "cold": NamedState(),
    "image": NamedState(image=True),
    "image+weights": NamedState(image=True, weights=True),
    "warm": NamedState(image=True, weights=True, compile=CompileCache.LOCAL, adapters=True),
    "snapshot": NamedState(image=True, weights=True, compile=CompileCache.LOCAL, snapshot=True, adapters=True),
}


def breakdown(profile: Profile, node_class: NodeClass) -> dict[str, dict[str, float]]:
    """Phase table of ``profile`` on one node class for each named state in :data:`STATES`.

    The ``snapshot`` row appears only when the profile has a snapshot.
    """
    named = {k: v for k, v in STATES.items() if not v.snapshot or profile.snapshot is not None}
    rows = list(named.values())
    state = CacheState(
        image=np.array([r.image for r in rows], dtype=np.bool_),
        weights_bytes=np.array([profile.weights.bytes if r.weights else 0 for r in rows], dtype=np.float64),
        compile=np.array([int(r.compile) for r in rows], dtype=np.int8),
        snapshot=np.array([r.snapshot for r in rows], dtype=np.bool_),
        queued_bytes=np.zeros(len(rows)),
        adapters=np.array([[r.adapters] * len(profile.preloaded_adapters) for r in rows],
                          dtype=np.bool_).reshape(len(rows), len(profile.preloaded_adapters)),
    )
    est = estimate(profile, [node_class], np.zeros(len(rows), dtype=np.intp), state)
    return {name: est.row(i) for i, name in enumerate(named)}


def estimate_pairs(policy: Policy, workload: str | None, node_class: str | None) -> list[tuple[str, str]]:
    """The ``(workload, node class)`` pairs ``extender estimate`` shows: every class each profile runs on,
    narrowed to ``workload`` and ``node_class`` when given.

    An unknown name raises :class:`UnknownNameError`; names that are known but make no pair (the
    workload does not run on that class) raise :class:`InvalidValueError` saying where it does run,
    rather than an empty table that reads as an empty policy.
    """
    profiles = [policy.profile(workload)] if workload else list(policy.profiles)
    if node_class:
        policy.node_class(node_class)  # unknown name -> clear error
    pairs = [(p.name, c.name) for p in profiles for c in policy.classes_for(p) if node_class in (None, c.name)]
    if pairs or not profiles:
        return pairs
    if workload:
        runs_on = ", ".join(c.name for c in policy.classes_for(profiles[0]))
        raise InvalidValueError(f"workload {workload!r} does not run on node class {node_class!r} "
                                f"(it runs on {runs_on})")
    raise InvalidValueError(f"no workload runs on node class {node_class!r} (every profile's nodeClasses leave it out)")
