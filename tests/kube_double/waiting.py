"""Bounded waiting for tests that watch background threads: poll a condition, never sleep blindly."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal, TypeVar

T = TypeVar("T")

#: Upper bound for anything a test waits on; a setup bound, not a performance assertion.
DEFAULT_TIMEOUT_S = 20.0


def wait_until(condition: Callable[[], T | Literal[False] | None], *, timeout_s: float = DEFAULT_TIMEOUT_S,
               what: str = "condition", report: Callable[[], str] | None = None, interval_s: float = 0.01) -> T:
    """Poll ``condition`` until it returns something truthy and return that (``None`` and ``False``
    mean "not yet", so the result's type leaves them out); fail the test after ``timeout_s``, with
    ``report()`` (e.g. the logs of the processes involved) in the message."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f"\n{report()}" if report is not None else ""
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}{detail}")
        time.sleep(interval_s)
