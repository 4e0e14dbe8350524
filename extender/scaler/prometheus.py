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
observation either. A failed queue query (an error or a timeout) leaves the queue at zero, says so
in the note and makes the observation incomplete: the demand is then a lower bound, which may raise
the decision but not lower it (docs/scaler.md section 7). An empty or non-finite queue is zero (no
series waiting; ``0 / 0`` of the tokens/s conversion while idle), and complete.

**The past** (``backfill``, on by default): the same two queries as range queries,
``GET <url>/api/v1/query_range?query=...&start=...&end=...&step=...``, evaluated at every ``step``
from ``start`` to ``end``, which is what the instant query would have said at each of those times.
A matrix is summed over its series at each time, as a vector is. Prometheus refuses more than
11,000 points per series in one query, so a long range is asked for in pieces of at most
:data:`RANGE_POINTS`. A time with no rate is left out (a gap, as a missed tick is); a time with no
queue value has a queue of zero. The scaler fills a short history with it
(:mod:`extender.scaler.loop`).
"""

from __future__ import annotations

import base64
import json
import math
import os
import ssl
import threading
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode

from extender.core.errors import InvalidValueError, SignalError
from extender.core.policy import Policy, Profile, PrometheusSignal
from extender.scaler.exposition import engine
from extender.scaler.observation import Fetcher, Observation, http_get
from extender.scaler.pods import Pod
from extender.state.history import Sample

#: Points per series asked for in one range query (Prometheus refuses more than 11,000).
RANGE_POINTS = 10_000
#: Time limit of one range query at least (a day of 15 s points is more work than an instant query),
#: and of all the range queries of one fill by default.
RANGE_TIMEOUT_S = 30.0


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


def _data(body: str) -> tuple[Any, Any]:
    """``(resultType, result)`` of a successful API reply; :class:`SignalError` otherwise."""
    try:
        doc: Any = json.loads(body)
    except ValueError as exc:
        raise SignalError(f"not a Prometheus API reply: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("status") != "success":
        error = doc.get("error") if isinstance(doc, dict) else None
        raise SignalError(f"query failed: {error or 'no success status'}")
    data = doc.get("data") or {}
    return data.get("resultType"), data.get("result")


def parse_result(body: str) -> float | None:
    """The value of a ``/api/v1/query`` reply (vector summed, scalar as is); ``None`` if empty or non-finite.

    Raises :class:`SignalError` for an error reply or a body that is not one.
    """
    kind, result = _data(body)
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


def parse_range(body: str) -> dict[float, float]:
    """The values of a ``/api/v1/query_range`` reply by time, summed over the series (a time where
    the sum is not finite is left out). Raises :class:`SignalError` as :func:`parse_result` does."""
    kind, result = _data(body)
    if kind != "matrix" or not isinstance(result, list):
        raise SignalError(f"range query returned a {kind}; need a range vector")
    out: dict[float, float] = {}
    try:
        for series in result:
            for t, v in series["values"]:
                out[float(t)] = out.get(float(t), 0.0) + float(v)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise SignalError(f"unreadable range query result: {exc}") from exc
    return {t: v for t, v in sorted(out.items()) if math.isfinite(v)}


#: Largest secret file read (a token or a password; a service-account JWT is about 1 KB).
MAX_SECRET_BYTES = 64 * 1024


class WatchedFile:
    """A small file re-read when its identity changes (mtime, size, inode: one ``stat`` per use).

    ``field`` names it in errors the way the policy does (``bearerTokenFile``, ``tls.caFile``).
    """

    def __init__(self, path: str, field: str) -> None:
        self.path = path
        self.field = field
        self._signature: tuple[int, int, int] | None = None
        self._text = ""

    def _fail(self, exc: OSError | str) -> SignalError:
        reason = exc if isinstance(exc, str) else (exc.strerror or str(exc))
        return SignalError(f"prometheus {self.field} {self.path}: cannot read: {reason}")

    def signature(self) -> tuple[int, int, int]:
        """The file's identity now; raises :class:`SignalError` when it cannot be seen."""
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise self._fail(exc) from exc
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def text(self) -> str:
        """The content with surrounding whitespace dropped, read again only after a change; never empty."""
        signature = self.signature()
        if signature != self._signature:
            try:
                with open(self.path, "rb") as f:
                    raw = f.read(MAX_SECRET_BYTES + 1)
            except OSError as exc:
                raise self._fail(exc) from exc
            if len(raw) > MAX_SECRET_BYTES:
                raise self._fail(f"larger than {MAX_SECRET_BYTES} bytes: not a token or a password")
            text = raw.decode("utf-8", errors="replace").strip()
            if not text:
                raise self._fail("the file is empty")
            if not text.isprintable():
                raise self._fail("it holds control characters (one token or password, nothing else)")
            self._signature, self._text = signature, text
        return self._text


