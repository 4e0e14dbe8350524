"""The kinds of cache a node holds for a workload, and every fact derived from them, in one place.

A kind is one row of :data:`KINDS`:

=========  ====================  ======================  ========  ==================================
kind       name on a node        inventory field         on NVMe   cache-root directory (layout)
=========  ====================  ======================  ========  ==================================
image      image reference       ``images``              no        none: the runtime's image store
weights    ``<workload>/<ver>``  ``weights`` (bytes)     yes       ``weights/<workload>/<version>/``
compile    compile-cache key     ``compile_keys``        yes       ``compile/<key>/``
snapshot   ``<workload>/<ver>``  ``snapshots``           yes       ``snapshots/<workload>/<version>/``
adapter    ``<workload>/<name>`` ``adapters``            yes       ``adapters/<workload>/<adapter>/``
=========  ====================  ======================  ========  ==================================

A cache entry's identity everywhere (``NodeState.last_used``, ``in_use``, ``cache_bytes``, warm
actions, evictions) is its *cache id* ``<kind>:<name>`` (:func:`cache_id`). Weights record the
bytes present (a partial download counts); the other NVMe kinds are present or not, and their
sizes are in ``NodeState.cache_bytes`` (the policy's declared size where missing).

The per-kind behaviour of the estimator (extender.core.estimate), the warm planner
(extender.core.warming), the agent's scan, the warmer's steps and templates and the simulator is
written as ``match kind`` statements that end in :func:`typing.assert_never`, so adding a kind to
:data:`CacheKind` is a type error until every one of them handles it (mypy proves it;
tests/test_caches.py drives every kind through each of them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, assert_never, get_args

import numpy as np
from numpy.typing import NDArray

from extender.core.cachekey import compile_cache_key_of, key_material
from extender.core.errors import InvalidValueError, UnknownNameError
from extender.core.policy import UNKNOWN_CLASS, NodeClass, Policy, Profile

if TYPE_CHECKING:
    from extender.core.inventory import NodeState

#: The kinds of cache a node holds for a workload (and the kinds of warm action).
CacheKind = Literal["image", "weights", "compile", "snapshot", "adapter"]


@dataclass(frozen=True)
class KindSpec:
    """What one kind of cache is, as data (the table in the module docstring)."""

    kind: CacheKind
    #: The ``NodeState`` (and ``AgentReport``) field listing the node's entries of this kind.
    field: str
    #: The field maps name -> bytes present (weights); otherwise it is a tuple of names.
    sized: bool
    #: Lives in the node's cache root on NVMe: counted against room, evictable, has a directory.
    on_nvme: bool
    #: Top directory under the cache root, and the name's parts as directory levels below it.
    directory: str | None
    parts: tuple[str, ...]


#: Every kind, in the warm planner's tie-break order.
KINDS: tuple[KindSpec, ...] = (
    KindSpec("image", "images", sized=False, on_nvme=False, directory=None, parts=("reference",)),
    KindSpec("weights", "weights", sized=True, on_nvme=True, directory="weights", parts=("workload", "version")),
    KindSpec("compile", "compile_keys", sized=False, on_nvme=True, directory="compile", parts=("key",)),
    KindSpec("snapshot", "snapshots", sized=False, on_nvme=True, directory="snapshots", parts=("workload", "version")),
    KindSpec("adapter", "adapters", sized=False, on_nvme=True, directory="adapters", parts=("workload", "adapter")),
)
SPECS: Mapping[CacheKind, KindSpec] = MappingProxyType({s.kind: s for s in KINDS})
#: Kinds whose entries live in the cache root (everything but images).
NVME_KINDS: tuple[KindSpec, ...] = tuple(s for s in KINDS if s.on_nvme)


def cache_id(kind: CacheKind, name: str) -> str:
    """Identity of one cache entry on a node: ``<kind>:<name>``."""
    return f"{kind}:{name}"


def parse_cache_id(text: str) -> tuple[CacheKind, str]:
    """``(kind, name)`` of a cache id; raises :class:`InvalidValueError` or :class:`UnknownNameError`."""
    kind, sep, name = text.partition(":")
    if not sep or not name:
        raise InvalidValueError(f"{text!r} is not a cache id (kind:name)")
    for s in KINDS:
        if s.kind == kind:
            return s.kind, name
    raise UnknownNameError(f"{text!r}: unknown cache kind {kind!r} ({', '.join(get_args(CacheKind))})")


def split_name(kind: CacheKind, name: str) -> tuple[str, ...]:
    """The parts of a name (``weights``: workload and version), as many as the kind has."""
    parts = tuple(name.split("/", len(SPECS[kind].parts) - 1))
    if len(parts) != len(SPECS[kind].parts) or not all(parts):
        raise InvalidValueError(f"{cache_id(kind, name)!r}: {kind} names are {'/'.join(SPECS[kind].parts)}")
    return parts


def weights_key(workload: str, version: str) -> str:
    """Name of a profile's weights on a node: ``<workload>/<version>``."""
    return f"{workload}/{version}"


