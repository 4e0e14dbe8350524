"""The two reports that make one node record, and how they merge (pure; stored by :mod:`extender.state.sources`).

The node agent knows the node's disk (NVMe total/free, the caches, possibly the runtime's complete
image list); the cluster sync knows the Node object (labels, class, GPUs, kubelet's
``status.images``) and the pods bound to it. Each writes only its own report; readers see the
:class:`~extender.core.inventory.NodeState` that :func:`merge` rebuilds from both.

Merge rules (why each source wins where it does):

* heartbeat and ttl come from the agent only: freshness means "the disk report is recent"; the
  sync writing a label change must never make a node with a dead agent look warm;
* images: the agent's list when it reports one (the runtime's full list), else kubelet's
  ``status.images``, which holds at most 50 images, largest first;
* class, labels, GPUs, and the workloads with pods starting or running on the node
  (``pod_workloads``): the sync's. A node the policy classes do not match is stored with an empty
  class, so each reader classifies it by labels against its own policy.

A node name must be a Kubernetes name on write too (:func:`merge` refuses any other): a record
under another name would be written and then skipped by every reader as corrupt.

What a scan finds does not always fit a record (:func:`fit_agent_report`): a file name with
control characters or invalid UTF-8, more entries than a record holds, or more bytes than the
agent's share of a record. Those parts are left out, each with a reason the agent logs, and the
rest is reported: one odd directory must never keep a node from reporting. The same holds for
what the API server says of a node (:func:`fit_kube_report`, same bounds; the sync logs the
reasons): one node with thousands of labels must never keep the sync from writing the others.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, TypeVar

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

from extender.core.caches import CacheKind, cache_id
from extender.core.errors import InvalidValueError
from extender.core.inventory import (
    DEFAULT_TTL_S,
    MAX_ENTRIES,
    MAX_GPUS,
    MAX_RECORD_BYTES,
    BytesMap,
    Count,
    NodeName,
    NodeState,
    StoredBytes,
    TextMap,
    Texts,
    TimeMap,
    Timestamp,
    Ttl,
)
from extender.core.schema import Schema, Text

#: Bytes of a stored record the agent's report may fill. The rest is left to the sync's part
#: (labels and kubelet's image names: a few KiB to a few tens of KiB on real nodes), so a merged
#: record stays under :data:`~extender.core.inventory.MAX_RECORD_BYTES`.
AGENT_RECORD_BYTES = MAX_RECORD_BYTES - (128 << 10)
#: Bytes of a stored record the sync's report may fill: what the agent's share leaves.
KUBE_RECORD_BYTES = MAX_RECORD_BYTES - AGENT_RECORD_BYTES


class Report(Schema):
    """Base of the per-source reports: built in Python by field name, stored camelCase like NodeState."""

    model_config = ConfigDict(populate_by_name=True)


class AgentReport(Report):
    """What the node agent measured on the node's disk."""

    nvme_total: StoredBytes = 0
    nvme_free: StoredBytes = 0
    weights: BytesMap = {}
    compile_keys: Texts = ()
    snapshots: Texts = ()
    adapters: Texts = ()
    #: Every name of every image the container runtime holds; ``None`` when the agent cannot see the
    #: runtime (kubelet's capped list is used then).
    images: Texts | None = None
    heartbeat: Timestamp = 0.0
    ttl: Ttl = DEFAULT_TTL_S
    #: Usage for the cache warmer's evictions, by cache id (``NodeState.last_used``, ``cache_bytes``).
    last_used: TimeMap = {}
    cache_bytes: BytesMap = {}

    def same_content(self, other: AgentReport | None, *, free_tolerance: int = 0) -> bool:
        """Equal apart from the heartbeat and a free-space drift of at most ``free_tolerance`` bytes."""
        if other is None or abs(self.nvme_free - other.nvme_free) > free_tolerance:
            return False
        ignore = {"heartbeat": 0.0, "nvme_free": 0}
        return self.model_copy(update=ignore) == other.model_copy(update=ignore)


