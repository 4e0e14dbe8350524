"""Prometheus metrics of the External Metrics API: how old the decision each workload is served is.

The API serves a workload the scaler has not decided for as ``"0"`` (:mod:`.app`), and a decision
however old. Both are silent to the HPA: it scales a ``"0"`` down to ``minReplicas`` and holds an
old value for ever. These families make the silence visible, per workload, from what was actually
served (every scaler replica serves the API, so each counts the replies it gave)::

    extender_external_metrics_decision_timestamp_seconds{workload}   gauge    t of the decision last served
    extender_external_metrics_decision_window_seconds{workload}      gauge    its window (the scaler's tick)
    extender_external_metrics_served_total{workload, state}          counter  items served, state decided or undecided

so that ``age = time() - timestamp`` is the age of what the HPA last read, in units of the tick
``age / window``. The gauges exist while the last item served for the workload carried a decision:
an undecided item removes them (there is no decision to date), and they come back with the next
decision served.

Label values are bounded by the policy: only the workloads it autoscales (:meth:`ServedMetrics.set_workloads`)
are ever labelled. The app answers any other name in a selector with a 404 before it serves
anything, and :meth:`ServedMetrics.record` ignores a name it does not know, so a client asking for
random names creates no series. A policy edit that drops a workload removes its gauges; its
counters stay (their rates fall to zero), as for the scaler's own families.

Made per process on the registry the API serves at ``/metrics`` (the scaler's: one gunicorn
worker per ``extender scale`` process, so an ordinary registry is the whole truth, and
prometheus_client's multiprocess mode, which cannot remove a series, is not used).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge

from extender.state.decisions import Published

#: The ``state`` label's values: an item carrying a stored decision, or the ``"0"`` of none.
STATES = ("decided", "undecided")


class ServedMetrics:
    """The API's families (module docstring); :meth:`record` takes each item of a reply."""

    def __init__(self, registry: CollectorRegistry, workloads: Iterable[str]) -> None:
        r = self.registry = registry
        self.decision_time = Gauge(
            "extender_external_metrics_decision_timestamp_seconds",
            "Unix time of the decision the External Metrics API last served for the workload "
            "(time() minus it: the age of what the HPA reads).",
            ["workload"], registry=r,
        )
        self.decision_window = Gauge(
            "extender_external_metrics_decision_window_seconds",
            "Window of the decision last served for the workload: the scaler's tick when it decided.",
            ["workload"], registry=r,
        )
        self.served_items = Counter(
            "extender_external_metrics_served_total",
            "Items the External Metrics API served for the workload, by state: decided (a stored decision) "
            'or undecided (no decision stored: served as "0").',
            ["workload", "state"], registry=r,
        )
        self._lock = threading.Lock()
        #: The workloads whose series may exist: the policy's autoscaled ones.
        self._workloads: frozenset[str] = frozenset()
        #: The workloads whose gauges exist (the last item served for each carried a decision).
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
                    self.served_items.labels(w, state)

    def record(self, workload: str, value: Published | None) -> None:
        """One item served for ``workload``: its decision, or ``None`` for the ``"0"`` of no decision.

        A workload the policy does not autoscale is not counted (no label value outside the policy).
        """
        with self._lock:
            if workload not in self._workloads:
                return
            if value is None:
                self.served_items.labels(workload, "undecided").inc()
                self._drop_gauges(workload)
                return
            self.served_items.labels(workload, "decided").inc()
            self.decision_time.labels(workload).set(value.t)
            self.decision_window.labels(workload).set(value.window)
            self._dated.add(workload)

    def _drop_gauges(self, workload: str) -> None:
        if workload in self._dated:
            self._dated.discard(workload)
            self.decision_time.remove(workload)
            self.decision_window.remove(workload)
