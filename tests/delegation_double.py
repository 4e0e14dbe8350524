"""A double of the three API-server endpoints an aggregated API server delegates to (plain HTTP, loopback).

* ``POST /apis/authentication.k8s.io/v1/tokenreviews``: tokens the test registered are
  authenticated as their user and groups, anything else is not;
* ``POST /apis/authorization.k8s.io/v1/subjectaccessreviews``: allowed when the test's rule says so;
* ``GET /api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication``: the data
  the test set.

The scaler's own calls must carry its ServiceAccount token (``caller_token``), as a real API server
would require; every review is recorded for assertions. (tests/kube_double serves neither reviews
nor ConfigMaps, and reviews are not stored objects, so they get this small server of their own.)
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

Rule = Callable[[str, list[str], dict[str, Any]], bool]


@dataclass
class DelegationState:
    caller_token: str = "scaler-sa-token"
    tokens: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    rule: Rule = lambda user, groups, attrs: False
    configmap: dict[str, str] = field(default_factory=dict)
    token_reviews: list[str] = field(default_factory=list)
    access_reviews: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Server(ThreadingHTTPServer):
    daemon_threads = False
    block_on_close = True
    state: DelegationState


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _authorized(self) -> bool:
        if self.headers.get("Authorization") != f"Bearer {self.server.state.caller_token}":
            self._send(401, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Unauthorized",
                             "code": 401, "message": "Unauthorized"})
            return False
        return True

    def do_GET(self) -> None:
        state = self.server.state
        if not self._authorized():
            return
        if self.path.split("?")[0] == "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication":
            self._send(200, {"apiVersion": "v1", "kind": "ConfigMap",
                             "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
                             "data": state.configmap})
            return
        self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                         "message": "not found"})

    def do_POST(self) -> None:
        state = self.server.state
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if not self._authorized():
            return
        path = self.path.split("?")[0]
        spec = body.get("spec") or {}
        if path == "/apis/authentication.k8s.io/v1/tokenreviews":
            token = spec.get("token", "")
            with state.lock:
                state.token_reviews.append(token)
            known = state.tokens.get(token)
            status: dict[str, Any] = {"authenticated": False}
            if known is not None:
                status = {"authenticated": True, "user": {"username": known[0], "uid": "u-1", "groups": known[1]}}
            self._send(201, {**body, "status": status})
        elif path == "/apis/authorization.k8s.io/v1/subjectaccessreviews":
            attrs = spec.get("resourceAttributes") or {}
            with state.lock:
                state.access_reviews.append(spec)
            allowed = state.rule(spec.get("user", ""), list(spec.get("groups") or []), attrs)
            self._send(201, {**body, "status": {"allowed": allowed,
                                                "reason": "" if allowed else "no RBAC policy matched"}})
        else:
            self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                             "code": 404, "message": "not found"})


class DelegationDouble:
    """The server; use :func:`running`."""

    def __init__(self) -> None:
        self.state = DelegationState()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.state = self.state
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="delegation-double", daemon=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def write_kubeconfig(self, path: Path) -> Path:
        doc = {"apiVersion": "v1", "kind": "Config",
               "clusters": [{"name": "d", "cluster": {"server": self.url}}],
               "users": [{"name": "d", "user": {"token": self.state.caller_token}}],
               "contexts": [{"name": "d", "context": {"cluster": "d", "user": "d"}}],
               "current-context": "d"}
        path.write_text(yaml.safe_dump(doc))
        return path


@contextlib.contextmanager
def running() -> Iterator[DelegationDouble]:
    double = DelegationDouble()
    double._thread.start()
    try:
        yield double
    finally:
        double._server.shutdown()
        double._server.server_close()
        double._thread.join()
