"""A local double of the Kubernetes API server, over real HTTP, for the official client and kubectl.

Why our own and not a library: the candidates either replace the client in-process (no HTTP, so the
official client's request building, chunked watch parsing and error mapping go untested) or are
asyncio servers driven by per-test expectations; none offered, together, one revision counter
across kinds, paged lists (``limit``/``continue``), resumable watches with bookmarks, ``410 Gone``
after compaction, the status subresource split, fault injection (cut streams, forced expiry, failing calls) and an RBAC
authorizer that decides every call from the RBAC our Helm chart renders. The standard library's
threading HTTP server is enough: one thread per connection, HTTP/1.1 keep-alive (the client pools
connections) and chunked transfer written by hand, so a test can also cut a stream mid-chunk.

Start one with :meth:`KubeDouble.running` (a context manager that always stops it: every handler
thread is joined and every socket closed), point a client at :attr:`KubeDouble.url` or at the file
from :meth:`KubeDouble.write_kubeconfig`, and read what clients did in :attr:`KubeDouble.requests`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import socket
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from tests.kube_double.kinds import KINDS, Kind, Route, kind_of, parse_route
from tests.kube_double.rbac import Authorizer, Request
from tests.kube_double.selectors import SelectorError, field_selector, label_selector
from tests.kube_double.state import ApiError, ClusterState, Obj, status_object, watch_event

log = logging.getLogger(__name__)

ANONYMOUS = "system:anonymous"
#: Longest watch the double serves when the client gives no ``timeoutSeconds``.
DEFAULT_WATCH_TIMEOUT_S = 1800.0


@dataclass
class Fault:
    """Answer the next ``times`` matching requests with an error instead of serving them, with
    these ``headers`` and Status ``details`` (a 429's ``Retry-After`` and ``retryAfterSeconds``)."""

    verb: str
    resource: str
    code: int
    times: int = 1
    headers: Mapping[str, str] = field(default_factory=dict)
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class _Options:
    bookmark_interval_s: float
    tokens: dict[str, str]
    authorizer: Authorizer | None
    faults: list[Fault] = field(default_factory=list)


def verb_of(method: str, route: Route, query: Mapping[str, str]) -> str:
    """The RBAC verb of a request, as the API server derives it."""
    if method == "GET":
        if query.get("watch") in ("true", "1"):
            return "watch"
        return "get" if route.name else "list"
    if method == "DELETE":
        return "delete" if route.name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


class _Server(ThreadingHTTPServer):
    # join every handler thread on close: a test must not leave threads behind
    daemon_threads = False
    block_on_close = True
    double: KubeDouble

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that closes with a reply unread (the log reader past limitBytes, when the server
        # ignores it) resets the connection: the client's choice, not a fault of the double, so no
        # traceback on the test run's output. Anything else is printed as socketserver does.
        if not isinstance(sys.exc_info()[1], ConnectionResetError | BrokenPipeError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.double._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.double._track(self.connection, add=False)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("kube double: " + format, *args)

    def do_GET(self) -> None:
        self.server.double._dispatch(self)

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET  # noqa: N815 - http.server's naming

    # ---- writing -------------------------------------------------------------------------

    def send_json(self, code: int, body: Any, *, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(body, separators=(",", ":")).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def start_chunked(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def end_chunked(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class KubeDouble:
    """The API double: cluster state, HTTP server, request log, authorizer and fault injection."""

    def __init__(
        self,
        *,
        bookmark_interval_s: float = 1.0,
        tokens: Mapping[str, str] | None = None,
        authorizer: Authorizer | None = None,
        history_limit: int = 100_000,
    ) -> None:
        self.state = ClusterState(history_limit=history_limit)
        self.requests: list[Request] = []
        self._options = _Options(bookmark_interval_s, dict(tokens or {}), authorizer)
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._watches = 0
        #: Lists handed out in pages: continue token -> the objects not yet sent and their revision.
        self._continues: dict[str, tuple[list[Obj], int]] = {}
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        #: Container logs served at ``pods/<name>/log``: (namespace, pod, container) -> text.
        self._logs: dict[tuple[str, str, str], str | bytes] = {}
        #: Logs served whole whatever ``limitBytes`` asks (:meth:`set_log`).
        self._unlimited: set[tuple[str, str, str]] = set()

    # ---- lifecycle -------------------------------------------------------------------------

    @classmethod
    @contextlib.contextmanager
    def running(cls, **options: Any) -> Iterator[KubeDouble]:
        """Start a double on a free loopback port; stop it (threads joined) however the block ends."""
        double = cls(**options)
        double.start()
        try:
            yield double
        finally:
            double.stop()

    def start(self) -> None:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.double = self
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="kube-double", daemon=False)
        self._thread.start()

    def stop(self) -> None:
        if self._server is None:
            return
        self.state.stop()
        self._server.shutdown()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:  # idle keep-alive connections block in readline until shut down
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._server.server_close()  # joins every handler thread
        if self._thread is not None:
            self._thread.join()
        self._server = None

    def _track(self, sock: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._sockets.add(sock)
            else:
                self._sockets.discard(sock)

    @property
    def port(self) -> int:
        assert self._server is not None, "the double is not running"
        port: int = self._server.server_address[1]
        return port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def open_watches(self) -> int:
        """Watch streams currently being served (past their initial events)."""
        with self._lock:
            return self._watches

    def open_connections(self) -> int:
        """Client connections currently open (watches and idle keep-alives)."""
        with self._lock:
            return len(self._sockets)

    # ---- test-side helpers -----------------------------------------------------------------

    def add_token(self, token: str, user: str) -> None:
        """Requests bearing ``token`` act as ``user`` (``system:serviceaccount:<ns>:<name>``)."""
        self._options.tokens[token] = user

    def set_authorizer(self, authorizer: Authorizer | None) -> None:
        self._options.authorizer = authorizer

    def write_kubeconfig(self, path: Path, *, token: str | None = None, namespace: str = "default") -> Path:
        """A kubeconfig for this double (plain HTTP; with a bearer token when given)."""
        user: dict[str, Any] = {"token": token} if token else {}
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "double", "cluster": {"server": self.url}}],
            "users": [{"name": "double", "user": user}],
            "contexts": [{"name": "double", "context": {"cluster": "double", "user": "double",
                                                         "namespace": namespace}}],
            "current-context": "double",
            "preferences": {},
        }
        path.write_text(yaml.safe_dump(doc))
        return path

    def fail(self, verb: str, resource: str, code: int, *, times: int = 1, headers: Mapping[str, str] | None = None,
             details: Mapping[str, Any] | None = None) -> None:
        """Answer the next ``times`` requests with this verb on ``resource`` with ``code`` (and
        ``headers`` and Status ``details``)."""
        with self._lock:
            self._options.faults.append(Fault(verb, resource, code, times, dict(headers or {}), dict(details or {})))

    def set_log(self, namespace: str, pod: str, container: str, text: str | bytes, *, honor_limit: bool = True) -> None:
        """What ``GET .../pods/<pod>/log?container=<container>`` serves (a container of the pod's spec
        with no log set is answered as the real server answers one not started: 400); with
        ``honor_limit`` false, the whole text whatever ``limitBytes`` says (a server or proxy that
        ignores it)."""
        with self._lock:
            self._logs[(namespace, pod, container)] = text
            if honor_limit:
                self._unlimited.discard((namespace, pod, container))
            else:
                self._unlimited.add((namespace, pod, container))

    def clear_faults(self) -> None:
        with self._lock:
            self._options.faults.clear()

    def count(self, verb: str, resource: str, *, user: str | None = None) -> int:
        """Requests served so far with this verb on ``resource`` (by ``user``, when given)."""
        with self._lock:
            return sum(1 for r in self.requests
                       if r.verb == verb and r.resource == resource and (user is None or r.user == user))

    def apply(self, obj: Obj) -> Obj:
        """Create or replace an object, status included (what a kubelet and a controller would do)."""
        kind = kind_of(obj["apiVersion"], obj["kind"])
        assert kind is not None, f"the double does not serve {obj['apiVersion']} {obj['kind']}"
        namespace = obj.get("metadata", {}).get("namespace") if kind.namespaced else None
        name = obj["metadata"]["name"]
        try:
            current = self.state.get(kind, namespace, name)
        except ApiError:
            return self.state.create(kind, namespace, obj)
        body = json.loads(json.dumps(obj))
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        stored = self.state.update(kind, namespace, name, body)
        if "status" in kind.subresources and "status" in obj:
            stored = self.state.update(kind, namespace, name, {"status": obj["status"], "metadata": {}}, sub="status")
        return stored

    def remove(self, api_version: str, kind_name: str, name: str, namespace: str | None = None) -> None:
        kind = kind_of(api_version, kind_name)
        assert kind is not None
        self.state.delete(kind, namespace, name)

    def verbs_used(self) -> set[tuple[str, str, str, str]]:
        """``(user, verb, group, resource[/subresource])`` of every request served so far."""
        with self._lock:
            return {
                (r.user, r.verb, r.group, f"{r.resource}/{r.subresource}" if r.subresource else r.resource)
                for r in self.requests
            }

    # ---- serving ---------------------------------------------------------------------------

    def _dispatch(self, h: _Handler) -> None:
        try:
            self._serve(h)
        except ApiError as exc:
            h.send_json(exc.code, exc.status(), headers=exc.headers)
        except (BrokenPipeError, ConnectionResetError):
            h.close_connection = True
        except Exception as exc:  # a bug in the double: answer 500 and keep serving
            log.exception("kube double failed on %s %s", h.command, h.path)
            with contextlib.suppress(OSError):
                h.send_json(500, status_object(500, "InternalError", f"double: {exc}"))

    def _body(self, h: _Handler) -> Any:
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"request body is not JSON: {exc}") from exc

    def _list_page(self, kind: Kind, ns: str | None, query: dict[str, str]) -> tuple[list[Obj], Obj, int]:
        """``(items, continue metadata, revision)`` of one list page, as the real server pages:
        ``limit`` objects at most, then a ``continue`` token for the rest of the same snapshot (an
        unknown or forgotten token is ``410 Expired``, what an etcd compaction makes of an old one)."""
        token = query.get("continue") or ""
        if token:
            with self._lock:
                kept = self._continues.pop(token, None)
            if kept is None:
                raise ApiError(410, "Expired", "The provided continue parameter is too old to display a "
                               "consistent list result. You can start a new list without the continue parameter.")
            items, revision = kept
        else:
            items, revision = self.state.list_objects(kind, ns, _selector(query))
        try:
            limit = int(query.get("limit") or 0)
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"invalid limit {query.get('limit')!r}") from exc
        if limit <= 0 or len(items) <= limit:
            return items, {}, revision
        rest, next_token = items[limit:], f"{revision}-{secrets.token_hex(6)}"
        with self._lock:
            self._continues[next_token] = (rest, revision)
        return items[:limit], {"continue": next_token, "remainingItemCount": len(rest)}, revision

    def expire_continues(self) -> None:
        """Forget every continue token handed out: the next page of those lists is ``410 Expired``."""
        with self._lock:
            self._continues.clear()

    def _user(self, h: _Handler) -> str:
        auth = h.headers.get("Authorization", "")
        if not auth:
            return ANONYMOUS
        scheme, _, token = auth.partition(" ")
        user = self._options.tokens.get(token.strip()) if scheme.lower() == "bearer" else None
        if user is None:
            raise ApiError(401, "Unauthorized", "Unauthorized")
        return user

    def _serve(self, h: _Handler) -> None:
        url = urlsplit(h.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        body = self._body(h) if h.command in ("POST", "PUT", "PATCH", "DELETE") else None
        user = self._user(h)
        discovery = self._discovery(url.path)
        if discovery is not None:
            h.send_json(200, discovery)
            return
        route = parse_route(url.path)
        if route is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        verb = verb_of(h.command, route, query)
        request = Request(user, verb, route.kind.group, route.kind.resource, route.subresource,
                          route.namespace, route.name)
        with self._lock:
            self.requests.append(request)
            fault = next((f for f in self._options.faults
                          if f.verb == verb and f.resource == route.kind.resource and f.times > 0), None)
            if fault is not None:
                fault.times -= 1
        authorizer = self._options.authorizer
        if authorizer is not None and not authorizer.allowed(request):
            what = f"{route.kind.resource}/{route.subresource}" if route.subresource else route.kind.resource
            group = f' in API group "{route.kind.group}"' if route.kind.group else ' in API group ""'
            raise ApiError(403, "Forbidden", f'{what} is forbidden: User "{user}" cannot {verb} resource '
                           f'"{what}"{group}' + (f' in the namespace "{route.namespace}"' if route.namespace else
                                                 " at the cluster scope"))
        if fault is not None:
            reason = {429: "TooManyRequests"}.get(fault.code, "InternalError" if fault.code >= 500 else "Injected")
            raise ApiError(fault.code, reason, f"injected failure for {verb} {route.kind.resource}", fault.details,
                           headers=fault.headers)
        self._handle(h, route, verb, query, body)

    def _handle(self, h: _Handler, route: Route, verb: str, query: dict[str, str], body: Any) -> None:
        kind, ns, name, sub = route.kind, route.namespace, route.name, route.subresource
        if sub == "log":
            self._log(h, route, verb, query)
            return
        if verb == "watch":
            self._watch(h, route, query)
            return
        if verb == "list":
            page, more, revision = self._list_page(kind, ns, query)
            h.send_json(200, {"kind": f"{kind.kind}List", "apiVersion": kind.api_version, "items": page,
                              "metadata": {"resourceVersion": str(revision), **more}})
        elif verb == "get":
            assert name is not None
            h.send_json(200, self.state.get(kind, ns, name))
        elif verb == "create":
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "create needs an object body")
            h.send_json(201, self.state.create(kind, ns, body))
        elif verb == "update":
            assert name is not None
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "update needs an object body")
            h.send_json(200, self.state.update(kind, ns, name, body, sub=sub))
        elif verb == "patch":
            assert name is not None
            content_type = h.headers.get("Content-Type", "")
            h.send_json(200, self.state.patch(kind, ns, name, content_type, body, sub=sub))
        elif verb == "delete":
            assert name is not None
            h.send_json(200, self.state.delete(kind, ns, name))
        elif verb == "deletecollection":
            items, _ = self.state.list_objects(kind, ns, _selector(query))
            gone = [self.state.delete(kind, i["metadata"].get("namespace"), i["metadata"]["name"]) for i in items]
            h.send_json(200, {"kind": f"{kind.kind}List", "apiVersion": kind.api_version,
                              "metadata": {"resourceVersion": str(self.state.revision)}, "items": gone})
        else:
            raise ApiError(405, "MethodNotAllowed", f"{verb} is not supported")

    def _log(self, h: _Handler, route: Route, verb: str, query: dict[str, str]) -> None:
        """A container's log as the real server sends it: plain text, the first ``limitBytes``; a
        missing pod is 404, a container the pod has not (or none named when it has several) 400."""
        ns, name = route.namespace, route.name
        if verb != "get" or ns is None or name is None:
            raise ApiError(405, "MethodNotAllowed", f"{verb} is not supported on pods/log")
        pod = self.state.get(route.kind, ns, name)
        names = [c.get("name") for c in pod.get("spec", {}).get("containers", [])]
        container = query.get("container") or (names[0] if len(names) == 1 else "")
        if not container:
            raise ApiError(400, "BadRequest", f"a container name must be specified for pod {name}, choose one of: "
                           f"{names}")
        if container not in names:
            raise ApiError(400, "BadRequest", f"container {container} is not valid for pod {name}")
        with self._lock:
            text = self._logs.get((ns, name, container))
            unlimited = (ns, name, container) in self._unlimited
        if text is None:
            raise ApiError(400, "BadRequest",
                           f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating')
        data = text if isinstance(text, bytes) else text.encode()
        try:
            limit = int(query.get("limitBytes") or 0)
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"invalid limitBytes {query.get('limitBytes')!r}") from exc
        if limit > 0 and not unlimited:
            data = data[:limit]
        h.send_response(200)
        h.send_header("Content-Type", "text/plain")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _watch(self, h: _Handler, route: Route, query: dict[str, str]) -> None:
        kind, ns = route.kind, route.namespace
        matches = _selector(query)
        timeout = float(query.get("timeoutSeconds") or DEFAULT_WATCH_TIMEOUT_S)
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        rv_text = query.get("resourceVersion") or "0"
        state = self.state
        try:
            start_rv = int(rv_text)
        except ValueError as exc:
            raise ApiError(400, "BadRequest", f"invalid resourceVersion {rv_text!r}") from exc
        gone: ApiError | None = None
        with state.cond:
            cut, expire = state.cut_epoch, state.expire_epoch
            if start_rv == 0:  # "any": the current state as synthetic ADDED events, then changes
                initial, cursor = state.list_objects(kind, ns, matches)
                pending = [("ADDED", obj) for obj in initial]
            else:
                cursor = start_rv
                pending = []
                try:
                    state.changes_after(kind, ns, cursor)
                except ApiError as exc:
                    gone = exc
        h.start_chunked()
        if gone is not None:
            self._send_event(h, "ERROR", gone.status())
            h.end_chunked()
            return
        with self._lock:
            self._watches += 1
        try:
            self._stream(h, kind, ns, matches=matches, cursor=cursor, pending=pending, cut=cut, expire=expire,
                         timeout=timeout, bookmarks=bookmarks)
        finally:
            with self._lock:
                self._watches -= 1

    def _stream(
        self,
        h: _Handler,
        kind: Kind,
        ns: str | None,
        *,
        matches: Any,
        cursor: int,
        pending: list[tuple[str, Obj]],
        cut: int,
        expire: int,
        timeout: float,
        bookmarks: bool,
    ) -> None:
        state = self.state
        deadline = time.monotonic() + timeout
        next_bookmark = time.monotonic() + self._options.bookmark_interval_s
        for etype, obj in pending:
            self._send_event(h, etype, obj)
        while True:
            with state.cond:
                while True:
                    now = time.monotonic()
                    if state.stopping or now >= deadline:
                        break
                    if state.cut_epoch != cut or state.expire_epoch != expire:
                        break
                    if state.revision > cursor or (bookmarks and now >= next_bookmark):
                        break
                    wake = min(deadline, next_bookmark if bookmarks else deadline)
                    state.cond.wait(max(0.0, wake - now))
                if state.stopping or time.monotonic() >= deadline:
                    h.end_chunked()
                    return
                if state.cut_epoch != cut:
                    # drop the connection mid-stream: no terminating chunk, as a reset or a proxy
                    # timeout looks to the client
                    h.close_connection = True
                    with contextlib.suppress(OSError):
                        h.connection.shutdown(socket.SHUT_RDWR)
                    return
                if state.expire_epoch != expire:
                    expired = ApiError(410, "Expired", f"too old resource version: {cursor} ({state.revision})")
                    events: list[tuple[str, Obj]] = [("ERROR", expired.status())]
                else:
                    events = []
                    try:
                        changes = state.changes_after(kind, ns, cursor)
                    except ApiError as exc:  # compacted past what this watcher has seen
                        changes = []
                        events.append(("ERROR", exc.status()))
                    for change in changes:
                        event = watch_event(change, matches)
                        if event is not None:
                            events.append(event)
                    cursor = state.revision
            for etype, obj in events:
                self._send_event(h, etype, obj)
            if events and events[-1][0] == "ERROR":
                h.end_chunked()
                return
            if bookmarks and time.monotonic() >= next_bookmark:
                self._send_event(h, "BOOKMARK", {"kind": kind.kind, "apiVersion": kind.api_version,
                                                 "metadata": {"resourceVersion": str(cursor)}})
                next_bookmark = time.monotonic() + self._options.bookmark_interval_s

    @staticmethod
    def _send_event(h: _Handler, etype: str, obj: Obj) -> None:
        h.chunk(json.dumps({"type": etype, "object": obj}, separators=(",", ":")).encode() + b"\n")

    @staticmethod
    def _discovery(path: str) -> Obj | None:
        path = path.rstrip("/") or "/"
        if path == "/version":
            return {"major": "1", "minor": "31", "gitVersion": "v1.31.0-double", "platform": "linux/amd64"}
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}
        if path == "/apis":
            groups: dict[str, list[str]] = {}
            for k in KINDS:
                if k.group:
                    groups.setdefault(k.group, []).append(k.version)
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in sorted(set(vs))],
                 "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]}}
                for g, vs in sorted(groups.items())]}
        for group_version in {k.prefix for k in KINDS}:
            if path == group_version:
                kinds: list[Kind] = [k for k in KINDS if k.prefix == group_version]
                resources: list[Obj] = []
                for k in kinds:
                    resources.append({"name": k.resource, "singularName": k.kind.lower(), "namespaced": k.namespaced,
                                      "kind": k.kind, "verbs": ["create", "delete", "deletecollection", "get", "list",
                                                                "patch", "update", "watch"]})
                    resources.extend({"name": f"{k.resource}/{s}", "singularName": "", "namespaced": k.namespaced,
                                      "kind": k.kind, "verbs": ["get", "patch", "update"]} for s in k.subresources)
                return {"kind": "APIResourceList", "apiVersion": "v1",
                        "groupVersion": kinds[0].api_version, "resources": resources}
        return None


def _selector(query: Mapping[str, str]) -> Any:
    try:
        labels = label_selector(query.get("labelSelector"))
        fields = field_selector(query.get("fieldSelector"))
    except SelectorError as exc:
        raise ApiError(400, "BadRequest", str(exc)) from exc
    return lambda obj: labels(obj) and fields(obj)
