"""The warm loop: one :meth:`WarmLoop.tick` per scaler tick, on the leader, turning plans into Jobs.

A tick, in order (each step's reason in docs/warming.md):

1. **Read.** The inventory snapshot (the caller's, or loaded from the store) and every warm Job
   in the namespace. Without the Job list nothing is started: the caps count what is in flight.
2. **Reconcile the Jobs.** Running: in flight, unless its node has left the cluster (gone from
   the inventory and the API server answers 404): such a Job's pod is pinned to a node that no
   longer exists and would hold its slots until ``activeDeadline``, so it is deleted and logged.
   Succeeded: in flight until the inventory shows
   the cache (the agent's next scan, or kubelet's image list through the sync); then the Job is
   deleted, its work confirmed (so is one whose node left the cluster, by the same 404 test: a
   node only the inventory lost is waited for). Succeeded but still not shown after ``confirmWithin``, or failed:
   a Warning Event on the Job, a metric, and a retry once ``initial * 2**(attempt-1)`` seconds
   (capped) have passed since the failure: the failed Job is kept until then (it is the record
   of the failure, across restarts) and deleted at that moment so the action can be planned again.
3. **Plan** (:func:`extender.core.warming.plan`) with the in-flight actions (and the nodes of
   running publish Jobs, which take a slot on their node and in the cluster too), the actions still
   backing off masked as done (so a failing action does not keep the node's slot and a cluster
   slot from others), and kinds without a template left out.
4. **Act** (only with ``warming.enabled``): create each action's Job (``AlreadyExists`` counts as
   started: same name, same work), after re-reading the node's record so that an eviction a pod
   started to need since the plan is not carried out; publish compile caches (:mod:`.publish`)
   with the slots and bytes the actions left (a publish Job counts against ``maxConcurrentPerNode``
   on its holder node, ``maxConcurrent`` and ``bytesPerTick`` like an action);
   taint or untaint new nodes (:mod:`.taints`).

Failures of the API server or the store never raise out of :meth:`WarmLoop.tick`: they are
logged, counted and listed in the returned :class:`TickReport`, and the next tick tries again. The
scaler's own work must not stop because warming could not run. An API server that asks for a
pause (``429`` or ``503`` with ``Retry-After``, as API Priority and Fairness and a restarting server
do) gets it: no tick calls it again until that wait has passed.

Calling it from the scaler's leader tick (the loop keeps its state between calls; build it once)::

    warm = WarmLoop(policy, InventoryStore(redis_client), KubeClient.connect(...), registry=metrics_registry)
    scale_loop.on_leader_tick.append(
        lambda r: warm.tick(r.now, r.expectations(), term=r.token))

(``snapshot=`` may pass the scaler's own inventory snapshot, saving one read of the store.)
"""

from __future__ import annotations

import logging
import socket
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry

from extender.core.calibration import NO_NODE_FACTORS, NodeFactors
from extender.core.errors import ExtenderError, KubeError, StateError
from extender.core.inventory import InventorySnapshot, NodeState
from extender.core.policy import Policy
from extender.core.warming import KINDS, Action, Expectation, Plan, apply, plan
from extender.kube.errors import MAX_RETRY_AFTER_S, KubeApiError, asked_wait_s
from extender.warm.checks import node_class, present, published_snapshots, unsafe_evictions
from extender.warm.executor import Executor, WarmKube, retry_delay
from extender.warm.jobspec import (
    PLACEHOLDER_HELPER_IMAGE,
    JobView,
    Publish,
    action_job,
    describe,
    job_name,
    publish_job,
    template_for,
)
from extender.warm.metrics import WarmMetrics
from extender.warm.publish import candidates, unpublished
from extender.warm.taints import NodeKube, NodeTainter, retry_note

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (node, cache id); ("", compile:<key>) for a publish


class Kube(WarmKube, NodeKube, Protocol):
    """Everything the loop calls (:class:`extender.kube.client.KubeClient`)."""


class WarmStore(Protocol):
    """What the loop needs from :class:`extender.state.store.InventoryStore`."""

    def load_all(self) -> tuple[int, list[NodeState], frozenset[str]]: ...

    def get(self, name: str) -> NodeState | None: ...

    def add_registry(self, key: str) -> int: ...


