"""The per-worker background thread that keeps an inventory snapshot and the policy current.

Requests never wait on Redis: they read :attr:`Refresher.engine`, an immutable
(policy, snapshot) pair swapped in by one reference assignment. This thread, once per
``poll_interval_s``:

1. checks the policy file (stat, then content hash); a valid new policy replaces the old one and
   the snapshot is rebuilt from the records already held (no Redis needed); an invalid one is
   logged with every problem and the last good policy stays;
2. reads the store's two counters (one round trip): the version, bumped by record writes, and the
   heartbeat sequence, bumped by agents that report nothing new. When the version moved it reads
   the records written since (every record at start and every ``full_reload_interval_s``),
   patches them into a new columnar snapshot (:meth:`InventorySnapshot.update`: cost in
   proportion to what changed), then pre-computes each profile's score table so the first
   request after a change does not pay for it (re-encoding only rows whose score moved). When
   the sequence moved it reads only the new heartbeats, a name and a number each, and moves the
   snapshot's heartbeat column (:meth:`Engine.with_heartbeats`: score tables are kept unless a
   stale node came back). Either counter below ours means the store lost its data (it restarted
   empty, or failed over to a replica that lagged): everything is read again at once;
3. records when the snapshot was last confirmed against the store. A request that finds the
   confirmation older than ``max_snapshot_age_s`` gets the neutral reply: the store is down or this
   thread is stuck, and old news about warm caches could be wrong.

With ``calibration.mode: apply`` the engine is built with the calibrated policy
(:class:`extender.state.observations.CalibratedPolicy`: the observations' version is one more GET
per iteration, and a new fit is one more rebuild), so scores use the fitted phase times. Refits
are spaced by ``calibration_interval_s`` and by ``calibration_duty_factor`` times the last refit's
cost, as reloads are by ``rebuild_duty_factor``: a refit holds this worker's GIL too.

Why poll a counter instead of subscribing to keyspace notifications: notifications must be switched
on in the server's configuration (``notify-keyspace-events``, often locked on managed Redis), they
are fire-and-forget pub/sub (a worker that reconnects has missed them and must poll to resync
anyway), and each worker would hold a dedicated subscriber connection. A GET every half second per
worker is negligible load, bounds staleness by construction, coalesces bursts of agent writes into
one rebuild, and doubles as the health check that drives fail-open.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from extender.api.scheduler.engine import Engine
from extender.api.scheduler.metrics import Metrics
from extender.api.scheduler.settings import Settings, Store
from extender.core.calibration import NO_NODE_FACTORS, NodeFactors
from extender.core.errors import StateError, StoreUnavailableError
from extender.core.inventory import InventorySnapshot, NodeState
from extender.core.policy import Policy
from extender.files import PolicyFile

if TYPE_CHECKING:
    from extender.state.observations import CalibratedPolicy

log = logging.getLogger(__name__)


class Throttle:
    """Allows one log line per key per interval, and counts what it held back."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def allow(self, key: str, now: float | None = None) -> int | None:
        """``None`` to stay quiet, else how many messages for ``key`` were held back since the last one."""
        t = time.monotonic() if now is None else now
        with self._lock:
            last = self._last.get(key)
            if last is not None and t - last < self.interval_s:
                self._held[key] = self._held.get(key, 0) + 1
                return None
            self._last[key] = t
            return self._held.pop(key, 0)


@dataclass(frozen=True)
class Health:
    """What the request path needs to know about the snapshot."""

    #: The policy to match pods with (the engine's, so matching and scoring always agree).
    policy: Policy
    engine: Engine | None
    #: Why the reply must be neutral right now, or ``None`` when the engine may be used.
    fail_open: str | None
    age_s: float


