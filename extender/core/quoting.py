"""Quoting what a caller, a pod or a file said in a message, cut short: however long the input, the
message stays one readable line, and says how much was left out."""

from __future__ import annotations


def clip(text: str, limit: int) -> str:
    """``text``, or its first ``limit`` characters and how many more there were."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... (+{len(text) - limit} more characters)"


def quote(text: str, limit: int) -> str:
    """``repr`` of ``text``, or of its first ``limit`` characters with how many more there were
    (outside the quotes, so the quoted part is exactly what was given)."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r} (+{len(text) - limit} more characters)"