class Replicas(Report):
    """Pods of one workload bound to a node."""

    starting: int = Field(default=0, ge=0)
    running: int = Field(default=0, ge=0)


class KubeReport(Report):
    """What the API server says about a node and the pods bound to it."""

    node_class: Text = ""
    labels: TextMap = {}
    gpus: Count = 0
    gpus_free: Count = 0
    #: Every name in kubelet's ``status.images`` (at most 50 images, largest first).
    images: Texts = ()
    #: Workload -> pods starting / running on this node.
    replicas: Annotated[dict[Text, Replicas], Field(max_length=MAX_ENTRIES)] = {}


def merge(name: str, agent: AgentReport | None, kube: KubeReport | None) -> NodeState:
    """The record readers see, from whichever reports exist (rules in the module docstring).

    Raises :class:`InvalidValueError` when ``name`` is no Kubernetes node name: the reports are
    valid by their own models, but the name is the one part only the caller gives, and a record
    under a bad name would be skipped by every reader as corrupt.
    """
    check_node_name(name)
    k = kube or KubeReport()
    fields: dict[str, Any] = {
        "name": name,
        "node_class": k.node_class,
        "labels": k.labels,
        "gpus": k.gpus,
        "gpus_free": min(k.gpus_free, k.gpus),
        "images": k.images,
        # workloads with a pod starting or running here: the warmer never evicts their caches
        "pod_workloads": tuple(sorted(w for w, r in k.replicas.items() if r.starting or r.running)),
    }
    if agent is not None:
        fields.update(
            nvme_total=agent.nvme_total,
            nvme_free=min(agent.nvme_free, agent.nvme_total),
            weights=agent.weights,
            compile_keys=agent.compile_keys,
            snapshots=agent.snapshots,
            adapters=agent.adapters,
            heartbeat=agent.heartbeat,
            ttl=agent.ttl,
            last_used=agent.last_used,
            cache_bytes=agent.cache_bytes,
        )
        if agent.images is not None:
            fields["images"] = agent.images
    return NodeState.model_construct(**fields)  # every value above is already valid


_NODE_NAME: TypeAdapter[str] = TypeAdapter(NodeName)
_TEXT: TypeAdapter[str] = TypeAdapter(Text)
_BYTES: TypeAdapter[int] = TypeAdapter(StoredBytes)
_TIME: TypeAdapter[float] = TypeAdapter(Timestamp)


def check_node_name(name: str) -> str:
    """``name`` if it is a Kubernetes node name (what a record is stored under), else :class:`InvalidValueError`."""
    if (why := _refusal(_NODE_NAME, name)) is not None:
        raise InvalidValueError(f"{name!r} is not a Kubernetes node name (lowercase letters, digits, '-' and '.', "
                                f"at most 253 characters): {why}")
    return name


def _refusal(adapter: TypeAdapter[Any], value: object) -> str | None:
    """Why ``adapter`` refuses ``value`` (pydantic's first message), or ``None`` when it accepts it."""
    try:
        adapter.validate_python(value)
    except ValidationError as exc:
        return str(exc.errors(include_url=False)[0]["msg"])
    return None


#: The report's entry lists in the order :func:`fit_agent_report` treats them: field, cache kind,
#: what one entry is, what several are.
_LISTS: tuple[tuple[str, CacheKind, str, str], ...] = (
    ("weights", "weights", "weights entry", "weights entries"),
    ("compile_keys", "compile", "compile key", "compile keys"),
    ("snapshots", "snapshot", "snapshot", "snapshots"),
    ("adapters", "adapter", "adapter", "adapters"),
)


def _storable_images(images: Iterable[str], dropped: list[str]) -> list[str]:
    """Each image name once, in the order given, but those a record cannot hold (each said in ``dropped``)."""
    names: list[str] = []
    for name in dict.fromkeys(images):
        if (why := _refusal(_TEXT, name)) is None:
            names.append(name)
        else:
            dropped.append(f"image name {name!r} cannot be stored ({why}): left out of the report")
    return names


