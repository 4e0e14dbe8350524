"""Least-privilege Redis users: for each component, the keys it may touch and the commands it may send.

Every component can connect as the one user every other component uses, but it need not: with Redis
6+ ACLs each can have its own user, granted only what it does. Then the node agent, which runs on
every GPU node, holds no credential that can take the scaler's lock, rewrite its decisions or the
calibration data, or delete what it did not write.

A user's rules, as ``ACL SETUSER`` arguments (:func:`rules`)::

    on resetkeys resetchannels -@all +ping +select +<command>... ~<prefix>:<key>... [%R~<prefix>:<key>...]

* ``resetkeys resetchannels -@all`` first, so applying the rules again (after an upgrade changed
  them) replaces what the user had, keys, channels and commands alike. No component uses pub/sub,
  so no channel is granted. (``resetchannels`` is new in Redis 6.2: the oldest server the rules are
  for.)
* No password, and no ``resetpass``: a new user has none and cannot log in until the operator gives
  it one (``ACL SETUSER agent >PASSWORD``); applying the rules again keeps the one it has.
* Commands are named one by one, never by category: a category grants more than a component sends
  (``@connection`` holds ``CLIENT KILL``, ``@write`` holds ``FLUSHALL``). Every user gets ``PING``
  (the check of :func:`extender.state.connection.connect`) and ``SELECT`` (sent on each new
  connection when the URL names a database other than 0). Not granted: ``CLIENT SETINFO``, which
  redis-py sends on each new connection and ignores when refused (the subcommand is new in Redis
  7.2, and Redis 7.0 refuses a rule naming a subcommand it does not know), so each new connection
  leaves one ``client`` entry in ``ACL LOG``.
* Commands that Lua scripts call count too: Redis checks each ``redis.call`` against the caller's
  rules, so a user running a script (the version bump, the heartbeat batch, the lock) is granted what
  the script calls (``INCR``, ``ZADD``, ``TYPE``, ``TIME``, ...) and the keys it declares.
* Each role has the keys it writes (:attr:`Role.writes`, read too) and the keys it only reads
  (:attr:`Role.reads`). Written keys are plain ``~`` patterns (read and write). Read-only keys depend
  on the oldest Redis the users are for (``version``, :func:`redis_version`):

  - **6.2** (the default, and the embedded server's version): plain ``~`` too, since the read-only
    ``%R~`` exists only from Redis 7.0. A reader is then read-only because it is granted no command
    that writes (extender, keda), but a writer may use the write commands of its own keys on every
    key it may read: the scaler, which needs SET, DEL and ZADD for its lock and history, could
    overwrite a node record or add an observed start.
  - **7.0** and later: ``%R~``, so the server refuses a write to a key the role only reads, whatever
    the command (Redis 7 checks each key of a command against what the command does with it: a
    read needs ``R``, a write ``W``, and ``~`` is both). Redis 6.2 refuses these rules as a syntax
    error: nothing is granted on a server too old for them.

  Redis 7 checks the keys a script declares (``EVAL``/``EVALSHA``) as both read and written, so those
  are among the written keys of each role that runs the script. No key is write-only (``%W~``): a
  role reads what it writes. The prefix is escaped for the glob (``*?[]\\``); ``*`` in a key below is
  the wildcard (a node name, a workload).

What each may do (``<p>`` the prefix; who runs as the user):

=========  ==========================================================================================
agent      ``extender agent`` (every GPU node): its report and the merged record of a node, its bare
           heartbeats, the version bump. Any node's, not only its own: ACL patterns cannot follow the
           node name a process was started with, short of one user per node.
sync       ``extender sync``: the cluster's reports, merged records, removed nodes' tombstones, the
           observed starts of calibration; reads the registry and the calibration.
extender   ``extender serve`` and ``extender explain``: reads the inventory and the calibration.
scaler     ``extender scale`` (the loop, its cache warmer and the External Metrics API, one process):
           the lock, the demand history, the decisions and the published metrics; reads the
           inventory and the calibration, and adds to the compile registry (the warmer's publish).
keda       ``extender keda-scaler`` and ``extender scale --no-loop``: reads the published metrics.
publish    ``extender warm publish`` (a sidecar in a serving pod): adds a key to the compile registry.
cli        the operator's commands (``inventory load|show``, ``calibrate show``, ``estimate
           --calibrated``, ``scale explain``, ``warm plan|publish``): writes the inventory, reads the
           rest; no lock, no history, no published metrics.
=========  ==========================================================================================

tests/test_acl.py runs each component's real store calls as its user against a real server (Redis
6.2 with the 6.2 rules, Redis 7.0 with the 7.0 rules), and refuses a rule that no call needs, and on
7.0 a written key that no call writes: the table cannot drift from the code either way unnoticed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from extender.core.errors import InvalidValueError, UnknownNameError

#: Granted to every user: the connection's own check, and a database other than 0 in its URL.
CONNECTION = ("ping", "select")
#: What a MULTI/EXEC transaction sends; ``unwatch`` too where a WATCH may end without EXEC (redis-py
#: unwatches when the code between them raises, as an oversized record does).
TRANSACTION = ("multi", "exec")
OPTIMISTIC = ("watch", "unwatch", *TRANSACTION)

#: The keys of the inventory's version bump (extender.state.store._BUMP: INCR, then ZADD of each node
#: name written; a write of no node, as of the compile registry alone, sends no ZADD). By EVAL, not
#: EVALSHA: it runs inside MULTI, where a missing script would fail after the writes beside it landed.
BUMP_KEYS = ("inventory:version", "inventory:changes")
BUMP = ("eval", "incr", "zadd")
#: The keys of node state: the merged records, their names, bare heartbeats.
NODE_KEYS = ("node:*", "nodes", "heartbeats")
#: The keys a full read of the inventory touches (InventoryStore.load_all, get).
INVENTORY_READ_KEYS = (*NODE_KEYS, "compile-registry", *BUMP_KEYS)
#: The calibration's keys (extender.state.observations) and what a read of them sends.
CALIBRATION_KEYS = ("calibration:*",)
CALIBRATION_READ = ("get", "smembers", "hgetall", "zrange")

#: The oldest Redis the rules are for (``resetchannels`` is new in 6.2), and the first with ``%R~``.
OLDEST: tuple[int, int] = (6, 2)
READ_ONLY_KEYS: tuple[int, int] = (7, 0)


@dataclass(frozen=True)
class Role:
    """One component's user: ``name`` (the user's name too), who runs as it, its keys and commands.

    ``writes``: the keys it writes (and reads); ``reads``: the keys it only reads; key names after
    ``<prefix>:``, ``*`` a wildcard, no key in both. ``commands``: lower case, a subcommand as
    ``script|load``. The two connection commands are added by :func:`rules`.
    """

    name: str
    who: str
    writes: tuple[str, ...]
    reads: tuple[str, ...]
    commands: tuple[str, ...]


ROLES: tuple[Role, ...] = (
    Role("agent", "extender agent, on every GPU node",
         ("source:*", *NODE_KEYS, "heartbeats:seq", "heartbeats:changes", *BUMP_KEYS),
         (),
         # SourceStore.report_agent (WATCH, TYPE, HGETALL, then HSET, SET, SADD, HDEL, the bump; GET when the
         # node is a tombstone) and beat_agent (the heartbeat script by EVALSHA, loaded on NOSCRIPT: SISMEMBER,
         # TYPE, HGET, HSET, INCR, ZADD)
         (*OPTIMISTIC, "hgetall", "hset", "set", "sadd", "hdel", "get", *BUMP, "evalsha", "script|load", "sismember",
          "type", "hget")),
    Role("sync", "extender sync",
         ("source:*", *NODE_KEYS, *BUMP_KEYS, *CALIBRATION_KEYS),
         ("heartbeats:seq", "compile-registry"),
         # SourceStore.report_kube (TYPE first: a source key of another type is refused), remove_node,
         # kube_reports; InventoryStore.names, versions; read_nodes; ObservationStore.append (redis-py's
         # INCR is INCRBY: the previous release's step of the calibration version, kept so these lines can be
         # applied before the rollout; this release steps it by the script observations._STEP: INCR, and
         # GET, TYPE and SET of a version that holds no integer); the calibrated policy
         (*OPTIMISTIC, "type", "hget", "hset", "hdel", "persist", "set", "sadd", *BUMP, "del", "expire", "srem",
          "exists", "mget", "hmget", "zremrangebyscore", "zremrangebyrank", "hincrby", "incrby", *CALIBRATION_READ)),
    Role("extender", "extender serve, extender explain",
         (),
         (*INVENTORY_READ_KEYS, "heartbeats:seq", "heartbeats:changes", *CALIBRATION_KEYS),
         # InventoryStore.versions, load_all, changes_since (SMISMEMBER: is a name without a record still
         # listed), heartbeats_since; the calibrated policy
         (*TRANSACTION, "mget", "hmget", "smismember", "zrangebyscore", *CALIBRATION_READ)),
    Role("scaler", "extender scale: its loop, cache warmer and External Metrics API",
         ("scaler:*", "compile-registry", *BUMP_KEYS),
         (*NODE_KEYS, "heartbeats:seq", *CALIBRATION_KEYS),
         # LeaderLock (its scripts by EVALSHA, loaded on NOSCRIPT: TIME, HMGET, GET, HSET, INCR, DEL, and SET
         # to carry the fence past a store that lost its data; the fenced commit: WATCH, GET, HGET, and
         # the type of each key it writes by EVALSHA of TYPE),
         # HistoryStore, DecisionStore, InventoryStore.versions, load_all, get, add_registry; the
         # calibrated policy
         (*OPTIMISTIC, "evalsha", "script|load", "time", "hmget", "hset", "set", "del", "hget",
          "zrangebyscore", "zrem", "zremrangebyscore", "zremrangebyrank", "lpush", "ltrim", "mget", "sadd", "type",
          *BUMP, *CALIBRATION_READ)),
    Role("keda", "extender keda-scaler, extender scale --no-loop",
         (),
         ("scaler:published",),
         ("hgetall",)),  # DecisionStore.published_entries
    Role("publish", "extender warm publish, in a serving pod",
         ("compile-registry", *BUMP_KEYS),
         (),
         (*TRANSACTION, "sadd", "eval", "incr")),  # InventoryStore.add_registry: a bump of no node
    Role("cli", "the operator's commands: inventory, calibrate show, estimate, scale explain, warm plan",
         (*INVENTORY_READ_KEYS, "heartbeats:changes"),
         (*CALIBRATION_KEYS, "scaler:decisions:*"),
         # InventoryStore.put_many, replace, get, names, load_all, version, add_registry;
         # ObservationStore.read; DecisionStore.records; the calibrated policy
         (*OPTIMISTIC, "mset", "sadd", "hdel", "del", *BUMP, "hget", "mget", "lrange", *CALIBRATION_READ)),
)

_BY_NAME: Mapping[str, Role] = {r.name: r for r in ROLES}
#: Characters a glob gives a meaning (Redis's stringmatchlen), escaped in the prefix.
_GLOB = re.compile(r"([*?\[\]\\])")
#: What a prefix in a rule cannot hold: a rule is one word of ``redis-cli`` and of an ACL file. Any
#: script's space (Unicode on purpose): Redis splits only at ASCII ones, but a prefix a person reads as
#: two words is refused where it is written.
_UNWRITABLE = re.compile(r"[\s\"'\x00-\x1f\x7f]", re.UNICODE)


def role(name: str) -> Role:
    """The role called ``name``; :class:`UnknownNameError` naming the known ones otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnknownNameError(f"no Redis user for component {name!r} (known: {', '.join(_BY_NAME)})") from None