class Credentials:
    """What each query carries: headers and the TLS context (module docstring); thread-safe."""

    def __init__(self, prom: PrometheusSignal) -> None:
        self.static_headers = dict(prom.headers)
        self.token = WatchedFile(prom.bearer_token_file, "bearerTokenFile") if prom.bearer_token_file else None
        self.username = prom.basic_auth.username if prom.basic_auth else None
        self.password = WatchedFile(prom.basic_auth.password_file, "basicAuth.passwordFile") \
            if prom.basic_auth else None
        tls = prom.tls
        self.tls_files = [] if tls is None else [
            WatchedFile(path, f"tls.{field}") for field, path in
            (("caFile", tls.ca_file), ("certFile", tls.cert_file), ("keyFile", tls.key_file)) if path]
        self.ca_file = tls.ca_file if tls else None
        self.cert_file = tls.cert_file if tls else None
        self.key_file = tls.key_file if tls else None
        self._lock = threading.Lock()
        self._context: ssl.SSLContext | None = None
        self._context_of: tuple[tuple[int, int, int], ...] | None = None

    @property
    def uses_tls(self) -> bool:
        return bool(self.tls_files)

    def headers(self) -> dict[str, str]:
        """The request headers: the policy's, plus Authorization from the current token or password."""
        headers = dict(self.static_headers)
        with self._lock:
            if self.token is not None:
                headers["Authorization"] = f"Bearer {self.token.text()}"
            elif self.password is not None:
                pair = f"{self.username}:{self.password.text()}".encode()
                headers["Authorization"] = f"Basic {base64.b64encode(pair).decode('ascii')}"
        return headers

    def context(self) -> ssl.SSLContext | None:
        """The TLS context for ``tls`` (built again when one of its files changed); ``None`` without ``tls``."""
        if not self.tls_files:
            return None
        with self._lock:
            signatures = tuple(f.signature() for f in self.tls_files)
            if signatures != self._context_of:
                self._context = self._build()
                self._context_of = signatures
            return self._context

    def _build(self) -> ssl.SSLContext:
        try:
            context = ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise SignalError(f"prometheus tls.caFile {self.ca_file}: not a readable PEM CA bundle: {exc}") from exc
        if self.cert_file is not None:
            try:
                context.load_cert_chain(self.cert_file, self.key_file)
            except (OSError, ssl.SSLError) as exc:
                raise SignalError(f"prometheus tls.certFile {self.cert_file} / tls.keyFile {self.key_file}: "
                                  f"not a readable PEM certificate and matching key: {exc}") from exc
        return context

    def check(self) -> None:
        """Read every file now; raises :class:`SignalError` naming the first one that is unusable."""
        self.headers()
        self.context()


def check_credentials(policy: Policy) -> list[str]:
    """For each profile whose signal is ``prometheus``: what is wrong with its secret and certificate files now."""
    problems = []
    for profile in policy.profiles:
        signal = profile.autoscaling.signal if profile.autoscaling else None
        if signal is None or signal.source != "prometheus" or signal.prometheus is None:
            continue
        try:
            Credentials(signal.prometheus).check()
        except SignalError as exc:
            problems.append(f"profile {profile.name}: {exc}")
    return problems


