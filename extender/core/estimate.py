"""Startup-time estimator: seconds until a pod of a profile is ready on each node, phase by phase.

One call estimates any number of nodes at once (numpy arrays, no Python loop over nodes): the
extender scores thousands of candidates per request with it, the scaler takes its look-ahead from
it and the simulator times every pod start with it.

The model (README.md, "Startup-time estimate"). For a pod of profile *w* on node *n* of class *c*, in seconds::

    T          = T_queue + T_image + T_weights + T_compile + T_graph + T_init
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
    T_queue    = queued_bytes / nic_bps(c)                     bytes other pulls already have
                                                               in flight to n; paid only when
                                                               this pod downloads anything itself

The registry fetch is chosen when ``extra_queue + fetch_s < cold_s``, where ``extra_queue`` is the
queue wait the fetch alone would add (zero when the pod downloads its image or weights anyway): a
small archive stuck behind 100 GB of other pulls is slower than compiling.

Snapshot path, when the profile has a snapshot and node n holds one for it::

    T_snap = T_queue' + T_image + snapshot_bytes / nvme_read_bps(c) + restore_s
    T      = min(T, T_snap)   (the restore replaces weights, compile, graph capture and init)

where ``T_queue'`` counts only when the image is missing. Taking the minimum encodes that a node
operator would not restore a snapshot that is slower than a normal start; it also makes the
estimate monotone: more cache never makes a start slower (a property test holds us to it).

Units: bytes, bytes per second, seconds. Every phase is finite and non-negative for a valid policy
(bandwidths are validated > 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from enum import IntEnum

import numpy as np
from numpy.typing import NDArray

from extender.core.policy import NodeClass, Profile

F64 = NDArray[np.float64]

#: Phase columns, in the order a pod goes through them.
PHASES = ("queue_s", "image_s", "weights_s", "compile_s", "graph_s", "init_s", "restore_s")


class CompileCache(IntEnum):
    """Where the compile artifacts for the pod's cache key are."""

    ABSENT = 0
    REGISTRY = 1
    LOCAL = 2


@dataclass(frozen=True)
class CacheState:
    """Cache state of n nodes for one profile; every field is an array of length n."""

    image: NDArray[np.bool_]
    weights_bytes: F64
    compile: NDArray[np.int8]
    snapshot: NDArray[np.bool_]
    queued_bytes: F64

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
    ) -> CacheState:
        """n nodes in the same state (a cold cluster by default)."""
        return cls(
            image=np.full(n, image, dtype=np.bool_),
            weights_bytes=np.full(n, weights_bytes, dtype=np.float64),
            compile=np.full(n, int(compile), dtype=np.int8),
            snapshot=np.full(n, snapshot, dtype=np.bool_),
            queued_bytes=np.full(n, queued_bytes, dtype=np.float64),
        )

    def __len__(self) -> int:
        return len(self.image)


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
        rows = []
        for c in classes:
            o = profile.overrides.get(c.name)
            cold = o.compile_cold if o and o.compile_cold is not None else profile.compile.cold
            warm = o.compile_warm if o and o.compile_warm is not None else profile.compile.warm
            snapshot_restore = profile.snapshot.restore if profile.snapshot else 0.0
            stream = profile.weights.stream_bandwidth or c.network.object_store_per_stream
            rows.append((
                o.nvme_read if o and o.nvme_read is not None else c.nvme.read_bandwidth,
                c.network.nic,
                o.stream_bandwidth if o and o.stream_bandwidth is not None else stream,
                o.image_pull if o and o.image_pull is not None else c.network.image_pull,
                cold,
                min(warm, cold),  # a cache hit is never slower than compiling
                o.graph_capture if o and o.graph_capture is not None else profile.graph_capture,
                o.engine_init if o and o.engine_init is not None else profile.engine_init,
                o.snapshot_restore if o and o.snapshot_restore is not None else snapshot_restore,
            ))
        cols = np.array(rows, dtype=np.float64).reshape(len(rows), len(fields(cls)))
        return cls(*(cols[:, i].copy() for i in range(cols.shape[1])))


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
    total_s: F64

    def __len__(self) -> int:
        return len(self.total_s)

    def row(self, i: int) -> dict[str, float]:
        """Phases and total of node ``i`` as plain floats."""
        return {f.name: float(getattr(self, f.name)[i]) for f in fields(self)}


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
    nvme, nic, stream, pull = t.nvme_bps[idx], t.nic_bps[idx], t.stream_bps[idx], t.pull_bps[idx]

    image_bytes = float(profile.image.size)
    image_s = np.where(state.image, 0.0, image_bytes / pull)

    total_bytes = float(profile.weights.bytes)
    local = np.clip(state.weights_bytes, 0.0, total_bytes)
    remote = total_bytes - local
    remote_bps = np.minimum(nic, profile.weights.streams * stream)
    local_bps = np.maximum(nvme, remote_bps)
    weights_s = local / local_bps + remote / remote_bps

    cold, warm = t.compile_cold_s[idx], t.compile_warm_s[idx]
    waiting_s = np.maximum(state.queued_bytes, 0.0) / nic
    downloads = ~state.image | (remote > 0)
    fetch_s = float(profile.compile.artifact_bytes) / np.minimum(nic, stream) + warm
    extra_queue_s = np.where(downloads, 0.0, waiting_s)
    use_fetch = (state.compile == CompileCache.REGISTRY) & (extra_queue_s + fetch_s < cold)
    compile_s = np.select([state.compile == CompileCache.LOCAL, use_fetch], [warm, fetch_s], default=cold)

    graph_s, init_s = t.graph_s[idx], t.init_s[idx]
    queue_s = np.where(downloads | use_fetch, waiting_s, 0.0)
    restore_s = np.zeros(len(idx))
    total_s = queue_s + image_s + weights_s + compile_s + graph_s + init_s

    if profile.snapshot is not None:
        snap_restore = float(profile.snapshot.bytes) / nvme + t.restore_s[idx]
        snap_queue = np.where(state.image, 0.0, np.maximum(state.queued_bytes, 0.0) / nic)
        snap_total = snap_queue + image_s + snap_restore
        use = state.snapshot & (snap_total < total_s)
        zero = np.zeros(len(idx))
        queue_s = np.where(use, snap_queue, queue_s)
        weights_s = np.where(use, zero, weights_s)
        compile_s = np.where(use, zero, compile_s)
        graph_s = np.where(use, zero, graph_s)
        init_s = np.where(use, zero, init_s)
        restore_s = np.where(use, snap_restore, zero)
        total_s = np.where(use, snap_total, total_s)

    return Estimate(queue_s, image_s, weights_s, compile_s, graph_s, init_s, restore_s, total_s)


@dataclass(frozen=True)
class NamedState:
    """A whole-node cache state by name: which caches the node holds for the profile."""

    image: bool = False
    weights: bool = False
    compile: CompileCache = CompileCache.ABSENT
    snapshot: bool = False


#: Named cache states shown by ``extender estimate``: what a node holds, from nothing to everything.
STATES: dict[str, NamedState] = {
    "cold": NamedState(),
    "image": NamedState(image=True),
    "image+weights": NamedState(image=True, weights=True),
    "warm": NamedState(image=True, weights=True, compile=CompileCache.LOCAL),
    "snapshot": NamedState(image=True, weights=True, compile=CompileCache.LOCAL, snapshot=True),
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
    )
    est = estimate(profile, [node_class], np.zeros(len(rows), dtype=np.intp), state)
    return {name: est.row(i) for i, name in enumerate(named)}