def snapshot_key(profile: Profile) -> str:
    """Name of a profile's process snapshot on a node: ``<workload>/<weights version>``.

    A snapshot holds the loaded model, so one taken before a rollout to new weights is not a
    snapshot of the new version: naming it by the version makes it stop counting, as old weights do.
    """
    return f"{profile.name}/{profile.weights.version}"


def adapter_key(workload: str, adapter: str) -> str:
    """Name of one LoRA adapter of a workload on a node: ``<workload>/<adapter>``."""
    return f"{workload}/{adapter}"


# ---- facts about a (profile, node class) pair -------------------------------------------------------


#: :func:`compile_key` by the identity of its (frozen) arguments: ``(id(profile), id(class))`` ->
#: ``(profile, class, key)``. Holding the objects keeps their ids from being reused while they are
#: listed; the whole memo is dropped when it reaches :data:`_KEY_MEMO_SIZE` entries.
_KEY_MEMO: dict[tuple[int, int], tuple[Profile, NodeClass, str | None]] = {}
_KEY_MEMO_SIZE = 4096


def compile_key(profile: Profile, node_class: NodeClass) -> str | None:
    """The profile's compile-cache key on a class; ``None`` without key inputs or on the unknown class.

    The key hashes the GPU product, so a node whose class the policy does not know has no key.
    Memoised by the arguments' identity (both are frozen models, so the same objects always give
    the same key): the simulator and the planner ask for the same few pairs many times a tick, and
    each key is a SHA-256 over canonical JSON.
    """
    slot = (id(profile), id(node_class))
    got = _KEY_MEMO.get(slot)
    if got is not None and got[0] is profile and got[1] is node_class:
        return got[2]
    material = compile_key_material(profile, node_class)
    key = None if material is None else compile_cache_key_of(material)
    if len(_KEY_MEMO) >= _KEY_MEMO_SIZE:
        _KEY_MEMO.clear()
    _KEY_MEMO[slot] = (profile, node_class, key)
    return key


def compile_key_material(profile: Profile, node_class: NodeClass) -> dict[str, object] | None:
    """The document :func:`compile_key` hashes (``extender cachekey -v`` prints it), or ``None``."""
    if profile.compile.key is None or node_class.name == UNKNOWN_CLASS.name:
        return None
    return key_material(profile.compile.key, gpu_product=node_class.gpu.product,
                        tensor_parallel=profile.parallelism.tensor, pipeline_parallel=profile.parallelism.pipeline)


def caches_weights(profile: Profile, node_class: NodeClass) -> bool:
    """Does a node of this class keep the profile's weights (and adapters) on NVMe?"""
    return profile.weights.cached and node_class.nvme.capacity > 0


def keeps_weights(profile: Profile, classes: Sequence[NodeClass], class_index: NDArray[np.intp]) -> NDArray[np.bool_]:
    """Per node (``class_index`` into ``classes``): does its class keep the profile's weights on NVMe
    (:func:`caches_weights`)? One call per class, then a gather."""
    out: NDArray[np.bool_] = np.array([caches_weights(profile, c) for c in classes], dtype=np.bool_)[class_index]
    return out


def adapter_keys(profile: Profile) -> tuple[str, ...]:
    """Names on a node of the adapters a replica loads at start (``lora.preloaded``), in policy order."""
    return tuple(adapter_key(profile.name, a.name) for a in profile.preloaded_adapters)


def replica_ids(profile: Profile, node_class: NodeClass) -> set[str]:
    """Cache ids in the cache root that a replica of ``profile`` on ``node_class`` reads."""
    ids = {cache_id("weights", weights_key(profile.name, profile.weights.version)),
           cache_id("snapshot", snapshot_key(profile)), *(cache_id("adapter", k) for k in adapter_keys(profile))}
    key = compile_key(profile, node_class)
    if key is not None:
        ids.add(cache_id("compile", key))
    return ids


def warm_entries(profile: Profile, node_class: NodeClass, kind: CacheKind) -> dict[str, int]:
    """The entries of one kind a fully warm node of ``node_class`` holds for ``profile``: cache id -> bytes.

    Empty where the kind does not apply: no weights or adapters on a class that does not cache
    them, no compile entry without a key, no snapshot for a profile without one.
    """
    match kind:
        case "image":
            return {cache_id("image", profile.image.reference): 0}
        case "weights":
            if not caches_weights(profile, node_class):
                return {}
            return {cache_id("weights", weights_key(profile.name, profile.weights.version)): profile.weights.bytes}
        case "compile":
            key = compile_key(profile, node_class)
            return {} if key is None else {cache_id("compile", key): profile.compile.artifact_bytes}
        case "snapshot":
            if profile.snapshot is None:
                return {}
            return {cache_id("snapshot", snapshot_key(profile)): profile.snapshot.bytes}
        case "adapter":
            if not caches_weights(profile, node_class):
                return {}
            return {cache_id("adapter", k): a.bytes
                    for k, a in zip(adapter_keys(profile), profile.preloaded_adapters, strict=True)}
        case _:
            assert_never(kind)


