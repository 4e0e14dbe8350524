"""The extender's Flask app behind gunicorn's asyncio worker: whole requests first, then a thread.

Why: with ``gthread`` a pool thread reads the request itself, in a blocking read. A client that
sends headers and part of a body, then stalls, holds that thread; eight such connections (2 workers
x 4 threads) stopped every /prioritize and /healthz for as long as they were held. In the asyncio
worker every connection is read by the event loop, which costs a stalled client nothing but a
buffer; the WSGI app runs in a small thread pool only once the whole body is in memory, and its
reply is written back by the event loop. kube-scheduler sends each request in one write, so it
never waits behind anyone's slow body.

The body limit is enforced while the body arrives (413 as soon as ``Content-Length`` or the bytes
received pass it). The WSGI environ is built by :mod:`asgiref` (``WsgiToAsgiInstance``); we do not
use its ``WsgiToAsgi`` runner, which hops between the loop and a thread for every message and cost
about 1 ms per call at 5,000 nodes. Here each request is one hop there and one back.

TLS servers that authenticate by client certificate (the External Metrics API of ``extender
scale``) run :class:`TLSASGIWorker`: the verified peer certificate comes from the TLS transport
(``get_extra_info("peercert")``) into the WSGI environ under ``extender.peer_cert``, and one
``request_timeout_s`` bounds each TLS handshake (asyncio's ``ssl_handshake_timeout``), the
headers of each request from its first byte (the connection is dropped), and the body (408, then
the connection is closed). An idle kept-alive connection is not a stalled request: gunicorn's
keep-alive timeout governs it. Every bound is a timer on the event loop, never a thread.

The 408 and 413 replies are written here, before the app sees the request, as ``{"error": message}``
(the scheduler extender's error body), or by ``error_body`` when the server speaks another format:
the External Metrics API's are ``metav1.Status`` objects
(:func:`extender.api.external_metrics.app.status_json`). :class:`TLSASGIWorker` also sends the
replies gunicorn writes for a request it cannot parse (400 bad request line or header, 414 request
line over ``limit_request_line``, 431 headers too large, 501 unknown transfer coding) through its
``error_body`` when one is set, so a client of the External Metrics API reads a ``Status`` there
too, not gunicorn's ``text/plain``.
"""

from __future__ import annotations

import asyncio
import io
import json
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from typing import Any

from asgiref.wsgi import WsgiToAsgiInstance
from gunicorn.arbiter import Arbiter
from gunicorn.sock import ssl_context
from gunicorn.workers.gasgi import ASGIWorker

#: Seconds a stopping worker keeps serving the connections it has, after it stopped accepting new
#: ones. Every reply in that time says ``Connection: close``, so a client that keeps a connection
#: alive (kube-scheduler does, and Go does not retry a POST that hits a closed one) moves to
#: another worker between two requests instead of losing one. gunicorn's gthread worker lingers
#: the same way; its asyncio worker closed kept-alive connections right after a reply that had not
#: announced it.
STOP_LINGER_S = 2.0
#: Past the linger, a request still being read or answered is waited for, up to this many seconds
#: after the signal (well inside gunicorn's 30 s graceful timeout): on a starved machine a request
#: read during the linger may not have its reply yet, and closing then resets the caller's socket.
MAX_DRAIN_S = 10.0

_draining = threading.Event()
#: HTTP requests of this worker begun and not yet answered (touched only on the event loop).
_in_flight = [0]


class LingeringASGIWorker(ASGIWorker):  # type: ignore[misc]
    """gunicorn's asyncio worker whose SIGTERM first drains connections, then stops as usual, that
    never serves plain HTTP when TLS is configured (:meth:`_get_ssl_context`), and that answers 400 to
    a request its parser fails on with a ``ValueError`` (:func:`_parse_errors_answered`)."""

    async def _serve(self) -> None:
        real = self.loop.create_server

        async def create_server(factory: Callable[[], Any], **kwargs: Any) -> Any:
            self._server_options(kwargs)
            return await real(lambda: self._protocol(factory()), **kwargs)

        self.loop.create_server = create_server
        await super()._serve()

    def _server_options(self, kwargs: dict[str, Any]) -> None:
        """Change ``loop.create_server``'s keyword arguments in place (nothing here)."""

    def _protocol(self, protocol: Any) -> Any:
        """gunicorn's protocol for one connection, wrapped."""
        return _parse_errors_answered(protocol)

    def _get_ssl_context(self) -> ssl.SSLContext | None:
        """gunicorn's TLS context, or ``None`` without TLS; a context that cannot be built (a certificate
        replaced by a broken one before a worker restart) stops the worker with gunicorn's boot-error
        code, which stops the server. gunicorn's own worker logs the error and serves plain HTTP on
        the port, with no certificate and no client authentication."""
        if not self.cfg.is_ssl:
            return None
        try:
            context: ssl.SSLContext = ssl_context(self.cfg)
        except Exception as exc:
            self.log.error("TLS: cannot build the server's TLS context: %s; stopping rather than serve plain HTTP",
                           exc)
            raise SystemExit(Arbiter.WORKER_BOOT_ERROR) from None
        return context

    def handle_exit_signal(self) -> None:
        if _draining.is_set():
            return
        _draining.set()  # replies now say Connection: close (whole_requests)
        stop_accepting(self.loop, self.servers)  # the other workers accept new connections
        self.loop.call_later(STOP_LINGER_S, self._stop_when_idle, time.monotonic() + MAX_DRAIN_S - STOP_LINGER_S)

    def _stop_when_idle(self, deadline: float) -> None:
        if _in_flight[0] and time.monotonic() < deadline:
            self.loop.call_later(0.05, self._stop_when_idle, deadline)
            return
        super().handle_exit_signal()


