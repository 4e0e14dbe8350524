"""The ``scrape`` signal source: read the serving pods' own Prometheus endpoints and turn counters into rates.

Per tick, every scrapeable pod of the workload (Running, with an IP, not terminating) is fetched
in parallel at ``<scheme>://<podIP>:<port><path>`` and parsed (:mod:`extender.scaler.exposition`).
The demand is the sum over pods of each pod's counter rate::

    rate_pod = sum_c delta_c / (now - t_prev)         c: the unit's counters (requests, or
                                                      prompt + generation tokens)
    delta_c  = v_c - v_prev_c       if v_c >= v_prev_c
             = v_c                  otherwise: the counter was reset (the engine restarted), so
                                    everything it counts now happened since the reset

Each pod keeps its own previous sample, so a pod whose scrape failed last tick gets its rate over
the longer interval when it answers again, and no requests are lost or counted twice.

Pods appearing and vanishing:

* a pod seen for the first time has no previous sample. If it started after our previous tick
  (``status.startTime``), its counters began at zero inside this interval, so
  ``rate_pod = sum_c v_c / (now - startTime)`` (a slight under-estimate: the engine starts after
  the pod does). Otherwise its rate starts next tick;
* a pod that vanished is forgotten; what it served since its last scrape is not counted.

Failures never invent load: a pod that did not answer (or answered without the counters)
contributes nothing, and if it was ready the observation is *incomplete*, i.e. a lower bound
(:mod:`extender.scaler.observation`). With no pod contributing a rate the observation is empty.

Queue: the sum of the engine's waiting gauges over the pods that answered, in requests. For a
``tokens/s`` workload it is converted to tokens with the tokens-per-request ratio of the latest tick
that had finished requests (no ratio known yet: the queue counts as zero, and the note says so).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from extender.core.errors import InvalidValueError, SignalError
from extender.core.policy import Profile
from extender.scaler.exposition import engine, read_sums
from extender.scaler.observation import Fetcher, Observation, http_get
from extender.scaler.pods import Pod

#: Pods scraped at once (each scrape waits up to the signal's timeout).
MAX_PARALLEL_SCRAPES = 16


@dataclass(frozen=True)
class _Previous:
    t: float
    counters: dict[str, float]


@dataclass(frozen=True)
class _PodReading:
    rate: float | None
    requests_rate: float | None
    queue: float
    failed: str


class ScrapeSource:
    """Scrapes a workload's pods (module docstring); keeps per-pod counter values between ticks."""

    name = "scrape"

    def __init__(
        self,
        *,
        rate_metrics: Sequence[str],
        request_metrics: Sequence[str],
        queue_metrics: Sequence[str],
        queue_to_tokens: bool,
        port: int,
        path: str = "/metrics",
        scheme: str = "http",
        timeout_s: float = 2.0,
        fetch: Fetcher = http_get,
    ) -> None:
        if not rate_metrics:
            raise InvalidValueError("the scrape source needs at least one counter for the rate")
        self.rate_metrics = tuple(rate_metrics)
        self.request_metrics = tuple(request_metrics)
        self.queue_metrics = tuple(queue_metrics)
        self.queue_to_tokens = queue_to_tokens
        self.port, self.path, self.scheme, self.timeout_s = port, path, scheme, timeout_s
        self._fetch = fetch
        self._previous: dict[str, _Previous] = {}
        self._last_now: float | None = None
        self._tokens_per_request: float | None = None

    @classmethod
    def for_profile(cls, profile: Profile, fetch: Fetcher = http_get) -> ScrapeSource:
        """The source a profile's ``autoscaling.signal`` describes (engine names unless overridden)."""
        if profile.autoscaling is None or profile.capacity is None:
            raise InvalidValueError(f"profile {profile.name!r} has no autoscaling section with a capacity")
        signal = profile.autoscaling.signal
        names = engine(signal.engine)
        tokens = profile.capacity.unit == "tokens/s"
        rate = signal.rate_metrics or (names.tokens if tokens else names.requests)
        return cls(
            rate_metrics=rate,
            request_metrics=names.requests,
            queue_metrics=signal.queue_metrics or names.waiting,
            # an explicit queue metric is taken to be in the workload's unit already
            queue_to_tokens=tokens and not signal.queue_metrics,
            port=signal.port, path=signal.path, scheme=signal.scheme, timeout_s=signal.timeout, fetch=fetch,
        )

    def url(self, pod: Pod) -> str:
        host = f"[{pod.ip}]" if pod.ip and ":" in pod.ip else pod.ip
        return f"{self.scheme}://{host}:{self.port}{self.path}"

    def _get(self, pod: Pod) -> str | SignalError:
        try:
            return self._fetch(self.url(pod), self.timeout_s)
        except SignalError as exc:
            return exc

    def observe(self, pods: Sequence[Pod], now: float) -> Observation:
        """Scrape every scrapeable pod once and combine (rules in the module docstring)."""
        targets = [p for p in pods if p.scrapeable]
        bodies: list[str | SignalError] = []
        if targets:
            with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_SCRAPES, len(targets)),
                                    thread_name_prefix="scrape") as pool:
                bodies = list(pool.map(self._get, targets))
        readings = {p.key: self._read(p, body, now) for p, body in zip(targets, bodies, strict=True)}
        live = {p.key for p in pods}
        self._previous = {k: v for k, v in self._previous.items() if k in live}
        self._last_now = now  # after the readings: _read compares start times with the previous tick
        return self._combine(targets, readings)

    def _read(self, pod: Pod, body: str | SignalError, now: float) -> _PodReading:
        if isinstance(body, SignalError):
            return _PodReading(None, None, 0.0, f"{pod.namespace}/{pod.name}: {body}")
        counters = (*self.rate_metrics, *self.request_metrics)
        try:
            sums = read_sums(body, (*counters, *self.queue_metrics), counters)
        except InvalidValueError as exc:  # its previous sample is kept: the next good reading spans both ticks
            return _PodReading(None, None, 0.0, f"{pod.namespace}/{pod.name}: {exc}")
        queue = sum(v for n in self.queue_metrics if (v := sums.get(n)) is not None)
        values = {n: v for n in counters if (v := sums.get(n)) is not None}
        missing = [n for n in self.rate_metrics if n not in values]
        previous = self._previous.get(pod.key)
        self._previous[pod.key] = _Previous(now, values)
        if missing:
            return _PodReading(None, None, queue, f"{pod.namespace}/{pod.name}: no {', '.join(missing)}")
        if previous is not None and now > previous.t:
            dt = now - previous.t
            base = previous.counters
        elif (previous is None and pod.start_time is not None and self._last_now is not None
              and pod.start_time > self._last_now and now > pod.start_time):
            dt = now - pod.start_time  # started since our last tick: its counters began at zero
            base = {}
        else:
            return _PodReading(None, None, queue, "")  # first sight of an older pod: rate from next tick

        def delta(names: Sequence[str]) -> float | None:
            if any(n not in values for n in names):
                return None
            total = 0.0
            for n in names:
                v, before = values[n], base.get(n, 0.0)
                total += v - before if v >= before else v  # a drop is a counter reset
            return total

        rate = delta(self.rate_metrics)
        requests = delta(self.request_metrics) if self.request_metrics else None
        return _PodReading(None if rate is None else rate / dt, None if requests is None else requests / dt,
                           queue, "")

    def _combine(self, targets: Sequence[Pod], readings: dict[str, _PodReading]) -> Observation:
        ready = [p for p in targets if p.ready]
        rates = [r.rate for r in readings.values() if r.rate is not None]
        failures = [r.failed for r in readings.values() if r.failed]
        missing_ready = [p for p in ready if readings[p.key].rate is None]
        answered = sum(1 for r in readings.values() if not r.failed)
        queue = sum(r.queue for r in readings.values() if not r.failed)
        notes: list[str] = []
        if failures:
            notes.append("; ".join(failures[:3]) + (f" (+{len(failures) - 3} more)" if len(failures) > 3 else ""))
        rate = sum(rates) if rates else None
        if self.queue_to_tokens:
            token_rate = sum(r.rate for r in readings.values() if r.rate is not None and r.requests_rate is not None)
            request_rate = sum(r.requests_rate for r in readings.values()
                               if r.rate is not None and r.requests_rate is not None)
            if request_rate > 0:
                self._tokens_per_request = token_rate / request_rate
            if self._tokens_per_request is None:
                if queue > 0:
                    notes.append(f"queue of {queue:g} requests not converted to tokens: no finished requests seen yet")
                queue = 0.0
            else:
                queue *= self._tokens_per_request
        if not targets:
            notes.append("no running pods to scrape")
        elif rate is None and not failures:
            notes.append("first scrape of these pods: the rate starts next tick")
        elif missing_ready:
            notes.append(f"{len(ready) - len(missing_ready)} of {len(ready)} ready pods gave a rate: lower bound")
        return Observation(rate=rate, queue=queue, complete=rate is not None and not missing_ready,
                           expected=len(targets), answered=answered, note="; ".join(notes))