class PrometheusSource:
    """Queries a Prometheus server for the demand (module docstring)."""

    name = "prometheus"

    def __init__(self, *, url: str, query: str, queue_query: str | None, timeout_s: float = 5.0,
                 fetch: Fetcher = http_get, credentials: Credentials | None = None, backfill: bool = True) -> None:
        self.backfill = backfill
        self.url = url.rstrip("/")
        self.query = query
        self.queue_query = queue_query
        self.timeout_s = timeout_s
        self._fetch = fetch
        self.credentials = credentials

    @classmethod
    def for_profile(cls, profile: Profile, fetch: Fetcher = http_get) -> PrometheusSource:
        """The source a profile's ``autoscaling.signal.prometheus`` describes."""
        if profile.autoscaling is None or profile.autoscaling.signal.prometheus is None:
            raise InvalidValueError(f"profile {profile.name!r} has no autoscaling.signal.prometheus section")
        prom = profile.autoscaling.signal.prometheus
        rate, queue = default_queries(profile)
        return cls(url=prom.url, query=prom.query or rate, queue_query=prom.queue_query or queue,
                   timeout_s=prom.timeout, fetch=fetch, credentials=Credentials(prom), backfill=prom.backfill)

    def run(self, query: str) -> float | None:
        """Evaluate one instant query now; raises :class:`SignalError` on failure."""
        return parse_result(self._get("query", {"query": query}, timeout_s=self.timeout_s))

    def run_range(self, query: str, start: float, end: float, step: float, *, until: float) -> dict[float, float]:
        """Evaluate one range query in pieces of at most :data:`RANGE_POINTS` (module docstring), all
        of them before ``until`` (``time.monotonic()``); raises :class:`SignalError` on failure."""
        out: dict[float, float] = {}
        n = math.floor((end - start) / step + 1e-9) + 1  # points from start to end
        for first in range(0, max(n, 0), RANGE_POINTS):
            left = until - time.monotonic()
            if left <= 0:
                raise SignalError("the range queries ran out of their time")
            last = min(first + RANGE_POINTS, n) - 1
            out.update(parse_range(self._get("query_range", {
                "query": query, "start": repr(start + first * step), "end": repr(start + last * step),
                "step": repr(step)}, timeout_s=min(left, max(self.timeout_s, RANGE_TIMEOUT_S)))))
        return out

    def _get(self, endpoint: str, params: dict[str, str], *, timeout_s: float) -> str:
        url = f"{self.url}/api/v1/{endpoint}?{urlencode(params)}"
        if self.credentials is None:
            return self._fetch(url, timeout_s)
        try:
            return self._fetch(url, timeout_s, headers=self.credentials.headers(),
                               context=self.credentials.context())
        except SignalError as exc:
            if " HTTP 401 " in f"{exc} " or " HTTP 403 " in f"{exc} ":
                raise SignalError(f"{exc} (check the profile's prometheus bearerTokenFile, basicAuth, tls and "
                                  "headers)") from exc
            raise

    def past(self, start: float, end: float, step: float, *, budget_s: float = RANGE_TIMEOUT_S) -> list[Sample]:
        """The rate and queue queries at every ``step`` from ``start`` to ``end`` (module docstring),
        every query within ``budget_s`` in all."""
        until = time.monotonic() + budget_s
        rates = self.run_range(self.query, start, end, step, until=until)
        queues = self.run_range(self.queue_query, start, end, step, until=until) if self.queue_query and rates else {}
        return [Sample(t, max(0.0, rate), max(0.0, queues.get(t, 0.0))) for t, rate in rates.items()]

    def observe(self, pods: Sequence[Pod], now: float) -> Observation:
        """The rate query's value and the queue query's (``pods`` are not needed: Prometheus found them)."""
        try:
            rate = self.run(self.query)
        except SignalError as exc:
            return Observation(rate=None, complete=False, expected=1, answered=0, note=f"rate query: {exc}")
        notes = [] if rate is not None else ["rate query returned no series"]
        queue, queue_answered = 0.0, True
        if self.queue_query:
            try:
                value = self.run(self.queue_query)
            except SignalError as exc:
                # the queue is unknown, so rate + 0 is a lower bound of the demand: no scale-down on it
                value, queue_answered = None, False
                notes.append(f"queue query: {exc}")
            queue = max(0.0, value) if value is not None else 0.0
        return Observation(rate=None if rate is None else max(0.0, rate), queue=queue,
                           complete=rate is not None and queue_answered, expected=1, answered=1,
                           note="; ".join(notes))
