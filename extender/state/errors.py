"""The one place where redis-py exceptions become ours.

Callers above ``extender.state`` (CLI, HTTP layer, agent) must be able to say "the store is down,
fail open" without importing redis, so every Redis call in this package runs inside
:func:`redis_errors`, which maps:

* connection refused / reset, timeouts, AUTH failures, a server still loading its data
  (``redis.ConnectionError`` and ``redis.TimeoutError`` and their subclasses), and a server that
  refuses commands until it can persist again (``MISCONF``: its disk is full or read-only; it
  refuses even PING) or free memory (``OOM``)
  -> :class:`~extender.core.errors.StoreUnavailableError`;
* anything else the server or client reports (``WRONGTYPE``, ``READONLY`` replica, a failed
  transaction) -> :class:`~extender.core.errors.StateError`.

The redis exception is always chained as ``__cause__`` so logs keep the original detail.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
from redis.client import NEVER_DECODE
from redis.sentinel import MasterNotFoundError

from extender.core.errors import StateError, StoreUnavailableError


@contextmanager
def redis_errors(action: str) -> Iterator[None]:
    """Run a block of Redis calls, re-raising redis-py errors as ours; ``action`` starts the message."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError, redis.OutOfMemoryError) as exc:
        raise StoreUnavailableError(f"{action}: Redis is unavailable: {_said(exc)}") from exc
    except redis.RedisError as exc:
        if _refuses_until_it_can_persist(exc):
            raise StoreUnavailableError(f"{action}: Redis is unavailable: {exc}") from exc
        raise StateError(f"{action}: {exc}") from exc


#: What one sentinel's failure is called inside redis-py's MasterNotFoundError, after that
#: sentinel's client: ``...)> - network:ConnectionError`` (redis-py 7 to 8.1; 8.2 adds ``: message``
#: after it, and before 7 it was ``ConnectionError('message')``). The kind is kept, not the message:
#: the URL in the same error already names the sentinels.
_SENTINEL_ERROR = re.compile(r"\)> - ((?:[A-Za-z_]+:)?[A-Za-z_]+)")


#: What a server that requires a password answers a client that gave none (RESP3's HELLO, RESP2's commands).
_NO_CREDENTIALS = ("HELLO must be called with the client already authenticated", "Authentication required",
                   "NOAUTH")


def _said(exc: redis.RedisError) -> str:
    """What the error says, in a line: redis-py writes each sentinel's whole client (a thousand
    characters of connection settings) into MasterNotFoundError; only what each failed with is kept."""
    text = str(exc)
    if isinstance(exc, redis.TimeoutError) and _in_tls_handshake(exc):
        # redis-py says "Timeout connecting to server" for the TCP connect and the TLS handshake alike;
        # a plain server reads the TLS ClientHello as the start of a command and waits for its end
        return ("the TLS handshake did not complete before the timeout: the server may not speak TLS "
                "(rediss:// needs a port that serves TLS; a plain Redis port takes redis://)")
    if isinstance(exc, redis.AuthenticationError) and any(w in text for w in _NO_CREDENTIALS):
        # redis-py's HELLO is answered with how to use HELLO, which says nothing of the URL at fault
        return ("the server asks for credentials and none were given (put them in the URL: "
                "redis://:PASSWORD@HOST:PORT/DB, or redis://USER:PASSWORD@... for an ACL user)")
    if not isinstance(exc, MasterNotFoundError):
        return text
    head, _, tried = text.partition(" : ")
    errors = sorted(set(_SENTINEL_ERROR.findall(tried)))
    return f"{head} (the sentinels failed with {', '.join(errors)})" if errors else head


def _in_tls_handshake(exc: BaseException) -> bool:
    """Whether ``exc`` was raised out of a TLS handshake: redis-py raises its own error in place of
    the socket's, which it keeps as the context, with the frames down to ``ssl``'s ``do_handshake``."""
    inner = exc.__cause__ or exc.__context__
    if inner is None:
        return False
    return any(frame.f_code.co_name == "do_handshake" and Path(frame.f_code.co_filename).name == "ssl.py"
               for frame, _ in traceback.walk_tb(inner.__traceback__))


def _refuses_until_it_can_persist(exc: redis.RedisError) -> bool:
    """The server's ``MISCONF``: it cannot write its AOF or RDB file and takes no command until it can
    (in a pipeline, redis-py puts the failed command before the server's words)."""
    text = str(exc)
    return isinstance(exc, redis.ResponseError) and (text.startswith("MISCONF ") or "caused error: MISCONF " in text)


def raw_reply(client: redis.Redis, action: str, *command: str | int | float) -> Any:
    """One command's reply as the server sent it, bytes undecoded, errors mapped as :func:`redis_errors`.

    For keys whose members a person, a tool or another release may have written: the reader sees
    each member's bytes as written and decodes each itself, so a bad one spoils only itself, and it
    can name that member exactly to remove it (the demand history does). The client's own decoding
    reads a byte that is not UTF-8 as its escape (:func:`extender.state.connection.connect`): text
    that names no member.
    """
    # the command and its key: a key of another type is then named (WRONGTYPE does not say which)
    with redis_errors(f"{action} ({command[0]} {command[1]})" if len(command) > 1 else action):
        return client.execute_command(*command, **{NEVER_DECODE: True})  # type: ignore[no-untyped-call]
