"""Kubernetes client failures, mapped to our hierarchy at the one place that calls the client.

:class:`~extender.core.errors.KubeError` is the base callers catch. The subclasses carry what a
caller decides on: the HTTP status (a 404 on a GET is an answer, a 403 is a deployment bug),
``410 Gone`` (the resourceVersion a watch resumed from was compacted: list again), the seconds
the server asked us to wait before the next try (``Retry-After``, sent with ``429 Too Many
Requests`` by API Priority and Fairness and the max-in-flight filter), and "the API server could
not be reached at all" (retry with backoff). The original exception is always chained as
``__cause__``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import urllib3.exceptions
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from urllib3.exceptions import InvalidHeader
from urllib3.util.retry import Retry

from extender.core.errors import KubeError

#: The longest ``Retry-After`` taken at its word, in seconds: a proxy's "come back tomorrow" is not.
MAX_RETRY_AFTER_S = 300.0


class KubeApiError(KubeError):
    """The API server answered with an error status; ``retry_after_s``: the wait it asked for, if any."""

    def __init__(self, message: str, status: int | None, reason: str = "", retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.retry_after_s = retry_after_s


def asked_wait_s(exc: BaseException) -> float | None:
    """The wait the API server asked for with ``exc`` (``Retry-After``), or ``None`` (it asked for none,
    or ``exc`` is no answer of the API server)."""
    return exc.retry_after_s if isinstance(exc, KubeApiError) else None


class KubeGoneError(KubeApiError):
    """``410 Gone``: the resourceVersion is too old (compacted); the client must list again."""


class KubeUnreachableError(KubeError):
    """No answer: connection refused or reset, a timeout, or a stream cut mid-response."""


def _status_object(exc: ApiException) -> dict[str, Any]:
    """The ``Status`` body the API server sends with errors (empty when the body is not one)."""
    body = exc.body
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str) and body.startswith("{"):
        try:
            status = json.loads(body)
        except ValueError:
            return {}
        if isinstance(status, dict):
            return status
    return {}


def retry_after_s(exc: ApiException, status: dict[str, Any]) -> float | None:
    """The seconds the server asked for: the ``Retry-After`` header (RFC 9110 section 10.2.3:
    delay-seconds or an HTTP-date, read by urllib3's parser), else the Status's
    ``details.retryAfterSeconds``; at most :data:`MAX_RETRY_AFTER_S`. ``None`` when neither says."""
    details = status.get("details")
    for raw in ((exc.headers or {}).get("Retry-After"),
                details.get("retryAfterSeconds") if isinstance(details, dict) else None):
        if raw is None:
            continue
        try:
            return min(Retry.DEFAULT.parse_retry_after(str(raw)), MAX_RETRY_AFTER_S)
        except InvalidHeader:
            continue
    return None


def from_api_exception(action: str, exc: ApiException) -> KubeApiError:
    """Our error for an ``ApiException`` (the caller chains it)."""
    status_object = _status_object(exc)
    reason = str(status_object.get("reason") or exc.reason or "")
    message = str(status_object.get("message") or "")
    status = exc.status if isinstance(exc.status, int) else None
    text = f"{action}: {status} {reason}" + (f": {message}" if message else "")
    cls = KubeGoneError if status == 410 else KubeApiError
    return cls(text, status, reason, retry_after_s(exc, status_object))


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
