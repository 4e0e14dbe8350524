"""Prometheus metrics of the extender, correct under gunicorn's multiple worker processes.

Every worker is a separate process, so an in-memory registry would show only the worker that
happens to answer the scrape. With ``PROMETHEUS_MULTIPROC_DIR`` set (the launcher sets it before
anything imports ``prometheus_client``), values live in per-process files and ``/metrics``
aggregates all of them. Gauges that describe one worker's view (snapshot age, nodes known) use the
``live*`` modes, so a dead worker's last value disappears once gunicorn reports its exit.

Metric objects are created per app (with a private registry) rather than at import time, so
importing this module does nothing and tests can build many apps in one process.
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess, values

from extender.telemetry.build import add_build_info

#: Latency buckets from 0.5 ms: at 5,000 candidates a reply takes a few milliseconds, and the
#: scheduler's budget for all extenders together is about 10 ms per pod (docs/kubernetes-interfaces.md 6).
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


#: The series created at start (extender.api.scheduler.verbs and .refresher name the same values).
VERBS = ("filter", "prioritize")
OUTCOMES = ("scored", "unmatched", "fail_open", "bad_request", "error")
FAIL_OPEN_REASONS = ("no_snapshot", "store_unavailable", "stale_snapshot", "exception", "budget")
REFRESH_ERRORS = ("store_unavailable", "store_error", "bad_record")


def multiprocess_dir() -> str | None:
    """The multiprocess directory, when metrics are aggregated across workers."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class Metrics:
    """The extender's metric families."""

    def __init__(self) -> None:
        if multiprocess_dir() and not getattr(values.ValueClass, "_multiprocess", False):
            # prometheus_client picked its value class when first imported, before the variable
            # was set; metrics made now would be per-process and /metrics would lie.
            values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.latency = Histogram(
            "extender_request_duration_seconds", "Time to answer one scheduler call, by verb.",
            ["verb"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.requests = Counter(
            "extender_requests_total",
            "Calls by verb and outcome (scored, unmatched, fail_open, bad_request; error for an unexpected 500).",
            ["verb", "outcome"], registry=r,
        )
        self.fail_open = Counter(
            "extender_fail_open_total",
            "Neutral replies given because of a failure, by verb and reason.",
            ["verb", "reason"], registry=r,
        )
        self.snapshot_age = Gauge(
            "extender_snapshot_age_seconds",
            "Seconds since the worker last confirmed its inventory snapshot against the store (worst worker).",
            registry=r, multiprocess_mode="livemax",
        )
        self.snapshot_version = Gauge(
            "extender_snapshot_version", "Inventory version of the worker's snapshot (oldest worker).",
            registry=r, multiprocess_mode="livemin",
        )
        self.nodes_known = Gauge(
            "extender_nodes_known", "Nodes in the worker's inventory snapshot (largest worker).",
            registry=r, multiprocess_mode="livemax",
        )
        self.refresh_errors = Counter(
            "extender_snapshot_refresh_errors_total", "Failed snapshot refreshes, by reason.",
            ["reason"], registry=r,
        )
        self.policy_reloads = Counter(
            "extender_policy_reloads_total", "Policy file changes seen, by result (ok, invalid).",
            ["result"], registry=r,
        )
        add_build_info(r, "serve")
        # every labelled series exists from the start, so alerts on them have a series before the first event
        for verb in VERBS:
            self.latency.labels(verb)
            for outcome in OUTCOMES:
                self.requests.labels(verb, outcome)
            for reason in FAIL_OPEN_REASONS:
                self.fail_open.labels(verb, reason)
        for reason in REFRESH_ERRORS:
            self.refresh_errors.labels(reason)
        for result in ("ok", "invalid"):
            self.policy_reloads.labels(result)

    def exposition(self) -> bytes:
        """The text exposition of every worker's metrics (or this process's without multiprocess mode)."""
        if multiprocess_dir():
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
            return generate_latest(registry)
        return generate_latest(self.registry)


def aggregated_registry() -> CollectorRegistry:
    """A registry that reads every worker's values from the multiprocess directory (for ``--metrics-bind``)."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    return registry


def mark_worker_dead(pid: int) -> None:
    """Drop a dead worker's ``live*`` gauges (gunicorn's ``child_exit`` hook)."""
    if multiprocess_dir():
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
