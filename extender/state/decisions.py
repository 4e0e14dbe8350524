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
  leader or standby, so the APIService's Service can route to any of them.

Writes are stages of one fenced commit per workload and tick (:meth:`LeaderLock.commit`): the
sample, the decision, the window and the published value land together or not at all.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import redis
from redis.client import Pipeline

from extender.core.errors import InvalidValueError, StateError
from extender.state.errors import redis_errors
from extender.state.lock import Stage

#: Decision records kept per workload (an hour at the default 15 s tick, plus slack).
DEFAULT_KEEP = 300


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
        data = json.loads(raw)
        return cls(desired=int(data["desired"]), load=float(data["load"]), unit=str(data["unit"]),
                   t=float(data["t"]), window=int(data["window"]), token=int(data["token"]),
                   standby=int(data.get("standby", 0)))


class DecisionStore:
    """Read and stage writes of decision records, recommendations and published metrics."""

    def __init__(self, client: redis.Redis, *, prefix: str = "extender", keep: int = DEFAULT_KEEP) -> None:
        if keep < 1:
            raise InvalidValueError("keep at least one decision record")
        self.client = client
        self.prefix = prefix
        self.keep = keep

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
        """The newest ``count`` decision records of ``workload``, newest first."""
        with redis_errors(f"reading the decisions of {workload!r}"):
            raw: Any = self.client.lrange(self.log_key(workload), 0, max(0, count - 1))
        out: list[dict[str, Any]] = []
        for item in raw:
            try:
                record = json.loads(item)
            except ValueError as exc:
                raise StateError(f"decision log of {workload!r} holds unreadable JSON") from exc
            if not isinstance(record, dict):
                raise StateError(f"decision log of {workload!r} holds a {type(record).__name__}, not a record")
            out.append(record)
        return out

    def recommendations(self, workload: str) -> list[tuple[float, int]]:
        """The stabilisation window as ``(at, replicas)``, oldest first."""
        with redis_errors(f"reading the recommendations of {workload!r}"):
            raw: Any = self.client.zrange(self.recommendations_key(workload), 0, -1)
        out = []
        for m in raw:
            text = m.decode() if isinstance(m, bytes) else m
            try:
                at, n = text.split(" ")
                out.append((float(at), int(n)))
            except ValueError as exc:
                raise StateError(f"recommendations of {workload!r} hold an unreadable entry {text!r}") from exc
        return out

    def published(self) -> dict[str, Published]:
        """Every workload's published values (one HGETALL: the External Metrics API calls this per request)."""
        with redis_errors("reading the published scaler metrics"):
            raw: Any = self.client.hgetall(self.published_key)
        out: dict[str, Published] = {}
        for name, value in raw.items():
            key = name.decode() if isinstance(name, bytes) else name
            try:
                out[key] = Published.decode(value)
            except (ValueError, KeyError, TypeError) as exc:
                raise StateError(f"published metrics of {key!r} are unreadable: {exc}") from exc
        return out