def redis_version(text: str) -> tuple[int, int]:
    """``MAJOR[.MINOR[.PATCH]]`` as ``(major, minor)``; :class:`InvalidValueError` for another spelling, or
    for a version older than :data:`OLDEST`."""
    match = re.fullmatch(r"([0-9]{1,4})(?:\.([0-9]{1,4})(?:\.[0-9]{1,4})?)?", text)
    if match is None:
        raise InvalidValueError(f"{text!r} is not a Redis version (expected MAJOR.MINOR, as 6.2 or 7.0)")
    version = (int(match[1]), int(match[2] or 0))
    if version < OLDEST:
        raise InvalidValueError(f"Redis {text} is too old for these users: they need 6.2 or later "
                                "(the first to know resetchannels)")
    return version


def key_pattern(prefix: str, key: str, *, read_only: bool = False) -> str:
    """``~<prefix>:<key>``, or ``%R~<prefix>:<key>`` when ``read_only``; the prefix escaped for the glob
    (``*`` in ``key`` stays a wildcard)."""
    if not prefix:
        raise InvalidValueError("an ACL key pattern needs a non-empty key prefix")
    if _UNWRITABLE.search(prefix):
        raise InvalidValueError(f"key prefix {prefix!r} cannot be written in an ACL rule "
                                "(it holds whitespace, a quote or a control character)")
    escaped = _GLOB.sub(r"\\\1", prefix)
    return f"{'%R' if read_only else ''}~{escaped}:{key}"


