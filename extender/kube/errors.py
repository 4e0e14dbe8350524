"""Kubernetes client failures, mapped to our hierarchy at the one place that calls the client.

:class:`~extender.core.errors.KubeError` is the base callers catch. The subclasses carry what a
caller decides on: the HTTP status (a 404 on a GET is an answer, a 403 is a deployment bug),
``410 Gone`` (the resourceVersion a watch resumed from was compacted: list again), and "the API
server could not be reached at all" (retry with backoff). The original exception is always
chained as ``__cause__``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import urllib3.exceptions
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from extender.core.errors import KubeError


class KubeApiError(KubeError):
    """The API server answered with an error status."""

    def __init__(self, message: str, status: int | None, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class KubeGoneError(KubeApiError):
    """``410 Gone``: the resourceVersion is too old (compacted); the client must list again."""


class KubeUnreachableError(KubeError):
    """No answer: connection refused or reset, a timeout, or a stream cut mid-response."""


def _status_message(exc: ApiException) -> tuple[str, str]:
    """``(reason, message)`` from the ``Status`` body the API server sends with errors."""
    body = exc.body
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str) and body.startswith("{"):
        try:
            status = json.loads(body)
        except ValueError:
            status = None
        if isinstance(status, dict):
            return str(status.get("reason") or exc.reason or ""), str(status.get("message") or "")
    return str(exc.reason or ""), ""


def from_api_exception(action: str, exc: ApiException) -> KubeApiError:
    """Our error for an ``ApiException`` (the caller chains it)."""
    reason, message = _status_message(exc)
    status = exc.status if isinstance(exc.status, int) else None
    text = f"{action}: {status} {reason}" + (f": {message}" if message else "")
    cls = KubeGoneError if status == 410 else KubeApiError
    return cls(text, status, reason)


@contextmanager
def kube_errors(action: str) -> Iterator[None]:
    """Run client calls, re-raising the client's and urllib3's errors as ours; ``action`` starts the message."""
    try:
        yield
    except ApiException as exc:
        raise from_api_exception(action, exc) from exc
    except urllib3.exceptions.HTTPError as exc:
        raise KubeUnreachableError(f"{action}: the API server is unreachable: {exc}") from exc
    except ConfigException as exc:
        raise KubeError(f"{action}: invalid Kubernetes client configuration: {exc}") from exc
    except OSError as exc:  # a socket error below urllib3 (a stream shut down by Watch.stop, ...)
        raise KubeUnreachableError(f"{action}: connection error: {exc}") from exc
