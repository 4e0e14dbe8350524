"""Prometheus metrics of what an HPA is served: how old the decision each workload is served is.

Two servers hand the scaler's decisions to an HPA: the External Metrics API inside ``extender scale``
(:mod:`extender.api.external_metrics.app`) and ``extender keda-scaler``'s ``GetMetrics``
(:mod:`extender.keda.service`), whose value KEDA's HPA reads. Both serve a workload the scaler has
not decided for as ``0``, and a decision however old. Both are silent to the HPA: it scales a ``0``
down to ``minReplicas`` and holds an old value for ever. These families make the silence visible,
per workload, from what was actually served (each process counts the replies it gave)::

    extender_served_decision_timestamp_seconds{api, workload}   gauge    t of the decision last served
    extender_served_decision_window_seconds{api, workload}      gauge    its window (the scaler's tick)
    extender_served_values_total{api, workload, state}          counter  values served, state decided or undecided

so that ``age = time() - timestamp`` is the age of what the HPA last read, in units of the tick
``age / window``. The gauges exist while the last value served for the workload carried a
decision: an undecided value removes them (there is no decision to date), and they come back with
the next decision served.

``api`` says which server served (:data:`APIS`): ``external-metrics`` or ``keda``. One set of
families with that label, rather than one set per server, keeps a single alert expression
(``ExtenderDecisionStale`` groups by ``api, workload``) and a single dashboard query for both; the
label also keeps apart an HPA served ``"0"`` by one server while the other serves the same workload
a decision (a KEDA scaler pointed at another Redis prefix than the scaler), which a join on
``workload`` alone would hide. A process serves one API, so each ``ServedMetrics`` fixes its label.

Label values are bounded by the policy: only the workloads it autoscales (:meth:`ServedMetrics.set_workloads`)
are ever labelled. Both servers refuse any other name before they serve anything (a 404, or gRPC
``NOT_FOUND``), and :meth:`ServedMetrics.record` ignores a name it does not know, so a client asking
for random names creates no series. A policy edit that drops a workload removes its gauges; its
counters stay (their rates fall to zero), as for the scaler's own families.

Made per process on the registry the process serves at ``/metrics`` (the scaler's: one gunicorn
worker per ``extender scale`` process; the KEDA scaler's: one process, one event loop), so an
ordinary registry is the whole truth, and prometheus_client's multiprocess mode, which cannot
remove a series, is not used.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge

from extender.state.decisions import Published

#: The ``state`` label's values: a value carrying a stored decision, or the ``0`` of none.
STATES = ("decided", "undecided")
#: Which server served: the ``api`` label's values.
Api = Literal["external-metrics", "keda"]
APIS: tuple[Api, ...] = ("external-metrics", "keda")


class ServedMetrics:
    """The families of the module docstring for one server (``api``); :meth:`record` takes each value served."""

    def __init__(self, registry: CollectorRegistry, api: Api, workloads: Iterable[str]) -> None:
        r = self.registry = registry
        self.api = api
        self.decision_time = Gauge(
            "extender_served_decision_timestamp_seconds",
            "Unix time of the decision last served to an HPA for the workload, by API (time() minus it: "
            "the age of what the HPA reads).",
            ["api", "workload"], registry=r,
        )
        self.decision_window = Gauge(
            "extender_served_decision_window_seconds",
            "Window of the decision last served for the workload, by API: the scaler's tick when it decided.",
            ["api", "workload"], registry=r,
        )
        self.served_values = Counter(
            "extender_served_values_total",
            "Values served to an HPA for the workload, by API and state: decided (a stored decision) or "
            "undecided (no decision stored: served as 0).",
            ["api", "workload", "state"], registry=r,
        )
        self._lock = threading.Lock()
        #: The workloads whose series may exist: the policy's autoscaled ones.
        self._workloads: frozenset[str] = frozenset()
        #: The workloads whose gauges exist (the last value served for each carried a decision).
        self._dated: set[str] = set()
        self.set_workloads(workloads)

    def set_workloads(self, workloads: Iterable[str]) -> None:
        """Create the counters of ``workloads`` at zero; remove the gauges of workloads no longer among them."""
        known = frozenset(workloads)
        with self._lock:
            for w in self._workloads - known:
                self._drop_gauges(w)
            self._workloads = known
            for w in known:
                for state in STATES:
                    self.served_values.labels(self.api, w, state)

    def record(self, workload: str, value: Published | None) -> None:
        """One value served for ``workload``: its decision, or ``None`` for the ``0`` of no decision.

        A workload the policy does not autoscale is not counted (no label value outside the policy).
        """
        with self._lock:
            if workload not in self._workloads:
                return
            if value is None:
                self.served_values.labels(self.api, workload, "undecided").inc()
                self._drop_gauges(workload)
                return
            self.served_values.labels(self.api, workload, "decided").inc()
            self.decision_time.labels(self.api, workload).set(value.t)
            self.decision_window.labels(self.api, workload).set(value.window)
            self._dated.add(workload)

    def _drop_gauges(self, workload: str) -> None:
        if workload in self._dated:
            self._dated.discard(workload)
            self.decision_time.remove(self.api, workload)
            self.decision_window.remove(self.api, workload)