def rules(prefix: str, component: str | Role, version: tuple[int, int] = OLDEST) -> tuple[str, ...]:
    """The ``ACL SETUSER`` arguments after the user's name, for keys under ``prefix`` on Redis ``version``
    and later: the keys a role only reads as ``%R~`` from :data:`READ_ONLY_KEYS` (module docstring)."""
    r = component if isinstance(component, Role) else role(component)
    commands = dict.fromkeys((*CONNECTION, *r.commands))  # in order, once each
    read_only = version >= READ_ONLY_KEYS
    return ("on", "resetkeys", "resetchannels", "-@all", *(f"+{c}" for c in commands),
            *(key_pattern(prefix, k) for k in dict.fromkeys(r.writes)),
            *(key_pattern(prefix, k, read_only=read_only) for k in dict.fromkeys(r.reads)))


def all_rules(prefix: str, version: tuple[int, int] = OLDEST) -> dict[str, tuple[str, ...]]:
    """Every component's rules under ``prefix``: user name -> ``ACL SETUSER`` arguments."""
    return {r.name: rules(prefix, r, version) for r in ROLES}


def setuser_line(prefix: str, component: str, version: tuple[int, int] = OLDEST) -> str:
    """``ACL SETUSER <name> <rules...>``: one command for ``redis-cli``."""
    return " ".join(("ACL", "SETUSER", component, *rules(prefix, component, version)))


def aclfile_line(prefix: str, component: str, version: tuple[int, int] = OLDEST) -> str:
    """``user <name> <rules...>``: one line of an ACL file (``aclfile`` in redis.conf)."""
    return " ".join(("user", component, *rules(prefix, component, version)))
