"""What the inventory needs from Node and Pod objects, parsed from the API's JSON (pure).

Only the fields we use are modelled (pydantic, unknown fields ignored: the API grows). From those:

* :func:`node_facts`: class (first policy class whose ``matchLabels`` hold, else empty so readers
  classify by labels), labels, allocatable GPUs, and every name in ``status.images``;
* :func:`pod_facts`: for a pod bound to a node and not finished, the GPUs it holds and, when it
  matches a workload profile, whether it is starting or running;
* :func:`kube_report`: one node's report for the inventory, from its facts and its pods, left
  without what a record cannot hold (:func:`fitted_kube_report` says what).

GPU requests follow the scheduler's arithmetic (:func:`pod_gpus`): init containers run one at a
time before the rest, except sidecars (init containers with ``restartPolicy: Always``), which start
in order and keep running beside the app containers. A pod being deleted still holds its GPUs until
it is gone, but no longer counts as a replica.

The API's ``null`` means what an absent field means (kubelet reports an untagged image with
``"names": null``): every model reads a ``null`` field as its default.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Literal

from kubernetes.utils import parse_quantity
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from extender.core.errors import InvalidValueError, KubeError
from extender.core.policy import UNKNOWN_CLASS, Policy
from extender.core.reports import KubeReport, Replicas, fit_kube_report

#: Extended resource that counts GPUs (``--gpu-resource`` changes it, e.g. ``amd.com/gpu``).
DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"


class _Api(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, alias_generator=to_camel, populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        """A ``null`` field is read as absent (its default): API servers send ``null`` for empty lists and maps."""
        if isinstance(data, Mapping):
            return {key: value for key, value in data.items() if value is not None}
        return data


class ObjectMeta(_Api):
    name: str
    namespace: str = ""
    uid: str = ""
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    deletion_timestamp: str | None = None


class ContainerImage(_Api):
    names: list[str] = []
    size_bytes: int = 0


class NodeStatus(_Api):
    capacity: dict[str, str] = {}
    allocatable: dict[str, str] = {}
    images: list[ContainerImage] = []


class Node(_Api):
    metadata: ObjectMeta
    status: NodeStatus = NodeStatus()


class Resources(_Api):
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}


class Container(_Api):
    resources: Resources = Resources()
    #: ``Always`` on an init container makes it a sidecar (it keeps running beside the app containers).
    restart_policy: str = ""


class PodSpec(_Api):
    node_name: str = ""
    containers: list[Container] = []
    init_containers: list[Container] = []


class PodCondition(_Api):
    type: str
    status: str
    last_transition_time: str | None = None


class RunningState(_Api):
    started_at: str | None = None


class ContainerState(_Api):
    running: RunningState | None = None
    #: Only its presence is read (in ``lastState``: the container ran and ended before this one).
    terminated: dict[str, Any] | None = None


class ContainerStatus(_Api):
    state: ContainerState = ContainerState()
    last_state: ContainerState = ContainerState()
    restart_count: int = 0


class PodStatus(_Api):
    phase: str = "Pending"
    conditions: list[PodCondition] = []
    container_statuses: list[ContainerStatus] = []
    init_container_statuses: list[ContainerStatus] = []


class Pod(_Api):
    metadata: ObjectMeta
    spec: PodSpec = PodSpec()
    status: PodStatus = PodStatus()


def parse_count(quantity: str | int | float | None) -> int:
    """A resource quantity as a whole count: ``"8"`` -> 8, ``"1k"`` -> 1000, ``"500m"`` -> 1 (fractions round up).

    Read by the client library's ``parse_quantity``, so every form the API server writes is
    accepted (``1e3``, ``.5``, ``1Pi``, ``1u``, ``2Ki``, ...); ``None`` (no such resource) is 0. A
    negative or non-finite value, or text that is no quantity, is an :class:`InvalidValueError`.
    """
    if quantity is None:
        return 0
    try:
        value: Decimal = parse_quantity(quantity)  # type: ignore[no-untyped-call]
    except (ValueError, TypeError, ArithmeticError) as exc:
        raise InvalidValueError(f"not a resource quantity: {quantity!r}") from exc
    if not value.is_finite() or value < 0:
        raise InvalidValueError(f"not a resource quantity: {quantity!r} (a count is finite and not negative)")
    return math.ceil(value)


@dataclass(frozen=True)
class NodeFacts:
    """One Node, reduced to what the inventory records."""

    name: str
    node_class: str
    labels: Mapping[str, str]
    gpus: int
    images: tuple[str, ...]


PodState = Literal["starting", "running", "terminating"]


@dataclass(frozen=True)
class PodFacts:
    """One pod bound to a node and not finished.

    The times (unix seconds, ``None`` when the status does not say) are what calibration observes
    (:mod:`extender.kube.observe`): the ``PodScheduled`` and ``Ready`` conditions' last transitions,
    and the earliest ``state.running.startedAt`` of the app containers running now (a container
    restarted gives its restart's time). ``restarted``: a container of the pod, init containers
    included, ran before the current one (``restartCount`` above 0, or a ``lastState.terminated``):
    the pod is starting *again*, after a crash, an OOM kill or its node's reboot.
    """

    key: str  # namespace/name
    node: str
    gpus: int
    workload: str | None
    state: PodState
    uid: str = ""
    scheduled_at: float | None = None
    started_at: float | None = None
    ready_at: float | None = None
    restarted: bool = False


def _parse(model: type[Node] | type[Pod], raw: Mapping[str, Any]) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        name = raw.get("metadata", {}).get("name", "?") if isinstance(raw.get("metadata"), Mapping) else "?"
        raise KubeError(f"cannot read {model.__name__} {name!r}: {exc.error_count()} invalid field(s): "
                        f"{exc.errors(include_url=False)[0]['msg']}") from exc


def node_facts(raw: Mapping[str, Any], policy: Policy, gpu_resource: str = DEFAULT_GPU_RESOURCE) -> NodeFacts:
    """Facts of a Node object; raises :class:`KubeError` for an object that is not a readable Node."""
    node: Node = _parse(Node, raw)
    labels = dict(node.metadata.labels)
    matched = policy.classify_node(labels)
    quantity = node.status.allocatable.get(gpu_resource, node.status.capacity.get(gpu_resource))
    try:
        gpus = parse_count(quantity)
    except ValueError as exc:
        raise KubeError(f"node {node.metadata.name!r}: {gpu_resource}: {exc}") from exc
    images: list[str] = []
    seen: set[str] = set()
    for image in node.status.images:
        for name in image.names:
            if name not in seen:
                seen.add(name)
                images.append(name)
    return NodeFacts(
        name=node.metadata.name,
        node_class="" if matched is UNKNOWN_CLASS else matched.name,
        labels=labels,
        gpus=gpus,
        images=tuple(images),
    )


def pod_gpus(spec: PodSpec, resource: str) -> int:
    """GPUs a pod holds: Kubernetes' effective request of ``resource``, sidecars included.

    With ``r(c)`` a container's request (its limit when it has no request) and the init
    containers in order, sidecars ``S`` (``restartPolicy: Always``) and regular ones ``I``::

        init  = max over i in I of ( r(i) + sum of r(s), s in S declared before i )
        total = max( init, sum of r(s), s in S  +  sum of r(c), c in containers )

    A regular init container runs alone beside the sidecars started before it; the sidecars then
    keep running beside the app containers (KEP-753, the scheduler's ``PodRequests``).
    """
    sidecars = 0
    init = 0
    for container in spec.init_containers:
        gpus = _container_gpus(container, resource)
        if container.restart_policy == "Always":
            sidecars += gpus
        else:
            init = max(init, sidecars + gpus)
    return max(init, sidecars + sum(_container_gpus(c, resource) for c in spec.containers))


def _container_gpus(container: Container, resource: str) -> int:
    value = container.resources.requests.get(resource, container.resources.limits.get(resource))
    try:
        return parse_count(value)
    except ValueError:
        return 0  # the API server rejects such pods; nothing sensible to count


#: The label of a standby placeholder pod (docs/scaler.md, "Standby capacity"); its value names the
#: workload it holds room for.
STANDBY_LABEL = "extender.io/standby-for"


def pod_facts(raw: Mapping[str, Any], policy: Policy, gpu_resource: str = DEFAULT_GPU_RESOURCE) -> PodFacts | None:
    """Facts of a pod, or ``None`` when it holds nothing on any node (unbound, succeeded, failed).

    A standby placeholder (``STANDBY_LABEL``) holds no GPUs here: a replica preempts it at once, so
    for the extender, the scaler's next replica and the warmer its GPUs are free.
    """
    pod: Pod = _parse(Pod, raw)
    if not pod.spec.node_name or pod.status.phase in ("Succeeded", "Failed"):
        return None
    profile = policy.profile_for_pod(dict(pod.metadata.labels), dict(pod.metadata.annotations))
    state: PodState
    if pod.metadata.deletion_timestamp:
        state = "terminating"
    elif pod.status.phase == "Running" and any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions):
        state = "running"
    else:
        state = "starting"
    conditions = {c.type: c for c in pod.status.conditions}
    started = [t for c in pod.status.container_statuses
               if c.state.running is not None and (t := timestamp(c.state.running.started_at)) is not None]
    restarted = any(c.restart_count > 0 or c.last_state.terminated is not None
                    for c in (*pod.status.container_statuses, *pod.status.init_container_statuses))
    return PodFacts(
        key=f"{pod.metadata.namespace}/{pod.metadata.name}",
        node=pod.spec.node_name,
        gpus=0 if STANDBY_LABEL in pod.metadata.labels else pod_gpus(pod.spec, gpu_resource),
        workload=profile.name if profile is not None else None,
        state=state,
        uid=pod.metadata.uid,
        scheduled_at=_transition(conditions.get("PodScheduled")),
        started_at=min(started) if started else None,
        ready_at=_transition(conditions.get("Ready")) if state == "running" else None,
        restarted=restarted,
    )


def timestamp(text: str | None) -> float | None:
    """An API timestamp (RFC 3339, ``2025-01-02T03:04:05Z``) as unix seconds; ``None`` if absent or unreadable."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _transition(condition: PodCondition | None) -> float | None:
    if condition is None or condition.status != "True":
        return None
    return timestamp(condition.last_transition_time)


def kube_report(node: NodeFacts, pods: Iterable[PodFacts]) -> KubeReport:
    """The sync's report of one node: its facts, the GPUs its pods hold, its replicas per workload.

    What a record cannot hold is left out (:func:`fitted_kube_report` says what).
    """
    return fitted_kube_report(node, pods)[0]


def fitted_kube_report(node: NodeFacts, pods: Iterable[PodFacts]) -> tuple[KubeReport, tuple[str, ...]]:
    """:func:`kube_report` and one reason per thing a record cannot hold, left out of it
    (:func:`extender.core.reports.fit_kube_report`; the sync logs them)."""
    used = 0
    replicas: dict[str, dict[str, int]] = {}
    for pod in pods:
        used += pod.gpus
        if pod.workload is not None and pod.state != "terminating":
            counts = replicas.setdefault(pod.workload, {"starting": 0, "running": 0})
            counts[pod.state] += 1
    return fit_kube_report(
        node_class=node.node_class,
        labels=node.labels,
        gpus=node.gpus,
        gpus_free=max(0, node.gpus - used),
        images=node.images,
        replicas={w: Replicas(**c) for w, c in sorted(replicas.items())},
    )
