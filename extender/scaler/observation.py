"""One tick's demand observation, and the interface every signal source implements.

A source turns "the pods of a workload right now" into an :class:`Observation`: the demand rate in
the workload's unit (requests/s or tokens/s), the queue depth in the matching amount, and whether
the observation is *complete*. Incomplete means some serving pods (or queries) did not answer, so
the rate is a lower bound: the loop lets a lower bound raise the decision but never lower it.
``rate=None`` means nothing was observed at all; the decision then holds (never scales down on
missing data) and the history gets a gap, not a zero.
"""

from __future__ import annotations

import codecs
import concurrent.futures
import functools
import http.client
import io
import reprlib
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast, runtime_checkable

from extender.core.errors import SignalError
from extender.scaler.pods import Pod
from extender.state.history import Sample


@dataclass(frozen=True)
class Observation:
    """Demand seen at one tick (module docstring): ``expected`` targets, ``answered`` of them."""

    rate: float | None
    queue: float = 0.0
    complete: bool = True
    expected: int = 0
    answered: int = 0
    note: str = ""


class SignalSource(Protocol):
    """Observes one workload's demand; may keep state between ticks (counter values)."""

    name: str

    def observe(self, pods: Sequence[Pod], now: float) -> Observation:
        """The demand at ``now`` (unix seconds), given the workload's current pods."""
        ...


@runtime_checkable
class PastSource(Protocol):
    """A source that can also say what the demand was (the ``prometheus`` source: range queries)."""

    #: Whether the policy lets the scaler fill a short history from :meth:`past`.
    backfill: bool

    def past(self, start: float, end: float, step: float, *, budget_s: float) -> list[Sample]:
        """The demand at ``start, start + step, ...`` up to ``end`` (unix seconds), where it is known;
        raises :class:`SignalError` when the source cannot answer within ``budget_s`` seconds."""
        ...


class Fetcher(Protocol):
    """``fetch(url, timeout_s, headers=..., context=...) -> body``; raises :class:`SignalError` on any failure."""

    def __call__(self, url: str, timeout_s: float, *, headers: Mapping[str, str] | None = None,
                 context: ssl.SSLContext | None = None) -> str: ...


#: Largest body a scrape or query may return (a vLLM /metrics page is tens of KB).
MAX_BODY_BYTES = 16 * 2**20
#: Characters of a redirect's ``Location`` quoted in the error (the server chose them; the rest is cut).
MAX_LOCATION = 256