def fit_agent_report(
    *,
    nvme_total: int,
    nvme_free: int,
    weights: Mapping[str, int],
    compile_keys: Iterable[str],
    snapshots: Iterable[str],
    adapters: Iterable[str],
    ttl: float,
    last_used: Mapping[str, float],
    cache_bytes: Mapping[str, int],
    images: Iterable[str] | None = None,
    budget: int = AGENT_RECORD_BYTES,
) -> tuple[AgentReport, tuple[str, ...]]:
    """The :class:`AgentReport` of what a scan found, with whatever a record cannot hold left out.

    Returns the report and one reason per thing left out (the agent logs each as a scan problem).
    Why: a record is validated as a whole, so one name it refuses would otherwise refuse the
    node's entire report, and the node would stop reporting over one odd directory. In order:

    1. An entry whose name (or cache id) a record refuses (control characters, invalid UTF-8,
       longer than a record's text) is left out, with its usage; so is an impossible value (a
       last-use time outside 0 to 10^11, a size over a record's bound), the entry staying.
    2. A list longer than a record holds (:data:`~extender.core.inventory.MAX_ENTRIES`) keeps its
       first entries **in name order**, deterministic from scan to scan; the usage maps keep the
       entries still reported, and when their sum over all kinds is still too long, the first by
       cache id. An entry without a last-use time is never evicted, so dropping one errs safe.
    3. While the report's stored JSON is over ``budget`` bytes, the list taking the most bytes
       loses entries from the end of its name order (with their usage) until it fits.

    ``images`` (the container runtime's image names, ``None`` when the agent does not read the
    runtime) follows the same rules in the order given, each name once: the runtime's lister gives
    the largest image's names first, so what a cut leaves out is the smallest images, as in
    kubelet's list (:func:`fit_kube_report`). ``None`` stays ``None``.
    """
    dropped: list[str] = []
    lists: dict[str, list[str]] = {"weights": sorted(weights), "compile_keys": sorted(set(compile_keys)),
                                   "snapshots": sorted(set(snapshots)), "adapters": sorted(set(adapters))}
    if images is not None:
        names = _storable_images(images, dropped)
        if len(names) > MAX_ENTRIES:
            dropped.append(f"{len(names)} image names, more than the {MAX_ENTRIES} a record holds: reported the "
                           f"first {MAX_ENTRIES} (largest images first), left out {len(names) - MAX_ENTRIES} from "
                           f"{names[MAX_ENTRIES]!r} on")
            names = names[:MAX_ENTRIES]
        lists["images"] = names
    for field, kind, one, what in _LISTS:
        kept = []
        for name in lists[field]:
            why = _refusal(_TEXT, cache_id(kind, name))
            if why is None and field == "weights" and (bad := _refusal(_BYTES, weights[name])) is not None:
                why = f"{weights[name]} bytes: {bad}"
            if why is None:
                kept.append(name)
            else:
                dropped.append(f"{one} {name!r} cannot be stored ({why}): left out of the report")
        if len(kept) > MAX_ENTRIES:
            dropped.append(f"{len(kept)} {what}, more than the {MAX_ENTRIES} a record holds: reported the first "
                           f"{MAX_ENTRIES} by name, left out {len(kept) - MAX_ENTRIES} from {kept[MAX_ENTRIES]!r} on")
            kept = kept[:MAX_ENTRIES]
        lists[field] = kept

    def usage(values: Mapping[str, Any], adapter: TypeAdapter[Any], what: str) -> dict[str, Any]:
        reported = {cache_id(kind, name) for field, kind, _, _ in _LISTS for name in lists[field]}
        out: dict[str, Any] = {}
        for ident in sorted(reported & values.keys()):
            if (why := _refusal(adapter, values[ident])) is None:
                out[ident] = values[ident]
            else:
                dropped.append(f"{what} of {ident!r} ({values[ident]!r}) cannot be stored ({why}): left out")
        if len(out) > MAX_ENTRIES:
            dropped.append(f"{what}s of {len(out)} entries, more than the {MAX_ENTRIES} a record holds: kept the "
                           f"first {MAX_ENTRIES} by cache id")
            out = dict(list(out.items())[:MAX_ENTRIES])
        return out

    times = usage(last_used, _TIME, "last-use time")
    sizes = usage(cache_bytes, _BYTES, "size")

    def build() -> AgentReport:
        return AgentReport(nvme_total=nvme_total, nvme_free=nvme_free,
                           weights={k: weights[k] for k in lists["weights"]},
                           compile_keys=tuple(lists["compile_keys"]), snapshots=tuple(lists["snapshots"]),
                           adapters=tuple(lists["adapters"]), ttl=ttl, last_used=times, cache_bytes=sizes,
                           images=None if images is None else tuple(lists["images"]))

    def cost(kind: CacheKind | None, name: str) -> int:
        """About the bytes ``name`` takes in the stored JSON: in its list, and its usage entries."""
        if kind is None:  # an image name: in its list only
            return len(json.dumps(name)) + 1
        ident = json.dumps(cache_id(kind, name))
        usage_bytes = sum(len(ident) + len(json.dumps(m[cache_id(kind, name)])) + 2
                          for m in (times, sizes) if cache_id(kind, name) in m)
        own = len(json.dumps(weights[name])) + 1 if kind == "weights" else 0
        return len(json.dumps(name)) + 1 + own + usage_bytes

    kinds: dict[str, CacheKind | None] = {field: kind for field, kind, _, _ in _LISTS}
    kinds["images"] = None

    def forget(field: str, name: str) -> None:
        if (kind := kinds[field]) is not None:
            for m in (times, sizes):
                m.pop(cache_id(kind, name), None)

    report, left_out = _within_budget(lists, lambda field, name: cost(kinds[field], name), build, budget, forget)
    for field, what, order in (*((f, w, "by name") for f, _, _, w in _LISTS),
                               ("images", "image names", "(the smallest images)")):
        if left_out.get(field):
            dropped.append(f"the report is over the {budget} bytes the agent's part of a record may take: left out "
                           f"the last {left_out[field]} of {len(lists[field]) + left_out[field]} {what} {order}")
    return report, tuple(dropped)


