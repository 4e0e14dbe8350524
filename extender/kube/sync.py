"""``extender sync``: keep the inventory's cluster view true (Nodes, and the pods bound to them).

Two reflectors (:mod:`extender.kube.reflector`) feed an in-memory view:

* Nodes: class by the policy's node-class selectors, labels, allocatable GPUs, every name in
  ``status.images``;
* Pods bound to a node and not finished (``spec.nodeName!=,status.phase!=Succeeded,
  status.phase!=Failed``, the scheduler's own "assigned pods" selector): the GPUs each holds and,
  for pods matching a workload profile, whether it is starting or running there.

A writer loop turns the nodes touched since the last write into :class:`KubeReport` records and
stores them through :class:`extender.state.sources.SourceStore`, which merges them with the agents'
reports. It writes only reports that differ from what it last wrote, waits for both resources'
first list before the first write (a node listed before its pods would look all free for a
moment), deletes nodes that left the cluster, and after every node (re)list prunes inventory
records of nodes the cluster no longer has. A Node it cannot read keeps its last facts and its
record (:attr:`ClusterView.unreadable`): only what the API server no longer lists is deleted. A
report is built with what a record cannot hold left out (:func:`extender.core.reports.fit_kube_report`),
and a report the store refuses (:class:`OversizedRecordError`) is no outage: the other nodes are
written, and it is logged once and tried again at each resync.

With ``calibration.mode`` other than ``off``, the view also hands every pod of a workload profile
to a :class:`~extender.kube.observe.StartObserver`, and the writer records each new replica's start
(where it landed, what its node held then, when it became Ready) for calibration.

Policy edits: with a :class:`~extender.files.PolicyFile` the writer loop polls the file every
``policy_check_s``. A new valid policy changes which class each node is in and which pods belong
to a workload profile, and the view holds only what the old policy made of the objects, so both
reflectors list again: the view is rebuilt from the whole truth under the new policy, and the
writer stores only the reports that came out different. An invalid edit keeps the last good
policy (logged once by the watcher). The start observer is rebuilt for the new policy and takes over
the starts in flight of the workloads it still profiles (:meth:`StartObserver.carried_into`).

Redis outages: the writer keeps what it could not write marked dirty and retries with backoff. A
Redis that came back empty is noticed from its version counter or its heartbeat sequence going
backwards (checked every ``version_check_s``) and triggers a full rewrite; every ``resync_s``
the stored reports are also compared with the view, so anything else that went missing is repaired.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from extender.core.backoff import Backoff
from extender.core.errors import InvalidValueError, KubeError, OversizedRecordError, StateError
from extender.core.policy import Policy
from extender.core.reports import KubeReport
from extender.files import PolicyFile
from extender.kube.client import JSON, KubeClient
from extender.kube.metrics import SyncMetrics
from extender.kube.objects import DEFAULT_GPU_RESOURCE, NodeFacts, PodFacts, fitted_kube_report, node_facts, pod_facts
from extender.kube.observe import EngineLogs, StartObserver
from extender.kube.reflector import DEFAULT_WATCH_TIMEOUT_S, Reflector
from extender.state.observations import CalibratedPolicy, ObservationStore
from extender.state.sources import SourceStore

log = logging.getLogger(__name__)

#: The scheduler's selector for pods that hold resources on a node.
ASSIGNED_PODS = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"


@dataclass(frozen=True)
class SyncSettings:
    """Knobs of the sync loop; tests shrink the time bounds."""

    gpu_resource: str = DEFAULT_GPU_RESOURCE
    watch_timeout_s: int = DEFAULT_WATCH_TIMEOUT_S
    #: Compare every stored report with the view this often (repairs a store that lost data).
    resync_s: float = 60.0
    #: Read the store's version this often to notice a Redis that restarted empty.
    version_check_s: float = 2.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    #: Look at the policy file this often (with a ``policy_file``).
    policy_check_s: float = 2.0


class ClusterView:
    """Nodes and assigned pods as last seen, and which nodes need writing (thread-safe)."""

    def __init__(self, policy: Policy, gpu_resource: str, observer: StartObserver | None = None) -> None:
        self.policy = policy
        self.gpu_resource = gpu_resource
        self.observer = observer
        self.cond = threading.Condition()
        self.nodes: dict[str, NodeFacts] = {}
        self.pods: dict[str, PodFacts] = {}
        self.pods_by_node: dict[str, dict[str, PodFacts]] = {}
        self.dirty: set[str] = set()
        self.removed: set[str] = set()
        self.prune = False
        #: Monotonic time of the first change not yet written (``None``: none), for the write lag.
        self.changed_at: float | None = None
        #: Nodes the API server lists but the sync cannot read: name -> why. Each keeps its last
        #: facts (if it had any) and its record: unreadable is not deleted.
        self.unreadable: dict[str, str] = {}
        #: Nodes whose last report left out what a record cannot hold: name -> the reasons.
        self.trimmed: dict[str, tuple[str, ...]] = {}
        self._bad: set[str] = set()

    def _changed(self) -> None:
        """Wake the writer; caller holds ``cond``."""
        if self.changed_at is None:
            self.changed_at = time.monotonic()
        self.cond.notify_all()

    def _node(self, raw: JSON) -> tuple[str, NodeFacts | str]:
        """The object's name and its facts, or why it cannot be read (logged once)."""
        meta = raw.get("metadata")
        name = str(meta.get("name") or "") if isinstance(meta, dict) else ""
        try:
            return name, node_facts(raw, self.policy, self.gpu_resource)
        except KubeError as exc:
            why = str(exc)
            if name:
                self._warn_once(f"node {name!r} cannot be read; keeping its last facts and its record "
                                f"(an unreadable node is not a deleted one): {why}")
            else:
                self._warn_once(why)
            return name, why

    def _pod(self, raw: JSON) -> PodFacts | None:
        try:
            return pod_facts(raw, self.policy, self.gpu_resource)
        except KubeError as exc:
            self._warn_once(str(exc))
            return None

    def _warn_once(self, message: str) -> None:
        if message not in self._bad:
            self._bad.add(message)
            log.warning("skipping an object: %s", message, extra={"error": message})

    # ---- nodes -----------------------------------------------------------------------------

    def replace_nodes(self, items: Iterable[JSON]) -> None:
        """A full list: nodes it does not hold are gone; a node it holds but the sync cannot read
        keeps its last facts (only what the API server no longer lists is deleted).

        ``items`` is read to the end (page by page: only the facts are kept) before the view
        changes, so a list that fails midway leaves the view as it was."""
        read = [self._node(raw) for raw in items]
        with self.cond:
            fresh = {n: f for n, f in read if isinstance(f, NodeFacts)}
            bad = {n: f for n, f in read if isinstance(f, str) and n and n not in fresh}
            fresh.update({n: self.nodes[n] for n in bad if n in self.nodes})
            gone = self.nodes.keys() - fresh.keys()
            self.unreadable = bad
            self.trimmed = {n: p for n, p in self.trimmed.items() if n in fresh}
            self.nodes = fresh
            self.removed |= gone
            self.removed -= fresh.keys()
            self.dirty = (self.dirty | fresh.keys()) - gone
            self.prune = True
            self._changed()

    def node_event(self, etype: str, raw: JSON) -> None:
        if etype == "DELETED":
            name = str(raw.get("metadata", {}).get("name", ""))
            with self.cond:
                self.nodes.pop(name, None)
                self.unreadable.pop(name, None)
                self.trimmed.pop(name, None)
                self.dirty.discard(name)
                self.removed.add(name)
                self._changed()
            return
        name, facts = self._node(raw)
        if isinstance(facts, str):  # its last facts stand
            if name:
                with self.cond:
                    self.unreadable[name] = facts
            return
        with self.cond:
            self.unreadable.pop(facts.name, None)
            self.nodes[facts.name] = facts
            self.removed.discard(facts.name)
            self.dirty.add(facts.name)
            self._changed()

    # ---- pods ------------------------------------------------------------------------------

    def _unlink(self, key: str) -> str | None:
        old = self.pods.pop(key, None)
        if old is None:
            return None
        on_node = self.pods_by_node.get(old.node)
        if on_node is not None:
            on_node.pop(key, None)
            if not on_node:
                del self.pods_by_node[old.node]
        return old.node

    def _link(self, facts: PodFacts) -> None:
        self.pods[facts.key] = facts
        self.pods_by_node.setdefault(facts.node, {})[facts.key] = facts

    def replace_pods(self, items: Iterable[JSON]) -> None:
        """A full list of assigned pods, read to the end before the view changes (as :meth:`replace_nodes`)."""
        facts = [f for f in map(self._pod, items) if f is not None]
        with self.cond:
            touched = set(self.pods_by_node)
            self.pods, self.pods_by_node = {}, {}
            for f in facts:
                self._link(f)
                if self.observer is not None:
                    self.observer.pod(f)
            if self.observer is not None:
                self.observer.keep_only(set(self.pods))
            touched |= self.pods_by_node.keys()
            self.dirty |= touched & self.nodes.keys()
            self._changed()

    def pod_event(self, etype: str, raw: JSON) -> None:
        meta = raw.get("metadata", {})
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        facts = None if etype == "DELETED" else self._pod(raw)
        with self.cond:
            touched = {self._unlink(key)}
            if facts is not None:
                self._link(facts)
                touched.add(facts.node)
            if self.observer is not None:
                if facts is None:
                    self.observer.gone(key)
                else:
                    self.observer.pod(facts)
            self.dirty |= {n for n in touched if n is not None and n in self.nodes}
            self._changed()

    # ---- reports ---------------------------------------------------------------------------

    def report(self, name: str) -> KubeReport | None:
        """The report of one node now (``None`` if the node is not in the cluster); caller holds ``cond``.

        What a record cannot hold is left out of it (:func:`~extender.kube.objects.fitted_kube_report`),
        logged once each time the reasons change.
        """
        facts = self.nodes.get(name)
        if facts is None:
            return None
        report, problems = fitted_kube_report(facts, self.pods_by_node.get(name, {}).values())
        if not problems:
            self.trimmed.pop(name, None)
        elif self.trimmed.get(name) != problems:
            self.trimmed[name] = problems
            for problem in problems:
                log.error("node %s: %s", name, problem, extra={"node": name, "problem": problem})
        return report

    @property
    def kept(self) -> set[str]:
        """Names whose records stay: the nodes in the view and those listed but unreadable; caller holds ``cond``."""
        return set(self.nodes) | set(self.unreadable)

    def mark_dirty(self, names: Iterable[str]) -> None:
        with self.cond:
            self.dirty |= set(names) & self.nodes.keys()
            self._changed()


