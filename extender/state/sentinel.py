"""``redis+sentinel://`` URLs: a Redis whose master is found through Sentinel (redis-py's client).

redis-py's ``from_url`` knows one host; a Sentinel deployment is several sentinels and a service
name. The URL form we accept (the one other Redis clients use too)::

    redis+sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/SERVICE[/DB][?OPTIONS]
    rediss+sentinel://...                      the same over TLS (sentinels and data nodes)

* ``HOST[:PORT]``: the sentinels (port 26379 when left out), tried in order;
* ``SERVICE``: the master's name in the sentinels' configuration (``sentinel monitor SERVICE ...``);
* ``DB``: the database number (0);
* ``USER``/``PASSWORD``: the data nodes' credentials (``requirepass`` / ACL user);
* options: ``sentinel_password`` and ``sentinel_username`` when the sentinels themselves ask for
  credentials (``requirepass`` in sentinel.conf), ``socket_timeout`` and ``socket_connect_timeout``
  (seconds). Any other option is an error that names it.

The client asks the sentinels for the current master on every new connection, so after a failover
(``SENTINEL FAILOVER`` or a dead master) the next command that reconnects reaches the new one; our
retry policy (connection.py) covers the reconnect.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote

import redis
from redis.sentinel import Sentinel

from extender.core.errors import StateError
from extender.core.units import read_float, read_int

SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_SENTINEL_PORT = 26379
_FLOAT_OPTIONS = ("socket_timeout", "socket_connect_timeout")
_TEXT_OPTIONS = ("sentinel_password", "sentinel_username")


@dataclass(frozen=True)
class SentinelUrl:
    """The parts of a ``redis+sentinel://`` URL."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False
    options: dict[str, Any] = field(default_factory=dict)


def is_sentinel_url(url: str) -> bool:
    return url.split("://", 1)[0].lower() in SCHEMES


def parse(url: str) -> SentinelUrl:
    """Split ``url`` into sentinels, service, database, credentials and options.

    Raises :class:`StateError` naming what is wrong (never showing the password).
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        raise StateError(f"not a Sentinel URL (expected {' or '.join(s + '://' for s in SCHEMES)})")
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    sentinels = tuple(_host_port(h) for h in hosts.split(",") if h) if hosts else ()
    if not sentinels:
        raise StateError("Sentinel URL names no sentinel host (redis+sentinel://HOST[:PORT],.../SERVICE)")
    parts = [p for p in path.split("/") if p]
    if not parts or len(parts) > 2:
        raise StateError("Sentinel URL needs the service name as its path, then optionally the database: "
                         "redis+sentinel://HOST:26379/SERVICE[/DB]")
    service = unquote(parts[0])
    db = 0
    if len(parts) == 2:
        if not (parts[1].isascii() and parts[1].isdigit()):
            raise StateError(f"Sentinel URL database must be a number, got {parts[1]!r}")
        db = read_int(parts[1])
    options: dict[str, Any] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name in _FLOAT_OPTIONS:
            try:
                options[name] = read_float(value)
            except ValueError:
                raise StateError(f"Sentinel URL option {name} must be a number of seconds, got {value!r}") from None
            if not (math.isfinite(options[name]) and options[name] >= 0):  # socket.settimeout's ValueError
                raise StateError(f"Sentinel URL option {name} must be a finite number of seconds >= 0, got {value!r}")
        elif name in _TEXT_OPTIONS:
            options[name] = value
        else:
            allowed = ", ".join(_FLOAT_OPTIONS + _TEXT_OPTIONS)
            raise StateError(f"unknown Sentinel URL option {name!r} (allowed: {allowed})")
    return SentinelUrl(sentinels, service, db, username, password, scheme.lower().startswith("rediss"), options)


def _host_port(text: str) -> tuple[str, int]:
    if text.startswith("["):  # [IPv6]:port
        host, _, port = text[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = text.rpartition(":") if ":" in text else (text, "", "")
    if not host:
        raise StateError(f"Sentinel URL host {text!r} has no name")
    if not port:
        return host, DEFAULT_SENTINEL_PORT
    if not (port.isascii() and port.isdigit()) or not 0 < read_int(port) < 65536:
        raise StateError(f"Sentinel URL port {port!r} of {host} is not a port number")
    return host, read_int(port)


def client(url: SentinelUrl, options: dict[str, Any]) -> redis.Redis:
    """A client of the current master of ``url.service``; ``options`` are the connection settings
    (timeouts, retry, decoding) for both the sentinels and the master, the URL's own winning."""
    settings = {**options, **{k: v for k, v in url.options.items() if k in _FLOAT_OPTIONS}}
    sentinel_settings = {k: v for k, v in settings.items() if k != "decode_responses"}
    if url.tls:
        settings["ssl"] = sentinel_settings["ssl"] = True
    if "sentinel_password" in url.options:
        sentinel_settings["password"] = url.options["sentinel_password"]
    if "sentinel_username" in url.options:
        sentinel_settings["username"] = url.options["sentinel_username"]
    # redis-py < 8.2 leaves Sentinel untyped; from 8.2 it is typed, so the ignores may go unused.
    sentinel = Sentinel(  # type: ignore[no-untyped-call, unused-ignore]
        list(url.sentinels), sentinel_kwargs=sentinel_settings, **settings)
    master: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call, unused-ignore]
        url.service, db=url.db, username=url.username, password=url.password)
    return master


def redact(url: str) -> str:
    """``url`` with the password of its user part, and any ``sentinel_password``, replaced by ``***``."""
    scheme, sep, rest = url.partition("://")
    rest, q, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        userinfo = userinfo.split(":", 1)[0] + ":***"
    if query:
        query = "&".join(f"{k}=***" if k == "sentinel_password" else f"{k}={v}"
                         for k, v in parse_qsl(query, keep_blank_values=True))
    return f"{scheme}{sep}{userinfo}{at}{hosts}{slash}{path}{q}{query}"


def describe(pool: Any) -> str:
    """``redis+sentinel://SERVICE/DB`` for a client of :func:`client` (no credentials, no hosts)."""
    db = pool.connection_kwargs.get("db", 0)
    return f"redis+sentinel://{pool.service_name}/{db}"
