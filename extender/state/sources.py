"""Two writers, one node record: what the node agent measures and what the cluster sync reads from the API.

The agent knows the node's disk (NVMe total/free, weights, compile keys, snapshots, and possibly
the runtime's complete image list); the sync knows the Node object (labels, class, GPUs, kubelet's
``status.images``) and the pods bound to it. Both write at their own pace, and neither may clobber
the other's fields. So each writes only its own *report*, and the :class:`NodeState` readers see is
rebuilt from both reports in the same transaction::

    <p>:source:<name>   hash   agent -> AgentReport JSON, kube -> KubeReport JSON,
                               deleted -> unix time (tombstone of a node removed from the cluster)
    <p>:node:<name>     the merged NodeState, written by extender.state.store's rules

A write WATCHes the node's source hash, reads the other report, merges (:func:`merge`, pure), then
in one MULTI/EXEC stores its report, the merged record, the node set and the version bump. A
concurrent write of the other source makes EXEC fail and the write is retried with the fresh
report, so the last merged record always contains the latest of both: no lock, no lost update.

Merge rules (why each source wins where it does):

* heartbeat and ttl come from the agent only: freshness means "the disk report is recent"; the
  sync writing a label change must never make a node with a dead agent look warm;
* images: the agent's list when it reports one (the runtime's full list), else kubelet's
  ``status.images``, which holds at most 50 images, largest first;
* class, labels, GPUs, and the workloads with pods starting or running on the node
  (``pod_workloads``): the sync's. A node the policy classes do not match is stored with an empty
  class, so each reader classifies it by labels against its own policy.

Deleting a node leaves a tombstone for :data:`TOMBSTONE_TTL_S`: an agent still running on a node the
cluster already removed must not bring the record back. A later sync report of that name (the node
re-registered) clears it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

from pydantic import ConfigDict, Field, ValidationError
from redis.client import Pipeline

from extender.core.inventory import (
    DEFAULT_TTL_S,
    MAX_ENTRIES,
    BytesMap,
    Count,
    NodeState,
    StoredBytes,
    Text,
    TextMap,
    Texts,
    TimeMap,
    Timestamp,
    Ttl,
)
from extender.core.schema import Schema
from extender.state.errors import redis_errors
from extender.state.store import InventoryStore, encode

log = logging.getLogger(__name__)

AGENT = "agent"
KUBE = "kube"
DELETED = "deleted"

#: How long a deleted node's tombstone keeps late agent reports out (an agent's pod is gone minutes
#: after its node; an hour leaves room for a node stuck terminating).
TOMBSTONE_TTL_S = 3600

#: Nodes per transaction when the sync writes many reports (its first list of a large cluster).
BATCH = 200


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
    """The record readers see, from whichever reports exist (rules in the module docstring)."""
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
            heartbeat=agent.heartbeat,
            ttl=agent.ttl,
            last_used=agent.last_used,
            cache_bytes=agent.cache_bytes,
        )
        if agent.images is not None:
            fields["images"] = agent.images
    return NodeState.model_construct(**fields)  # every value above is already valid


def _dump(report: Report) -> str:
    # plain numbers in SI units, like extender.state.store.encode: any writer can produce them
    return json.dumps(report.model_dump(mode="python", by_alias=True), separators=(",", ":"), sort_keys=True)


def _load(model: type[AgentReport] | type[KubeReport], key: str, raw: str | bytes | None) -> Any:
    """Parse a stored report; a corrupt one counts as absent (the next write replaces it)."""
    if raw is None:
        return None
    try:
        return model.model_validate_json(raw)
    except (ValidationError, ValueError) as exc:
        log.warning("ignoring corrupt %s report in %s: %s", model.__name__, key, exc)
        return None


class SourceStore:
    """Per-source writes on top of an :class:`InventoryStore` (same client, prefix and version counter)."""

    def __init__(self, store: InventoryStore) -> None:
        self.store = store
        self.client = store.client

    def key(self, name: str) -> str:
        return f"{self.store.keys.prefix}:source:{name}"

    def _stage_record(self, pipe: Pipeline, state: NodeState) -> None:
        pipe.set(self.store.keys.node(state.name), encode(state))
        pipe.sadd(self.store.keys.nodes, state.name)

    # ---- the agent -------------------------------------------------------------------------

    def report_agent(self, name: str, report: AgentReport) -> int | None:
        """Store the agent's report and the merged record; ``None`` if the node was deleted (tombstone)."""
        key = self.key(name)
        outcome: list[int | None] = []

        def write(pipe: Pipeline) -> None:
            stored = pipe.hgetall(key)
            pipe.multi()
            if DELETED in stored:
                outcome.append(None)
                pipe.get(self.store.keys.version)
                return
            kube = _load(KubeReport, key, stored.get(KUBE))
            pipe.hset(key, AGENT, _dump(report))
            self._stage_record(pipe, merge(name, report, kube))
            self.store.stage_bump(pipe, [name])
            outcome.append(0)

        with redis_errors(f"writing the agent report of node {name!r}"):
            result: Any = self.client.transaction(write, key)
        if outcome[-1] is None:
            return None
        return int(result[-1])

    # ---- the sync --------------------------------------------------------------------------

    def report_kube(self, reports: Mapping[str, KubeReport]) -> int:
        """Store the sync's reports (clearing tombstones) and the merged records; returns the version."""
        items = sorted(reports.items())
        version = self.store.version() if not items else 0
        for start in range(0, len(items), BATCH):
            batch = items[start : start + BATCH]
            keys = [self.key(name) for name, _ in batch]

            def write(pipe: Pipeline, batch: list[tuple[str, KubeReport]] = batch, keys: list[str] = keys) -> None:
                agents = [pipe.hget(k, AGENT) for k in keys]
                pipe.multi()
                for (name, report), k, raw in zip(batch, keys, agents, strict=True):
                    pipe.hset(k, KUBE, _dump(report))
                    pipe.hdel(k, DELETED)
                    pipe.persist(k)
                    self._stage_record(pipe, merge(name, _load(AgentReport, k, raw), report))
                self.store.stage_bump(pipe, [name for name, _ in batch])

            with redis_errors(f"writing the cluster reports of {len(batch)} node(s)"):
                result: Any = self.client.transaction(write, *keys)
            version = int(result[-1])
        return version

    def remove_node(self, name: str) -> int:
        """The node left the cluster: drop both reports and the record, leave a tombstone."""
        key = self.key(name)

        def write(pipe: Pipeline) -> None:
            pipe.delete(key)
            pipe.hset(key, DELETED, str(time.time()))
            pipe.expire(key, TOMBSTONE_TTL_S)
            pipe.delete(self.store.keys.node(name))
            pipe.srem(self.store.keys.nodes, name)
            self.store.stage_bump(pipe, [name])

        with redis_errors(f"removing node {name!r}"), self.client.pipeline(transaction=True) as pipe:
            write(pipe)
            return int(pipe.execute()[-1])

    def kube_reports(self, names: Iterable[str]) -> dict[str, KubeReport | None]:
        """The stored sync reports of ``names`` (``None`` where missing or corrupt, or the record is gone).

        The sync compares these with what it knows to repair a store that lost data.
        """
        ordered = list(names)
        if not ordered:
            return {}
        with redis_errors("reading cluster reports"), self.client.pipeline(transaction=False) as pipe:
            for name in ordered:
                pipe.hget(self.key(name), KUBE)
                pipe.exists(self.store.keys.node(name))
            raw = pipe.execute()
        out: dict[str, KubeReport | None] = {}
        for i, name in enumerate(ordered):
            report, present = raw[2 * i], raw[2 * i + 1]
            out[name] = _load(KubeReport, self.key(name), report) if present else None
        return out

    def agent_report(self, name: str) -> AgentReport | None:
        """The stored agent report of ``name``."""
        key = self.key(name)
        with redis_errors(f"reading the agent report of node {name!r}"):
            raw = self.client.hget(key, AGENT)
        result: AgentReport | None = _load(AgentReport, key, raw)
        return result