@dataclass
class Skipped:
    """A planned action not started this tick, and why."""

    action: Action
    reason: str


@dataclass
class TickReport:
    """What one tick saw and did (``extender warm plan`` prints it; the scaler can log :meth:`summary`)."""

    now: float
    enabled: bool
    dry_run: bool = False
    plan: Plan | None = None
    jobs: list[JobView] = field(default_factory=list)
    #: Jobs created, and Jobs that already existed (planned again: the same work, not started twice).
    started: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    #: Actions a dry run would start (job names).
    would_start: list[str] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    confirmed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)
    #: Jobs deleted because their node left the cluster (their pod can never run).
    abandoned: list[str] = field(default_factory=list)
    published: list[str] = field(default_factory=list)
    publishing: list[str] = field(default_factory=list)
    tainted: list[str] = field(default_factory=list)
    untainted: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One log line."""
        planned = len(self.plan.actions) if self.plan is not None else 0
        parts = [f"planned {planned}", f"started {len(self.started)}", f"existing {len(self.existing)}",
                 f"confirmed {len(self.confirmed)}", f"failed {len(self.failed)}", f"retried {len(self.retried)}"]
        for name, items in (("abandoned", self.abandoned), ("published", self.published), ("tainted", self.tainted),
                            ("untainted", self.untainted), ("skipped", self.skipped), ("errors", self.errors)):
            if items:
                parts.append(f"{name} {len(items)}")
        return "warm: " + ", ".join(parts)


@dataclass(frozen=True)
class _Backoff:
    retry_at: float
    action: Action | None
    publish: Publish | None


def _without_weights(policy: Policy) -> Policy:
    """The policy with no weights caching: the planner then plans no weights actions (no template for them)."""
    profiles = tuple(p.model_copy(update={"weights": p.weights.model_copy(update={"cache": "none"})})
                     for p in policy.profiles)
    return policy.model_copy(update={"profiles": profiles})


class WarmLoop:
    """The cache warmer's executor, ticked by the scaler's leader (or ``extender warm plan`` as a dry run).

    ``store``: the inventory (snapshots when the caller passes none, eviction re-checks, the
    compile registry); ``kube``: ``None`` for a dry run that ignores Jobs in flight. ``registry``:
    where the metrics go (the scaler's, so one ``/metrics`` serves both). ``starts_jobs``: ``False``
    for a loop only ever ticked as a dry run (``extender warm plan``), which then says nothing about
    the helper image its Jobs would run.

    Build it once and keep it: between ticks it remembers attempts, backoffs, the Events already
    sent and when each unpublished compile key was first seen (all recoverable from the Jobs after a
    restart, except the first-seen times, which only delay a publish). Not thread-safe: one caller,
    the leader's loop.
    """

    def __init__(self, policy: Policy, store: WarmStore | None, kube: Kube | None, *,
                 registry: CollectorRegistry | None = None, instance: str | None = None,
                 helper_image: str | None = None, starts_jobs: bool = True,
                 nodes: NodeFactors = NO_NODE_FACTORS) -> None:
        self.helper_image = helper_image
        #: The per-node factors of the policy's calibration (:meth:`set_policy`): the plan's estimates use them.
        self.nodes = nodes
        # ``extender warm plan`` builds a loop that only plans: no Job will run the helper image, and
        # the flag that would set it is the scaler's, so the placeholder is not worth a warning there.
        self._placeholder_told = not starts_jobs
        self.policy = policy = self._completed(policy)
        self.store = store
        self.kube = kube
        self.metrics = WarmMetrics(registry)
        self.metrics.set_policy(policy)
        self.instance = instance or socket.gethostname()
        self.executor = Executor(kube, policy.warming.namespace, instance=self.instance) if kube else None
        self.tainter = NodeTainter(kube, self.metrics) if kube else None
        self._backoff: dict[Key, _Backoff] = {}
        self._attempts: dict[Key, int] = {}
        self._warned: set[tuple[str, str]] = set()
        self._first_seen: dict[str, float] = {}
        self._weightless: tuple[Policy, Policy] | None = None
        #: The leadership term (the scaler's fencing token) of the last tick, ``None`` before one.
        self._term: int | None = None
        #: No tick calls the API server before this time (unix s): the end of the wait it last asked for.
        self._api_pause_until = 0.0

    def set_policy(self, policy: Policy, nodes: NodeFactors = NO_NODE_FACTORS) -> None:
        """Use a reloaded policy, and the per-node factors of its calibration, from the next tick on
        (Jobs of a previous namespace are no longer seen). The scaler's ``on_estimator_policy`` calls it
        with both, so the warmer estimates every node as the extender scores it."""
        if self.kube is not None and policy.warming.namespace != self.policy.warming.namespace:
            self.executor = Executor(self.kube, policy.warming.namespace, instance=self.instance)
        self.policy = self._completed(policy)
        self.nodes = nodes
        self.metrics.set_policy(policy)

    def _completed(self, policy: Policy) -> Policy:
        """``policy`` with ``warming.helperImage``, when unset, taken from :attr:`helper_image` (the
        image ``extender scale --warm-helper-image`` names: the chart passes its own); the policy's
        own value wins. Neither: the Jobs name the placeholder, said once in the log when warming is on."""
        w = policy.warming
        if w.helper_image is not None:
            return policy
        if self.helper_image is not None:
            return policy.model_copy(update={"warming": w.model_copy(update={"helper_image": self.helper_image})})
        if w.enabled and not self._placeholder_told:
            self._placeholder_told = True
            log.warning("warm Jobs will run their own steps in %s, a placeholder: set warming.helperImage in the "
                        "policy or pass --warm-helper-image (the chart passes its image)", PLACEHOLDER_HELPER_IMAGE)
        return policy

    # ---- the tick ----------------------------------------------------------------------------

    def tick(self, now: float, expectations: Iterable[Expectation] = (), *,
             snapshot: InventorySnapshot | None = None, dry_run: bool = False, term: int | None = None) -> TickReport:
        """One pass (steps in the module docstring). ``now``: unix seconds, the clock heartbeats use.

        ``expectations``: at most one per workload (the scaler's decisions, through
        :meth:`TickReport.expectations`: each decision's look-ahead); keep-warm workloads come from the policy.
        ``dry_run``: read and plan, change nothing (no Job, Event, Node or registry write, no metric).
        ``term``: the leadership term this tick runs in (the scaler's fencing token, new at each
        acquisition of the lock); a tick of a new term first forgets what earlier terms learnt
        (:meth:`_new_term`).
        """
        if term is not None and not dry_run and term != self._term:
            if self._term is not None:
                self._new_term()
            self._term = term
        policy = self.policy
        report = TickReport(now=now, enabled=policy.warming.enabled, dry_run=dry_run)
        # (a pause longer than any the server may ask for is the wall clock stepping back: dropped)
        if not dry_run and now < self._api_pause_until <= now + MAX_RETRY_AFTER_S:
            report.notes.append(f"the API server asked for a pause: no call to it for "
                                f"{self._api_pause_until - now:.0f}s more")
            return report
        try:
            snap = snapshot if snapshot is not None else self._load(now)
            views = self.executor.jobs() if self.executor is not None else []
        except ExtenderError as exc:
            self._error(report, "read", exc, dry_run)
            return report
        report.jobs = views
        self._backoff = {k: b for k, b in self._backoff.items() if b.retry_at > now}
        in_flight, publishing, pub_nodes = self._reconcile(views, snap, now, report, dry_run)
        plan_policy, plan_snap = self._planning_view(snap, now, report)
        published = published_snapshots(policy)
        try:
            result = plan(plan_policy, plan_snap, list(expectations), now=now, in_flight=in_flight,
                          published_snapshots=published, other_jobs=pub_nodes, nodes=self.nodes)
        except (ExtenderError, ValueError) as exc:  # an expectation for an unknown workload, or one twice
            self._error(report, "plan", exc, dry_run)
            return report
        report.plan = result
        if policy.warming.enabled or dry_run:
            running = self._start(result, snap, now, report, dry_run)
            self._publish(snap, publishing, [*(a.node for a in in_flight), *pub_nodes, *running],
                          result=result, now=now, report=report, dry_run=dry_run)
        elif result.actions:
            report.notes.append("warming.enabled is false: nothing is started")
            report.skipped.extend(Skipped(a, "disabled") for a in result.actions)
        if self.tainter is not None and not dry_run:
            changes = self.tainter.reconcile(policy, snap, now, published)
            report.tainted, report.untainted = changes.tainted, changes.untainted
            report.errors.extend(changes.errors)
            self._pause(now, changes.retry_after_s)
        if not dry_run:
            self._observe(report, in_flight, publishing, now)
            self._observe_reserve(snap, now)
        return report

    def _new_term(self) -> None:
        """Start over as a restarted warmer would, from the Jobs and the Nodes alone.

        The loop lives as long as its scaler replica, and the replica may lead, stand by while
        another leads, and lead again. What it learnt before is then out of date: the other leader
        tainted nodes this one has already seen (and would never look at again, so the taint
        stayed for good), removed taints it still tracks, and retried or finished actions it
        still holds back. Everything it forgets here is read back from the cluster: taints from
        the Nodes (one list), backoffs and attempts from the failed Jobs, which are kept until
        their retry time.
        """
        if self.tainter is not None:
            self.tainter = NodeTainter(self.tainter.kube, self.metrics)
        self._backoff.clear()
        self._attempts.clear()
        self._warned.clear()
        self._first_seen.clear()

    def _load(self, now: float) -> InventorySnapshot:
        if self.store is None:
            raise StateError("no inventory store and no snapshot given")
        version, records, registry = self.store.load_all()
        return InventorySnapshot.build(self.policy, records, version=version, taken_at=now, registry=registry)

    def _error(self, report: TickReport, operation: str, exc: Exception, dry_run: bool) -> None:
        report.errors.append(f"{operation}: {exc}")
        if not dry_run:
            self.metrics.errors.labels(operation).inc()
            wait = asked_wait_s(exc)
            self._pause(report.now, wait)
            log.warning("warm %s: %s; retrying %s", operation, exc, retry_note(wait),
                        extra={"operation": operation, "error": str(exc), "retry_in_s": wait})

    def _pause(self, now: float, wait_s: float | None) -> None:
        """Make no call to the API server for ``wait_s`` from ``now`` (``None``: it asked for no pause)."""
        if wait_s is not None:
            self._api_pause_until = max(self._api_pause_until, now + wait_s)

    # ---- step 2: the Jobs that exist ------------------------------------------------------------

    def _reconcile(self, views: Sequence[JobView], snap: InventorySnapshot, now: float, report: TickReport,
                   dry_run: bool) -> tuple[list[Action], set[str], list[str]]:
        """In-flight actions, keys being published and the nodes of running publish Jobs; confirmed
        Jobs deleted, failures reported, running Jobs of nodes that left the cluster deleted."""
        w = self.policy.warming
        in_flight: list[Action] = []
        publishing: set[str] = set()
        pub_nodes: list[str] = []
        gone: dict[str, bool] = {}
        for view in views:
            if view.state == "active" and self._node_gone(view.node, snap, gone, report, dry_run):
                self._abandon(view, report, dry_run)
                continue
            if view.publish is not None:
                publishing.add(view.publish.key)
                if view.state == "active":
                    pub_nodes.append(view.publish.node)
                elif view.state == "succeeded":
                    self._published(view, report, dry_run)
                elif view.state == "failed":
                    self._failed(view, failed_at=view.finished_at or now, reason="WarmPublishFailed",
                                 detail=f"{view.reason or 'Failed'}: {view.message}".rstrip(": "), now=now,
                                 report=report, dry_run=dry_run)
                continue
            action = view.action
            assert action is not None  # read_job returns views with an action or a publish
            if view.state == "active":
                in_flight.append(action)
            elif view.state == "succeeded":
                done = present(self.policy, snap, action, now)
                finished = view.finished_at if view.finished_at is not None else now
                if done or self._node_gone(action.node, snap, gone, report, dry_run):
                    # done, or its node left the cluster: nothing to wait for. A node the inventory
                    # lost but the API server still has (Redis restarted empty) is waited for: its
                    # agent's next report confirms the work, or confirmWithin fails it
                    self._confirmed(view, report, dry_run)
                elif now - finished < w.confirm_within:
                    in_flight.append(action)  # the agent has not scanned since: its caches and free NVMe are old
                else:
                    self._failed(view, failed_at=finished + w.confirm_within, reason="WarmNotConfirmed",
                                 detail=f"the Job succeeded but after {w.confirm_within:.0f}s the inventory does not "
                                 f"show {action.cache} on {action.node} (does the template write to {{{{staging}}}}? "
                                 "is the node's agent reporting?)", now=now, report=report, dry_run=dry_run)
            else:
                self._failed(view, failed_at=view.finished_at or now, reason="WarmJobFailed",
                             detail=f"{view.reason or 'Failed'}: {view.message}".rstrip(": "), now=now,
                             report=report, dry_run=dry_run)
        if not dry_run:
            alive = {view.uid for view in views}
            self._warned = {k for k in self._warned if k[0] in alive}
        return in_flight, publishing, pub_nodes

    def _node_gone(self, node: str, snap: InventorySnapshot, gone: dict[str, bool], report: TickReport,
                   dry_run: bool) -> bool:
        """Has ``node`` left the cluster? Asked only for nodes the inventory no longer lists (an
        inventory that lost its records must not make the warmer delete Jobs): a 404 from the API
        server says so; any other answer keeps the Job (``False``)."""
        if node in snap.positions or not node or self.kube is None:
            return False
        if node not in gone:
            try:
                self.kube.get_node(node)
                gone[node] = False
            except KubeApiError as exc:
                gone[node] = exc.status == 404
                if not gone[node]:
                    self._error(report, "read", exc, dry_run)
            except KubeError as exc:
                gone[node] = False
                self._error(report, "read", exc, dry_run)
        return gone[node]

    def _abandon(self, view: JobView, report: TickReport, dry_run: bool) -> None:
        """Delete a running Job whose node left the cluster: its pod is pinned there and never runs,
        and counted in flight it would hold a node and a cluster slot until ``activeDeadline``."""
        report.abandoned.append(view.name)
        if dry_run or self.executor is None:
            return
        log.warning("warm job %s: node %s left the cluster; deleting the Job (%s is planned again where needed)",
                    view.name, view.node, view.cache,
                    extra={"job": view.name, "node": view.node, "cache": view.cache, "kind": view.kind,
                           "decision": "node-gone"})
        self._delete(view, report)

    def _confirmed(self, view: JobView, report: TickReport, dry_run: bool) -> None:
        report.confirmed.append(view.name)
        if dry_run or self.executor is None:
            return
        if self._delete(view, report):
            self.metrics.finished.labels(view.kind, "confirmed").inc()

    def _delete(self, view: JobView, report: TickReport) -> bool:
        """Delete ``view``'s Job and forget its attempts; ``False`` (the error reported) if the API refused."""
        assert self.executor is not None
        try:
            self.executor.delete(view)
        except KubeError as exc:
            self._error(report, "delete-job", exc, False)
            return False
        self._attempts.pop(view.key, None)
        return True

    def _published(self, view: JobView, report: TickReport, dry_run: bool) -> None:
        assert view.publish is not None
        if dry_run or self.store is None or self.executor is None:
            return
        try:
            self.store.add_registry(view.publish.key)
            self.executor.delete(view)
        except ExtenderError as exc:
            self._error(report, "publish", exc, dry_run)
            return
        self._attempts.pop(view.key, None)
        report.published.append(view.publish.key)
        self.metrics.published.inc()
        self.metrics.finished.labels("publish", "confirmed").inc()

    def _failed(self, view: JobView, *, failed_at: float, reason: str, detail: str, now: float,
                report: TickReport, dry_run: bool) -> None:
        """Report a failure once, then hold the action back until its retry time and delete the Job then."""
        retry_at = failed_at + retry_delay(self.policy.warming.retry, view.attempt)
        key = view.key
        if dry_run or self.executor is None:
            if now < retry_at:
                self._backoff[key] = _Backoff(retry_at, view.action, view.publish)
            return
        self._attempts[key] = max(self._attempts.get(key, 0), view.attempt)
        if (view.uid, reason) not in self._warned:
            self._warned.add((view.uid, reason))
            wait = max(0.0, retry_at - now)
            message = (f"{describe(view)}, attempt {view.attempt}: {detail}; next attempt in {wait:.0f}s "
                       f"(kubectl -n {view.namespace} logs job/{view.name} --all-containers)")
            # The Event, named after the Job and the reason, is the cluster's record that this
            # failure was reported: a warmer that restarted, or the other scaler replica leading
            # now, finds it there and neither counts nor logs the failure a second time.
            try:
                first = self.executor.warn(view, reason=reason, message=message, now=now)
            except KubeError as exc:
                self._error(report, "event", exc, dry_run)
                first = True  # unknown: better counted twice than never
            if first:
                report.failed.append(view.name)
                outcome = "unconfirmed" if reason == "WarmNotConfirmed" else "failed"
                self.metrics.finished.labels(view.kind, outcome).inc()
                log.warning("warm job %s: %s", view.name, message,
                            extra={"job": view.name, "node": view.node, "cache": view.cache, "kind": view.kind,
                                   "attempt": view.attempt, "reason": reason, "retry_in_s": wait})
        if now < retry_at:
            self._backoff[key] = _Backoff(retry_at, view.action, view.publish)
            return
        try:
            self.executor.delete(view)
        except KubeError as exc:
            self._error(report, "delete-job", exc, dry_run)
            self._backoff[key] = _Backoff(retry_at, view.action, view.publish)  # it still stands there
            return
        report.retried.append(view.name)
        self.metrics.retries.labels(view.kind).inc()

    # ---- step 3: what the planner may choose from ----------------------------------------------

    def _planning_view(self, snap: InventorySnapshot, now: float,
                       report: TickReport) -> tuple[Policy, InventorySnapshot]:
        """The policy and snapshot to plan on: unrunnable kinds left out, backing-off actions taken as done."""
        policy = self.policy
        templates = policy.warming.templates
        if templates.weights is None:
            if self._weightless is None or self._weightless[0] is not policy:
                self._weightless = (policy, _without_weights(policy))
            policy = self._weightless[1]
            report.notes.append("no warming.templates.weights: weights are not staged")
        registry = snap.registry
        if templates.compile is None and registry:
            registry = frozenset()
            report.notes.append("no warming.templates.compile: compile caches are not fetched")
        masked = [b.action for b in self._backoff.values() if b.action is not None]
        if not masked and registry is snap.registry:
            return policy, snap  # the snapshot serves both policies: they differ in no estimate
        records = list(snap.nodes)
        for a in masked:
            row = snap.positions.get(a.node)
            if row is not None:
                records[row] = apply(records[row], a.model_copy(update={"evictions": (), "nvme_bytes": 0}), now=now)
        return policy, InventorySnapshot.build(policy, records, version=snap.version, taken_at=snap.taken_at,
                                               registry=registry)

    # ---- step 4: acting --------------------------------------------------------------------------

    def _start(self, result: Plan, snap: InventorySnapshot, now: float, report: TickReport,
               dry_run: bool) -> list[str]:
        """Create the plan's Jobs; returns the nodes of the actions now running (or that a dry run would start)."""
        running: list[str] = []
        for action in result.actions:
            key = (action.node, action.cache)
            if key in self._backoff:
                report.skipped.append(Skipped(action, "backoff"))
                continue
            if action.kind != "image" and template_for(self.policy, action) is None:
                report.skipped.append(Skipped(action, "no-template"))
                continue
            row = snap.positions.get(action.node)
            cls = node_class(snap, row) if row is not None else None
            if action.evictions and cls is not None and not dry_run:
                try:
                    record = self.store.get(action.node) if self.store is not None else None
                except StateError as exc:
                    self._error(report, "read", exc, dry_run)
                    record = None
                unsafe = unsafe_evictions(self.policy, record, cls, action.evictions)
                if unsafe:
                    report.skipped.append(Skipped(action, "eviction-unsafe"))
                    log.info("warm %s on %s: not evicting %s, a pod there needs it now", action.cache,
                             action.node, ", ".join(unsafe),
                             extra={"node": action.node, "workload": action.workload, "cache": action.cache,
                                    "decision": "eviction-unsafe", "evictions": list(unsafe)})
                    continue
            name = job_name(action.kind, action.node, action.cache)
            if dry_run or self.executor is None:
                report.would_start.append(name)
                running.append(action.node)
                continue
            body = action_job(self.policy, action, attempt=self._attempts.get(key, 0) + 1,
                              node_class=cls.name if cls is not None else "")
            try:
                outcome = self.executor.create(body)
            except KubeError as exc:
                self._error(report, "create-job", exc, dry_run)
                report.skipped.append(Skipped(action, "error"))
                continue
            running.append(action.node)
            if outcome == "created":
                report.started.append(name)
                self.metrics.started.labels(action.kind).inc()
            else:
                report.existing.append(name)
        return running

    def _publish(self, snap: InventorySnapshot, publishing: set[str], running: Sequence[str], *, result: Plan,
                 now: float, report: TickReport, dry_run: bool) -> None:
        """Start publish Jobs within what is left of the caps: ``running`` lists the node of every warm
        Job running or started this tick (actions and publishes), ``result`` the bytes planned."""
        w = self.policy.warming
        if w.templates.publish_compile is None:
            return
        holders = unpublished(self.policy, snap, now)
        if not dry_run:
            self._first_seen = {k: self._first_seen.get(k, now) for k in holders}
        first_seen = self._first_seen if not dry_run else {k: self._first_seen.get(k, now) for k in holders}
        busy = publishing | {b.publish.key for b in self._backoff.values() if b.publish is not None}
        limit = max(0, w.max_concurrent - len(running))
        budget = None if w.bytes_per_tick is None else w.bytes_per_tick - sum(a.bytes for a in result.actions)
        per_node = Counter(running)
        for p in candidates(self.policy, holders, first_seen, now, busy=busy, limit=limit, running=per_node,
                            budget=budget):
            key: Key = ("", p.cache)
            body = publish_job(self.policy, p, attempt=self._attempts.get(key, 0) + 1)
            name = str(body["metadata"]["name"])
            if dry_run or self.executor is None:
                report.would_start.append(name)
                continue
            try:
                outcome = self.executor.create(body)
            except KubeError as exc:
                self._error(report, "create-job", exc, dry_run)
                continue
            if outcome == "created":
                report.publishing.append(name)
                self.metrics.started.labels("publish").inc()

    def _observe_reserve(self, snap: InventorySnapshot, now: float) -> None:
        """Per node class: fresh nodes whose free NVMe is below the class's reserve (a reserve of 0 never is)."""
        fresh = snap.fresh(now)[:-1]
        free = snap.nvme_free[:-1]
        index = snap.class_index[:-1]
        known = {c.name for c in self.policy.node_classes}
        for i, cls in enumerate(snap.classes):
            if cls.name not in known:
                continue
            mask = fresh & (index == i)
            below = int((free[mask] < cls.nvme.reserve).sum()) if cls.nvme.reserve > 0 else 0
            self.metrics.below_reserve.labels(cls.name).set(below)

    def _observe(self, report: TickReport, in_flight: Sequence[Action], publishing: set[str], now: float) -> None:
        m = self.metrics
        for kind in KINDS:
            m.in_flight.labels(kind).set(sum(1 for a in in_flight if a.kind == kind))
        m.in_flight.labels("publish").set(len(publishing))
        m.backing_off.set(sum(1 for b in self._backoff.values() if b.retry_at > now))
        saved: dict[str, float] = {}
        if report.plan is not None:
            for a in report.plan.actions:
                m.planned.labels(a.kind, a.purpose).inc()
                saved[a.workload] = saved.get(a.workload, 0.0) + a.saved_s
        for workload in {p.name for p in self.policy.profiles}:
            m.saved.labels(workload).set(saved.get(workload, 0.0))
        for s in report.skipped:
            m.skipped.labels(s.reason).inc()
        if report.started or report.confirmed or report.failed or report.errors:
            log.info("%s", report.summary(), extra={"started": report.started, "confirmed": report.confirmed,
                                                    "failed": report.failed, "errors": report.errors})