def fit_kube_report(
    *,
    node_class: str,
    labels: Mapping[str, str],
    gpus: int,
    gpus_free: int,
    images: Iterable[str],
    replicas: Mapping[str, Replicas],
    budget: int = KUBE_RECORD_BYTES,
) -> tuple[KubeReport, tuple[str, ...]]:
    """The :class:`KubeReport` of what the API server says of a node, with whatever a record cannot hold left out.

    Returns the report and one reason per thing left out (the sync logs each). Why: a report is
    validated as a whole, so one label it refuses would otherwise refuse the node's whole report
    (and, raised in the sync's writer, stop every other node's writes). The bounds and the order
    are :func:`fit_agent_report`'s:

    1. A label (key or value) or an image name a record refuses is left out; a class name it
       refuses is left empty (readers then classify the node by its labels); a GPU count over
       :data:`~extender.core.inventory.MAX_GPUS` is stored as that bound (free GPUs at most that).
    2. More than :data:`~extender.core.inventory.MAX_ENTRIES` labels keep the first by key; more
       image names keep the first in kubelet's order (largest image first); more workloads with
       pods keep the first by name.
    3. While the report's stored JSON is over ``budget`` bytes (the sync's share of a record,
       :data:`KUBE_RECORD_BYTES`), the list taking the most bytes, labels or images, loses entries
       from the end of its order until it fits.

    Labels keep the API server's order in the report; the order above only chooses which stay.
    """
    dropped: list[str] = []
    if (why := _refusal(_TEXT, node_class)) is not None:
        dropped.append(f"node class {node_class!r} cannot be stored ({why}): left empty")
        node_class = ""
    if gpus > MAX_GPUS:
        dropped.append(f"{gpus} GPUs, more than the {MAX_GPUS} a record holds: stored as {MAX_GPUS}")
        gpus = MAX_GPUS
    gpus_free = max(0, min(gpus_free, gpus))

    label_keys: list[str] = []
    for key in sorted(labels):
        why = _refusal(_TEXT, key) or _refusal(_TEXT, labels[key])
        if why is None:
            label_keys.append(key)
        else:
            dropped.append(f"label {key!r} cannot be stored ({why}): left out of the report")
    names = _storable_images(images, dropped)
    lists = {"labels": label_keys, "images": names}
    for field, what, order in (("labels", "labels", "by key"), ("images", "image names", "in kubelet's order")):
        kept = lists[field]
        if len(kept) > MAX_ENTRIES:
            dropped.append(f"{len(kept)} {what}, more than the {MAX_ENTRIES} a record holds: reported the first "
                           f"{MAX_ENTRIES} {order}, left out {len(kept) - MAX_ENTRIES} from {kept[MAX_ENTRIES]!r} on")
            lists[field] = kept[:MAX_ENTRIES]
    workloads = dict(replicas)
    if len(workloads) > MAX_ENTRIES:
        dropped.append(f"pods of {len(workloads)} workloads, more than the {MAX_ENTRIES} a record holds: "
                       f"reported the first {MAX_ENTRIES} by name")
        workloads = {w: workloads[w] for w in sorted(workloads)[:MAX_ENTRIES]}

    def build() -> KubeReport:
        keep = set(lists["labels"])
        return KubeReport(node_class=node_class, labels={k: v for k, v in labels.items() if k in keep},
                          gpus=gpus, gpus_free=gpus_free, images=tuple(lists["images"]), replicas=workloads)

    def cost(field: str, entry: str) -> int:
        """About the bytes ``entry`` takes in the stored JSON."""
        if field == "labels":
            return len(json.dumps(entry)) + len(json.dumps(labels[entry])) + 2
        return len(json.dumps(entry)) + 1

    report, left_out = _within_budget(lists, cost, build, budget)
    for field, what in (("labels", "labels"), ("images", "image names")):
        if left_out.get(field):
            dropped.append(f"the report is over the {budget} bytes the sync's part of a record may take: left out "
                           f"the last {left_out[field]} of {len(lists[field]) + left_out[field]} {what}")
    return report, tuple(dropped)


