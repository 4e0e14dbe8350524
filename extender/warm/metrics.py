"""Prometheus metrics of the cache warmer.

Created per :class:`~extender.warm.loop.WarmLoop` on a registry the caller passes (the scaler's, so
one ``/metrics`` shows both), or a private one; importing this module registers nothing. Every
label set the loop can write is created at start (alerts have a series before the first event).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from extender.core.policy import Policy
from extender.core.warming import KINDS

#: The values the loop writes, created at start.
PURPOSES = ("demand", "keep-warm")
SKIP_REASONS = ("disabled", "no-template", "backoff", "eviction-unsafe", "error")
JOB_KINDS: tuple[str, ...] = (*KINDS, "publish")
OUTCOMES = ("confirmed", "failed", "unconfirmed")
OPERATIONS = ("read", "plan", "create-job", "delete-job", "event", "publish", "taint")
TAINT_CHANGES = (("added", "joined"), ("removed", "disabled"), ("removed", "policy"), ("removed", "warm"),
                 ("removed", "max-taint"))


class WarmMetrics:
    """The warmer's metric families."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.planned = Counter(
            "extender_warm_actions_planned_total", "Warm actions the planner chose, by kind and purpose.",
            ["kind", "purpose"], registry=r,
        )
        self.skipped = Counter(
            "extender_warm_actions_skipped_total",
            "Planned actions not started, by reason (disabled, no-template, backoff, eviction-unsafe, error).",
            ["reason"], registry=r,
        )
        self.started = Counter(
            "extender_warm_jobs_started_total", "Warm Jobs created (an existing Job counts as started once).",
            ["kind"], registry=r,
        )
        self.finished = Counter(
            "extender_warm_jobs_finished_total",
            "Warm Jobs finished, by outcome: confirmed (the agent reports the cache), failed, unconfirmed.",
            ["kind", "outcome"], registry=r,
        )
        self.retries = Counter(
            "extender_warm_jobs_retried_total", "Failed warm Jobs removed so the action can run again.",
            ["kind"], registry=r,
        )
        self.in_flight = Gauge(
            "extender_warm_jobs_in_flight", "Warm Jobs running or awaiting the agent's confirmation.",
            ["kind"], registry=r,
        )
        self.backing_off = Gauge(
            "extender_warm_jobs_backing_off", "Failed warm actions waiting for their retry.", registry=r,
        )
        self.published = Counter(
            "extender_warm_compile_published_total", "Compile-cache keys added to the registry.", registry=r,
        )
        self.tainted = Gauge(
            "extender_warm_nodes_tainted", "New nodes the warmer keeps tainted until warm.", registry=r,
        )
        self.taint_changes = Counter(
            "extender_warm_taint_changes_total", "Warming taints added or removed, by change and why.",
            ["change", "reason"], registry=r,
        )
        self.errors = Counter(
            "extender_warm_errors_total", "Failed calls to the API server or the store, by operation.",
            ["operation"], registry=r,
        )
        self.below_reserve = Gauge(
            "extender_warm_nodes_below_nvme_reserve",
            "Fresh nodes whose free NVMe is below their class's reserve, by node class (the planner's last read).",
            ["node_class"], registry=r,
        )
        self.saved = Gauge(
            "extender_warm_plan_saved_seconds",
            "Expected replica startup seconds the last plan's actions save, by workload.",
            ["workload"], registry=r,
        )
        #: The workloads and node classes whose series exist (:meth:`set_policy`).
        self._workloads: frozenset[str] = frozenset()
        self._classes: frozenset[str] = frozenset()
        for kind in KINDS:
            for purpose in PURPOSES:
                self.planned.labels(kind, purpose)
        for reason in SKIP_REASONS:
            self.skipped.labels(reason)
        for job_kind in JOB_KINDS:
            self.started.labels(job_kind)
            self.retries.labels(job_kind)
            self.in_flight.labels(job_kind)
            for outcome in OUTCOMES:
                self.finished.labels(job_kind, outcome)
        for operation in OPERATIONS:
            self.errors.labels(operation)
        for change, reason in TAINT_CHANGES:
            self.taint_changes.labels(change, reason)

    def set_policy(self, policy: Policy) -> None:
        """Create the series of ``policy``'s workloads and node classes; drop those of the ones it no longer has.

        Nothing writes the gauge of a node class or workload the policy dropped, so its last value
        would stay until a restart: a class renamed while two of its nodes were below the reserve
        would hold ExtenderNvmeReserveBreached firing for a class that no longer exists.
        """
        workloads = frozenset(profile.name for profile in policy.profiles)
        classes = frozenset(node_class.name for node_class in policy.node_classes)
        for workload in self._workloads - workloads:
            self.saved.remove(workload)
        for node_class in self._classes - classes:
            self.below_reserve.remove(node_class)
        self._workloads, self._classes = workloads, classes
        for workload in workloads:
            self.saved.labels(workload)
        for node_class in classes:
            self.below_reserve.labels(node_class)
