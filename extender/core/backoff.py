"""Exponential backoff with jitter, for every loop that retries an outside service (API server, Redis).

``delay_n = min(max_s, initial_s * factor**n) * (1 + jitter * u)``, ``u`` uniform in [-1, 1].
The jitter spreads the retries of many agents (one per node) that lost Redis at the same moment, so
they do not all reconnect in the same millisecond when it returns.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Delays for successive failures; :meth:`reset` after a success."""

    initial_s: float = 0.5
    max_s: float = 30.0
    factor: float = 2.0
    jitter: float = 0.2
    rng: random.Random = field(default_factory=random.Random, repr=False)
    failures: int = 0

    def next(self, at_least: float | None = None) -> float:
        """Seconds to wait before the next attempt (counts one more failure); never less than
        ``at_least`` (what the service asked for: ``Retry-After``) up to ``max_s``."""
        base = min(self.max_s, self.initial_s * self.factor ** min(self.failures, 64))
        self.failures += 1
        delay = max(0.0, base * (1.0 + self.jitter * self.rng.uniform(-1.0, 1.0)))
        return max(delay, min(at_least, self.max_s)) if at_least is not None else delay

    def reset(self) -> None:
        self.failures = 0