class Refresher:
    """Keeps one worker's (policy, snapshot) current; see the module docstring."""

    def __init__(self, settings: Settings, policy: Policy, metrics: Metrics, throttle: Throttle, *,
                 version: str | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self.throttle = throttle
        self.policy = policy
        #: Version of :attr:`policy` (:func:`extender.files.policy_version`); ``None``: unknown, so
        #: the first look at the file takes whatever valid policy it holds.
        self.policy_version = version
        #: Version of the policy the current engine was built with (what requests are scored by).
        self.engine_policy_version: str | None = None
        self.engine: Engine | None = None
        #: The policy the engine estimates with: :attr:`policy`, calibrated when its mode is ``apply``.
        self.estimator_policy = policy
        #: The per-node factors the engine multiplies its estimates by (per-node calibration).
        self.estimator_nodes: NodeFactors = NO_NODE_FACTORS
        self._calibration: CalibratedPolicy | None = None
        self.started_at = time.time()
        self.confirmed_at = 0.0
        self.error: tuple[str, str] | None = None
        self._store: Store | None = None
        self._records: list[NodeState] | None = None
        self._registry: frozenset[str] = frozenset()
        self._version = -1
        #: Heartbeat sequence the snapshot has caught up with, and the heartbeats read since the
        #: last full read (records rebuilt from :attr:`_records` get them back).
        self._beat_seq = 0
        self._beats: dict[str, float] = {}
        self._last_load = -float("inf")
        self._last_full = -float("inf")
        self._rebuild_cost = 0.0
        self._policy_dirty = False
        self.policy_file = PolicyFile(settings.policy_path, version)
        self._policy_checked = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- thread ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Run :meth:`refresh_once` every ``poll_interval_s`` in a daemon thread."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="extender-refresher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the thread to finish and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def alive(self) -> bool:
        """False when the thread was started and has died (liveness should then fail)."""
        return self._thread is None or self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh_once()
            except Exception:  # never let the thread die: a dead refresher means stale forever
                if self.throttle.allow("refresher-crash") is not None:
                    log.exception("inventory refresher iteration failed")
            self._stop.wait(self.settings.poll_interval_s)

    # ---- one iteration ---------------------------------------------------------------------------

    def refresh_once(self, now: float | None = None) -> None:
        """Check the policy file and the store once; swap in a new engine when either changed."""
        t = time.time() if now is None else now
        if time.monotonic() - self._policy_checked >= self.settings.policy_check_interval_s:
            self.check_policy()
        self._calibrate()
        if self._policy_dirty and self._records is not None:
            self._rebuild(t, self._records, self._registry, self._version)  # no Redis needed
        try:
            store = self._store if self._store is not None else self._connect()
            version, beat_seq = store.versions()
            # A reload holds this worker's GIL for its whole duration (a few ms for a patch, 0.3 s
            # for a full read at 15,000 nodes), and requests arriving meanwhile are slowed down;
            # spacing reloads by a multiple of their cost keeps that to a small share of requests.
            spacing = max(self.settings.min_rebuild_interval_s, self.settings.rebuild_duty_factor * self._rebuild_cost)
            # A counter below ours: the store restarted empty (or failed over to a replica that
            # lagged, or is another one), and its change log cannot tell us what we hold that it
            # lost (the full read also resets beat_seq). Either counter: agents whose heartbeats
            # the emptied store refuses write whole reports, and those can bring the version back
            # to ours, or past it, before we look; the heartbeat sequence has a long way back up.
            # Both only ever grow in a store that keeps its data.
            went_back = version < self._version or beat_seq < self._beat_seq
            if self._records is None or went_back or (version != self._version and t - self._last_load >= spacing):
                started = time.perf_counter()
                if self._records is None or went_back or t - self._last_full >= self.settings.full_reload_interval_s:
                    loaded, records, registry = store.load_all()  # with every heartbeat up to beat_seq
                    self._last_full = t
                    self._last_load = t
                    self._beats, self._beat_seq = {}, beat_seq
                    self._rebuild(t, records, registry, loaded)
                else:  # only what was written since our version: a changed record costs one record
                    loaded, changed, registry = store.changes_since(self._version)
                    self._last_load = t
                    # a record written whole says its own heartbeat (the store dropped the bare one,
                    # and the record read carries any later): one kept here would outlive it in a
                    # rebuild, as a heartbeat from a clock that ran ahead, stale ahead for good
                    for name in changed:
                        self._beats.pop(name, None)
                    if not self._patch(t, changed, registry, loaded):
                        self._rebuild(t, _apply(self._records, changed), registry, loaded)
                self._rebuild_cost = time.perf_counter() - started
            if beat_seq != self._beat_seq and self.engine is not None:
                self._beat_seq, beats = store.heartbeats_since(self._beat_seq)
                self._take_beats(t, beats)
            if self.engine is not None:
                # A record whose heartbeat just expired makes its profile tables outdated; rebuild
                # them here rather than in the next request.
                self.engine.warm(t)
            self.confirmed_at = t
            if self.error is not None:
                log.info("inventory store reachable again (version %d)", self._version,
                         extra={"version": self._version})
            self.error = None
        except StoreUnavailableError as exc:
            self._note_error("store_unavailable", exc)
            if self.settings.store_factory is None and not self.settings.redis_url:
                # The embedded server is ours to keep running: connecting again starts it anew
                # (one server per data directory, whichever worker gets there first).
                self._drop_store()
        except StateError as exc:
            self._note_error("store_error", exc)
        finally:
            self._publish(t)

    def _connect(self) -> Store:
        factory = self.settings.store_factory
        if factory is not None:
            self._store = factory()
        else:
            from extender.state import InventoryStore, connect

            self._store = InventoryStore(connect(self.settings.redis_url, self.settings.data_dir),
                                         prefix=self.settings.key_prefix)
        client, keys = getattr(self._store, "client", None), getattr(self._store, "keys", None)
        if client is not None and keys is not None:
            from extender.state.observations import CalibratedPolicy, ObservationStore

            self._calibration = CalibratedPolicy(ObservationStore(client, prefix=keys.prefix),
                                                 min_interval_s=self.settings.calibration_interval_s,
                                                 duty_factor=self.settings.calibration_duty_factor)
        return self._store

    def _calibrate(self) -> None:
        """Take the calibrated policy when it changed (a new fit or a new base policy); never raises."""
        calibrated, nodes = ((self.policy, NO_NODE_FACTORS) if self._calibration is None
                             else self._calibration.calibration_for(self.policy))
        if calibrated is not self.estimator_policy or nodes is not self.estimator_nodes:
            self.estimator_policy, self.estimator_nodes = calibrated, nodes
            self._policy_dirty = True

    def _drop_store(self) -> None:
        store, self._store = self._store, None
        self._calibration = None
        client = getattr(store, "client", None)
        if client is not None:
            client.close()

    def _note_error(self, reason: str, exc: Exception) -> None:
        self.error = (reason, str(exc))
        self.metrics.refresh_errors.labels(reason).inc()
        held = self.throttle.allow(f"refresh:{reason}")
        if held is not None:
            log.warning("inventory refresh failed (%s): %s%s", reason, exc,
                        f" [{held} similar messages suppressed]" if held else "",
                        extra={"reason": reason, "error": str(exc), "suppressed": held})

    def _rebuild(self, now: float, records: list[NodeState], registry: frozenset[str], version: int) -> None:
        """Swap in an engine for ``records``; what it was built from is kept only once it was built.

        A build that fails leaves the version unconsumed, so the next iteration tries again and the
        snapshot is not confirmed meanwhile (it goes stale and the replies neutral, instead of an
        old snapshot passing for the current one).
        """
        engine, skipped = self._build(now, records, registry, version)
        for name, why in skipped:
            self.metrics.refresh_errors.labels("bad_record").inc()
            if self.throttle.allow(f"bad-record:{name}") is not None:
                log.warning("skipping inventory record %r: it breaks the snapshot build (%s)", name, why,
                            extra={"node": name, "error": why})
        bad = {name for name, _ in skipped}
        self._records = [r for r in records if r.name not in bad] if bad else records
        self._registry, self._version = registry, version
        self.engine = engine
        self.engine_policy_version = self.policy_version
        self._policy_dirty = False

    def _patch(self, now: float, changed: dict[str, NodeState | None], registry: frozenset[str],
               version: int) -> bool:
        """Swap in an engine for the current snapshot with ``changed`` patched in; False when it cannot.

        Costs in proportion to ``changed`` (:meth:`InventorySnapshot.update`, and score tables that
        re-encode only rows whose score moved). It cannot when there is no engine yet or the policy
        changed since (the caller then rebuilds everything), nor when a patched record breaks the
        build (the caller's full rebuild then finds and skips it).
        """
        engine = self.engine
        if (engine is None or self._policy_dirty or engine.policy is not self.estimator_policy
                or engine.nodes is not self.estimator_nodes):
            return False
        try:
            snapshot = engine.snapshot.update(engine.policy, changed, version=version, taken_at=now,
                                              registry=registry)
            patched = Engine(engine.policy, snapshot, previous=engine, nodes=engine.nodes)
            patched.warm(now)
        except Exception as exc:  # the full rebuild that follows finds and skips a bad record
            if self.throttle.allow("patch-failed") is not None:
                log.warning("patching %d changed records failed, rebuilding from every record: %s", len(changed), exc,
                            extra={"changed": len(changed), "error": str(exc)})
            return False
        self._records = list(snapshot.nodes)
        self._registry, self._version = registry, version
        self.engine = patched
        self.engine_policy_version = self.policy_version
        return True

    def _take_beats(self, now: float, beats: dict[str, float]) -> None:
        """Swap in an engine whose snapshot has ``beats`` in its heartbeat column (records untouched)."""
        engine = self.engine
        if engine is None or not beats:
            return
        self._beats.update(beats)
        self.engine = engine.with_heartbeats(engine.snapshot.with_heartbeats(beats, taken_at=now), now)

    @property
    def serving_version(self) -> str | None:
        """The version of the policy requests are answered with now."""
        return self.engine_policy_version if self.engine is not None else self.policy_version

    def _build(self, now: float, records: list[NodeState], registry: frozenset[str],
               version: int) -> tuple[Engine, list[tuple[str, str]]]:
        """The engine for ``records``, leaving out any record that makes the build fail.

        The model bounds every field so that no record should; this is the second line, for a
        record that still does (another writer, a future field). Bisecting finds the culprits in
        O(k log n) builds for k of them, and costs nothing while every record is fine.
        """

        def attempt(part: list[NodeState]) -> Engine:
            policy = self.estimator_policy
            snapshot = InventorySnapshot.build(policy, part, version=version, taken_at=now, registry=registry)
            if self._beats:  # heartbeats read since the records were: the records do not carry them
                snapshot = snapshot.with_heartbeats(self._beats, taken_at=now)
            engine = Engine(policy, snapshot, nodes=self.estimator_nodes)
            engine.warm(now)
            return engine

        try:
            return attempt(records), []
        except Exception:
            pass
        skipped: list[tuple[str, str]] = []

        def usable(part: list[NodeState]) -> list[NodeState]:
            try:
                attempt(part)
                return part
            except Exception as exc:
                if len(part) <= 1:
                    skipped.extend((r.name, f"{type(exc).__name__}: {exc}") for r in part)
                    return []
                mid = len(part) // 2
                return usable(part[:mid]) + usable(part[mid:])

        return attempt(usable(records)), skipped

    def _publish(self, now: float) -> None:
        engine = self.engine
        since = self.confirmed_at if engine is not None else self.started_at
        self.metrics.snapshot_age.set(max(0.0, now - since))
        if engine is not None:
            self.metrics.nodes_known.set(len(engine.snapshot))
            self.metrics.snapshot_version.set(engine.snapshot.version)

    # ---- policy hot reload -----------------------------------------------------------------------

    def check_policy(self) -> bool:
        """Reload the policy if the file holds a new valid one (:class:`PolicyFile`); True when taken."""
        self._policy_checked = time.monotonic()
        found = self.policy_file.poll()
        if found.outcome == "invalid":
            self.metrics.policy_reloads.labels("invalid").inc()
        if found.policy is None:
            return False
        self.policy, self.policy_version = found.policy, self.policy_file.version
        self._policy_dirty = True
        self.metrics.policy_reloads.labels("ok").inc()
        return True

    # ---- request path ----------------------------------------------------------------------------

    def health(self, now: float) -> Health:
        """The engine to use, or why not (never blocks, never touches the store)."""
        engine = self.engine
        if engine is None:
            return Health(self.policy, None, "no_snapshot", now - self.started_at)
        age = now - self.confirmed_at
        if age > self.settings.max_snapshot_age_s:
            reason = "store_unavailable" if self.error and self.error[0] == "store_unavailable" else "stale_snapshot"
            return Health(engine.policy, None, reason, age)
        return Health(engine.policy, engine, None, age)

    def ready(self, now: float) -> tuple[bool, str]:
        """Readiness: a snapshot is loaded, or the startup grace is over and fail-open is declared.

        Ready either way once the grace is over: neutral replies serve the scheduler better than an
        endpoint taken out of the Service. The mode says which replies it gets: ``snapshot`` while
        the snapshot is within its bound, ``fail-open`` when every reply is neutral (no snapshot,
        or the store down or the refresher stuck past ``max_snapshot_age_s``).
        """
        if self.engine is not None:
            return True, "snapshot" if self.health(now).fail_open is None else "fail-open"
        if now - self.started_at >= self.settings.startup_grace_s:
            return True, "fail-open"
        return False, "loading"


def _apply(records: list[NodeState], changed: dict[str, NodeState | None]) -> list[NodeState]:
    """``records`` with ``changed`` applied (``None``: the node is gone), sorted by name like ``load_all``."""
    if not changed:
        return records
    by_name = {r.name: r for r in records}
    for name, record in changed.items():
        if record is None:
            by_name.pop(name, None)
        else:
            by_name[name] = record
    return [by_name[name] for name in sorted(by_name)]