def stop_accepting(loop: asyncio.AbstractEventLoop, servers: list[asyncio.Server]) -> None:
    """Stop accepting connections on ``servers`` now, and close them once the connections already
    accepted have their transports.

    ``Server.close()`` alone loses a connection: asyncio accepts a socket in one loop iteration and
    makes its transport in a task that runs in a later one, and a transport cannot attach to a
    closed server (the task fails on an assertion, and the socket is dropped with the client's
    request unread: the client reads a reset). CPython issue gh-109564, open. Removing the
    listening sockets' readers stops new accepts at once; the servers are closed by a callback
    queued behind the tasks already created.
    """
    for server in servers:
        for sock in server.sockets:
            loop.remove_reader(sock.fileno())
    loop.call_soon(_close_all, servers)


def _close_all(servers: list[asyncio.Server]) -> None:
    for server in servers:
        server.close()


#: Scope keys our worker adds (ASGI servers may add namespaced keys): the peer certificate, and the
#: callbacks that tell the connection a request's headers are in and its reply is out.
PEER_CERT_SCOPE = "extender.peer_cert"
STARTED_SCOPE = "extender.request_started"
FINISHED_SCOPE = "extender.request_finished"
#: The WSGI environ key the app reads the peer certificate from
#: (:data:`extender.api.external_metrics.app.PEER_CERT_ENVIRON`).
PEER_CERT_ENVIRON = "extender.peer_cert"


class TLSASGIWorker(LingeringASGIWorker):
    """The asyncio worker with the peer certificate in each request and bounded reads (module docstring).

    ``request_timeout_s`` is set on the class in the master before gunicorn forks its workers.
    """

    request_timeout_s: float = 5.0
    #: The body of the replies gunicorn writes itself for an unparsable request (module docstring);
    #: ``None``: gunicorn's ``text/plain``. Set on the class in the master, like ``request_timeout_s``.
    error_body: ErrorBody | None = None

    def _server_options(self, kwargs: dict[str, Any]) -> None:
        if kwargs.get("ssl") is not None:
            kwargs["ssl_handshake_timeout"] = self.request_timeout_s

    def _protocol(self, protocol: Any) -> Any:
        return _bounded(super()._protocol(protocol), self.request_timeout_s, self.loop, type(self).error_body)


def _parse_errors_answered(protocol: Any) -> Any:
    """gunicorn's protocol whose HTTP/1 parser failing with a ``ValueError`` answers 400 and closes.

    gunicorn answers the parse errors it raises itself (400, 414, 431, 501) and re-raises anything
    else out of ``data_received``: asyncio then logs a traceback and drops the connection with no
    reply. Its parser checks ``Content-Length`` is ASCII digits, then reads it with ``int()``, which
    refuses a string of more than 4,300 digits (``sys.get_int_max_str_digits``) with a ``ValueError``:
    any client could write a traceback in the log per request. A ``ValueError`` out of the parser is
    a request it could not read, so it gets gunicorn's own answer to one (through the server's
    ``error_body`` where :func:`_bounded` sets one).
    """
    feed = protocol._feed_callback_parser

    def feed_answered(data: bytes) -> bool:
        try:
            return bool(feed(data))
        except ValueError as exc:
            reason = str(exc).split(";")[0]
            protocol._send_error_response(400, f"Invalid request: a header value could not be read ({reason})")
            protocol._close_transport()
            return False

    protocol._feed_callback_parser = feed_answered
    return protocol


