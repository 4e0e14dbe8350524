"""Prometheus metrics of ``extender keda-scaler`` (served by ``--metrics-bind``).

Calls are counted by method and gRPC status code (``OK`` or the code the call was aborted with);
unary calls are timed. Every labelled series exists from the start. What ``GetMetrics`` served, per
workload (the age of its decision, the ``0`` of none), is recorded in the families the External
Metrics API shares (:mod:`extender.telemetry.served`, ``api="keda"``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

METHODS = ("GetMetricSpec", "GetMetrics", "IsActive", "StreamIsActive")
CODES = ("OK", "INVALID_ARGUMENT", "NOT_FOUND", "UNAVAILABLE", "DATA_LOSS", "CANCELLED", "UNKNOWN")
CALL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class KedaMetrics:
    """The KEDA scaler's metric families."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = self.registry = registry
        self.calls = Counter("extender_keda_requests_total", "gRPC calls finished, by method and status code.",
                             ["method", "code"], registry=r)
        self.duration = Histogram("extender_keda_request_duration_seconds", "Time to answer a unary gRPC call.",
                                  ["method"], buckets=CALL_BUCKETS, registry=r)
        self.streams = Gauge("extender_keda_streams_open", "StreamIsActive streams open.", registry=r)
        self.readable = Gauge("extender_keda_decisions_readable",
                              "1 while the scaler's published decisions can be read from the store, else 0.",
                              registry=r)
        self.workloads = Gauge("extender_keda_workloads", "Autoscaled workloads served.", registry=r)
        for method in METHODS:
            if method != "StreamIsActive":
                self.duration.labels(method)
            for code in CODES:
                self.calls.labels(method, code)

    @contextmanager
    def call(self, method: str, context: Any, *, timed: bool = True) -> Iterator[None]:
        """Count (and time) one call; the code is ``OK`` unless it raised (then the context's code)."""
        started = time.perf_counter()
        code = "OK"
        try:
            yield
        except BaseException:
            code = status_name(context)
            raise
        finally:
            self.calls.labels(method, code).inc()
            if timed:
                self.duration.labels(method).observe(time.perf_counter() - started)


def status_name(context: Any) -> str:
    """The name of the status code a servicer context was aborted with (``UNKNOWN`` when it has none)."""
    try:
        code = context.code()
    except Exception:
        return "UNKNOWN"
    name = getattr(code, "name", None)
    return name if isinstance(name, str) else "CANCELLED" if code is None else "UNKNOWN"