def declared_sizes(policy: Policy, node_class: NodeClass) -> dict[str, int]:
    """Sizes the policy declares for the unsized NVMe kinds, by cache id, on one class."""
    sizes: dict[str, int] = {}
    for p in policy.profiles:
        key = compile_key(p, node_class)
        if key is not None:
            sizes[cache_id("compile", key)] = p.compile.artifact_bytes
        if p.snapshot is not None:
            sizes[cache_id("snapshot", snapshot_key(p))] = p.snapshot.bytes
        for a in p.adapters:
            sizes[cache_id("adapter", adapter_key(p.name, a.name))] = a.bytes
    return sizes


# ---- facts about a node record ----------------------------------------------------------------------


def held(record: NodeState, spec: KindSpec) -> Iterable[str]:
    """Names of the entries of one kind on a record."""
    value: Mapping[str, int] | tuple[str, ...] = getattr(record, spec.field)
    return value.keys() if isinstance(value, Mapping) else value


def nvme_entries(record: NodeState) -> dict[str, int | None]:
    """Every cache-root entry on a record by cache id, with its size where the record says it."""
    out: dict[str, int | None] = {}
    for spec in NVME_KINDS:
        sized: Mapping[str, int] = getattr(record, spec.field) if spec.sized else {}
        for name in held(record, spec):
            ident = cache_id(spec.kind, name)
            out[ident] = sized[name] if spec.sized else record.cache_bytes.get(ident)
    return out


def ids_in_use(policy: Policy, record: NodeState, node_class: NodeClass) -> set[str]:
    """Cache ids the pods running or starting on the node need: never evicted.

    ``in_use`` (what the agent saw open), and for each workload with a pod there
    (``pod_workloads``): what its replica reads on this class (its current snapshot included),
    plus its weights of every version and its adapters (a pod of the previous rollout still reads
    its own; a snapshot is read only while a replica restores from it, so an old version's is not
    kept).

    Compile caches are kept the way weights are, every version, but a compile key is a hash that
    does not name its workload: a pod of the previous rollout (another image, engine or flags)
    reads a key no current profile computes. So while any pod runs on the node, every compile key
    there is kept except the current keys of profiles with no pod on it (those are known not to be
    read); a key nobody can attribute may be such a pod's, and unknown is kept.
    """
    needed = set(record.in_use)
    for w in record.pod_workloads:
        prefix = f"{w}/"
        needed |= {cache_id("weights", k) for k in record.weights if k.startswith(prefix)}
        needed |= {cache_id("adapter", k) for k in record.adapters if k.startswith(prefix)}
        if w in policy.profile_names:
            needed |= replica_ids(policy.profile(w), node_class)
    if record.pod_workloads and record.compile_keys:
        running = set(record.pod_workloads)
        idle = {compile_key(p, node_class) for p in policy.profiles if p.name not in running}
        needed |= {cache_id("compile", k) for k in record.compile_keys if k not in idle}
    return needed


def with_entries(record: NodeState, *, add: Mapping[str, int] = MappingProxyType({}),
                 remove: Iterable[str] = ()) -> dict[str, object]:
    """Field updates for a record that gains the entries ``add`` (cache id -> bytes) and loses ``remove``.

    Weights add bytes to what is there (a finished partial download); other kinds become present
    with their size in ``cache_bytes``. A removed entry also leaves ``last_used`` and ``cache_bytes``.
    Free NVMe is the caller's: it knows what was really written and freed.
    """
    updates: dict[str, Any] = {}

    def current(spec: KindSpec) -> Any:
        if spec.field not in updates:
            value = getattr(record, spec.field)
            updates[spec.field] = dict(value) if spec.sized else list(value)
        return updates[spec.field]

    sizes = dict(record.cache_bytes)
    last_used = dict(record.last_used)
    for ident in remove:
        kind, name = parse_cache_id(ident)
        entries = current(SPECS[kind])
        if SPECS[kind].sized:
            entries.pop(name, None)
        elif name in entries:
            entries.remove(name)
        sizes.pop(ident, None)
        last_used.pop(ident, None)
    for ident, size in add.items():
        kind, name = parse_cache_id(ident)
        spec = SPECS[kind]
        entries = current(spec)
        if spec.sized:
            entries[name] = entries.get(name, 0) + size
        else:
            if name not in entries:
                entries.append(name)
            if spec.on_nvme:
                sizes[ident] = size
    for spec in KINDS:
        if spec.field in updates and not spec.sized:
            updates[spec.field] = tuple(updates[spec.field])
    updates["cache_bytes"] = sizes
    updates["last_used"] = last_used
    return updates