def _bounded(protocol: Any, timeout_s: float, loop: asyncio.AbstractEventLoop,
             error_body: ErrorBody | None = None) -> Any:
    """gunicorn's protocol for one connection, with the certificate in its scopes and a header timer.

    Wraps methods of the instance: ``data_received`` (the first byte of a request arms a
    timer that drops the connection unless the request's headers are complete in time),
    ``_build_http_scope`` (adds the peer certificate and the callbacks :func:`whole_requests` calls),
    and, given ``error_body``, ``_send_error_response`` (gunicorn's own error replies in that format).
    """
    state = {"phase": "idle"}
    timer: list[asyncio.TimerHandle] = []
    received, build = protocol.data_received, protocol._build_http_scope

    def drop() -> None:
        if state["phase"] == "headers" and protocol.transport is not None:
            protocol.transport.abort()

    def data_received(data: bytes) -> None:
        if state["phase"] == "idle" and data:
            state["phase"] = "headers"
            timer[:] = [loop.call_later(timeout_s, drop)]
        received(data)

    def started() -> None:
        state["phase"] = "request"
        for t in timer:
            t.cancel()

    def finished() -> None:
        state["phase"] = "idle"

    def build_scope(request: Any, sockname: Any, peername: Any) -> Scope:
        scope: Scope = build(request, sockname, peername)
        transport = protocol.transport
        scope[PEER_CERT_SCOPE] = transport.get_extra_info("peercert") if transport is not None else None
        scope[STARTED_SCOPE], scope[FINISHED_SCOPE] = started, finished
        return scope

    def send_error(code: int, message: str, extra_headers: Any = ()) -> None:
        assert error_body is not None
        body = error_body(code, message)
        try:
            phrase = HTTPStatus(code).phrase
        except ValueError:
            phrase = "Error"
        extra = "".join(f"{name}: {value}\r\n" for name, value in extra_headers)
        head = (f"HTTP/1.1 {code} {phrase}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                f"{extra}Connection: close\r\n\r\n")
        protocol._safe_write(head.encode("latin-1") + body)

    protocol.data_received = data_received
    protocol._build_http_scope = build_scope
    if error_body is not None:
        protocol._send_error_response = send_error
    return protocol


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
#: ``error_body(code, message) -> JSON bytes`` of a 408 or 413 reply.
ErrorBody = Callable[[int, str], bytes]


def plain_error(code: int, message: str) -> bytes:
    """``{"error": message}``: the default error body (the scheduler extender's)."""
    return json.dumps({"error": message}).encode()


def whole_requests(wsgi_app: Any, max_body_bytes: int, threads: int = 4,
                   request_timeout_s: float | None = None, error_body: ErrorBody = plain_error) -> ASGIApp:
    """An ASGI app that reads each request whole (at most ``max_body_bytes``), then runs ``wsgi_app``.

    ``threads``: the pool that runs the app; a thread is taken only by a request that is complete.
    ``request_timeout_s``: a body not complete this long after the headers gets 408 and the
    connection is closed (``None``: no bound here). ``error_body``: the JSON of those 408 and 413
    replies (module docstring).
    """
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="extender-request")

    async def _too_large(send: Send, limit: int) -> None:
        await _error(send, 413, error_body(413, f"request body is larger than the {limit} byte limit"))

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        _in_flight[0] += 1
        started = scope.get(STARTED_SCOPE)
        if started is not None:
            started()
        try:
            await _answer(scope, receive, send)
        finally:
            _in_flight[0] -= 1
            finished = scope.get(FINISHED_SCOPE)
            if finished is not None:
                finished()

    async def _answer(scope: Scope, receive: Receive, send: Send) -> None:
        length = _content_length(scope)
        if length is not None and length > max_body_bytes:
            await _too_large(send, max_body_bytes)
            return
        chunks: list[bytes] = []

        async def read() -> bool:
            size = 0
            while True:
                message = await receive()
                if message["type"] != "http.request":  # the client went away
                    return False
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > max_body_bytes:
                    await _too_large(send, max_body_bytes)
                    return False
                chunks.append(chunk)
                if not message.get("more_body"):
                    return True

        try:
            if not await asyncio.wait_for(read(), request_timeout_s):
                return
        except TimeoutError:
            await _error(send, 408, error_body(408, f"the request body did not arrive within {request_timeout_s:g} s"))
            return
        loop = asyncio.get_running_loop()
        status, headers, body = await loop.run_in_executor(pool, _call, wsgi_app, scope, b"".join(chunks))
        if _draining.is_set():
            headers = [*headers, (b"connection", b"close")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    app.wsgi_app = wsgi_app  # type: ignore[attr-defined]  # for hooks that need the app (worker_exit)
    return app


def _call(wsgi_app: Any, scope: Scope, body: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Run the WSGI app on one whole request (in a pool thread): ``(status, headers, body)``."""
    builder = WsgiToAsgiInstance(wsgi_app)  # type: ignore[no-untyped-call]
    builder.scope = scope
    environ = builder.build_environ(scope, io.BytesIO(body))  # type: ignore[no-untyped-call]
    if scope.get(PEER_CERT_SCOPE):
        environ[PEER_CERT_ENVIRON] = scope[PEER_CERT_SCOPE]
    started: list[tuple[int, list[tuple[bytes, bytes]]]] = []
    out: list[bytes] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
        started[:] = [(int(status.split(" ", 1)[0]),
                       [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers])]
        return out.append

    result = wsgi_app(environ, start_response)
    try:
        out.extend(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    (status, headers), = started
    return status, headers, b"".join(out)


def _content_length(scope: Scope) -> int | None:
    """The request's ``Content-Length``. gunicorn's parser refused the request already unless the value is
    ASCII digits (RFC 9110's ``1*DIGIT``; blanks around it are the field's, stripped): no sign, ``1_000``
    or other script's digit reaches ``int()`` here (tests/test_fault_metrics_apis.py, ``content-length-*``)."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _error(send: Send, code: int, body: bytes) -> None:
    """A JSON error reply that closes the connection."""
    await send({"type": "http.response.start", "status": code,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
