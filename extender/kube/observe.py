"""Calibration's observations: ``extender sync`` follows each new replica from binding to Ready.

For every pod of a workload profile that the sync first sees *starting* (bound, not yet Ready, and
no container of it ran before), the observer reads its node's inventory record at once (the state
the pod found: image, weights bytes, compile cache, snapshot, bytes in flight) and, when the pod
turns Ready, stores an :class:`~extender.core.calibration.Observation` with the pod's
``PodScheduled``, container ``startedAt`` and ``Ready`` times (:mod:`extender.state.observations`).

A start is *not* recorded (and counted by reason in ``<p>:calibration:discarded``) when:

* ``stale inventory``: the node's heartbeat was further than ``calibration.maxInventoryAge`` or its
  own TTL from the sync's clock when read, behind (a silent agent: the record is not what the pod
  found) or ahead (a clock that cannot be trusted), or the node has none;
* ``seen late``: the sync first saw the pod more than ``calibration.captureWithin`` after its
  ``PodScheduled`` time (the sync was restarting or lagging: the pod may already have changed its
  node's caches), or the pod has no ``PodScheduled`` time. A replica that was Ready and only failed
  its readiness probe (no container restarted) when a restarted sync first lists it lands here
  too: nothing in its status says it was Ready before;
* ``unknown node class``: no policy class matches the node;
* ``deleted before ready``: the pod went away (or failed) before Ready;
* ``ready before scheduled``: the pod's ``Ready`` time precedes its ``PodScheduled`` time (clocks
  skewed between the control plane's components): its duration cannot be known;
* ``too many pending``: :data:`MAX_PENDING` starts are followed already; the pod is not followed
  (counted once, not at each of its updates);
* ``unreadable``: the start does not make a valid observation (a time outside what one holds).

A pod first seen already Ready (the sync restarted) is not a start this sync saw, and is ignored;
so is a pod first seen starting *again*: a container of it ran before (``restartCount`` above 0 or a
``lastState.terminated``: a replica caught after a crash, an OOM kill or its node's reboot while
the sync restarted). Neither is counted as a discard: the discard counts are of new starts. (A
start first seen after a container of it crashed, never Ready yet, is ignored with them: nothing
tells the two apart, and its image was pulled before the node was read, so not what it found.) A
later readiness flap or restart of a pod followed, recorded or ignored is no new start either.
A start that turned Ready is recorded even when its pod is deleted, or replaced under its name by a
new pod (a StatefulSet's), before the writer's next pass.
The pending starts live in memory: a restart of the sync loses the ones in flight.

Engine logs: for a workload whose profile sets ``engineLog``, the writer reads the first
``engineLog.limitBytes`` of the engine container's log when it records a start that turned Ready
(:class:`EngineLogs`, one ``pods/log`` GET per start, at most :data:`~extender.kube.client.LOG_TIMEOUT_S`
per read of the reply) and stores the phase times :func:`~extender.core.enginelog.parse_engine_log`
finds in it as the observation's ``phases``. Reading the log is never a reason to lose a start: one
that cannot be read (``403`` without the ``pods/log`` grant, a pod already gone, a container the
pod has not, a timeout) is recorded without phases, and a warning is logged once for each cause
(again only after a read worked), never per pod. After a read that got no answer at all (the API
server unreachable, a timeout) the other starts of the same pass are recorded without reading, so
one pass waits for one timeout at most. Each read is counted by result
(``extender_sync_engine_logs_total``, :data:`LOG_RESULTS`).

The view (:class:`extender.kube.sync.ClusterView`) calls :meth:`StartObserver.pod` and
:meth:`StartObserver.gone` under its lock (no I/O); the sync's writer thread calls
:meth:`StartObserver.flush`, which does the Redis reads and writes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from extender.core.calibration import CompileWord, Observation
from extender.core.enginelog import EnginePhases, parse_engine_log
from extender.core.errors import KubeError
from extender.core.estimate import CompileCache
from extender.core.inventory import InventorySnapshot, NodeState
from extender.core.policy import UNKNOWN_CLASS, EngineLog, Policy
from extender.kube.client import LOG_TIMEOUT_S, KubeClient
from extender.kube.errors import KubeApiError, KubeUnreachableError
from extender.kube.objects import PodFacts
from extender.state.observations import ObservationStore, read_nodes
from extender.state.store import InventoryStore

log = logging.getLogger(__name__)

_WORDS: dict[int, CompileWord] = {int(CompileCache.ABSENT): "absent", int(CompileCache.REGISTRY): "registry",
                                  int(CompileCache.LOCAL): "local"}

#: Why a start whose Ready time precedes its PodScheduled time is not recorded (module docstring).
READY_BEFORE_SCHEDULED = "ready before scheduled"

#: Starts followed at once, at most (a bound on memory; each is a few hundred bytes).
MAX_PENDING = 100_000


#: Results of reading an engine's log (``extender_sync_engine_logs_total{result}``): ``read`` (phase
#: times found), ``empty`` (read, none found), ``forbidden`` (403: no ``pods/log`` grant), ``missing``
#: (404 or 400: the pod is gone, or has no such container, or it has not started), ``unreachable``
#: (no answer: a timeout, a connection refused or cut), ``failed`` (any other error status),
#: ``skipped`` (not tried: an earlier read of the same pass got no answer).
LOG_RESULTS = ("read", "empty", "forbidden", "missing", "unreachable", "failed", "skipped")


@dataclass
class EngineLogs:
    """Reads the engine phase times of recorded starts from their containers' logs (module docstring).

    Shared by every observer of one sync (a policy edit keeps what was warned about).
    """

    kube: KubeClient
    #: Called with each read's result (one of :data:`LOG_RESULTS`), e.g. a metric's ``inc``.
    count: Callable[[str], None] | None = None
    timeout_s: float = LOG_TIMEOUT_S
    #: Causes already warned about: a failure's until a read works, ``cut`` until a log is read whole.
    _warned: set[str] = field(default_factory=set, repr=False)

    def read(self, pod_key: str, setting: EngineLog, *, skip: bool = False) -> tuple[EnginePhases | None, str]:
        """The phases in the log of ``pod_key`` (``namespace/name``) and the read's result."""
        if skip:
            return self._done(None, "skipped")
        namespace, _, name = pod_key.partition("/")
        try:
            text, cut = self.kube.read_pod_log(namespace, name, container=setting.container,
                                               limit_bytes=setting.limit_bytes, timeout_s=self.timeout_s)
        except KubeApiError as exc:
            result = {403: "forbidden", 404: "missing", 400: "missing"}.get(exc.status or 0, "failed")
            return self._done(None, result, exc)
        except KubeUnreachableError as exc:
            return self._done(None, "unreachable", exc)
        except KubeError as exc:
            return self._done(None, "failed", exc)
        # a failure's cause is warned about again once it comes back; a cut log, once it was not cut
        self._warned &= {"cut"} if cut else set()
        if cut:
            self._warn("cut", f"the log of {pod_key} is longer than engineLog.limitBytes "
                              f"({setting.limit_bytes}); only its beginning is read")
        phases = parse_engine_log(text)
        return self._done(None, "empty") if phases.empty else self._done(phases, "read")

    def _done(self, phases: EnginePhases | None, result: str,
              exc: KubeError | None = None) -> tuple[EnginePhases | None, str]:
        if exc is not None:
            hint = " (grant it with the chart's sync.readEngineLogs)" if result == "forbidden" else ""
            self._warn(result, f"cannot read an engine's log, so starts are recorded without its phase "
                               f"times{hint}: {exc}")
        if self.count is not None:
            self.count(result)
        return phases, result

    def _warn(self, cause: str, message: str) -> None:
        if cause not in self._warned:
            self._warned.add(cause)
            log.warning("calibration: %s", message, extra={"cause": cause})

    def read_all(self, starts: list[tuple[str, EngineLog]]) -> list[EnginePhases | None]:
        """The phases of each ``(pod, setting)``, in order; after a read that got no answer, the rest
        are not tried."""
        out: list[EnginePhases | None] = []
        unanswered = False
        for pod_key, setting in starts:
            phases, result = self.read(pod_key, setting, skip=unanswered)
            unanswered = unanswered or result == "unreachable"
            out.append(phases)
        return out