def _left(deadline: float) -> float:
    """Seconds until ``deadline`` (``time.monotonic()``); a :class:`TimeoutError` once it has passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    return left


class _DeadlineReader(io.RawIOBase):
    """The socket's bytes, each read waiting at most until the deadline.

    A socket's timeout bounds one read: a server that sends a byte a second never trips it. Setting
    it to the time left before every read bounds them all together, headers and body alike.
    """

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._sock = sock
        self._raw = sock.makefile("rb", buffering=0)  # holds a reference: the connection closes its socket early
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self._sock.settimeout(_left(self._deadline))
        got: int | None = self._raw.readinto(buffer)
        return got or 0

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


class _DeadlineSocket:
    """A connected socket whose sends and reads all end by ``deadline``; everything else is the socket's."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def makefile(self, mode: str = "rb", *_: Any, **__: Any) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))

    def sendall(self, data: Any) -> None:
        self._sock.settimeout(_left(self._deadline))  # sendall's timeout is already one for the whole send
        self._sock.sendall(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def _resolve(host: str, port: int, deadline: float) -> list[tuple[str, int]]:
    """The addresses of ``host`` as numeric ``(address, port)``, looked up by ``deadline``.

    ``getaddrinfo`` takes no timeout: with the cluster's DNS down, glibc retries each name of the
    pod's search list for 5 s or more apiece, and a Prometheus hostname held the scaler's tick that
    long. The lookup runs on a daemon thread instead, and a late one is left to end in its own time
    (its answer unused): :class:`TimeoutError`. An address given as numbers needs no thread.
    """
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except socket.gaierror:
        answer: concurrent.futures.Future[list[Any]] = concurrent.futures.Future()

        def look_up() -> None:
            try:
                answer.set_result(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
            except OSError as exc:
                answer.set_exception(exc)

        threading.Thread(target=look_up, name=f"resolve {host}", daemon=True).start()
        try:
            found = answer.result(timeout=_left(deadline))
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"timed out looking up {host}") from None
    return [(str(sockaddr[0]), int(sockaddr[1])) for *_, sockaddr in found]


def _connect_by(deadline: float) -> Any:
    """``socket.create_connection`` bounded by ``deadline``, the lookup included (:func:`_resolve`).

    Each address found is tried in turn with the time left as its timeout, which stays on the
    socket for TLS's handshake; the last address's error is the one raised.
    """

    def create(address: tuple[str, int], timeout: Any = None, source_address: Any = None,
               **kwargs: Any) -> socket.socket:
        error: OSError = OSError(f"no address for {address[0]}")
        for numeric in _resolve(*address, deadline):
            try:
                sock = socket.create_connection(numeric, _left(deadline), source_address, **kwargs)
            except TimeoutError:
                raise
            except OSError as exc:
                error = exc
                continue
            sock.settimeout(_left(deadline))
            return sock
        raise error

    return create


class _DeadlineHTTPConnection(http.client.HTTPConnection):
    def __init__(self, *args: Any, deadline: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline = deadline
        self._create_connection = _connect_by(deadline)

    def connect(self) -> None:
        super().connect()  # for https: TCP, then the TLS handshake, whose timeout covers all of it (ssl's own)
        self.sock = _DeadlineSocket(self.sock, self._deadline)


class _DeadlineHTTPSConnection(_DeadlineHTTPConnection, http.client.HTTPSConnection):
    """The same, over TLS (``connect`` reaches :class:`http.client.HTTPSConnection`'s through the MRO)."""


class _Fetch(urllib.request.Request):
    """One GET of :func:`http_get`, carrying its deadline and TLS context to the shared opener's handlers."""

    def __init__(self, url: str, headers: Mapping[str, str], deadline: float, context: ssl.SSLContext | None) -> None:
        super().__init__(url, headers=dict(headers))
        self.deadline = deadline
        self.context = context


class _DeadlineHTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        fetch = cast(_Fetch, req)  # the opener is http_get's alone (_opener), and it sends only _Fetch
        return self.do_open(functools.partial(_DeadlineHTTPConnection, deadline=fetch.deadline), req)


class _DeadlineHTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        fetch = cast(_Fetch, req)
        return self.do_open(functools.partial(_DeadlineHTTPSConnection, deadline=fetch.deadline), req,
                            context=fetch.context)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Follows no redirect: the 3xx reply is raised as the ``HTTPError`` it is (:func:`http_get`)."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int,  # noqa: PLR0917 (urllib's)
                         msg: str, headers: Any, newurl: str) -> None:
        return None


@functools.cache
def _opener() -> urllib.request.OpenerDirector:
    """The one opener of every fetch, built at the first (each fetch's deadline and context ride on its
    :class:`_Fetch`).

    ``build_opener`` reads the environment's proxies and lists every handler's methods: 0.4-0.6 ms,
    paid by every fetch when each built its own, about 0.8 ms on a tick's two Prometheus queries of
    about 2 ms (BENCHMARKS.md, the backfill section). As with ``urllib.request.urlopen``'s own
    opener, the ``http_proxy``/``no_proxy`` variables are read once, at the first fetch.
    """
    return urllib.request.build_opener(_NoRedirects, _DeadlineHTTPHandler(), _DeadlineHTTPSHandler())


def http_get(url: str, timeout_s: float, *, headers: Mapping[str, str] | None = None,
             context: ssl.SSLContext | None = None) -> str:
    """GET ``url`` and return its body as text: the default :class:`Fetcher` (standard library only).

    ``headers`` are added to the request (credentials, a tenant); ``context`` verifies an https
    server (and presents a client certificate) instead of the system's default.

    Redirects are not followed: a 3xx is a :class:`SignalError` naming where it pointed. A scrape
    target is any pod that carries the workload's labels, and what such a pod answers must not
    choose what the scaler fetches next (a pod's redirect would make the scaler GET any address it
    can reach, cloud metadata included, and its first line would come back in the observation's
    note); urllib's redirect handler also sends the request's headers, a Prometheus bearer token or
    basic-auth password among them, to whatever host the ``Location`` names, over plain HTTP too.

    ``timeout_s`` bounds the whole fetch: connecting, the TLS handshake, sending, the headers and the
    body. (urllib's own timeout bounds each socket read, so a server sending a byte a second held
    the fetch, and the scaler's tick, for as long as it liked.) Running out of it is a
    :class:`SignalError` saying the fetch timed out.

    Every way the server can fail is a :class:`SignalError` naming the URL, a reply that is no
    HTTP/1 included (``http.client.HTTPException``: an HTTP/2-only or binary port, a broken chunked
    body): one pod's odd port is that pod's missing reading, not an unexpected error that costs the
    workload its decision and logs a traceback at every tick. A charset Python does not know is
    read as UTF-8, the exposition format's own.
    """
    request = _Fetch(url, {"Accept": "text/plain, application/json;q=0.9, */*;q=0.1", **(headers or {})},
                     time.monotonic() + timeout_s, context)
    try:
        with _opener().open(request, timeout=timeout_s) as response:
            body: bytes = response.read(MAX_BODY_BYTES + 1)
            charset = response.headers.get_content_charset() or "utf-8"
    except urllib.error.HTTPError as exc:
        where = exc.headers.get("Location") if exc.headers is not None and 300 <= exc.code < 400 else None
        if where is not None:
            raise SignalError(f"GET {url}: HTTP {exc.code} redirect to {where[:MAX_LOCATION]!r} not followed "
                              "(the scaler reads the address it is given)") from exc
        raise SignalError(f"GET {url}: HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, TimeoutError, OSError, ValueError) as exc:
        if isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError):
            raise SignalError(f"GET {url}: timed out: no whole reply within {timeout_s:.3g}s") from exc
        raise SignalError(f"GET {url}: {getattr(exc, 'reason', None) or exc}") from exc
    except http.client.HTTPException as exc:
        # repr: the server's bytes escaped, and cut, since a status line can be 64 KiB of anything
        raise SignalError(f"GET {url}: not an HTTP/1 reply ({type(exc).__name__} {reprlib.repr(str(exc))})") from exc
    if len(body) > MAX_BODY_BYTES:
        raise SignalError(f"GET {url}: body larger than {MAX_BODY_BYTES} bytes")
    try:
        codecs.lookup(charset)
    except LookupError:
        charset = "utf-8"
    return body.decode(charset, errors="replace")
