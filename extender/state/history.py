"""Per-workload demand history in Redis: bounded, shared by every scaler candidate, surviving restarts.

The forecasters are stateless (:mod:`extender.core.forecast`): they refit from the history on every
call. So the history is the only thing a restarted or newly elected scaler needs to forecast as
well as the one before it, and it lives in Redis rather than in the process.

Key (``<p>`` is the prefix)::

    <p>:scaler:history:<workload>   sorted set   score: unix seconds; member: "t rate queue"

The member holds the timestamp too, so two samples never collide (a sorted set keeps one copy of
a member), and it is three numbers separated by spaces rather than JSON: a three-day history at a
15 s tick is ~17,000 members, read on every tick, and ``str.split`` parses them several times
faster than ``json.loads``. A later release may only append numbers to a member; a reader takes
the first three and ignores the rest, so an older scaler reading a newer one's samples (a rolling
upgrade, a rollback) keeps forecasting instead of failing on the workload until they age out.

Bounds, applied in the same transaction as every append: samples older than ``max_age_s`` are
dropped (Holt-Winters needs two daily seasons; three days is the default), and so is everything
beyond the newest ``max_points`` (a tick shortened by mistake cannot grow the key without limit).

Only observed rates are stored. A tick without an observation (every scrape failed) leaves a gap,
which the forecasters treat as missing data, never as zero demand.

Samples dated after the reader's ``now`` were written by a replica whose clock runs ahead of the
reader's (each replica stamps samples with its own clock; only the lease uses the server's). They
are not read: a forecast grid is anchored at its newest sample, so one sample ten minutes ahead
would make every forecast start ten minutes in the future and call the history fresh while it
aged. The next append removes them, and the reader logs how many it skipped and by how much.

A member that does not parse as three finite numbers (written by hand, by a broken tool, cut short)
is skipped too, never fatal: one such member would otherwise stop every decision for the workload
until it aged out, three days later. The reader logs it, and the next append by the same store
object (the leader reads, then appends, on every tick) removes it in its fenced transaction.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.client import Pipeline

from extender.core.errors import InvalidValueError
from extender.core.units import read_float
from extender.state.errors import raw_reply, redis_errors
from extender.state.lock import Stage

#: Seconds of history kept by default: three daily seasons (Holt-Winters starts after two).
DEFAULT_MAX_AGE_S = 3 * 86_400.0
#: Samples kept by default per workload: three days at the default 15 s tick, plus slack.
DEFAULT_MAX_POINTS = 20_000

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Sample:
    """Observed demand at ``t`` (unix seconds): ``rate`` in the workload's unit, ``queue`` waiting."""

    t: float
    rate: float
    queue: float = 0.0

    def encode(self) -> str:
        """``"t rate queue"``, each the shortest text that reads back exactly (``float``'s repr: a
        numpy scalar's repr is ``np.float64(...)``, which Redis refused as a score)."""
        return f"{float(self.t)!r} {float(self.rate)!r} {float(self.queue)!r}"

    @classmethod
    def decode(cls, member: str | bytes) -> Sample:
        """A stored member; numbers after the third (a newer release's) are ignored. Raises
        :class:`ValueError` unless the first three are finite numbers."""
        text = member.decode() if isinstance(member, bytes) else member
        t, rate, queue, *_ = text.split(" ")
        sample = cls(read_float(t), read_float(rate), read_float(queue))
        if not (math.isfinite(sample.t) and math.isfinite(sample.rate) and math.isfinite(sample.queue)):
            raise InvalidValueError(f"not finite: {text!r}")
        return sample


class HistoryStore:
    """Read the history of a workload; stage appends for a fenced commit (:mod:`extender.state.lock`)."""

    def __init__(self, client: redis.Redis, *, prefix: str = "extender", max_age_s: float = DEFAULT_MAX_AGE_S,
                 max_points: int = DEFAULT_MAX_POINTS) -> None:
        if max_age_s <= 0 or max_points < 1:
            raise InvalidValueError("history bounds must be positive")
        self.client = client
        self.prefix = prefix
        self.max_age_s = max_age_s
        self.max_points = max_points
        # unreadable members seen by the last read of each workload, removed by its next append
        self._unreadable: dict[str, list[str | bytes]] = {}

    def key(self, workload: str) -> str:
        return f"{self.prefix}:scaler:history:{workload}"

    def read(self, workload: str, *, now: float | None = None) -> list[Sample]:
        """Samples in time order; with ``now``, only those within ``max_age_s`` before it and none
        after it (module docstring: a clock ahead of ours wrote those)."""
        low: float | str = "-inf" if now is None else now - self.max_age_s
        members = raw_reply(self.client, f"reading the demand history of {workload!r}",
                            "ZRANGEBYSCORE", self.key(workload), low, "+inf")
        out: list[Sample] = []
        unreadable: list[str | bytes] = []
        for m in members:
            try:
                out.append(Sample.decode(m))
            except ValueError:  # UnicodeDecodeError included
                unreadable.append(m)
        if unreadable:
            self._unreadable[workload] = unreadable
            log.warning("history of %s: skipped %d unreadable sample(s), the first %r; the next write removes them",
                        workload, len(unreadable), unreadable[0][:80],
                        extra={"workload": workload, "skipped": len(unreadable)})
        else:
            self._unreadable.pop(workload, None)
        if now is None or not out or out[-1].t <= now:
            return out
        kept = [s for s in out if s.t <= now]
        log.warning("history of %s: skipped %d samples dated up to %.6gs after now, written by a replica whose "
                    "clock runs ahead of this one's; the next write removes them", workload,
                    len(out) - len(kept), out[-1].t - now,
                    extra={"workload": workload, "skipped": len(out) - len(kept), "ahead_s": out[-1].t - now})
        return kept

    def stage_append(self, workload: str, samples: Sequence[Sample], *, now: float) -> Stage:
        """A fenced-commit stage that adds ``samples`` and trims the key to its bounds: older than
        ``max_age_s`` before ``now``, dated after ``now``, beyond the newest ``max_points``; it also
        removes the unreadable members the last :meth:`read` of ``workload`` skipped."""
        for s in samples:
            if not (math.isfinite(s.t) and math.isfinite(s.rate) and math.isfinite(s.queue)):
                raise InvalidValueError(f"a history sample must be finite, got {s}")
            if s.t > now:
                raise InvalidValueError(f"a history sample cannot be dated after now ({now!r}), got {s}")
        key = self.key(workload)
        members = {s.encode(): float(s.t) for s in samples}  # a numpy score would be sent as its repr
        cutoff = now - self.max_age_s
        keep = self.max_points
        unreadable = self._unreadable.pop(workload, [])

        def stage(pipe: Pipeline) -> None:
            if unreadable:
                pipe.zrem(key, *unreadable)
            if members:
                pipe.zadd(key, members)
            pipe.zremrangebyscore(key, "-inf", f"({float(cutoff)!r}")
            pipe.zremrangebyscore(key, f"({float(now)!r}", "+inf")
            pipe.zremrangebyrank(key, 0, -(keep + 1))

        return stage

    def length(self, workload: str) -> int:
        """Samples stored for ``workload``."""
        with redis_errors(f"counting the demand history of {workload!r} (ZCARD {self.key(workload)})"):
            count: Any = self.client.zcard(self.key(workload))
        return int(count)