class ClusterSync:
    """Runs the reflectors and the writer until stopped."""

    def __init__(
        self,
        kube: KubeClient,
        open_sources: Callable[[], SourceStore],
        policy: Policy,
        settings: SyncSettings = SyncSettings(),
        *,
        clock: Callable[[], float] = time.monotonic,
        metrics: SyncMetrics | None = None,
        policy_file: PolicyFile | None = None,
    ) -> None:
        self.settings = settings
        #: Where lists, watches, writes and observed starts are counted (``--metrics-bind``), if anywhere.
        self.metrics = metrics
        #: Watched for edits (module docstring); ``None``: the policy stays as started.
        self.policy_file = policy_file
        #: Policies taken from the file since start (logs and tests).
        self.policy_reloads = 0
        #: Follows new replicas for calibration (``None`` with ``calibration.mode: off``).
        #: Reads new replicas' engine logs for profiles that set ``engineLog`` (extender.kube.observe).
        self.engine_logs = EngineLogs(kube, count=metrics.engine_log if metrics is not None else None)
        self.observer = StartObserver(policy, engine_logs=self.engine_logs) \
            if policy.calibration.mode != "off" else None
        self.view = ClusterView(policy, settings.gpu_resource, self.observer)
        self.policy = policy
        self.open_sources = open_sources
        self.clock = clock
        note = metrics.note if metrics is not None else None
        self.nodes = Reflector(kube, "nodes", on_replace=self.view.replace_nodes, on_event=self.view.node_event,
                               watch_timeout_s=settings.watch_timeout_s, backoff=self._backoff(), note=note)
        self.pods = Reflector(kube, "pods", on_replace=self.view.replace_pods, on_event=self.view.pod_event,
                              field_selector=ASSIGNED_PODS, watch_timeout_s=settings.watch_timeout_s,
                              backoff=self._backoff(), note=note)
        if metrics is not None and self.observer is not None:
            self.observer.on_recorded.append(lambda starts: metrics.starts(starts, self._estimator_policy()))
        #: What each node's stored report is, as far as we know (reports equal to it are not rewritten).
        self.written: dict[str, KubeReport] = {}
        #: Reports the store refused (node -> report): not written again until they change or a resync.
        self.refused: dict[str, KubeReport] = {}
        self._refusal_logged: set[str] = set()
        #: Count of completed writes (tests wait on it; logs report it).
        self.flushes = 0
        self._sources: SourceStore | None = None
        self._observations: ObservationStore | None = None
        self._calibrated: CalibratedPolicy | None = None
        self._last_version = 0
        self._last_beat_seq = 0
        self._outage = False
        self._stop = threading.Event()

    def _backoff(self) -> Backoff:
        return Backoff(self.settings.backoff_initial_s, self.settings.backoff_max_s)

    # ---- lifecycle -------------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None) -> None:
        """Sync until ``stop`` (or :meth:`stop`) is set; reflector threads are joined before returning."""
        stop = stop or self._stop
        threads = [threading.Thread(target=r.run, args=(stop,), name=f"reflector-{r.resource}", daemon=True)
                   for r in (self.nodes, self.pods)]
        for t in threads:
            t.start()
        try:
            self._write_loop(stop)
        finally:
            stop.set()
            for r in (self.nodes, self.pods):
                r.interrupt()
            for t in threads:
                t.join()

    @property
    def outage(self) -> bool:
        """True while the last write to the store failed (the writer retries with backoff)."""
        return self._outage

    def stop(self) -> None:
        self._stop.set()
        with self.view.cond:
            self.view.cond.notify_all()

    # ---- writing ---------------------------------------------------------------------------

    def _write_loop(self, stop: threading.Event) -> None:
        backoff = self._backoff()
        next_resync = self.clock() + self.settings.resync_s
        next_version_check = self.clock() + self.settings.version_check_s
        next_policy_check = self.clock() + self.settings.policy_check_s
        while not stop.is_set():
            if self.policy_file is not None and self.clock() >= next_policy_check:
                self.check_policy()
                next_policy_check = self.clock() + self.settings.policy_check_s
            with self.view.cond:
                pending = self.view.dirty or self.view.removed or self.view.prune or self._observing()
                if not pending or not self._synced():
                    wake = min(next_resync, next_version_check, next_policy_check) - self.clock()
                    self.view.cond.wait(timeout=max(0.01, min(wake, 0.5)))
            if stop.is_set():
                break
            if not self._synced():
                continue
            try:
                sources = self._connect()
                now = self.clock()
                if now >= next_version_check:
                    self._check_version(sources)
                    next_version_check = now + self.settings.version_check_s
                if now >= next_resync:
                    self._resync(sources)
                    next_resync = now + self.settings.resync_s
                self._flush(sources)
                self._observe(sources)
            except StateError as exc:
                if self.metrics is not None:
                    self.metrics.wrote(False)
                delay = backoff.next()
                if not self._outage:
                    log.warning("inventory store: %s; retrying (next in %.1fs)", exc, delay,
                                extra={"error": str(exc), "retry_s": delay})
                self._outage = True
                stop.wait(delay)
                continue
            if self._outage:
                log.info("inventory store is back")
                self._outage = False
            backoff.reset()

    def _estimator_policy(self) -> Policy:
        """The policy the components estimate with: calibrated when ``calibration.mode`` is ``apply``."""
        if self._observations is None or self.policy.calibration.mode != "apply":
            return self.policy
        if self._calibrated is None:
            self._calibrated = CalibratedPolicy(self._observations)
        return self._calibrated.policy_for(self.policy)

    def check_policy(self) -> bool:
        """Take a new valid policy from the file, if there is one, and list both resources again."""
        if self.policy_file is None:
            return False
        policy = self.policy_file.poll().policy
        if policy is None:
            return False
        metrics = self.metrics
        if metrics is not None:
            metrics.set_policy(policy)
        with self.view.cond:
            observer = None
            if policy.calibration.mode != "off":  # the starts in flight go on being followed
                observer = StartObserver(policy, engine_logs=self.engine_logs) if self.observer is None \
                    else self.observer.carried_into(policy)
                if metrics is not None:
                    observer.on_recorded.append(lambda starts: metrics.starts(starts, self._estimator_policy()))
            self.policy = policy
            self.observer = observer
            self.view.policy = policy
            self.view.observer = observer
            self._observations = None
            self._calibrated = None
        self.policy_reloads += 1
        log.info("policy changed: listing nodes and pods again to apply it",
                 extra={"version": self.policy_file.version})
        self.nodes.relist()
        self.pods.relist()
        return True

    def _observing(self) -> bool:
        return self.observer is not None and self.observer.pending()

    def _observe(self, sources: SourceStore) -> None:
        """Read the nodes of new replicas, record the starts that are complete (extender.kube.observe)."""
        if self.observer is None or not self.observer.pending():
            return
        if self._observations is None:
            self._observations = ObservationStore.for_policy(sources.client, self.policy,
                                                             prefix=sources.store.keys.prefix)
        self.observer.flush(sources.store, self._observations)

    def _synced(self) -> bool:
        return self.nodes.synced.is_set() and self.pods.synced.is_set()

    def _connect(self) -> SourceStore:
        if self._sources is None:
            self._sources = self.open_sources()
        return self._sources

    def _flush(self, sources: SourceStore) -> None:
        view = self.view
        with view.cond:
            dirty, removed, prune = view.dirty, view.removed, view.prune
            view.dirty, view.removed, view.prune = set(), set(), False
            changed_at, view.changed_at = view.changed_at, None
            reports = {n: r for n in dirty if (r := view.report(n)) is not None}
            alive = view.kept
            unreadable, trimmed = len(view.unreadable), len(view.trimmed)
        changed = {n: r for n, r in reports.items() if self.written.get(n) != r and self.refused.get(n) != r}
        try:
            if changed:
                self._write_reports(sources, changed)
            for name in sorted(removed):
                self._last_version = max(self._last_version, sources.remove_node(name))
                self.written.pop(name, None)
                removed = removed - {name}
            if prune:
                for name in sorted(sources.store.names() - alive):
                    log.info("node %s is no longer in the cluster; removing it from the inventory", name,
                             extra={"node": name})
                    self._last_version = max(self._last_version, sources.remove_node(name))
                    self.written.pop(name, None)
        except StateError:
            with view.cond:  # keep everything not confirmed written for the next attempt
                if changed_at is not None:
                    view.changed_at = changed_at if view.changed_at is None else min(changed_at, view.changed_at)
                view.dirty |= {n for n, r in changed.items() if self.written.get(n) != r}
                view.dirty &= view.nodes.keys()
                view.removed |= removed - view.nodes.keys()
                view.prune = view.prune or prune
            raise
        if changed or removed or prune:
            self.flushes += 1
        if self.metrics is not None:
            self.metrics.nodes.set(len(alive))
            self.metrics.synced.set(1)
            self.metrics.node_problems.labels("unreadable").set(unreadable)
            self.metrics.node_problems.labels("trimmed").set(trimmed)
            self.metrics.node_problems.labels("refused").set(len(self.refused))
            if changed or removed or prune:
                lag = time.monotonic() - changed_at if changed_at is not None else None
                self.metrics.wrote(True, lag_s=lag, at=time.time())

    def _write_reports(self, sources: SourceStore, changed: dict[str, KubeReport]) -> None:
        """Write the reports in batches; when the store refuses one (its merged record is over the
        size limit, or its name is none a record can have), write them one by one, so every other
        node is written. A refused report is no outage: it is logged once (until a write of that
        node succeeds), counted, and tried again at the next resync (the agent's part may shrink)."""
        try:
            self._last_version = max(self._last_version, sources.report_kube(changed))
            self.written.update(changed)
            for name in changed:
                self._accepted(name)
            return
        except (OversizedRecordError, InvalidValueError):
            pass
        for name, report in sorted(changed.items()):
            try:
                version = sources.report_kube({name: report})
            except (OversizedRecordError, InvalidValueError) as exc:
                self.refused[name] = report
                if name not in self._refusal_logged:
                    self._refusal_logged.add(name)
                    log.error("node %s: the store refuses its report, so the inventory keeps its last record: %s; "
                              "the other nodes are written", name, exc, extra={"node": name, "error": str(exc)})
                continue
            self._last_version = max(self._last_version, version)
            self.written[name] = report
            self._accepted(name)

    def _accepted(self, name: str) -> None:
        if self.refused.pop(name, None) is not None or name in self._refusal_logged:
            self._refusal_logged.discard(name)
            log.info("node %s: its report is written again", name, extra={"node": name})

    def _check_version(self, sources: SourceStore) -> None:
        """Rewrite every node when the store lost its data: either of its counters went back.

        The version alone can miss it: the agents' heartbeats are refused by an emptied store, so
        they all write whole reports at once, which can bring the version back to ours, or past it,
        before this look. The heartbeat sequence only ever grows in a store that keeps its data.
        """
        version, beat_seq = sources.store.versions()
        if version < self._last_version or beat_seq < self._last_beat_seq:
            log.warning("inventory version went back from %d to %d (heartbeat sequence from %d to %d): the store "
                        "lost data; rewriting every node", self._last_version, version, self._last_beat_seq,
                        beat_seq, extra={"version": version, "previous_version": self._last_version,
                                         "beat_seq": beat_seq, "previous_beat_seq": self._last_beat_seq})
            self.written.clear()
            with self.view.cond:
                self.view.dirty |= set(self.view.nodes)
                self.view.prune = True
        self._last_version, self._last_beat_seq = version, beat_seq

    def _resync(self, sources: SourceStore) -> None:
        with self.view.cond:
            names = sorted(self.view.nodes)
        stored = sources.kube_reports(names)
        stale = [n for n in names if stored.get(n) is None or stored[n] != self.written.get(n)]
        for name in stale:
            self.written.pop(name, None)
        retry = [n for n in stale if n in self.refused]
        for name in retry:  # tried again once per resync (logged once, in _write_reports)
            del self.refused[name]
        if len(stale) > len(retry):
            log.info("resync: %d node report(s) differ from the store; rewriting them", len(stale) - len(retry),
                     extra={"nodes": sorted(set(stale) - set(retry))})
        if stale:
            self.view.mark_dirty(stale)
