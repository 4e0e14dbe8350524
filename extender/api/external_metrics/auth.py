"""Authentication and authorization of the External Metrics API, the way an aggregated API server does it.

Who calls us (docs/kubernetes-interfaces.md 4.6): kube-apiserver's aggregator, proxying the HPA controller's (or a
person's) request over TLS with its *front-proxy client certificate*, the caller's identity in
``X-Remote-User`` / ``X-Remote-Group`` / ``X-Remote-Extra-*`` headers; or a client talking to us
directly with a bearer token or its own client certificate. In that order:

1. **Front proxy.** The TLS layer verified the client certificate against a CA bundle; if its
   issuer is a subject of the *request-header* CA and its common name is in the allowed names
   (empty list: any name), the identity headers are trusted. Without that certificate the headers
   are ignored: anyone can send a header, only the proxy holds the key.
2. **Client certificate.** Issued by the *client* CA: user = CN, groups = the O values.
3. **Bearer token**, checked with a ``TokenReview`` against the cluster (cached for
   ``cache_ttl_s``, the generic apiserver's 10 s).
4. Otherwise ``401``.

Every authenticated user also has group ``system:authenticated``. Authorization: a
``SubjectAccessReview`` per (user, namespace, metric) for the ``list`` verb on
``external.metrics.k8s.io/<metric>`` (cached the same way); ``system:masters`` is always allowed
(the aggregator's own checks carry it). Discovery documents need authentication only, as
``system:discovery`` grants them to every authenticated user. Without an access reviewer, every
authenticated user is allowed (say so at startup).

Which CA issued a certificate: Python's ``ssl`` hands over only the verified leaf, so the issuer
name is compared with the subject names of the certificates in each CA bundle. That is sound
because the TLS handshake already verified the chain against the union of both bundles; the two
CAs must have different subject names (kubeadm's ``kubernetes`` and ``front-proxy-ca`` do), and
the server refuses to start when they overlap without allowed names to tell them apart.

``insecure`` turns all of this off (plain HTTP allowed, everyone is ``system:anonymous`` with
``system:masters``): for a laptop, never a cluster.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import unquote

from extender.core.errors import ExtenderError, InvalidValueError

#: A distinguished name as Python's ssl module reports it: RDNs of (attribute, value) pairs.
Name = tuple[tuple[tuple[str, str], ...], ...]

MASTERS = "system:masters"
AUTHENTICATED = "system:authenticated"


class AuthError(ExtenderError):
    """A request was refused; ``code`` and ``reason`` go into the ``Status`` reply."""

    code = 401
    reason = "Unauthorized"


class UnauthenticatedError(AuthError):
    """No acceptable credentials (401)."""


class ForbiddenError(AuthError):
    """Authenticated, not allowed (403)."""

    code = 403
    reason = "Forbidden"


class AuthUnavailableError(AuthError):
    """The cluster could not be asked (TokenReview / SubjectAccessReview failed): 503, try again."""

    code = 503
    reason = "ServiceUnavailable"


@dataclass(frozen=True)
class User:
    """An authenticated caller; ``method`` says how (front-proxy, x509, token, insecure)."""

    name: str
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()
    method: str = ""


@dataclass(frozen=True)
class Access:
    """What a request does, in SubjectAccessReview ``resourceAttributes`` terms."""

    verb: str
    group: str
    version: str
    resource: str
    namespace: str


class TokenReviewer(Protocol):
    """Asks the cluster who a bearer token belongs to (``TokenReview``); ``None``: not a valid token."""

    def review_token(self, token: str) -> User | None: ...


class AccessReviewer(Protocol):
    """Asks the cluster whether a user may do something (``SubjectAccessReview``): ``(allowed, reason)``."""

    def review_access(self, user: User, access: Access) -> tuple[bool, str]: ...


def ca_subjects(pem: str) -> frozenset[Name]:
    """Subject names of the CA certificates in a PEM bundle (raises ``ssl.SSLError`` on bad PEM)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if pem.strip():
        context.load_verify_locations(cadata=pem)
    return frozenset(_name(c.get("subject")) for c in context.get_ca_certs())


def _name(raw: Any) -> Name:
    return tuple(tuple((str(k), str(v)) for k, v in rdn) for rdn in (raw or ()))


def _attribute(name: Name, key: str) -> list[str]:
    return [v for rdn in name for k, v in rdn if k == key]


@dataclass(frozen=True)
class AuthConfig:
    """Where identities may come from (module docstring); the header names are the Kubernetes defaults."""

    insecure: bool = False
    requestheader_cas: frozenset[Name] = frozenset()
    allowed_names: tuple[str, ...] = ()
    username_headers: tuple[str, ...] = ("X-Remote-User",)
    group_headers: tuple[str, ...] = ("X-Remote-Group",)
    extra_prefixes: tuple[str, ...] = ("X-Remote-Extra-",)
    client_cas: frozenset[Name] = frozenset()
    cache_ttl_s: float = 10.0
    cache_size: int = 4096

    def check(self) -> None:
        """Refuse a configuration in which a client certificate could pose as the front proxy."""
        if self.requestheader_cas & self.client_cas and not self.allowed_names:
            raise InvalidValueError("the request-header CA and the client CA share a subject name and no "
                             "requestheader allowed names are set: any client certificate could pose as the "
                             "front proxy; set --front-proxy-allowed-names (or requestheader-allowed-names in "
                             "the ConfigMap)")


