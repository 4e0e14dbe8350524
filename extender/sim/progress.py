"""A one-line progress bar on stderr, for runs long enough to wonder about.

Drawn only when the stream is a terminal (a pipe or a CI log gets nothing) and the run has at
least :data:`MIN_TICKS` ticks in all; redrawn at most every :data:`REDRAW_S` seconds.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

#: Runs shorter than this (ticks over all strategies) finish before a bar would help.
MIN_TICKS = 5_000
REDRAW_S = 0.2
WIDTH = 30


class Progress:
    """``update(strategy, ticks_done)`` for each strategy in turn; ``close()`` at the end."""

    def __init__(self, strategies: list[str], ticks: int, stream: TextIO | None = None,
                 enabled: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.order = strategies
        self.ticks = ticks
        self.total = ticks * len(strategies)
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = enabled if enabled is not None else bool(isatty and isatty() and self.total >= MIN_TICKS)
        self.started = time.monotonic()
        self._last = 0.0

    def update(self, strategy: str, done: int) -> None:
        """``done`` ticks of ``strategy`` are simulated."""
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < REDRAW_S and done < self.ticks:
            return
        self._last = now
        overall = self.order.index(strategy) * self.ticks + done
        share = overall / self.total if self.total else 1.0
        filled = round(WIDTH * share)
        elapsed = now - self.started
        eta = elapsed / share - elapsed if share > 0 else 0.0
        self.stream.write(f"\r[{'#' * filled}{'.' * (WIDTH - filled)}] {100 * share:3.0f}%  {strategy:<12} "
                          f"{elapsed:5.0f}s elapsed, ~{eta:4.0f}s left ")
        self.stream.flush()

    def close(self) -> None:
        """Clear the line."""
        if self.enabled:
            self.stream.write("\r" + " " * (WIDTH + 60) + "\r")
            self.stream.flush()
