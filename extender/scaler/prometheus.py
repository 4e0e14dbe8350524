"""The ``prometheus`` signal source: the demand rate and queue from PromQL instant queries.

``GET <url>/api/v1/query?query=<promql>`` (the Prometheus HTTP API), evaluated at the server's
current time. The policy may give both queries; otherwise they are built from the engine's metric
names (:mod:`extender.scaler.exposition`), the ``selector`` label matchers and ``rateWindow``::

    requests/s   sum(rate(<requests counter>{<selector>}[<window>]))
    tokens/s     sum(rate(<prompt>{<selector>}[<window>])) + sum(rate(<generation>{...}[<window>]))
    queue        sum(<waiting gauge>{<selector>})                                    (requests)
                 ... * <tokens rate> / <requests rate>                               (tokens/s)

One ``sum(rate(...))`` per counter, added: a single ``rate()`` over a ``__name__`` regex would drop
the names and leave two series with the same labels, which Prometheus refuses. If one of the
counters has no series at all, the sum is empty: no observation, rather than half the load.

Reading the result: a vector is summed over its series, a scalar taken as is. An empty vector is
no observation (the series do not exist, which is not the same as zero load: ``sum(rate(...))``
over existing series is 0, not empty). A query error, a timeout or a non-finite value is no
observation either. A failed queue query leaves the queue at zero and says so in the note.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode

from extender.core.errors import InvalidValueError, SignalError
from extender.core.policy import Profile
from extender.scaler.exposition import engine
from extender.scaler.observation import Fetcher, Observation, http_get
from extender.scaler.pods import Pod


def promql_duration(seconds: float) -> str:
    """A PromQL range duration: whole seconds as ``60s``, anything finer in milliseconds."""
    ms = max(1, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _matchers(selector: str) -> str:
    inner = selector.strip().strip("{}").strip()
    return f"{{{inner}}}" if inner else ""


def _rate(names: Sequence[str], selector: str, window: str) -> str:
    return " + ".join(f"sum(rate({n}{_matchers(selector)}[{window}]))" for n in names)


def _gauge(names: Sequence[str], selector: str) -> str:
    return " + ".join(f"sum({n}{_matchers(selector)})" for n in names)


def default_queries(profile: Profile) -> tuple[str, str]:
    """``(rate query, queue query)`` for a profile whose policy gives none (rules in the module docstring)."""
    if profile.autoscaling is None or profile.capacity is None:
        raise InvalidValueError(f"profile {profile.name!r} has no autoscaling section with a capacity")
    signal = profile.autoscaling.signal
    prom = signal.prometheus
    selector = prom.selector if prom is not None else ""
    window = promql_duration(prom.rate_window if prom is not None else 60.0)
    names = engine(signal.engine)
    tokens = profile.capacity.unit == "tokens/s"
    counters = signal.rate_metrics or (names.tokens if tokens else names.requests)
    rate = _rate(counters, selector, window)
    queue = _gauge(signal.queue_metrics or names.waiting, selector)
    if tokens and not signal.queue_metrics:
        queue = f"({queue}) * ({rate}) / ({_rate(names.requests, selector, window)})"
    return rate, queue


def parse_result(body: str) -> float | None:
    """The value of a ``/api/v1/query`` reply (vector summed, scalar as is); ``None`` if empty or non-finite.

    Raises :class:`SignalError` for an error reply or a body that is not one.
    """
    try:
        doc: Any = json.loads(body)
    except ValueError as exc:
        raise SignalError(f"not a Prometheus API reply: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("status") != "success":
        error = doc.get("error") if isinstance(doc, dict) else None
        raise SignalError(f"query failed: {error or 'no success status'}")
    data = doc.get("data") or {}
    kind, result = data.get("resultType"), data.get("result")
    try:
        if kind == "vector":
            if not result:
                return None
            total = sum(float(s["value"][1]) for s in result)
        elif kind == "scalar" and isinstance(result, list):
            total = float(result[1])
        else:
            raise SignalError(f"query returned a {kind}; need an instant vector or a scalar")
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise SignalError(f"unreadable query result: {exc}") from exc
    return total if math.isfinite(total) else None


class PrometheusSource:
    """Queries a Prometheus server for the demand (module docstring)."""

    name = "prometheus"

    def __init__(self, *, url: str, query: str, queue_query: str | None, timeout_s: float = 5.0,
                 fetch: Fetcher = http_get) -> None:
        self.url = url.rstrip("/")
        self.query = query
        self.queue_query = queue_query
        self.timeout_s = timeout_s
        self._fetch = fetch

    @classmethod
    def for_profile(cls, profile: Profile, fetch: Fetcher = http_get) -> PrometheusSource:
        """The source a profile's ``autoscaling.signal.prometheus`` describes."""
        if profile.autoscaling is None or profile.autoscaling.signal.prometheus is None:
            raise InvalidValueError(f"profile {profile.name!r} has no autoscaling.signal.prometheus section")
        prom = profile.autoscaling.signal.prometheus
        rate, queue = default_queries(profile)
        return cls(url=prom.url, query=prom.query or rate, queue_query=prom.queue_query or queue,
                   timeout_s=prom.timeout, fetch=fetch)

    def run(self, query: str) -> float | None:
        """Evaluate one instant query now; raises :class:`SignalError` on failure."""
        body = self._fetch(f"{self.url}/api/v1/query?{urlencode({'query': query})}", self.timeout_s)
        return parse_result(body)

    def observe(self, pods: Sequence[Pod], now: float) -> Observation:
        """The rate query's value and the queue query's (``pods`` are not needed: Prometheus found them)."""
        try:
            rate = self.run(self.query)
        except SignalError as exc:
            return Observation(rate=None, complete=False, expected=1, answered=0, note=f"rate query: {exc}")
        notes = [] if rate is not None else ["rate query returned no series"]
        queue = 0.0
        if self.queue_query:
            try:
                value = self.run(self.queue_query)
            except SignalError as exc:
                value = None
                notes.append(f"queue query: {exc}")
            queue = max(0.0, value) if value is not None else 0.0
        return Observation(rate=None if rate is None else max(0.0, rate), queue=queue, complete=rate is not None,
                           expected=1, answered=1, note="; ".join(notes))
