"""Leader election for ``extender scale``: a Redis lock whose every acquisition issues a fencing token.

Why Redis and not a Kubernetes Lease: what a scaler *does* is write to Redis (the demand history,
its decisions, and the published desired replicas that the External Metrics API serves). A Lease
would say who should lead, but a leader that was paused past its lease (GC, a stalled node, a
network partition) would still write to Redis when it wakes, and nothing in Redis would stop it.
With the lock in the same Redis as the data, the check "is my token still the current one?" and
the write happen in one transaction, so a deposed leader's writes are refused by the store itself:
at no moment are two leaders' writes both accepted. (A Lease would need exactly this fence in
Redis anyway, plus a second system to be up.)

Keys (``<p>`` is the prefix, ``extender`` by default)::

    <p>:scaler:leader   hash     holder, token, expires (ms), acquired (ms)
    <p>:scaler:fence    string   integer: the token of the latest acquisition (INCR'd by each one)

Protocol, every tick of every candidate (:meth:`LeaderLock.acquire`, one Lua script, atomic):

* the lock is ours and our token is still the fence: extend ``expires`` (renew);
* it is someone else's and not expired: stand by;
* it is free or expired: ``token = INCR fence``, take it.

The fence never goes back as far as a candidate can tell: each candidate remembers the highest
token it has seen (its own, or the holder's while it stood by) and the script first raises a fence
below that to it. A Redis that lost its data (restarted empty, ``FLUSHALL``) would otherwise count
from 1 again and hand a new leader the very token a deposed one still holds, whose writes the fence
would then accept, and the warmer of a replica that led again under its old number would take it
for the same term.

Every write the leader makes goes through :meth:`LeaderLock.commit`: ``WATCH fence``, check that
it equals our token and that the lock names us as its holder (a candidate that started after the
store lost its data has seen no token to carry forward, and may be given ours), then ``MULTI ..
EXEC`` the writes. A takeover between the check and EXEC
changes the fence, EXEC aborts, and :class:`~extender.core.errors.FencedOutError` tells the old
leader to step down.

Time: by default the script reads the Redis server's clock (``TIME``), so candidates on machines
with skewed clocks still agree on expiry. Tests pass their own clock (``now_ms``) to drive expiry
tick by tick, without waiting on wall time.

Caveat (Redis Sentinel / Cluster failover): a replica promoted before it received the latest
``INCR`` could issue a token a second time. Use ``min-replicas-to-write``/``WAIT`` there, or accept
that a failover of the store may overlap two leaders for up to one tick.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import redis
from redis.client import Pipeline

from extender.core.errors import FencedOutError, InvalidValueError, StateError
from extender.core.units import read_int
from extender.state.errors import redis_errors

#: A staged write: adds commands to the MULTI block of a fenced commit.
Stage = Callable[[Pipeline], None]
#: A clock in milliseconds (tests); ``None`` means the Redis server's clock.
Clock = Callable[[], int]

_ACQUIRE = """
local now = tonumber(ARGV[3])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local ttl = tonumber(ARGV[2])
local cur = redis.call('HMGET', KEYS[1], 'holder', 'token', 'expires')
local fence = redis.call('GET', KEYS[2])
if cur[1] == ARGV[1] and cur[2] == fence then
  redis.call('HSET', KEYS[1], 'expires', now + ttl)
  return {1, tonumber(cur[2]), now + ttl, now}
end
if cur[1] and tonumber(cur[3]) and tonumber(cur[3]) > now then
  return {0, tonumber(cur[2]), tonumber(cur[3]), now, cur[1]}
end
local seen = tonumber(ARGV[4])
if seen and (tonumber(fence) or 0) < seen then
  redis.call('SET', KEYS[2], seen)
end
local token = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', token, 'expires', now + ttl, 'acquired', now)
return {1, token, now + ttl, now}
"""

_RELEASE = """
local cur = redis.call('HMGET', KEYS[1], 'holder', 'token')
if cur[1] == ARGV[1] and cur[2] == ARGV[2] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""


#: The Redis type of each key (one round trip however many keys a commit writes). Run by EVALSHA on a
#: connection of the pool, not on the commit's own: a script run on a pipeline is loaded again
#: (``SCRIPT EXISTS``) before its EXEC, a round trip for nothing; the types are no part of the WATCH.
_TYPES = """
local out = {}
for i, key in ipairs(KEYS) do out[i] = redis.call('TYPE', key).ok end
return out
"""


@dataclass(frozen=True)
class LockKeys:
    """Key names of the scaler's lock under one prefix (use a ``{hash tag}`` prefix on Redis Cluster)."""

    prefix: str = "extender"

    @property
    def leader(self) -> str:
        return f"{self.prefix}:scaler:leader"

    @property
    def fence(self) -> str:
        return f"{self.prefix}:scaler:fence"


@dataclass(frozen=True)
class Lease:
    """The outcome of one :meth:`LeaderLock.acquire`.

    ``leader``: we hold the lock with fencing ``token`` until ``expires_ms``; otherwise ``holder``
    holds it with ``token`` until ``expires_ms``. ``now_ms`` is the clock the decision was made on.
    """

    leader: bool
    token: int
    expires_ms: int
    now_ms: int
    holder: str


