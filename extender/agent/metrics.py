"""Prometheus metrics of ``extender agent`` (served by ``--metrics-bind``, :mod:`extender.telemetry.endpoint`).

One agent per node, so the series carry no node label: the PodMonitor's relabelling adds the pod's
node (deploy/monitoring). Bytes per cache kind: weights from their manifests, the other kinds from
the measured sizes of their entries (:class:`extender.agent.scan.SizeCache`).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from extender.agent.scan import CacheScan
from extender.core.caches import NVME_KINDS, parse_cache_id
from extender.core.reports import AgentReport
from extender.cri import REASONS

#: Cache kinds on the node's NVMe: weights, compile, snapshot, adapter.
KINDS = tuple(spec.kind for spec in NVME_KINDS)
#: A scan walks the cache root: milliseconds for a few entries, seconds for a big tree on a slow disk.
SCAN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class AgentMetrics:
    """The agent's metric families; the agent calls :meth:`scanned`, :meth:`wrote` and :meth:`runtime_failed`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = self.registry = registry
        self.scan_duration = Histogram("extender_agent_scan_duration_seconds",
                                       "Time one scan of the cache root (and hub caches) took.",
                                       buckets=SCAN_BUCKETS, registry=r)
        self.cache_bytes = Gauge("extender_agent_cache_bytes", "Bytes of cache entries on the node, by kind.",
                                 ["kind"], registry=r)
        self.cache_entries = Gauge("extender_agent_cache_entries", "Cache entries on the node, by kind.",
                                   ["kind"], registry=r)
        self.nvme_capacity = Gauge("extender_agent_nvme_capacity_bytes", "Size of the cache root's filesystem.",
                                   registry=r)
        self.nvme_free = Gauge("extender_agent_nvme_free_bytes", "Free bytes on the cache root's filesystem.",
                               registry=r)
        self.problems = Gauge("extender_agent_scan_problems",
                              "Paths the last scan could not use as they are (unreadable, inconsistent, ...).",
                              registry=r)
        self.reports = Counter("extender_agent_reports_total",
                               "Reports written to the inventory (whole, or bare heartbeats), by result "
                               "(written, failed).", ["result"], registry=r)
        self.last_report = Gauge("extender_agent_last_report_timestamp_seconds",
                                 "Unix time of the last report the store accepted.", registry=r)
        self.runtime_failures = Counter("extender_agent_runtime_image_list_failures_total",
                                        "Image lists the container runtime did not give (--cri-socket), by reason "
                                        "(unreachable, timeout, unimplemented, too-large, error).",
                                        ["reason"], registry=r)
        for kind in KINDS:
            self.cache_bytes.labels(kind)
            self.cache_entries.labels(kind)
        for result in ("written", "failed"):
            self.reports.labels(result)
        for reason in REASONS:
            self.runtime_failures.labels(reason)

    def scanned(self, scan: CacheScan, report: AgentReport, seconds: float) -> None:
        self.scan_duration.observe(seconds)
        totals: dict[str, int] = dict.fromkeys(KINDS, 0)
        counts: dict[str, int] = dict.fromkeys(KINDS, 0)
        totals["weights"] = sum(w.bytes for w in scan.weights)
        counts["weights"] = len(scan.weights)
        for ident, size in scan.cache_bytes.items():
            kind, _ = parse_cache_id(ident)
            if kind in totals and kind != "weights":
                totals[kind] += size
        counts["compile"], counts["snapshot"] = len(scan.compile_keys), len(scan.snapshots)
        counts["adapter"] = len(scan.adapters)
        for kind in KINDS:
            self.cache_bytes.labels(kind).set(totals[kind])
            self.cache_entries.labels(kind).set(counts[kind])
        self.nvme_capacity.set(report.nvme_total)
        self.nvme_free.set(report.nvme_free)
        self.problems.set(len(scan.problems))

    def runtime_failed(self, reason: str) -> None:
        self.runtime_failures.labels(reason).inc()

    def wrote(self, ok: bool, at: float) -> None:
        self.reports.labels("written" if ok else "failed").inc()
        if ok:
            self.last_report.set(at)
