"""The node inventory in Redis: one JSON record per node, a version counter bumped by every write.

Keys (``<p>`` is the prefix, ``extender`` by default; see docs/inventory.md)::

    <p>:node:<name>          string   JSON of one NodeState (camelCase fields, SI units)
    <p>:nodes                set      names of every stored node
    <p>:compile-registry     set      compile-cache keys any node can fetch
    <p>:inventory:version    string   integer, INCR'd in the same MULTI/EXEC as every write
    <p>:inventory:changes    zset     node name -> version of the last write that touched it
    <p>:heartbeats           hash     node name -> unix seconds of its latest heartbeat-only report
    <p>:heartbeats:seq       string   integer, INCR'd by every heartbeat batch
    <p>:heartbeats:changes   zset     node name -> heartbeat sequence of its latest heartbeat

Why one JSON string per node rather than a hash: a record is validated as a whole by the same
pydantic model that checks ``inventory load`` files, it has nested maps and lists that a flat hash
cannot hold, and a whole inventory comes back in one ``MGET``.

Why a version counter rather than keyspace notifications: a reader learns "anything changed?" with
one ``GET`` of one key, notifications need ``notify-keyspace-events`` configured on the server
(often not allowed on managed Redis) and are lost while a subscriber is disconnected, whereas a
counter read after a reconnect still tells the truth.

Incremental reads: the same transaction records, per node name, the version its write produced
(one member per node ever written, so the set is bounded by the fleet). A reader at version v asks
for the names scored above v and reads only those records (:meth:`InventoryStore.changes_since`):
with 1,000 heartbeats a second a reader pays for the nodes that reported, not for all 15,000.

Heartbeats apart from records: an agent whose disk did not change reports only "still here, at time
t" (:meth:`InventoryStore.beat_many`). That writes one hash field and one sequence mark, and leaves
the record, the version and the version's change log alone, so a reader polling the version learns
nothing it would have to decode; it asks for the heartbeats since its sequence instead
(:meth:`InventoryStore.heartbeats_since`: a name and a number per node that reported). Every read of
records returns each record with the later of its own ``heartbeat`` and the one in the hash, so no
reader can see an older heartbeat than was reported. Writes that replace or delete a record drop
its hash entry with it.

A full read decodes only the records whose stored text changed since the store object's previous
full read (it keeps the text and record of each: about as much memory again as the records).

Consistency of :meth:`InventoryStore.load_all`: every write changes records, the name set and the
version in one MULTI/EXEC, and the read takes the version, the name set, the registry and the
records in one MULTI/EXEC too, so it sees the store between two writes, never in the middle of one.
The only thing the read must guess in advance is which record keys to ``MGET``; it uses the names
it saw last time and, if the name set read inside the transaction holds a name it did not fetch (a
node joined meanwhile), reads again with the new names. Node additions are rare, so this ends in one
or two round trips however many agents are reporting. (A "read everything, retry while the version
moved" loop would not: with thousands of agents reporting, the version moves during every read.)
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import redis
from pydantic import ValidationError
from redis.client import Pipeline
from redis.commands.core import Script

from extender.core.errors import InvalidValueError, OversizedRecordError, StateError
from extender.core.inventory import MAX_RECORD_BYTES, MAX_TIMESTAMP, NodeState, within_totals
from extender.core.schema import read_stored
from extender.core.units import read_float, read_int
from extender.state.errors import redis_errors

log = logging.getLogger(__name__)

#: Why a name in the node set has no record: its key is absent or holds another Redis type (``MGET``
#: reads both as nil).
MISSING = "listed in the node set but the record is missing or not a string"

#: Reads of :meth:`InventoryStore.load_all` before giving up on a name set that changes every time.
MAX_READ_ATTEMPTS = 8


@dataclass(frozen=True)
class Keys:
    """The Redis key names under one prefix.

    With Redis Cluster, use a prefix with a hash tag (``{extender}``) so every key lands in one
    slot; MULTI/EXEC cannot span slots.
    """

    prefix: str = "extender"

    def node(self, name: str) -> str:
        return f"{self.prefix}:node:{name}"

    @property
    def nodes(self) -> str:
        return f"{self.prefix}:nodes"

    @property
    def registry(self) -> str:
        return f"{self.prefix}:compile-registry"

    @property
    def version(self) -> str:
        return f"{self.prefix}:inventory:version"

    @property
    def changes(self) -> str:
        return f"{self.prefix}:inventory:changes"

    @property
    def heartbeats(self) -> str:
        return f"{self.prefix}:heartbeats"

    @property
    def beat_seq(self) -> str:
        return f"{self.prefix}:heartbeats:seq"

    @property
    def beat_changes(self) -> str:
        return f"{self.prefix}:heartbeats:changes"


#: Bumps the version and marks each written name with the new version, inside the write's
#: MULTI/EXEC (a script sees the INCR; a plain ZADD queued beside it could not know the value).
#: Sent as text (EVAL), unlike the other scripts (EVALSHA): inside MULTI a missing script is an
#: error of EXEC, after the writes queued beside it have been applied (Redis does not roll back), so
#: a ``SCRIPT FLUSH`` between redis-py's load of the script and EXEC would store records that no
#: version step announces, and incremental readers would never learn of them. The text is about
#: 100 bytes, and the server caches the compiled script by its digest either way.
_BUMP = """
local v = redis.call('INCR', KEYS[1])
for _, name in ipairs(ARGV) do redis.call('ZADD', KEYS[2], v, name) end
return v
"""


#: Records heartbeats of stored nodes: ARGV is name, time, field, digest, name, time, ...; ``KEYS[4 + j]``
#: is the record key of the j-th name. A name not in the node set, or whose record key holds no
#: string (deleted behind the store's back), is skipped (its record must be written whole first) and
#: returned; so is one with a ``field`` (not empty) whose value, in the i-th guard hash (the keys
#: after the record keys) for the i-th such name, does not have the SHA-1 ``digest`` (the record no
#: longer holds what the heartbeat vouches for). A heartbeat never moves back, but a stored value
#: that is not a number in [0, MAX_TIMESTAMP] counts as absent, as it does for readers
#: (:func:`stored_beat`). Returns ``{sequence, skipped names...}``.
_BEAT = """
local seq = redis.call('INCR', KEYS[1])
local skipped = {seq}
local record = 5
local guard = 5 + #ARGV / 4
for i = 1, #ARGV, 4 do
  local name, t, field, digest = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2], ARGV[i + 3]
  local ok = redis.call('SISMEMBER', KEYS[4], name) == 1 and redis.call('TYPE', KEYS[record]).ok == 'string'
  record = record + 1
  if field ~= '' then
    local held = redis.call('HGET', KEYS[guard], field)
    guard = guard + 1
    ok = ok and held ~= false and redis.sha1hex(held) == digest
  end
  if not ok then
    table.insert(skipped, name)
  else
    local old = tonumber(redis.call('HGET', KEYS[3], name))
    if old == nil or not (old >= 0 and old <= MAX_TIMESTAMP) or t > old then
      redis.call('HSET', KEYS[3], name, ARGV[i + 1])
    end
    redis.call('ZADD', KEYS[2], seq, name)
  end
