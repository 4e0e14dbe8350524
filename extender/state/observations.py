"""Observed replica starts in Redis (written by ``extender sync``), and the calibrated policy read from them.

Keys (``<p>`` is the prefix)::

    <p>:calibration:observations:<workload>:<class>   sorted set  score: readyAt (unix s); member: JSON
    <p>:calibration:pairs                             set         "<workload>:<class>" of every key above
    <p>:calibration:discarded                         hash        reason -> starts not recorded
    <p>:calibration:version                           string      INCR'd by every append (restarted
                                                                  when it holds no integer: _STEP)

Names are policy names (lowercase letters, digits, ``-`` and ``.``), so ``:`` separates them
unambiguously. A member is an :class:`extender.core.calibration.Observation` as JSON; it holds the
pod's name and times, so two starts never collide.

Bounds, applied to every pair in the same transaction as every append (like the demand history,
:mod:`extender.state.history`): observations older than ``max_age_s`` are dropped, and so is
everything beyond the newest ``window`` of a (workload, class). Both come from the writer's policy
(``calibration.maxAge`` and ``calibration.window``).

Readers (the extender's refresher, the scaler, ``extender calibrate show``) poll the version with
one GET and read everything again only when it moved: a few hundred small members per pair.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from pydantic import ValidationError

from extender.core.calibration import NO_NODE_FACTORS, NodeFactors, Observation, effective_calibration
from extender.core.errors import ExtenderError, InvalidValueError, StateError
from extender.core.inventory import NodeState
from extender.core.policy import Policy
from extender.core.schema import read_stored
from extender.core.units import read_int
from extender.state.errors import redis_errors
from extender.state.store import InventoryStore, corrupt_reason, decode, stored_beat, with_beat

log = logging.getLogger(__name__)

#: Steps the version at the end of an append's MULTI/EXEC: ``INCR``, or, when the key holds no integer
#: (a hand edit, another tool), ``SET`` to ``ARGV[1]`` (the writer's clock in milliseconds: above the
#: count of appends any reader can have cached, so every reader sees it move and fits again). Inside
#: MULTI a failed INCR did not undo the rest: the starts and discard counts landed, the append failed,
#: and the sync recorded them again every pass (counting the discards again) while no reader saw the
#: version move. Returns ``{version}``, or ``{version, what the key held}`` after a restart.
_STEP = """
local v = redis.pcall('INCR', KEYS[1])
if type(v) == 'number' then return {v} end
local held = redis.pcall('GET', KEYS[1])
if type(held) ~= 'string' then held = 'a Redis ' .. redis.call('TYPE', KEYS[1]).ok end
redis.call('SET', KEYS[1], ARGV[1])
return {tonumber(ARGV[1]), held}
"""

#: Observations kept per (workload, class) and their age, when the writer does not say.
DEFAULT_WINDOW = 200
DEFAULT_MAX_AGE_S = 7 * 86_400.0


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def encode(observation: Observation) -> str:
    """The stored form: camelCase JSON with sorted keys (equal observations are equal members).

    ``phases`` is left out when ``None``, so a start without engine phase times is stored as a
    release without them stores it (the same member, whichever release wrote it).
    """
    data = observation.model_dump(mode="python", by_alias=True)
    if data.get("phases") is None:
        data.pop("phases", None)
    return json.dumps(data, separators=(",", ":"), sort_keys=True, allow_nan=False)


@dataclass(frozen=True)
class Stored:
    """Everything in the store: observations, starts not recorded by reason, unreadable members."""

    version: int
    observations: tuple[Observation, ...]
    discarded: Mapping[str, int]
    unreadable: int = 0


class ObservationStore:
    """Append and read observed starts (module docstring for the keys and bounds)."""

    def __init__(self, client: redis.Redis, *, prefix: str = "extender", window: int = DEFAULT_WINDOW,
                 max_age_s: float = DEFAULT_MAX_AGE_S) -> None:
        if window < 1 or not max_age_s > 0:
            raise InvalidValueError("observation bounds must be positive")
        self.client = client
        self.prefix = prefix
        self.window = window
        self.max_age_s = max_age_s

    @classmethod
    def for_policy(cls, client: redis.Redis, policy: Policy, *, prefix: str = "extender") -> ObservationStore:
        """A store bounded by the policy's ``calibration.window`` and ``calibration.maxAge``."""
        return cls(client, prefix=prefix, window=policy.calibration.window, max_age_s=policy.calibration.max_age)

    # ---- keys --------------------------------------------------------------------------------

    def key(self, workload: str, node_class: str) -> str:
        return f"{self.prefix}:calibration:observations:{workload}:{node_class}"

    @property
    def pairs_key(self) -> str:
        return f"{self.prefix}:calibration:pairs"

    @property
    def discarded_key(self) -> str:
        return f"{self.prefix}:calibration:discarded"

    @property
    def version_key(self) -> str:
        return f"{self.prefix}:calibration:version"

    # ---- writes ------------------------------------------------------------------------------

    def append(self, observations: Sequence[Observation], discarded: Mapping[str, int] | None = None, *,
               now: float) -> int:
        """Store observations and count discarded starts in one transaction; returns the new version."""
        for o in observations:
            if not all(math.isfinite(v) for v in (o.scheduled_at, o.ready_at)):
                raise InvalidValueError(f"an observation's times must be finite, got {o}")
        groups: dict[tuple[str, str], dict[str, float]] = {}
        for o in observations:
            groups.setdefault((o.workload, o.node_class), {})[encode(o)] = o.ready_at
        cutoff = now - self.max_age_s
        with redis_errors(f"recording observed starts (SMEMBERS {self.pairs_key})"):
            known: Any = self.client.smembers(self.pairs_key)
        pairs = {tuple(_text(p).partition(":")[::2]) for p in known} | set(groups)
        with redis_errors("recording observed starts"), self.client.pipeline(transaction=True) as pipe:
            for workload, cls in sorted(pairs):
                key = self.key(workload, cls)
                members = groups.get((workload, cls))
                if members:
                    pipe.zadd(key, members)
                    pipe.sadd(self.pairs_key, f"{workload}:{cls}")
                pipe.zremrangebyscore(key, "-inf", f"({cutoff!r}")
                pipe.zremrangebyrank(key, 0, -(self.window + 1))
            for reason, count in (discarded or {}).items():
                if count:
                    pipe.hincrby(self.discarded_key, reason, count)
            # as text (EVAL): inside MULTI a missing script would fail after the writes beside it
            pipe.eval(_STEP, 1, self.version_key, max(1, int(now * 1000)))
            result = pipe.execute()
        version, *held = result[-1]
        if held:
            log.warning("calibration: %r held %r, not an integer: restarted at %d", self.version_key,
                        _text(held[0]), version, extra={"key": self.version_key})
        return int(version)

    # ---- reads -------------------------------------------------------------------------------

    def version(self) -> int:
        """The store's version (0 when nothing was ever recorded): one GET."""
        with redis_errors(f"reading the observations' version (GET {self.version_key})"):
            raw: Any = self.client.get(self.version_key)
        try:
            return read_int(raw) if raw is not None else 0
        except ValueError as exc:
            raise StateError(f"{self.version_key} holds {raw!r}, not an integer") from exc

    def read(self) -> Stored:
        """Every stored observation (oldest first per pair), the discard counts and the version.

        A member that does not parse is skipped and counted in ``unreadable`` (another writer, an
        older format): one bad member must not stop every fit. Fields this release does not know
        (a newer release wrote the member) are ignored: the start is still counted. So is anything
        else a person or a tool may have left: a pair whose key holds another Redis type (its
        starts are not read), a discard count that is not a whole number (not counted), a version
        that is not one (read as 0), each logged with its key; the other pairs are read as usual.
        Nothing unreadable is removed or rewritten here.
        """
        with redis_errors("reading observed starts"):
            with self.client.pipeline(transaction=True) as pipe:
                pipe.get(self.version_key)
                pipe.smembers(self.pairs_key)
                pipe.hgetall(self.discarded_key)
                raw_version, raw_pairs, raw_discarded = pipe.execute()
            pairs = sorted(_text(p) for p in raw_pairs)
            keys = [self.key(*pair.partition(":")[::2]) for pair in pairs]
            with self.client.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.zrange(key, 0, -1)
                # one key of another type must not spoil the others: its reply is the error
                members = pipe.execute(raise_on_error=False) if keys else []
        out: list[Observation] = []
        unreadable = 0
        for key, group in zip(keys, members, strict=True):
            if isinstance(group, redis.RedisError):
                log.warning("calibration: skipping the observed starts in %r: %s", key, group, extra={"key": key})
                continue
            for member in group:
                try:
                    out.append(read_stored(Observation, member))
                except (ValidationError, ValueError):
                    unreadable += 1
        if unreadable:
            log.warning("skipped %d unreadable observation(s) in %s", unreadable, self.pairs_key)
        discarded: dict[str, int] = {}
        for k, v in raw_discarded.items():
            count = _count(v)
            if count is None:
                log.warning("calibration: skipping the discard count %r of %r in %r: not a whole number",
                            v, _text(k), self.discarded_key, extra={"key": self.discarded_key})
            else:
                discarded[_text(k)] = count
        version = _count(raw_version)
        if version is None and raw_version is not None:
            log.warning("calibration: %r holds %r, not an integer: read as version 0", self.version_key,
                        raw_version, extra={"key": self.version_key})
        return Stored(version or 0, tuple(out), discarded, unreadable)


