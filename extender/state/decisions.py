"""What the scaler decided, in Redis: the decision log, the stabilisation window and the published metrics.

Keys (``<p>`` is the prefix)::

    <p>:scaler:decisions:<workload>         list        JSON records, newest first, at most ``keep``
    <p>:scaler:recommendations:<workload>   sorted set  member "at replicas", score at (unix seconds)
    <p>:scaler:published                    hash        workload -> JSON of :class:`Published`

* The log is what ``extender scale explain WORKLOAD`` reads: every decision with all its inputs.
* The recommendations are the HPA-style downscale stabilisation window of
  :func:`extender.core.scaler.decide`. They are replaced as a whole on every tick with what
  :func:`extender.core.scaler.prune` keeps (a handful of entries), so a new leader continues the
  same window instead of starting one that is not yet "covered" and holding every scale-down.
* The published hash is what the External Metrics API serves. Every scaler replica serves it,
  leader or standby, so the APIService's Service can route to any of them. The servers read it
  with :meth:`DecisionStore.published_entries`, which decodes each entry on its own: an entry that
  cannot be read (hand-edited, written by a newer release) is an :class:`Unreadable` for its own
  workload, logged once, and every other workload is served as usual.

Writes are stages of one fenced commit per workload and tick (:meth:`LeaderLock.commit`): the
sample, the decision, the window and the published value land together or not at all.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import redis
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from redis.client import Pipeline

from extender.core.errors import InvalidValueError, StateError
from extender.core.units import read_float, read_int
from extender.state.errors import raw_reply, redis_errors
from extender.state.lock import Stage

log = logging.getLogger(__name__)

#: Decision records kept per workload (an hour at the default 15 s tick, plus slack).
DEFAULT_KEEP = 300
#: Unix seconds of 10000-01-01: a decision time must be before it to be served as ``metav1.Time``.
_LAST_TIME = 253_402_300_800.0
#: The most replicas a published entry may hold: Kubernetes' replica type is an int32, and KEDA's
#: metric value an int64. A larger (or negative) count is no decision of ours: unreadable, not served.
MAX_REPLICAS = 2**31 - 1
#: The longest window a published entry may hold: ``windowSeconds`` is an int64 in Kubernetes' external
#: metric value, and one past it fails the HPA's decoding of the whole list (every workload in it).
MAX_WINDOW = 2**63 - 1
#: What JSON calls the values :func:`json.loads` returns, for messages.
_JSON_TYPES: Mapping[type, str] = {list: "array", str: "string", int: "number", float: "number", bool: "boolean",
                                   type(None): "null"}
#: The largest index a Redis list command takes.
_LAST_INDEX = 2**63 - 1


class _PublishedJson(BaseModel):
    """The JSON of one published entry, checked: finite numbers, a time that is a date, replica
    counts in ``0..MAX_REPLICAS``, a window in ``0..MAX_WINDOW``."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    desired: int = Field(ge=0, le=MAX_REPLICAS)
    load: float
    unit: str
    t: float = Field(ge=0, lt=_LAST_TIME)
    window: int = Field(ge=0, le=MAX_WINDOW)
    token: int
    standby: int = Field(default=0, ge=0, le=MAX_REPLICAS)


@dataclass(frozen=True)
class Published:
    """The metric values of one workload as last decided.

    ``desired``: replicas (HPA target ``AverageValue: 1``); ``load``: the demand the decision sized
    for, in ``unit`` (HPA target ``AverageValue: <capacity per replica>``); ``t``: decision time,
    unix seconds; ``window``: seconds the values cover (the tick); ``token``: the leader's fence;
    ``standby``: placeholder replicas (extender.core.warming.standby_replicas; 0 in a value written
    before it existed).
    """

    desired: int
    load: float
    unit: str
    t: float
    window: int
    token: int
    standby: int = 0

    def encode(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), allow_nan=False)

    @classmethod
    def decode(cls, raw: str | bytes) -> Published:
        """The value :meth:`encode` wrote; raises :class:`InvalidValueError` saying what is wrong."""
        try:
            data = _PublishedJson.model_validate_json(raw)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(x) for x in e['loc']) or 'value'}: {e['msg']}" for e in exc.errors())
            raise InvalidValueError(problems) from None
        return cls(**data.model_dump())


@dataclass(frozen=True)
class Unreadable:
    """A published entry that cannot be decoded, and why (its workload is not served until the next decision)."""

    reason: str