end
return skipped
""".replace("MAX_TIMESTAMP", repr(float(MAX_TIMESTAMP)))


@dataclass(frozen=True)
class Guard:
    """What a heartbeat vouches for: the value of ``field`` in the hash ``key`` has SHA-1 ``digest``.

    :meth:`InventoryStore.beat_many` refuses the heartbeat otherwise: the record no longer holds the
    report the heartbeat is meant to keep fresh (:mod:`extender.state.sources`).
    """

    key: str
    field: str
    digest: str


def encode(state: NodeState) -> str:
    """The stored form of a record: JSON with camelCase keys and plain numbers in SI units.

    Numbers, not ``64GiB``-style strings: other writers (agents in any language) produce them
    without a units library, and reading them back skips the unit parser. The model accepts both.
    """
    text = json.dumps(state.model_dump(mode="python", by_alias=True), separators=(",", ":"), allow_nan=False)
    if len(text) > MAX_RECORD_BYTES:  # ASCII (json.dumps escapes the rest): characters are bytes
        raise OversizedRecordError(f"the record of node {state.name!r} is {len(text)} bytes, larger than the "
                                   f"{MAX_RECORD_BYTES} byte limit of one record")
    return text


def decode(name: str, raw: str | bytes) -> NodeState:
    """Parse a stored record; raises ``ValueError`` (pydantic's included) when it is unusable.

    The size is checked before parsing, so an oversized record costs a reader nothing. Fields this
    release does not know (a newer one wrote the record, during a rolling upgrade or after a
    rollback) are ignored, not a reason to skip the node (:func:`extender.core.schema.read_stored`).
    Free GPUs or free NVMe above their totals (stored by another writer) are read as the totals,
    with a warning (:func:`extender.core.inventory.within_totals`): every reader then serves and
    shows the same record, and ``inventory show --json`` stays loadable.
    """
    if len(raw) > MAX_RECORD_BYTES:
        raise InvalidValueError(f"record is {len(raw)} bytes, larger than the {MAX_RECORD_BYTES} byte limit")
    state = read_stored(NodeState, raw)
    if state.name != name:
        raise InvalidValueError(f"record is stored under node {name!r} but names node {state.name!r}")
    state, cut = within_totals(state)
    if cut:
        # %r: a node name is whatever a writer stored (line feeds, escapes)
        log.warning("inventory record of node %r says %s: read as the total", name, " and ".join(cut),
                    extra={"node": name})
    return state


def stored_beat(raw: str | bytes | None) -> float:
    """A stored heartbeat; anything unreadable counts as none (the record's own heartbeat stands)."""
    if raw is None:
        return 0.0
    try:
        value = read_float(raw)
    except ValueError:
        return 0.0
    return value if 0.0 <= value <= MAX_TIMESTAMP else 0.0


def with_beat(state: NodeState, beat: float) -> NodeState:
    """``state`` with the later of its own heartbeat and ``beat``."""
    return state if beat <= state.heartbeat else state.model_copy(update={"heartbeat": beat})


def _text(value: str | bytes) -> str:
    # Works with clients built with or without decode_responses=True.
    return value.decode() if isinstance(value, bytes) else value


def corrupt_reason(exc: ValueError) -> str:
    """Why a stored value was refused, in one line: pydantic's first error with where it is."""
    if isinstance(exc, ValidationError):
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        return f"{where + ': ' if where else ''}{first['msg']}{more}"
    return str(exc)


class InventoryStore:
    """Read and write node records; every write is one transaction that also bumps the version.

    Reading never fails on a bad record: :meth:`load_all` skips it, logs a warning once per key
    (again only after the key was fixed and broke anew) and lists it in :attr:`corrupt`.
    Thread-safe: the redis client pools connections and our own bookkeeping is locked.
    """

    def __init__(self, client: redis.Redis, *, prefix: str = "extender") -> None:
        self.client = client
        self.keys = Keys(prefix)
        #: Records skipped by the last :meth:`load_all`: Redis key -> why.
        self.corrupt: Mapping[str, str] = {}
        self._reported: set[str] = set()
        self._names_hint: list[str] = []
        #: name -> (stored text, its record) from the last :meth:`load_all`: a record whose text did
        #: not change since is not decoded again (decoding was most of a full read's cost).
        self._decoded: dict[str, tuple[str | bytes, NodeState]] = {}
        self._lock = threading.Lock()
        #: EVALSHA of the heartbeat script (its kilobyte of text is not sent per batch); loaded
        #: again when the server answers NOSCRIPT (restarted, failed over, ``SCRIPT FLUSH``).
        self._beat: Script = client.register_script(_BEAT)

    # ---- writes --------------------------------------------------------------------------------

    def put(self, state: NodeState) -> int:
        """Store one node's record (replacing the previous one); returns the new version."""
        return self.put_many([state])

    def put_many(self, states: Iterable[NodeState], *, registry: Iterable[str] = ()) -> int:
        """Store several records and add ``registry`` keys in one transaction: one version step.

        With nothing to write, nothing is written and the current version is returned.
        """
        batch = list(states)
        records = {self.keys.node(s.name): encode(s) for s in batch}  # a repeated name: the last wins
        names = sorted({s.name for s in batch})
        registry_keys = list(registry)
        if not records and not registry_keys:
            return self.version()

        def write(pipe: Pipeline) -> None:
            if records:
                pipe.mset(records)
                pipe.sadd(self.keys.nodes, *names)
                pipe.hdel(self.keys.heartbeats, *names)  # a whole record says its own heartbeat
            if registry_keys:
                pipe.sadd(self.keys.registry, *registry_keys)

        return self._write("writing node records", write, names)

    def replace(self, states: Iterable[NodeState], registry: Iterable[str]) -> int:
        """Make the inventory exactly ``states`` and ``registry``: other nodes are deleted.

        Deleting needs the current names, read under WATCH: if a writer adds a node between that
        read and our EXEC, the transaction is retried, so no node survives that should not.
        """
        batch = list(states)
        records = {self.keys.node(s.name): encode(s) for s in batch}
        names = {s.name for s in batch}
        registry_keys = list(registry)

        def swap(pipe: Pipeline) -> None:
            current = {_text(n) for n in pipe.smembers(self.keys.nodes)}
            pipe.multi()
            stale = current - names
            if stale:
                pipe.delete(*(self.keys.node(n) for n in stale))
            pipe.delete(self.keys.nodes, self.keys.registry, self.keys.heartbeats, self.keys.beat_changes)
            if records:
                pipe.mset(records)
                pipe.sadd(self.keys.nodes, *names)
            if registry_keys:
                pipe.sadd(self.keys.registry, *registry_keys)
            self.stage_bump(pipe, sorted(names | stale))

        with redis_errors("replacing the inventory"):
            result = self.client.transaction(swap, self.keys.nodes)  # retried on WatchError
        if not isinstance(result, list):  # pragma: no cover - EXEC of our commands is always a list
            raise StateError(f"replacing the inventory: unexpected transaction result {result!r}")
        return int(result[-1])

    def delete(self, name: str) -> int:
        """Remove a node's record; returns the new version (bumped even if the node was absent)."""

        def write(pipe: Pipeline) -> None:
            pipe.delete(self.keys.node(name))
            pipe.srem(self.keys.nodes, name)
            pipe.hdel(self.keys.heartbeats, name)

        return self._write(f"deleting node {name!r}", write, [name])

    def set_registry(self, keys: Iterable[str]) -> int:
        """Replace the compile registry with ``keys``; returns the new version."""
        members = list(keys)

        def write(pipe: Pipeline) -> None:
            pipe.delete(self.keys.registry)
            if members:
                pipe.sadd(self.keys.registry, *members)

        return self._write("replacing the compile registry", write)

    def add_registry(self, key: str) -> int:
        """Add one compile-cache key to the registry; returns the new version."""
        return self._write("adding to the compile registry", lambda pipe: pipe.sadd(self.keys.registry, key))

    def beat_many(self, beats: Mapping[str, float], *,
                  guards: Mapping[str, Guard] | None = None) -> tuple[int, list[str]]:
        """Record heartbeats of stored nodes; returns ``(heartbeat sequence, names not stored)``.

        Leaves records and the inventory version alone (see the module docstring): an agent whose
        disk did not change reports this way. A name that has no record (not in the node set, or its
        record key deleted or holding no string), or whose :class:`Guard` in ``guards`` does not
        hold, is not stored and comes back in the second item; its agent must write the whole record.
        A heartbeat older than the one stored is ignored.
        """
        guards = guards or {}
        args: list[str | float] = []
        guard_keys: list[str] = []
        for name, beat in beats.items():
            if not (0.0 <= beat <= MAX_TIMESTAMP):  # also refuses NaN
                raise InvalidValueError(f"heartbeat of node {name!r} must be unix seconds between 0 and "
                                        f"{MAX_TIMESTAMP:g}, got {beat!r}")
            guard = guards.get(name)
            args += [name, repr(float(beat)), guard.field if guard else "", guard.digest if guard else ""]
            if guard is not None:
                guard_keys.append(guard.key)
        if not args:
            return self.beat_seq(), []
        record_keys = [self.keys.node(name) for name in beats]
        with redis_errors("writing heartbeats"):
            seq, *skipped = self._beat(keys=[self.keys.beat_seq, self.keys.beat_changes, self.keys.heartbeats,
                                             self.keys.nodes, *record_keys, *guard_keys], args=args)
        return int(seq), [_text(n) for n in skipped]

    def _write(self, action: str, commands: Callable[[Pipeline], Any], names: Iterable[str] = ()) -> int:
        with redis_errors(action), self.client.pipeline(transaction=True) as pipe:
            commands(pipe)
            self.stage_bump(pipe, names)
            return int(pipe.execute()[-1])

    def stage_bump(self, pipe: Pipeline, names: Iterable[str]) -> None:
        """Queue the version bump of a write touching ``names`` (its result is the new version).

        Every writer of records (here and :mod:`extender.state.sources`) must bump through this, or
        incremental readers would not learn of its change. The script goes as text: see :data:`_BUMP`.
        """
        pipe.eval(_BUMP, 2, self.keys.version, self.keys.changes, *names)

    # ---- reads ---------------------------------------------------------------------------------

    def version(self) -> int:
        """The current inventory version (0 for an empty store): one GET, cheap to poll."""
        with redis_errors("reading the inventory version"), self.client.pipeline(transaction=False) as pipe:
            pipe.get(self.keys.version)
            (raw,) = pipe.execute()
        return _version(raw, self.keys.version)

    def beat_seq(self) -> int:
        """The heartbeat sequence (0 before the first heartbeat-only report)."""
        return self.versions()[1]

    def versions(self) -> tuple[int, int]:
        """``(inventory version, heartbeat sequence)`` in one round trip: what a poller compares."""
        with redis_errors("reading the inventory version"), self.client.pipeline(transaction=False) as pipe:
            pipe.get(self.keys.version)
            pipe.get(self.keys.beat_seq)
            raw, raw_seq = pipe.execute()
        return _version(raw, self.keys.version), _version(raw_seq, self.keys.beat_seq)

    def heartbeats_since(self, seq: int) -> tuple[int, dict[str, float]]:
        """``(current sequence, name -> heartbeat)`` for the nodes that reported a heartbeat after ``seq``.

        Costs one name and one number per node that reported; no record is read. A heartbeat may be
        newer than the sequence returned (it landed between the two round trips); the next call
        returns it again, and applying a heartbeat twice is harmless.
        """
        with redis_errors("reading heartbeats"), self.client.pipeline(transaction=True) as pipe:
            pipe.get(self.keys.beat_seq)
            pipe.zrangebyscore(self.keys.beat_changes, f"({seq}", "+inf")
            raw_seq, raw_names = pipe.execute()
        names = [_text(n) for n in raw_names]
        with redis_errors(f"reading heartbeats (HMGET {self.keys.heartbeats})"):
            values = self.client.hmget(self.keys.heartbeats, names) if names else []
        beats = {name: beat for name, raw in zip(names, values, strict=True) if (beat := stored_beat(raw)) > 0.0}
        return _version(raw_seq, self.keys.beat_seq), beats

    def get(self, name: str) -> NodeState | None:
        """One node's record, or ``None`` if it is not stored.

        A corrupt record raises :class:`StateError` naming the key: a caller asking for one node
        must not mistake "unreadable" for "absent".
        """
        key = self.keys.node(name)
        with redis_errors(f"reading node {name!r}"), self.client.pipeline(transaction=False) as pipe:
            pipe.get(key)
            pipe.hget(self.keys.heartbeats, name)
            raw, beat = pipe.execute()
        if raw is None:
            return None
        try:
            return with_beat(decode(name, raw), stored_beat(beat))
        except ValueError as exc:
            raise StateError(f"inventory record {key} is corrupt: {corrupt_reason(exc)}") from exc

    def names(self) -> frozenset[str]:
        """Names of every stored node."""
        with redis_errors("reading node names"), self.client.pipeline(transaction=False) as pipe:
            pipe.smembers(self.keys.nodes)
            (members,) = pipe.execute()
        return frozenset(_text(m) for m in members)

    def load_all(self) -> tuple[int, list[NodeState], frozenset[str]]:
        """``(version, records sorted by name, compile registry)``, all from one instant.

        See the module docstring for why this is consistent. Corrupt records are skipped and
        listed in :attr:`corrupt`.
        """
        with self._lock:
            names = list(self._names_hint)
        with redis_errors("reading the inventory"):
            for _ in range(MAX_READ_ATTEMPTS):
                with self.client.pipeline(transaction=True) as pipe:
                    pipe.get(self.keys.version)
                    pipe.smembers(self.keys.nodes)
                    pipe.smembers(self.keys.registry)
                    pipe.hgetall(self.keys.heartbeats)
                    if names:
                        pipe.mget([self.keys.node(n) for n in names])
                    raw_version, raw_members, raw_registry, raw_beats, *fetched = pipe.execute()
                members = {_text(m) for m in raw_members}
                if members.issubset(names):
                    break
                names = sorted(members)  # a node joined since our last read: fetch it too
            else:
                raise StateError(
                    f"the set of inventory nodes changed during each of {MAX_READ_ATTEMPTS} reads; try again"
                )
        raws = dict(zip(names, fetched[0] if fetched else [], strict=True))
        beats = {_text(k): stored_beat(v) for k, v in raw_beats.items()}
        records: list[NodeState] = []
        corrupt: dict[str, str] = {}
        with self._lock:
            known = self._decoded
        decoded: dict[str, tuple[str | bytes, NodeState]] = {}
        for name in sorted(members):
            raw = raws.get(name)
            try:
                if raw is None:
                    raise InvalidValueError(MISSING)
                hit = known.get(name)
                state = hit[1] if hit is not None and hit[0] == raw else decode(name, raw)
                decoded[name] = (raw, state)
                records.append(with_beat(state, beats.get(name, 0.0)))
            except ValueError as exc:
                corrupt[self.keys.node(name)] = corrupt_reason(exc)
        self._note_corrupt(corrupt)
        with self._lock:
            self._names_hint = sorted(members)
            self._decoded = decoded
        return _version(raw_version, self.keys.version), records, frozenset(_text(k) for k in raw_registry)

    def changes_since(self, version: int) -> tuple[int, dict[str, NodeState | None], frozenset[str]]:
        """``(current version, name -> record, compile registry)`` for the nodes written after ``version``.

        A record that was deleted, or that cannot be read (skipped and listed in :attr:`corrupt`,
        like :meth:`load_all` does), maps to ``None``. A name still in the node set whose record key
        holds no string (deleted behind the store's back, or set to another Redis type: ``MGET`` reads
        both as nil) is such a record, not a deletion. The records may be newer than the version
        returned (a write landed between the two round trips); the next call returns them again,
        and applying a record twice is harmless.
        """
        with redis_errors("reading inventory changes"):
            with self.client.pipeline(transaction=True) as pipe:
                pipe.get(self.keys.version)
                pipe.zrangebyscore(self.keys.changes, f"({version}", "+inf")
                pipe.smembers(self.keys.registry)
                raw_version, raw_names, raw_registry = pipe.execute()
            names = [_text(n) for n in raw_names]
            fetched: list[Any] = []
            beats: list[Any] = []
            listed: list[Any] = []
            if names:
                with self.client.pipeline(transaction=True) as pipe:
                    pipe.mget([self.keys.node(n) for n in names])
                    pipe.hmget(self.keys.heartbeats, names)
                    pipe.smismember(self.keys.nodes, names)
                    fetched, beats, listed = pipe.execute()
        changed: dict[str, NodeState | None] = {}
        reread = {self.keys.node(n) for n in names}  # their old verdicts are replaced below
        corrupt = {k: v for k, v in self.corrupt.items() if k not in reread}
        for name, raw, beat, member in zip(names, fetched, beats, listed, strict=True):
            changed[name] = None
            if raw is None:
                if member:
                    corrupt[self.keys.node(name)] = MISSING
                continue
            try:
                changed[name] = with_beat(decode(name, raw), stored_beat(beat))
            except ValueError as exc:
                corrupt[self.keys.node(name)] = corrupt_reason(exc)
        self._note_corrupt(corrupt)
        return _version(raw_version, self.keys.version), changed, frozenset(_text(k) for k in raw_registry)

    def _note_corrupt(self, corrupt: dict[str, str]) -> None:
        with self._lock:
            new = corrupt.keys() - self._reported
            self._reported = set(corrupt)  # a key that heals and breaks again is reported again
            self.corrupt = corrupt
        for key in sorted(new):
            # %r: the key holds whatever name a writer put in the node set (newlines, escapes)
            log.warning("skipping corrupt inventory record %r: %s", key, corrupt[key])


def _version(raw: str | bytes | None, key: str) -> int:
    """A counter's value (0 when unset); a value that is no integer is a :class:`StateError` naming ``key``."""
    if raw is None:
        return 0
    try:
        return read_int(raw)
    except ValueError as exc:
        raise StateError(f"{key} holds {raw!r}, not an integer") from exc