def _count(raw: str | bytes | None) -> int | None:
    """A stored count (ASCII digits, as INCR and HINCRBY write them), or ``None`` when it is not one."""
    try:
        count = None if raw is None else read_int(raw)
    except ValueError:
        return None
    return count if count is not None and count >= 0 else None


@dataclass
class CalibratedPolicy:
    """The policy the estimator uses, from a base policy and the store: one per consumer, kept.

    ``policy_for(base)`` is :func:`extender.core.calibration.effective_policy` over the stored
    observations, and ``calibration_for(base)`` the same policy with the per-node factors of the
    same fit (:func:`~extender.core.calibration.effective_calibration`). It re-fits when the base
    policy object changed, or when the store's version moved and the last fit is at least
    ``max(min_interval_s, duty_factor x c)`` old, ``c`` being how long the last refit took by
    ``clock`` (reading the store and fitting); otherwise it costs one GET. A busy cluster records
    a start every few seconds, and a refit costs some 10 ms per (workload, class) at the default
    window but seconds at 20,000 stored starts, all of it holding the caller's GIL: in a serving
    worker a duty factor of ``k`` keeps refits to at most ``1/k`` of its time, whatever the store
    holds. The interval only decides when a fit is taken; a fit is the same function of the stored
    starts and the time on every replica. With
    ``calibration.mode`` other than ``apply`` the base is returned without reading anything. When
    the store cannot be read, the last calibrated policy of the same base is kept, else the base
    itself: calibration is never a reason to stop scoring or scaling.
    """

    store: ObservationStore
    clock: Callable[[], float] = time.time
    min_interval_s: float = 30.0
    #: 0: ``min_interval_s`` alone spaces refits (the scaler and the CLI, which serve no requests).
    duty_factor: float = 0.0
    _base: Policy | None = field(default=None, init=False, repr=False)
    _version: int = field(default=-1, init=False, repr=False)
    _fitted_at: float = field(default=-math.inf, init=False, repr=False)
    #: How long the last refit took (seconds by ``clock``).
    cost_s: float = field(default=0.0, init=False)
    _result: Policy | None = field(default=None, init=False, repr=False)
    _nodes: NodeFactors = field(default=NO_NODE_FACTORS, init=False, repr=False)
    #: The last error reading the store (``None`` when the last read worked).
    error: str | None = field(default=None, init=False)

    def policy_for(self, base: Policy) -> Policy:
        return self.calibration_for(base)[0]

    @property
    def interval_s(self) -> float:
        """The least time between refits of one base policy: ``max(min_interval_s, duty_factor x cost_s)``."""
        return max(self.min_interval_s, self.duty_factor * self.cost_s)

    def calibration_for(self, base: Policy) -> tuple[Policy, NodeFactors]:
        """The policy and the per-node factors (:func:`~extender.core.calibration.effective_calibration`),
        under the same rules as :meth:`policy_for`: the same objects until a refit, the last ones (or
        the base and no factors) when the store cannot be read."""
        if base.calibration.mode != "apply":
            return base, NO_NODE_FACTORS
        now = self.clock()
        try:
            recent = now - self._fitted_at < self.interval_s
            if base is self._base and self._result is not None and (recent or self.store.version() == self._version):
                return self._result, self._nodes
            stored = self.store.read()
            result, nodes = effective_calibration(base, stored.observations, now=now)
            self.cost_s = max(0.0, self.clock() - now)
        except ExtenderError as exc:
            if self.error is None:
                log.warning("calibration: cannot read the observed starts, keeping the %s policy: %s",
                            "last calibrated" if base is self._base else "uncalibrated", exc)
            self.error = str(exc)
            if base is self._base and self._result is not None:
                return self._result, self._nodes
            return base, NO_NODE_FACTORS
        self.error = None
        self._base, self._version, self._result, self._fitted_at = base, stored.version, result, now
        self._nodes = nodes
        return result, nodes