@dataclass
class _Start:
    key: str
    uid: str
    workload: str
    node: str
    scheduled_at: float | None
    seen_at: float
    #: Everything of the observation but the times, once the node's record was read.
    found: dict[str, Any] | None = None
    started_at: float | None = None
    ready_at: float | None = None
    #: What the engine's log said of its phases, once read (``log_read``; writer only).
    phases: EnginePhases | None = None
    log_read: bool = False


@dataclass
class StartObserver:
    """Pending starts and what they found on their node (thread-safe; module docstring)."""

    policy: Policy
    clock: Callable[[], float] = time.time
    #: Reads the engine's log of a start whose profile sets ``engineLog``; ``None``: never read.
    engine_logs: EngineLogs | None = None
    _starts: dict[str, _Start] = field(default_factory=dict, repr=False)
    #: Pods (key -> uid) already recorded, discarded or first seen Ready: a later readiness flap
    #: or a repeated event is not a new start.
    _known: dict[str, str] = field(default_factory=dict, repr=False)
    #: Ready starts whose pod went away (deleted, or replaced under its name by a new pod) before the
    #: writer recorded them: still recorded, and no longer in ``_starts``, which follows the name.
    _finished: list[_Start] = field(default_factory=list, repr=False)
    _discarded: dict[str, int] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    #: Observations recorded so far (tests and logs read it).
    recorded: int = 0
    #: Called (in the writer thread) with the starts just stored, e.g. to export each new replica's
    #: estimate error (:func:`extender.core.calibration.estimate_errors`); an exception is logged.
    on_recorded: list[Callable[[list[Observation]], None]] = field(default_factory=list)

    @property
    def enabled(self) -> bool:
        return self.policy.calibration.mode != "off"

    def carried_into(self, policy: Policy) -> StartObserver:
        """A new observer for ``policy`` that goes on where this one is: a policy edit must not lose
        the starts in flight (seen again in the relist that follows the edit, past
        ``captureWithin``, each was discarded as ``seen late``).

        It takes the starts of workloads ``policy`` still profiles, with what their nodes held when
        read, the pods already known, and the discard counts not yet written. Call it under the
        view's lock, so that no pod event falls between the two.
        """
        profiled = {p.name for p in policy.profiles}
        new = StartObserver(policy, clock=self.clock, engine_logs=self.engine_logs)
        with self._lock:
            new._starts = {k: s for k, s in self._starts.items() if s.workload in profiled}
            new._finished = [s for s in self._finished if s.workload in profiled]
            new._known = dict(self._known)
            new._discarded = dict(self._discarded)
        return new

    # ---- from the view (under its lock, no I/O) ----------------------------------------------------

    def pod(self, facts: PodFacts) -> None:
        """A pod as last seen (added or modified)."""
        if not self.enabled or facts.workload is None:
            return
        with self._lock:
            start = self._starts.get(facts.key)
            if start is not None and start.uid != facts.uid:  # same name, new pod: the old one is gone
                self._end(start)
                start = None
            if facts.key in self._known and self._known[facts.key] != facts.uid:
                del self._known[facts.key]
            if start is None:
                # first seen Ready, or starting again (a container of it ran before): no start this
                # sync saw from its beginning, and no discard either (module docstring)
                if facts.key in self._known or facts.state != "starting" or facts.restarted:
                    self._known[facts.key] = facts.uid
                    return
                if len(self._starts) + len(self._finished) >= MAX_PENDING:
                    self._known[facts.key] = facts.uid  # counted once: its next updates are no new start
                    self._count("too many pending")
                    return
                start = _Start(facts.key, facts.uid, facts.workload, facts.node, facts.scheduled_at, self.clock())
                self._starts[facts.key] = start
            if start.ready_at is not None:
                return
            if facts.state == "running":
                start.ready_at = facts.ready_at if facts.ready_at is not None else self.clock()
                start.started_at = facts.started_at
            elif facts.state == "terminating":
                self._discard(start, "deleted before ready", remember=True)

    def gone(self, key: str) -> None:
        """A pod deleted, or finished (Succeeded, Failed)."""
        with self._lock:
            self._known.pop(key, None)
            start = self._starts.get(key)
            if start is not None:
                self._end(start)

    def keep_only(self, keys: set[str]) -> None:
        """After a relist: pods not listed are gone."""
        for key in self.tracked() - keys:
            self.gone(key)

    def tracked(self) -> set[str]:
        """The pods (``namespace/name``) held by name: starts followed and pods known (recorded,
        discarded, first seen Ready). A pod deleted is in neither, whatever the writer was doing:
        a Ready start whose pod went is recorded from ``_finished``, which holds no name."""
        with self._lock:
            return set(self._starts) | set(self._known)

    def pending(self) -> bool:
        """True when the writer has something to read or record."""
        with self._lock:
            return bool(self._discarded) or any(s.found is None or s.ready_at is not None for s in self._all())

    def _all(self) -> list[_Start]:
        return [*self._starts.values(), *self._finished]

    def _follows(self, start: _Start) -> bool:
        """Is ``start`` still followed (not recorded, discarded or replaced by a pod's new start)?"""
        return self._starts.get(start.key) is start or any(f is start for f in self._finished)

    def _end(self, start: _Start) -> None:
        """The pod of a followed start is gone: before Ready it is discarded; once Ready the writer records it."""
        if start.ready_at is None:
            self._discard(start, "deleted before ready", remember=False)
        else:
            del self._starts[start.key]
            self._finished.append(start)

    def _drop(self, start: _Start, *, remember: bool) -> None:
        """Stop following ``start``; ``remember``: its pod, if still there, is no new start."""
        if self._starts.get(start.key) is start:
            del self._starts[start.key]
            if remember:
                self._known[start.key] = start.uid
        else:  # its pod went away: nothing to remember
            self._finished = [f for f in self._finished if f is not start]

    def _discard(self, start: _Start, reason: str, *, remember: bool = True) -> None:
        self._drop(start, remember=remember)
        self._count(reason)

    def _count(self, reason: str) -> None:
        self._discarded[reason] = self._discarded.get(reason, 0) + 1

    # ---- from the writer (Redis I/O) ---------------------------------------------------------------

    def flush(self, inventory: InventoryStore, store: ObservationStore) -> int:
        """Read the nodes of new starts, record the starts now Ready; returns how many were recorded.

        A store error leaves everything pending (reads are retried; a read that comes too late is
        then discarded as ``seen late``) and is raised for the writer's backoff.
        """
        now = self.clock()
        with self._lock:
            to_read = [s for s in self._all() if s.found is None]
        found: list[tuple[_Start, dict[str, Any] | str]] = []
        if to_read:
            records, registry = read_nodes(inventory, {s.node for s in to_read})
            found = [(s, self._found(s, records.get(s.node), registry, now)) for s in to_read]
        with self._lock:
            for start, result in found:
                # the start read for, not whatever the name holds now: a pod replaced under its name
                # meanwhile (a StatefulSet's, maybe on another node) is a new start, its node not read yet
                if not self._follows(start):
                    continue
                if isinstance(result, str):
                    self._discard(start, result)
                else:
                    start.found = result
            done = [s for s in self._all() if s.found is not None and s.ready_at is not None]
            discarded = dict(self._discarded)
        self._read_logs(done)
        observations: list[Observation] = []
        for s in done:
            assert s.found is not None and s.ready_at is not None and s.scheduled_at is not None
            if s.ready_at < s.scheduled_at:
                discarded[READY_BEFORE_SCHEDULED] = discarded.get(READY_BEFORE_SCHEDULED, 0) + 1
                continue
            try:
                observations.append(Observation.model_validate({
                    **s.found, "pod": s.key, "workload": s.workload, "node": s.node,
                    "scheduledAt": s.scheduled_at, "startedAt": s.started_at,
                    "readyAt": s.ready_at, "phases": s.phases}))
            except ValueError as exc:
                log.warning("calibration: cannot record the start of %s: %s", s.key, exc)
                discarded["unreadable"] = discarded.get("unreadable", 0) + 1
        if observations or discarded:
            store.append(observations, discarded, now=now)
        with self._lock:
            for s in done:
                self._drop(s, remember=True)
            for reason, count in discarded.items():
                left = self._discarded.get(reason, 0) - count
                if left > 0:
                    self._discarded[reason] = left
                else:
                    self._discarded.pop(reason, None)
        self.recorded += len(observations)
        for listener in self.on_recorded if observations else ():
            try:
                listener(observations)
            except Exception:
                log.exception("calibration: a listener of recorded starts failed")
        return len(observations)

    def _read_logs(self, done: list[_Start]) -> None:
        """Read the engine's log of each start to record whose profile sets ``engineLog`` (once per start)."""
        if self.engine_logs is None:
            return
        wanted: list[tuple[_Start, EngineLog]] = []
        for s in done:
            if s.log_read or s.scheduled_at is None or s.ready_at is None or s.ready_at < s.scheduled_at:
                continue
            setting = self.policy.profile(s.workload).engine_log
            if setting is not None:
                wanted.append((s, setting))
        found = self.engine_logs.read_all([(s.key, setting) for s, setting in wanted])
        for (s, _), phases in zip(wanted, found, strict=True):
            s.phases, s.log_read = phases, True

    def _found(self, start: _Start, record: NodeState | None, registry: frozenset[str],
               now: float) -> dict[str, Any] | str:
        """The start's node state as observation fields, or why the start cannot be observed."""
        settings = self.policy.calibration
        if start.scheduled_at is None or start.seen_at - start.scheduled_at > settings.capture_within \
                or now - start.scheduled_at > settings.capture_within:
            return "seen late"
        if record is None:
            return "stale inventory"
        # fresh by the record's rule (|now - heartbeat| <= ttl, extender.core.inventory) with the
        # smaller of its TTL and maxInventoryAge: a heartbeat stamped ahead of our clock by more
        # than that is no better news than one as far behind
        window = min(record.ttl, settings.max_inventory_age)
        if record.heartbeat <= 0 or not record.heartbeat - window <= now <= record.heartbeat + window:
            return "stale inventory"
        age = max(0.0, now - record.heartbeat)
        snapshot = InventorySnapshot.build(self.policy, [record], registry=registry)
        node_class = snapshot.classes[int(snapshot.class_index[0])]
        if node_class.name == UNKNOWN_CLASS.name:
            return "unknown node class"
        profile = self.policy.profile(start.workload)
        state, _ = snapshot.cache_state(profile)
        return {
            "nodeClass": node_class.name, "imageReference": profile.image.reference,
            "weightsVersion": profile.weights.version, "image": bool(state.image[0]),
            "weightsBytes": float(state.weights_bytes[0]), "compile": _WORDS[int(state.compile[0])],
            "snapshot": bool(state.snapshot[0]), "queuedBytes": float(state.queued_bytes[0]),
            "adapters": [bool(a) for a in state.adapters[0]],
            "inventoryAge": age,
        }
