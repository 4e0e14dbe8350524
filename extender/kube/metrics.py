"""Prometheus metrics of ``extender sync``: its list-watches, its writes, and the estimator's truth.

Served by ``--metrics-bind`` (:mod:`extender.telemetry.endpoint`). Every labelled series exists from
the start.

* Reflectors: ``relists`` are lists after the first (a watch whose resourceVersion was compacted
  away, 410 Gone, or a policy edit that changes what is watched); ``watch restarts`` are watches
  opened after the first (the server ends each watch after its timeout, so a steady rate is normal;
  a burst means the connection keeps failing).
* Node problems: nodes the API server lists that the sync cannot read (their last facts and
  records are kept), nodes whose report left out what a record cannot hold (labels, image
  names), and nodes whose report the store refuses (the merged record is over its size limit).
* Engine logs: reads of a new replica's engine log for its phase times (profiles that set
  ``engineLog``), by result (:data:`extender.kube.observe.LOG_RESULTS`): a start is recorded
  whatever the result, with the phase times only when ``read``.
* Lag: seconds from a change reaching the writer (the view marks a node dirty) to the store
  confirming the write that carries it.
* Estimator truth, for each new replica whose start the calibration observer records
  (:mod:`extender.kube.observe`; needs ``calibration.mode`` ``observe`` or ``apply``): the observed
  seconds from scheduled to Ready, the estimator's seconds for the same node state, and their ratio
  ``estimated / observed`` (1: exact; 0.5: the start took twice the estimate;
  :func:`extender.core.calibration.estimate_errors`). A ratio, not the relative error
  ``(estimated - observed) / observed``: a histogram's ``_sum`` must never decrease, or ``rate()``
  reads the decrease as a counter reset, and relative errors are negative when a start is slow.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from extender.core.calibration import Observation, estimate_errors
from extender.core.policy import Policy
from extender.kube.observe import LOG_RESULTS

RESOURCES = ("nodes", "pods")
#: Kinds of ``extender_sync_node_problems`` (module docstring).
NODE_PROBLEMS = ("unreadable", "trimmed", "refused")
EVENT_TYPES = ("ADDED", "MODIFIED", "DELETED")
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: Replica starts: 15 s (everything warm) to half an hour (cold, large model).
STARTUP_BUCKETS = (5.0, 10.0, 15.0, 30.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0, 900.0, 1800.0, 3600.0)
#: Estimated over observed seconds: 1 is exact, 0.5 a start twice as slow as estimated, 2 twice as fast.
RATIO_BUCKETS = (0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0)


class SyncMetrics:
    """The sync's metric families; the reflectors call :meth:`note`, the writer :meth:`wrote`."""

    def __init__(self, registry: CollectorRegistry, policy: Policy) -> None:
        r = self.registry = registry
        self.lists = Counter("extender_sync_lists_total", "Full lists of a resource, the first included.",
                             ["resource"], registry=r)
        self.relists = Counter("extender_sync_relists_total",
                               "Lists after the first (the watch's resourceVersion was too old, or a policy edit).",
                               ["resource"], registry=r)
        self.watch_restarts = Counter("extender_sync_watch_restarts_total", "Watches opened after the first.",
                                      ["resource"], registry=r)
        self.watch_errors = Counter("extender_sync_watch_errors_total",
                                    "Failed lists or watches, retried with backoff.", ["resource"], registry=r)
        self.events = Counter("extender_sync_events_total", "Watch events handled, by resource and type.",
                              ["resource", "type"], registry=r)
        self.writes = Counter("extender_sync_writes_total", "Writes of node reports to the store, by result.",
                              ["result"], registry=r)
        self.lag = Histogram("extender_sync_write_lag_seconds",
                             "Seconds from a change reaching the writer to the store confirming it.",
                             buckets=LAG_BUCKETS, registry=r)
        self.last_write = Gauge("extender_sync_last_write_timestamp_seconds",
                                "Unix time of the last write the store confirmed.", registry=r)
        self.nodes = Gauge("extender_sync_nodes", "Nodes in the sync's view of the cluster.", registry=r)
        self.synced = Gauge("extender_sync_synced", "1 once both reflectors have listed, else 0.", registry=r)
        self.node_problems = Gauge("extender_sync_node_problems",
                                   "Nodes whose record cannot be what the API server says, by kind (unreadable: "
                                   "last facts kept; trimmed: what a record cannot hold left out; refused: the "
                                   "store refuses the report).", ["kind"], registry=r)
        self.engine_logs = Counter("extender_sync_engine_logs_total",
                                   "Reads of a new replica's engine log for its phase times (profiles with "
                                   "engineLog), by result.", ["result"], registry=r)
        self.startup = Histogram("extender_replica_startup_seconds",
                                 "Observed seconds from a new replica's scheduling to Ready.",
                                 ["workload", "node_class"], buckets=STARTUP_BUCKETS, registry=r)
        self.estimated = Histogram("extender_replica_startup_estimate_seconds",
                                   "The estimator's seconds for the same starts, from their node's state.",
                                   ["workload", "node_class"], buckets=STARTUP_BUCKETS, registry=r)
        self.ratio = Histogram("extender_replica_startup_estimate_ratio",
                               "Estimated over observed startup seconds of each observed start (1: exact).",
                               ["workload", "node_class"], buckets=RATIO_BUCKETS, registry=r)
        self._seen: set[tuple[str, str]] = set()
        for resource in RESOURCES:
            for c in (self.lists, self.relists, self.watch_restarts, self.watch_errors):
                c.labels(resource)
            for etype in EVENT_TYPES:
                self.events.labels(resource, etype)
        for result in ("ok", "failed"):
            self.writes.labels(result)
        for kind in NODE_PROBLEMS:
            self.node_problems.labels(kind)
        for result in LOG_RESULTS:
            self.engine_logs.labels(result)
        self.synced.set(0)
        self.set_policy(policy)

    def set_policy(self, policy: Policy) -> None:
        """Estimate with ``policy`` from now on, and create the startup series of its workloads and classes.

        Created at zero before their first start, as at start: ``rate()`` and ``increase()`` take a
        series' first sample as their baseline, so a workload a policy edit adds would otherwise
        lose its first observed start to ExtenderStartupEstimateOff and the dashboard. Series of
        workloads the edit drops stay: they are cumulative, and their rates fall to zero.
        """
        self.policy = policy
        for profile in policy.profiles:
            for node_class in policy.node_classes:
                if profile.node_classes and node_class.name not in profile.node_classes:
                    continue
                for h in (self.startup, self.estimated, self.ratio):
                    h.labels(profile.name, node_class.name)

    def note(self, resource: str, what: str) -> None:
        """From a reflector: ``list``, ``watch``, ``error``, or an event type."""
        first = (resource, what) not in self._seen
        self._seen.add((resource, what))
        if what == "list":
            self.lists.labels(resource).inc()
            if not first:
                self.relists.labels(resource).inc()
        elif what == "watch":
            if not first:
                self.watch_restarts.labels(resource).inc()
        elif what == "error":
            self.watch_errors.labels(resource).inc()
        elif what in EVENT_TYPES:
            self.events.labels(resource, what).inc()

    def engine_log(self, result: str) -> None:
        """From the start observer: one engine log read (a result of :data:`extender.kube.observe.LOG_RESULTS`)."""
        self.engine_logs.labels(result).inc()

    def wrote(self, ok: bool, *, lag_s: float | None = None, at: float = 0.0) -> None:
        self.writes.labels("ok" if ok else "failed").inc()
        if ok:
            self.last_write.set(at)
            if lag_s is not None:
                self.lag.observe(max(0.0, lag_s))

    def starts(self, observations: Sequence[Observation], policy: Policy | None = None) -> None:
        """Record recorded starts: observed seconds, estimated seconds, their ratio (module docstring)."""
        for o in observations:
            self.startup.labels(o.workload, o.node_class).observe(o.total_s)
        for e in estimate_errors(policy or self.policy, observations):
            self.estimated.labels(e.workload, e.node_class).observe(e.estimated_s)
            if e.observed_s > 0:
                self.ratio.labels(e.workload, e.node_class).observe(e.estimated_s / e.observed_s)