def observations_of(stored: Stored, workloads: Iterable[str] = (), classes: Iterable[str] = ()) -> list[Observation]:
    """The stored observations of the given workloads and classes (all when empty), newest first."""
    w, c = set(workloads), set(classes)
    chosen = [o for o in stored.observations if (not w or o.workload in w) and (not c or o.node_class in c)]
    return sorted(chosen, key=lambda o: o.ready_at, reverse=True)


def read_nodes(inventory: InventoryStore, names: Iterable[str]) -> tuple[dict[str, NodeState], frozenset[str]]:
    """The records of ``names`` (missing and unreadable ones left out) and the compile registry, in one round trip.

    Each record carries the later of its own heartbeat and the node's bare heartbeat, as every
    reader of :class:`~extender.state.store.InventoryStore` sees it (``with_beat``): an agent whose
    disk did not change only sends bare heartbeats, and its node is as fresh as they say.
    """
    ordered = sorted(set(names))
    if not ordered:
        with redis_errors(f"reading the nodes of new replicas (SMEMBERS {inventory.keys.registry})"):
            registry: Any = inventory.client.smembers(inventory.keys.registry)
        return {}, frozenset(_text(m) for m in registry)
    keys = inventory.keys
    with redis_errors("reading the nodes of new replicas"), inventory.client.pipeline(transaction=False) as pipe:
        pipe.mget([keys.node(n) for n in ordered])
        pipe.hmget(keys.heartbeats, ordered)
        pipe.smembers(keys.registry)
        raws, beats, members = pipe.execute()
    records: dict[str, NodeState] = {}
    for name, raw, beat in zip(ordered, raws, beats, strict=True):
        if raw is None:
            continue
        try:
            records[name] = with_beat(decode(name, raw), stored_beat(beat))
        except ValueError as exc:  # one line, as the full read says it (pydantic's own text spans several)
            log.warning("calibration: skipping the unreadable record %r: %s", keys.node(name), corrupt_reason(exc),
                        extra={"node": name, "key": keys.node(name)})
    return records, frozenset(_text(m) for m in members)
