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

    def next(self) -> float:
        """Seconds to wait before the next attempt (counts one more failure)."""
        base = min(self.max_s, self.initial_s * self.factor ** min(self.failures, 64))
        self.failures += 1
        return max(0.0, base * (1.0 + self.jitter * self.rng.uniform(-1.0, 1.0)))

    def reset(self) -> None:
        self.failures = 0
