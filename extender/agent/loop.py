"""The agent's loop: scan, report what changed, keep the heartbeat alive, ride out Redis outages.

Every ``interval_s`` the agent scans the cache root and measures the filesystem. It writes its
report (:class:`~extender.state.sources.AgentReport`) when

* the content differs from the last report written (weights bytes, keys, snapshots, or free space
  by more than ``free_tolerance_bytes``: logs and scratch files move free space all the time, and
  rewriting the record for each of those would bump the inventory version on every scan), or
* the last write is ``heartbeat_s`` old (default a quarter of the TTL: three lost writes in a row
  still leave the node fresh), or
* nothing was written yet since the agent started.

So a scan that finds nothing new writes nothing unless the heartbeat is due. A due heartbeat with
nothing new is sent bare (the time only, :meth:`Agent.heartbeat_only`), except at least every
``full_report_s`` and when the wall clock went back behind the last heartbeat written: then the
whole report goes out. A store that refuses the bare heartbeat (it restarted empty, the record was
deleted, or it holds another report) gets the whole report at once, so the next write repairs it.

Outages: a failed write (Redis down, or not up yet when the agent starts) is retried with
exponential backoff capped at ``backoff_max_s`` (well under the interval), so the report lands
within seconds of Redis coming back; scanning goes on meanwhile and the retry sends the newest
report. Scan problems (corrupt manifest, unreadable directory, vanished file) are logged once per
path until they clear, never raised.

What a record cannot hold (a directory name with control characters or invalid UTF-8, more entries
than a record holds, more bytes than the agent's share of a record) is left out of the report and
logged as an ``unstorable`` scan problem, as an error: the rest is reported
(:func:`extender.core.reports.fit_agent_report`). A record the store still refuses as too large
(:class:`~extender.core.errors.OversizedRecordError`: the sync's part grew) is not an outage: it is
logged as an error once, until a write succeeds, and tried again at each scan, not with backoff.

With ``cri_socket`` each scan also lists the container runtime's images (:mod:`extender.cri.images`)
into the report's ``images``. A runtime that gives no list leaves ``images`` unset (readers use
kubelet's list) and never stops the rest of the report; it is logged once per change of state.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from extender.agent.disk import disk_usage
from extender.agent.hub import HubCaches
from extender.agent.metrics import AgentMetrics
from extender.agent.scan import CacheScan, ManifestCache, Problem, SizeCache, scan_cache
from extender.core.backoff import Backoff
from extender.core.errors import KubeError, OversizedRecordError, StateError
from extender.core.inventory import DEFAULT_TTL_S
from extender.core.reports import AgentReport, check_node_name, fit_agent_report

log = logging.getLogger(__name__)


class Reporter(Protocol):
    """Where reports go (``extender.state.sources.SourceStore``)."""

    def report_agent(self, name: str, report: AgentReport) -> int | None: ...

    def beat_agent(self, name: str, heartbeat: float) -> bool: ...


class Labeler(Protocol):
    """Mirrors readiness onto the Node (``extender.kube.labels.NodeLabeler``)."""

    def apply(self, ready: Iterable[str], *, refresh: bool = False) -> bool: ...


@dataclass(frozen=True)
class AgentSettings:
    """What one agent watches and how often."""

    node_name: str
    cache_root: Path
    interval_s: float = 15.0
    ttl_s: float = DEFAULT_TTL_S
    #: Longest time between two writes; ``None``: a quarter of the TTL.
    heartbeat_s: float | None = None
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 5.0
    #: Free-space drift that alone does not make a report "changed": the whole report that is sent at
    #: least every ``full_report_s`` carries it later.
    free_tolerance_bytes: int = 2**30
    #: Longest time between two whole reports while only bare heartbeats are due: bounds how stale the
    #: free space (drift under ``free_tolerance_bytes``) can get, and repairs a merged record that
    #: was damaged behind the store's back (its agent report intact, so heartbeats are still taken).
    full_report_s: float = 600.0
    #: Longest time between two full measurements of one compile or snapshot directory (its size).
    size_refresh_s: float = 300.0
    #: Longest time between two reads of the Node's labels (``--label-nodes``): a label someone
    #: removed, or a Node object deleted and registered again, is put back within it.
    label_resync_s: float = 600.0
    #: The container runtime's CRI socket (``--cri-socket``): each scan lists its images and reports
    #: every name as ``images``. ``None``: no image list (readers use kubelet's ``status.images``).
    cri_socket: Path | None = None
    #: Deadline of one image list: a runtime that hangs delays a scan by at most this much.
    cri_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        """Refuse a node name that is no Kubernetes name (:class:`InvalidValueError`) before any scan:
        the store would refuse every report of it, so the agent could never report."""
        check_node_name(self.node_name)

    @property
    def heartbeat_every_s(self) -> float:
        return self.heartbeat_s if self.heartbeat_s is not None else self.ttl_s / 4


@dataclass
class AgentStats:
    """Counters for logs and tests."""

    scans: int = 0
    writes: int = 0
    #: Of ``writes``, those sent as a bare heartbeat (nothing new in the report).
    heartbeats: int = 0
    failed_writes: int = 0
    label_patches: int = 0
    #: Image lists the container runtime did not give (``--cri-socket``).
    runtime_failures: int = 0
    last_scan: CacheScan | None = None
    problems: frozenset[Problem] = field(default_factory=frozenset)


class Agent:
    """One node's reporter."""

    def __init__(
        self,
        settings: AgentSettings,
        open_reporter: Callable[[], Reporter],
        *,
        labeler: Labeler | None = None,
        hub: HubCaches | None = None,
        metrics: AgentMetrics | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.open_reporter = open_reporter
        self.labeler = labeler
        #: Model hub caches to add to each scan (:mod:`extender.agent.hub`).
        self.hub = hub
        #: Where scans and writes are counted (``--metrics-bind``), if anywhere.
        self.metrics = metrics
        self.clock = clock
        self.monotonic = monotonic
        self.stats = AgentStats()
        self.last_written: AgentReport | None = None
        self._reporter: Reporter | None = None
        self._last_write_at = float("-inf")
        self._last_report_at = float("-inf")
        #: The wall-clock heartbeat of the last write, whole or bare (a clock that went back is below it).
        self._last_beat = float("-inf")
        self._labels_applied: frozenset[str] | None = None
        self._labels_checked_at = float("-inf")
        self._outage = False
        #: Why the store refused the last report as too large (logged once), ``None`` after a write.
        self._oversize: str | None = None
        self._tombstoned = False
        #: The container runtime's last state: ``None`` before the first list, ``"ok"``, or why the last list
        #: failed (:data:`extender.cri.REASONS`); a change is logged once.
        self._runtime_state: str | None = None
        self._manifests = ManifestCache()
        self._sizes = SizeCache(settings.size_refresh_s, clock=monotonic)
        self._stop = threading.Event()

    # ---- one step at a time (the loop and the tests use these) -------------------------------

    def scan(self) -> AgentReport:
        """Scan the cache root and the filesystem; the report has no heartbeat yet.

        What a record cannot hold is left out of the report and added to the scan's problems
        (:func:`~extender.core.reports.fit_agent_report`), so one odd entry never stops a report.
        """
        # The filesystem is measured once, and the same size bounds what the scan believes of sparse
        # files (extender.agent.scan.scan_cache) and is reported as the node's NVMe.
        started = self.monotonic()
        try:
            disk = disk_usage(self.settings.cache_root)
            total, free = disk.total_bytes, disk.free_bytes
        except OSError as exc:
            total = free = 0
            scan = scan_cache(self.settings.cache_root, manifests=self._manifests, sizes=self._sizes)
            failed = Problem(str(self.settings.cache_root), "unreadable", f"statvfs failed: {exc.strerror or exc}")
            scan = dataclasses.replace(scan, problems=(*scan.problems, failed))
        else:
            scan = scan_cache(self.settings.cache_root, manifests=self._manifests, sizes=self._sizes,
                              disk_bytes=total)
        if self.hub is not None:
            scan = self.hub.add_to(scan)
        images = self._runtime_images()
        report, left_out = fit_agent_report(
            nvme_total=total,
            nvme_free=free,
            weights=scan.weights_bytes,
            compile_keys=scan.compile_keys,
            snapshots=scan.snapshots,
            adapters=scan.adapters,
            ttl=self.settings.ttl_s,
            last_used=scan.last_used,
            cache_bytes=scan.cache_bytes,
            images=images,
        )
        if left_out:
            root = str(self.settings.cache_root)
            scan = dataclasses.replace(scan, problems=(*scan.problems,
                                                       *(Problem(root, "unstorable", why) for why in left_out)))
        self.stats.scans += 1
        self.stats.last_scan = scan
        self._log_problems(scan.problems)
        self._apply_labels(scan)
        if self.metrics is not None:
            self.metrics.scanned(scan, report, self.monotonic() - started)
        return report

    def due(self, report: AgentReport) -> bool:
        """Should this report be written now?

        Last-use times alone do not make a report "changed": every read by a serving pod moves an
        access time, and the heartbeat (a quarter of the TTL) carries them soon enough for
        evictions measured in minutes.
        """
        last = self.last_written
        if last is not None:
            report = report.model_copy(update={"last_used": last.last_used})
        return (
            not report.same_content(last, free_tolerance=self.settings.free_tolerance_bytes)
            or self.monotonic() - self._last_write_at >= self.settings.heartbeat_every_s
        )

    def heartbeat_only(self, report: AgentReport) -> bool:
        """May ``report`` go out as a bare heartbeat (:meth:`Reporter.beat_agent`) instead of whole?

        Yes when it holds what was last written (free space within the tolerance), the last whole
        report is younger than ``full_report_s``, and either its last-use times are those written too
        or the last whole report is younger than the TTL: new last-use times ride on a whole report
        once per TTL, soon enough for evictions measured in minutes, while the heartbeats in between
        cost readers nothing to decode.
        """
        last = self.last_written
        if last is None or self._tombstoned:
            return False
        if self.monotonic() - self._last_report_at >= self.settings.full_report_s:
            return False
        if not report.same_content(last.model_copy(update={"last_used": report.last_used}),
                                   free_tolerance=self.settings.free_tolerance_bytes):
            return False
        return report.last_used == last.last_used or self.monotonic() - self._last_report_at < self.settings.ttl_s

    def write(self, report: AgentReport) -> None:
        """Write ``report`` with a heartbeat of now; raises :class:`StateError` when the store fails.

        A report with nothing new (:meth:`heartbeat_only`) is sent as a bare heartbeat; when the
        store refuses it (no record of the node, or not this agent's report), it is written whole
        after all. So is one stamped earlier than the last heartbeat written: the wall clock went
        back, and a bare heartbeat never moves the stored one back, so only a whole report replaces
        a heartbeat from a clock that ran ahead.
        """
        stamped = report.model_copy(update={"heartbeat": self.clock()})
        node = self.settings.node_name
        bare = self.heartbeat_only(report)
        if bare and stamped.heartbeat < self._last_beat:
            bare = False
            log.warning("the clock went back %.3fs behind the last heartbeat written; writing the whole report "
                        "to replace it", self._last_beat - stamped.heartbeat,
                        extra={"node": node, "behind_s": self._last_beat - stamped.heartbeat})
        try:
            if self._reporter is None:
                self._reporter = self.open_reporter()
            if bare:
                if self._reporter.beat_agent(node, stamped.heartbeat):
                    if self.metrics is not None:
                        self.metrics.wrote(True, stamped.heartbeat)
                    self._last_write_at = self.monotonic()
                    self._last_beat = stamped.heartbeat
                    self.stats.writes += 1
                    self.stats.heartbeats += 1
                    return
                log.info("inventory store refused the heartbeat (the node's record is gone, or does not hold this "
                         "agent's last report); writing the whole report", extra={"node": node})
            version = self._reporter.report_agent(node, stamped)
        except StateError:
            self.stats.failed_writes += 1
            if self.metrics is not None:
                self.metrics.wrote(False, stamped.heartbeat)
            raise
        if self.metrics is not None:
            self.metrics.wrote(True, stamped.heartbeat)
        self.last_written = stamped
        self._last_beat = stamped.heartbeat
        self._last_write_at = self._last_report_at = self.monotonic()
        self.stats.writes += 1
        if version is None and not self._tombstoned:
            log.warning("node %s was removed from the cluster; its reports are ignored until it returns",
                        self.settings.node_name, extra={"node": self.settings.node_name})
        self._tombstoned = version is None

    def step(self) -> AgentReport:
        """One scan and, if due, one write (raises :class:`StateError` if that write fails)."""
        report = self.scan()
        if self.due(report):
            self.write(report)
        return report

    # ---- the loop --------------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None) -> None:
        """Scan and report until ``stop`` (or :meth:`stop`) is set."""
        stop = stop or self._stop
        s = self.settings
        backoff = Backoff(s.backoff_initial_s, s.backoff_max_s)
        report: AgentReport | None = None
        next_scan = self.monotonic()
        log.info("agent for node %s: scanning %s every %.0fs", s.node_name, s.cache_root, s.interval_s,
                 extra={"node": s.node_name, "cache_root": str(s.cache_root), "interval_s": s.interval_s})
        while not stop.is_set():
            now = self.monotonic()
            if report is None or now >= next_scan:
                report = self.scan()
                next_scan = now + s.interval_s
            wait = max(0.0, next_scan - self.monotonic())
            if self.due(report):
                try:
                    self.write(report)
                except OversizedRecordError as exc:
                    # not an outage: the store answered, and retrying in seconds would change nothing
                    if self._oversize is None:
                        log.error("inventory store refused the report: %s; trying again at each scan", exc,
                                  extra={"node": s.node_name, "error": str(exc)})
                    self._oversize = str(exc)
                except StateError as exc:
                    delay = backoff.next()
                    if not self._outage:
                        log.warning("inventory store: %s; retrying with backoff", exc,
                                    extra={"node": s.node_name, "error": str(exc)})
                    self._outage = True
                    wait = delay
                else:
                    if self._outage:
                        log.info("inventory store is back; report written", extra={"node": s.node_name})
                    if self._oversize is not None:
                        log.info("inventory store accepted the report again", extra={"node": s.node_name})
                    self._outage = False
                    self._oversize = None
                    backoff.reset()
            if not self._outage and self._oversize is None:  # a refused report waits for the next scan
                wait = min(wait, max(0.0, self._last_write_at + s.heartbeat_every_s - self.monotonic()))
            stop.wait(wait)

    def stop(self) -> None:
        self._stop.set()

    @property
    def outage(self) -> bool:
        """True while the last write failed (the loop retries with backoff)."""
        return self._outage

    @property
    def refused(self) -> str | None:
        """Why the store refuses the report (too large), while it does; ``None`` once it takes one."""
        return self._oversize

    # ---- helpers ---------------------------------------------------------------------------

    def _runtime_images(self) -> tuple[str, ...] | None:
        """Every image name the container runtime holds, or ``None`` (no ``cri_socket``, or the list failed).

        A failure never stops the scan: the report goes out without ``images``, and readers use
        kubelet's list. It is counted at every scan and logged once per change of state (ok, or the
        reason it failed), not at every scan: a runtime down for an hour is one warning, and one info
        line when it answers again.
        """
        socket = self.settings.cri_socket
        if socket is None:
            return None
        from extender.cri import ImageListError
        from extender.cri.images import list_images

        node = self.settings.node_name
        try:
            names = list_images(socket, self.settings.cri_timeout_s)
        except ImageListError as exc:
            self.stats.runtime_failures += 1
            if self.metrics is not None:
                self.metrics.runtime_failed(exc.reason)
            if self._runtime_state != exc.reason:
                log.warning("%s; reporting no image list (readers use kubelet's status.images) until it answers",
                            exc, extra={"node": node, "cri_socket": str(socket), "reason": exc.reason,
                                        "error": str(exc)})
            self._runtime_state = exc.reason
            return None
        if self._runtime_state != "ok":
            again = "answers again: " if self._runtime_state is not None else ""
            log.info("container runtime at %s %slists %d image names; reporting them", socket, again, len(names),
                     extra={"node": node, "cri_socket": str(socket), "images": len(names)})
        self._runtime_state = "ok"
        return names

    def _log_problems(self, problems: Iterable[Problem]) -> None:
        current = frozenset(problems)
        for p in sorted(current - self.stats.problems, key=lambda p: (p.path, p.kind)):
            level = {"vanished": logging.INFO, "unstorable": logging.ERROR}.get(p.kind, logging.WARNING)
            log.log(level, "cache scan: %s", p,
                    extra={"node": self.settings.node_name, "cache_path": p.path, "problem": p.kind})
        self.stats.problems = current

    def _apply_labels(self, scan: CacheScan) -> None:
        if self.labeler is None:
            return
        ready = scan.complete_workloads
        now = self.monotonic()
        resync = now - self._labels_checked_at >= self.settings.label_resync_s
        if ready == self._labels_applied and not resync:
            return
        try:
            if self.labeler.apply(ready, refresh=resync):
                self.stats.label_patches += 1
        except KubeError as exc:
            log.warning("node labels: %s; retrying after the next scan", exc,
                        extra={"node": self.settings.node_name, "error": str(exc)})
            return
        self._labels_applied = ready
        if resync:
            self._labels_checked_at = now