class LeaderLock:
    """One candidate's handle on the scaler lock; thread-safe (the client pools connections)."""

    def __init__(self, client: redis.Redis, holder: str, *, ttl_s: float, prefix: str = "extender",
                 clock: Clock | None = None) -> None:
        if not holder:
            raise InvalidValueError("a lock holder needs a non-empty identity")
        self.client = client
        self.holder = holder
        self.set_ttl(ttl_s)
        self.keys = LockKeys(prefix)
        self._clock = clock
        #: The highest fencing token this candidate has seen (module docstring: the fence never goes back).
        self._seen = 0
        self._acquire: Any = client.register_script(_ACQUIRE)
        self._release: Any = client.register_script(_RELEASE)
        self._types: Any = client.register_script(_TYPES)

    def set_ttl(self, ttl_s: float) -> None:
        """Make each later take or renewal last ``ttl_s`` (the lease of the scaler follows its tick)."""
        if not ttl_s > 0:
            raise InvalidValueError(f"lock ttl must be > 0 seconds, got {ttl_s}")
        self.ttl_ms = max(1, round(ttl_s * 1000))

    def acquire(self) -> Lease:
        """Take, renew or fail to take the lock (rules in the module docstring)."""
        now = "" if self._clock is None else str(int(self._clock()))
        with redis_errors(f"acquiring the scaler lock ({self.keys.leader}, {self.keys.fence})"):
            reply = self._acquire(keys=[self.keys.leader, self.keys.fence],
                                  args=[self.holder, self.ttl_ms, now, self._seen])
        try:
            won, token, expires, at = (int(x) for x in reply[:4])
        except (TypeError, ValueError, IndexError) as exc:
            # a Lua table ends at its first nil: the token or the expiry stored was no number
            raise StateError(f"acquiring the scaler lock: {self.keys.leader} or {self.keys.fence} holds a token or "
                             f"an expiry that is not an integer (script reply {reply!r}); a scaler leads again "
                             "once they are numbers or deleted") from exc
        self._seen = max(self._seen, token)
        holder = self.holder if won else _text(reply[4]) if len(reply) > 4 else ""
        return Lease(bool(won), token, expires, at, holder)

    def release(self, token: int) -> bool:
        """Give the lock up (clean shutdown) so a standby takes over at its next tick; False if not ours."""
        with redis_errors(f"releasing the scaler lock ({self.keys.leader})"):
            return bool(self._release(keys=[self.keys.leader], args=[self.holder, token]))

    def current(self) -> tuple[str, int, int] | None:
        """``(holder, token, expires_ms)`` of the lock as stored, or ``None`` when nobody holds it."""
        with redis_errors(f"reading the scaler lock ({self.keys.leader})"):
            raw: Any = self.client.hmget(self.keys.leader, ["holder", "token", "expires"])
        holder, token, expires = raw
        if holder is None:
            return None
        number, until = _integer(token), _integer(expires)
        if number is None or until is None:
            raise StateError(f"the scaler lock {self.keys.leader} holds token {token!r} and expiry {expires!r}, "
                             "not integers")
        return _text(holder), number, until

    def fence(self) -> int:
        """The current fencing token (0 before the first acquisition)."""
        with redis_errors(f"reading the scaler fence ({self.keys.fence})"):
            value: Any = self.client.get(self.keys.fence)
        if value is None:
            return 0
        number = _integer(value)
        if number is None:
            raise StateError(f"the scaler fence {self.keys.fence} holds {value!r}, not an integer")
        return number

    def commit(self, token: int, *stages: Stage, action: str = "committing",
               types: Mapping[str, str] | None = None) -> None:
        """Apply ``stages`` in one MULTI/EXEC if and only if ``token`` is still the fence and the
        lock still names this candidate.

        Raises :class:`FencedOutError` (nothing applied) when another candidate took the lock.
        ``types``: the Redis type each key the stages write must have (or be absent). Redis does not
        roll back a MULTI whose one command fails on a key of another type (a hand edit): the others
        land, so a key of another type is refused here first, a :class:`StateError` naming it, and
        nothing is applied.
        """
        fence_key = self.keys.fence
        with redis_errors(action), self.client.pipeline(transaction=True) as pipe:
            try:
                pipe.watch(fence_key)  # type: ignore[no-untyped-call]
                current: Any = pipe.get(fence_key)
                held = None if current is None else _integer(current)
                if held != token:
                    shown = "none" if current is None else held if held is not None else f"{current!r} in {fence_key}"
                    raise FencedOutError(f"{action}: fencing token {token} is stale (current: {shown}); "
                                         "another scaler leads now")
                holder: Any = pipe.hget(self.keys.leader, "holder")
                if holder is None:
                    raise FencedOutError(f"{action}: the lock is held by no one under token {token} (the store "
                                         "lost it or it was released); leading again takes it anew")
                if _text(holder) != self.holder:
                    raise FencedOutError(f"{action}: the lock is held by {_text(holder)} under token {token}, "
                                         f"not {self.holder}; another scaler leads now")
                if types:
                    found: Any = self._types(keys=list(types))
                    for (key, wanted), kind in zip(types.items(), found, strict=True):
                        if _text(kind) not in {wanted, "none"}:
                            raise StateError(f"{action}: {key} holds a Redis {_text(kind)}, not a {wanted}; "
                                             "nothing was written (delete it, or repair it)")
                pipe.multi()
                for stage in stages:
                    stage(pipe)
                pipe.execute()
            except redis.WatchError as exc:
                raise FencedOutError(f"{action}: the lock changed hands during the write (token {token}); "
                                     "another scaler leads now") from exc


def _integer(value: str | bytes | int) -> int | None:
    """A stored integer (what INCR and the scripts write), or ``None`` when it is not one."""
    if isinstance(value, int):
        return value
    try:
        return read_int(value)
    except ValueError:
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
