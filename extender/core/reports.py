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
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field

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
            adapters=agent.adapters,
            heartbeat=agent.heartbeat,
            ttl=agent.ttl,
            last_used=agent.last_used,
            cache_bytes=agent.cache_bytes,
        )
        if agent.images is not None:
            fields["images"] = agent.images
    return NodeState.model_construct(**fields)  # every value above is already valid
