"""A workload's pods as the scaler sees them: which to scrape, which are ready, which are still starting.

Pods are listed through the Kubernetes API with the profile's ``match.labels`` as the label selector
(annotations, which a selector cannot express, are checked here), within the workload's
``autoscaling.namespace`` when it names one (a namespaced list), else in every namespace. From each
pod object only a few fields matter:

* ``ready``: condition ``Ready=True`` (and not terminating): serving capacity now;
* ``starting``: ``Pending``, or ``Running`` but not yet ready, and not terminating: capacity in
  flight, which :func:`extender.core.scaler.decide` counts so that a spike does not cascade;
* terminating pods (``deletionTimestamp`` set), finished pods and pods in phase ``Unknown`` (their
  node stopped reporting) count as neither: they may never serve again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from extender.core.policy import Profile

JSON = Mapping[str, Any]


class PodLister(Protocol):
    """Lists pod objects (plain JSON, as the API server sends them) matching a label selector."""

    def list_pods(self, label_selector: str, namespace: str | None = None) -> Iterable[Mapping[str, Any]]:
        """Every pod in ``namespace`` (``None``: in every namespace) that matches ``label_selector``,
        iterated once (it may be fetched page by page as it is read: keep only what is needed of each)."""
        ...


@dataclass(frozen=True)
class Pod:
    """The few fields of a pod the scaler reads."""

    namespace: str
    name: str
    uid: str
    ip: str | None
    phase: str
    ready: bool
    terminating: bool
    start_time: float | None

    @property
    def key(self) -> str:
        """Identity across ticks: a pod recreated under the same name is a new pod (new uid)."""
        return f"{self.namespace}/{self.name}/{self.uid}"

    @property
    def scrapeable(self) -> bool:
        """Running with an IP and not on its way out: its metrics endpoint should answer."""
        return self.phase == "Running" and bool(self.ip) and not self.terminating

    @property
    def starting(self) -> bool:
        return not self.terminating and not self.ready and self.phase in ("Pending", "Running")


@dataclass(frozen=True)
class Replicas:
    """Ready and starting replicas of a workload (neither includes terminating pods)."""

    ready: int
    starting: int


def _timestamp(text: Any) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def parse_pod(obj: JSON) -> Pod | None:
    """The scaler's view of a pod object; ``None`` for an object without a name."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return None
    conditions = status.get("conditions") or []
    ready = any(isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True"
                for c in conditions)
    terminating = bool(meta.get("deletionTimestamp"))
    return Pod(
        namespace=str(meta.get("namespace") or "default"),
        name=name,
        uid=str(meta.get("uid") or ""),
        ip=status.get("podIP") or None,
        phase=str(status.get("phase") or "Pending"),
        ready=ready and not terminating and status.get("phase") == "Running",
        terminating=terminating,
        start_time=_timestamp(status.get("startTime")),
    )


def label_selector(profile: Profile) -> str:
    """The label selector for a profile's pods: its ``match.labels`` as ``k=v`` pairs, sorted by key.

    Empty when the profile matches on annotations only; then every pod is listed and filtered here.
    """
    return ",".join(f"{k}={v}" for k, v in sorted(profile.match.labels.items()))


def workload_pods(objects: Iterable[JSON], profile: Profile, namespace: str | None) -> list[Pod]:
    """The pods among ``objects`` that belong to ``profile`` (labels and annotations) in ``namespace``."""
    out: list[Pod] = []
    for obj in objects:
        meta = obj.get("metadata") or {}
        if namespace is not None and meta.get("namespace") != namespace:
            continue
        if not profile.matches(dict(meta.get("labels") or {}), dict(meta.get("annotations") or {})):
            continue
        pod = parse_pod(obj)
        if pod is not None:
            out.append(pod)
    return out


def count_replicas(pods: Sequence[Pod]) -> Replicas:
    """Ready and starting replicas (rules in the module docstring)."""
    return Replicas(ready=sum(p.ready for p in pods), starting=sum(p.starting for p in pods))