class _TTLCache:
    """A small thread-safe cache with expiry and a size bound (oldest entries dropped first)."""

    def __init__(self, ttl_s: float, size: int, clock: Callable[[], float]) -> None:
        self.ttl_s, self.size, self.clock = ttl_s, size, clock
        self._items: OrderedDict[Any, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return None
            if hit[0] <= self.clock():
                del self._items[key]
                return None
            return hit[1]

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            self._items[key] = (self.clock() + self.ttl_s, value)
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


class Headers(Protocol):
    """The part of werkzeug's ``Headers`` we use (case-insensitive lookups)."""

    def get(self, key: str) -> str | None: ...

    def getlist(self, key: str) -> list[str]: ...

    def items(self) -> Iterable[tuple[str, str]]: ...


class Authenticator:
    """Authenticates and authorizes requests (rules in the module docstring); safe across threads."""

    def __init__(self, config: AuthConfig, *, tokens: TokenReviewer | None = None,
                 access: AccessReviewer | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        config.check()
        self.config = config
        self.tokens = tokens
        self.access = access
        self._token_cache = _TTLCache(config.cache_ttl_s, config.cache_size, clock)
        self._access_cache = _TTLCache(config.cache_ttl_s, config.cache_size, clock)

    def authenticate(self, peer_cert: Mapping[str, Any] | None, headers: Headers) -> User:
        """The caller's identity; raises :class:`UnauthenticatedError` or :class:`AuthUnavailableError`."""
        c = self.config
        if c.insecure:
            return User("system:anonymous", (MASTERS, "system:unauthenticated"), method="insecure")
        if peer_cert:
            issuer, subject = _name(peer_cert.get("issuer")), _name(peer_cert.get("subject"))
            common = _attribute(subject, "commonName")
            cn = common[0] if common else ""
            if issuer in c.requestheader_cas and (not c.allowed_names or cn in c.allowed_names):
                user = self._front_proxy_user(headers)
                if user is not None:
                    return user
            if issuer in c.client_cas and cn:
                return _with_authenticated(User(cn, tuple(_attribute(subject, "organizationName")), method="x509"))
        scheme, _, token = (headers.get("Authorization") or "").partition(" ")
        token = token.strip()
        if scheme.lower() == "bearer" and token:
            return self._token_user(token)
        raise UnauthenticatedError("Unauthorized")

    def _front_proxy_user(self, headers: Headers) -> User | None:
        c = self.config
        name = next((v.strip() for h in c.username_headers for v in headers.getlist(h) if v.strip()), "")
        if not name:
            return None
        groups = tuple(v for h in c.group_headers for v in _header_values(headers, h))
        extra: dict[str, list[str]] = {}
        for header in dict.fromkeys(k for k, _ in headers.items()):
            for prefix in c.extra_prefixes:
                if header.lower().startswith(prefix.lower()):
                    key = unquote(header[len(prefix):]).lower()
                    extra.setdefault(key, []).extend(_header_values(headers, header))
        extras = tuple(sorted((k, tuple(v)) for k, v in extra.items()))
        return _with_authenticated(User(name, groups, extras, method="front-proxy"))

    def _token_user(self, token: str) -> User:
        cached = self._token_cache.get(token)
        if cached is not None:
            if cached is False:
                raise UnauthenticatedError("Unauthorized")
            user: User = cached
            return user
        if self.tokens is None:
            raise UnauthenticatedError("bearer tokens are not accepted: this server has no TokenReview access")
        try:
            reviewed = self.tokens.review_token(token)
        except ExtenderError as exc:
            raise AuthUnavailableError(f"authentication is unavailable: {exc}") from exc
        self._token_cache.put(token, False if reviewed is None else _with_authenticated(reviewed))
        if reviewed is None:
            raise UnauthenticatedError("Unauthorized")
        return _with_authenticated(reviewed)

    def authorize(self, user: User, access: Access) -> None:
        """Raise :class:`ForbiddenError` unless ``user`` may perform ``access`` (or :class:`AuthUnavailableError`)."""
        if self.config.insecure or MASTERS in user.groups or self.access is None:
            return
        key = (user, access)
        cached = self._access_cache.get(key)
        if cached is None:
            try:
                cached = self.access.review_access(user, access)
            except ExtenderError as exc:
                raise AuthUnavailableError(f"authorization is unavailable: {exc}") from exc
            self._access_cache.put(key, cached)
        allowed, reason = cached
        if not allowed:
            where = f' in the namespace "{access.namespace}"' if access.namespace else ""
            raise ForbiddenError(f'{access.resource}.{access.group} is forbidden: User "{user.name}" cannot '
                            f'{access.verb} resource "{access.resource}" in API group "{access.group}"{where}'
                            + (f": {reason}" if reason else ""))


def _with_authenticated(user: User) -> User:
    if AUTHENTICATED in user.groups:
        return user
    return User(user.name, (*user.groups, AUTHENTICATED), user.extra, user.method)


def _header_values(headers: Headers, name: str) -> list[str]:
    """Every value of a repeated header. The aggregator sends one ``X-Remote-Group`` header per
    group; WSGI servers (gunicorn) join repeated headers into one value with commas, so split it
    again (a Kubernetes group or extra value with a comma in it cannot survive WSGI either way)."""
    return [part.strip() for value in headers.getlist(name) for part in value.split(",") if part.strip()]


def parse_list(text: str | None) -> tuple[str, ...]:
    """A list given as a JSON array string (as the ConfigMap holds it) or comma-separated."""
    if not text or not text.strip():
        return ()
    stripped = text.strip()
    if stripped.startswith("["):
        value = json.loads(stripped)
        if not isinstance(value, list):
            raise InvalidValueError(f"expected a JSON array, got {stripped!r}")
        return tuple(str(v) for v in value if str(v))
    return tuple(v.strip() for v in stripped.split(",") if v.strip())
