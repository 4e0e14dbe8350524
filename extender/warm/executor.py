"""The warmer's calls to the API server: list its Jobs, create one, delete one, report a failure as an Event.

Thin on purpose: the decisions (what to start, when to retry, what counts as done) are in
:mod:`.loop` and the objects in :mod:`.jobspec`. Two answers of the API server are outcomes here,
not errors: ``409 AlreadyExists`` on create (the action's Job exists: it was started before,
maybe by a warmer that restarted; that is the idempotency the deterministic names give) and
``404 NotFound`` on delete (already gone: TTL, or someone cleaned up). Everything else raises
:class:`~extender.core.errors.KubeError` for the caller to count and retry on its next tick.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any, Literal, Protocol

from extender.core.errors import KubeError
from extender.core.policy import WarmRetry
from extender.kube.errors import KubeApiError
from extender.warm.jobspec import SELECTOR, JobView, event, read_job

log = logging.getLogger(__name__)

JSON = dict[str, Any]


class WarmKube(Protocol):
    """What the executor needs from :class:`extender.kube.client.KubeClient`."""

    def list_jobs(self, namespace: str, *, label_selector: str | None = None) -> list[JSON]: ...

    def create_job(self, namespace: str, body: Mapping[str, Any]) -> JSON: ...

    def delete_job(self, namespace: str, name: str) -> None: ...

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> JSON: ...


def retry_delay(retry: WarmRetry, attempt: int) -> float:
    """Seconds after the ``attempt``-th failure before the action may run again: ``min(max, initial * 2**(attempt-1))``.

    No jitter: the warmer is one process (the scaler's leader), not a herd, and a deterministic
    delay can be recomputed from the failed Job after a restart.
    """
    return min(retry.max, retry.initial * math.pow(2.0, min(max(attempt, 1) - 1, 60)))


def _status(exc: KubeError) -> int | None:
    return exc.status if isinstance(exc, KubeApiError) else None


class Executor:
    """Job and Event calls in one namespace."""

    def __init__(self, kube: WarmKube, namespace: str, *, instance: str = "") -> None:
        self.kube = kube
        self.namespace = namespace
        self.instance = instance
        self._unreadable: set[str] = set()

    def jobs(self) -> list[JobView]:
        """Every warm Job in the namespace (Jobs with our label but unreadable annotations are logged once, skipped)."""
        views: list[JobView] = []
        for raw in self.kube.list_jobs(self.namespace, label_selector=SELECTOR):
            view = read_job(raw)
            if view is None:
                name = str((raw.get("metadata") or {}).get("name", "?"))
                if name not in self._unreadable:
                    self._unreadable.add(name)
                    log.warning("job %s/%s carries the warm label but no readable action; leaving it alone",
                                self.namespace, name, extra={"job": name, "namespace": self.namespace})
                continue
            views.append(view)
        return views

    def create(self, body: JSON) -> Literal["created", "exists"]:
        """Create a Job; ``"exists"`` when a Job of that name is already there (the same work)."""
        try:
            self.kube.create_job(self.namespace, body)
        except KubeError as exc:
            if _status(exc) == 409:
                return "exists"
            raise
        return "created"

    def delete(self, view: JobView) -> None:
        """Delete a Job (and its pods, in the background); gone already is fine."""
        try:
            self.kube.delete_job(self.namespace, view.name)
        except KubeError as exc:
            if _status(exc) != 404:
                raise

    def warn(self, view: JobView, *, reason: str, message: str, now: float) -> bool:
        """Record a Warning Event on the Job; ``False`` if it already exists (reported before a restart)."""
        try:
            self.kube.create_event(self.namespace, event(view, reason=reason, message=message, now=now,
                                                         instance=self.instance))
        except KubeError as exc:
            if _status(exc) == 409:
                return False
            raise
        return True