class DecisionStore:
    """Read and stage writes of decision records, recommendations and published metrics."""

    def __init__(self, client: redis.Redis, *, prefix: str = "extender", keep: int = DEFAULT_KEEP) -> None:
        if keep < 1:
            raise InvalidValueError("keep at least one decision record")
        self.client = client
        self.prefix = prefix
        self.keep = keep
        #: Workload -> the reason last logged for its unreadable published entry (each logged once).
        self._unreadable: dict[str, str] = {}

    # ---- keys ----------------------------------------------------------------------------------

    def log_key(self, workload: str) -> str:
        return f"{self.prefix}:scaler:decisions:{workload}"

    def recommendations_key(self, workload: str) -> str:
        return f"{self.prefix}:scaler:recommendations:{workload}"

    @property
    def published_key(self) -> str:
        return f"{self.prefix}:scaler:published"

    # ---- stages (for LeaderLock.commit) ---------------------------------------------------------

    def stage_record(self, workload: str, record: Mapping[str, Any]) -> Stage:
        """Push one decision record (JSON-able; NaN and infinities are refused) and trim the log."""
        text = json.dumps(record, separators=(",", ":"), allow_nan=False)
        key, keep = self.log_key(workload), self.keep

        def stage(pipe: Pipeline) -> None:
            pipe.lpush(key, text)
            pipe.ltrim(key, 0, keep - 1)

        return stage

    def stage_recommendations(self, workload: str, recommendations: Sequence[tuple[float, int]]) -> Stage:
        """Replace the stabilisation window with ``(at, replicas)`` pairs."""
        members = {f"{at!r} {int(n)}": at for at, n in recommendations}
        key = self.recommendations_key(workload)

        def stage(pipe: Pipeline) -> None:
            pipe.delete(key)
            if members:
                pipe.zadd(key, members)

        return stage

    def stage_published(self, workload: str, value: Published) -> Stage:
        """Set the workload's published metric values."""
        if not math.isfinite(value.load):
            raise InvalidValueError(f"published load must be finite, got {value.load}")
        text, key = value.encode(), self.published_key

        def stage(pipe: Pipeline) -> None:
            pipe.hset(key, workload, text)

        return stage

    # ---- reads ---------------------------------------------------------------------------------

    def records(self, workload: str, count: int = 1) -> list[dict[str, Any]]:
        """The newest ``count`` decision records of ``workload``, newest first (every one when ``count``
        is past what LRANGE takes: Redis refuses a stop beyond a signed 64-bit number).

        An entry that is not a JSON object (cut short, edited by hand) is skipped with a warning
        naming the key and its place in the log (0 is the newest), and left where it is; the others
        are returned. Only when every entry read is unreadable is it a :class:`StateError`, naming
        the key: "nothing readable" must not read as "no decision recorded".
        """
        key = self.log_key(workload)
        with redis_errors(f"reading the decisions of {workload!r} in {key!r}"):
            raw: Any = self.client.lrange(key, 0, max(0, count - 1) if count <= _LAST_INDEX else -1)
        out: list[dict[str, Any]] = []
        skipped: list[tuple[int, str]] = []
        for index, item in enumerate(raw):
            try:
                record = json.loads(item)
            except ValueError:
                skipped.append((index, "not JSON"))
                continue
            if isinstance(record, dict):
                out.append(record)
            else:
                skipped.append((index, f"JSON {_JSON_TYPES.get(type(record), 'value')}, not an object"))
        if skipped and not out:
            index, why = skipped[0]
            raise StateError(f"the decision log {key!r} holds no readable record among its newest {len(raw)} "
                             f"(entry {index} is {why})")
        for index, why in skipped:
            log.warning("decision log %r: skipping entry %d (0 is the newest): %s", key, index, why,
                        extra={"workload": workload, "key": key})
        return out

    def recommendations(self, workload: str) -> list[tuple[float, int]]:
        """The stabilisation window as ``(at, replicas)``, oldest first.

        Words after the second in a member (appended by a newer release) are ignored, like the
        demand history's (:meth:`extender.state.history.Sample.decode`). A member that is not a
        finite time and a replica count empties the whole window, logged: its replicas could have
        been the highest, and an empty window holds every scale-down until it is covered again
        (what a new leader without a window does), where skipping the member alone could scale
        down early. The next commit replaces the key, so the window fills again from that tick.
        """
        out = []
        for m in raw_reply(self.client, f"reading the recommendations of {workload!r}",
                           "ZRANGE", self.recommendations_key(workload), 0, -1):
            try:
                text = m.decode() if isinstance(m, bytes) else m
                at, n, *_ = text.split(" ")
                entry = (read_float(at), read_int(n))
            except ValueError:  # UnicodeDecodeError included
                entry = None
            if entry is None or not math.isfinite(entry[0]) or entry[1] < 0:
                log.warning("recommendations of %s: unreadable entry %r; the stabilisation window starts anew, "
                            "so scale-downs wait for it to fill", workload, m[:80], extra={"workload": workload})
                return []
            out.append(entry)
        return out

    def published(self) -> dict[str, Published]:
        """Every workload's published values, all or nothing: raises :class:`StateError` if any one is
        unreadable (the servers read :meth:`published_entries`, which serves the others)."""
        out: dict[str, Published] = {}
        for key, entry in self.published_entries().items():
            if isinstance(entry, Unreadable):
                raise StateError(entry.reason)
            out[key] = entry
        return out

    def published_entries(self) -> dict[str, Published | Unreadable]:
        """Every workload's published values, each decoded on its own (one HGETALL: the External
        Metrics API calls this per request, the KEDA scaler every watch interval).

        An entry that cannot be decoded (not UTF-8, not JSON, a field missing, not finite or out of
        range) is an :class:`Unreadable` for its workload alone, logged once per workload and
        reason. Raises :class:`StateError` (:class:`StoreUnavailableError`) only when Redis cannot
        be read.
        """
        raw = raw_reply(self.client, "reading the published scaler metrics", "HGETALL", self.published_key)
        out: dict[str, Published | Unreadable] = {}
        for name, value in raw.items():
            key = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
            try:
                out[key] = Published.decode(value)
            except InvalidValueError as exc:
                reason = f"the published metrics of {key!r} are unreadable ({exc})"
                out[key] = Unreadable(reason)
                if self._unreadable.get(key) != reason:
                    log.error("scaler metrics: %s; they are served again after its next decision", reason,
                              extra={"workload": key})
            else:
                self._unreadable.pop(key, None)
                continue
            self._unreadable[key] = reason
        for gone in set(self._unreadable) - set(out):
            del self._unreadable[gone]
        return out