R = TypeVar("R", bound=Report)


def _within_budget(lists: dict[str, list[str]], cost: Callable[[str, str], int], build: Callable[[], R], budget: int,
                   forget: Callable[[str, str], None] | None = None) -> tuple[R, dict[str, int]]:
    """``build()`` once its stored JSON is at most ``budget`` bytes, and how many entries each list lost.

    While it is over, the list whose entries cost the most bytes (``cost(list, entry)``, about what
    the entry takes in the JSON) loses entries from its end until about the excess is freed;
    ``forget(list, entry)`` drops what else refers to an entry. Stops when nothing is left to drop
    (the fixed fields alone are never over a sane budget).
    """
    report = build()
    left_out: dict[str, int] = {}
    while (size := stored_size(report)) > budget:
        field = max(lists, key=lambda f: sum(cost(f, e) for e in lists[f]))
        entries, excess, freed = lists[field], size - budget, 0
        while entries and freed < excess:
            entry = entries.pop()
            freed += cost(field, entry)
            left_out[field] = left_out.get(field, 0) + 1
            if forget is not None:
                forget(field, entry)
        if not freed:
            break
        report = build()
    return report, left_out


def stored_size(report: Report) -> int:
    """Bytes of ``report`` stored as JSON, as :mod:`extender.state.sources` writes it (ASCII: characters are
    bytes); what :func:`fit_agent_report` and :func:`fit_kube_report` hold under their budgets."""
    return len(json.dumps(report.model_dump(mode="python", by_alias=True), separators=(",", ":"), sort_keys=True))
