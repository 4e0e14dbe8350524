"""``--metrics-bind``: a plain-HTTP endpoint with ``/metrics``, ``/healthz`` and ``/readyz``.

For the processes whose work is not an HTTP server (``extender agent``, ``extender sync``,
``extender keda-scaler``): a :class:`http.server.ThreadingHTTPServer` in a daemon thread.

* ``GET /metrics``: the registry in the Prometheus text format (``Content-Type`` from
  ``prometheus_client.CONTENT_TYPE_LATEST``, ``charset`` once);
* ``GET /healthz``: 200 ``{"status": "ok"}`` while the process's work thread lives, else 503 (the
  kubelet's liveness probe restarts it);
* ``GET /readyz``: 200 or 503 with a JSON body saying why (``ready`` plus the process's detail).

Anything else is 404. The probes carry no secrets, and the metrics name only nodes and workloads,
so the endpoint has no authentication; bind it to the pod IP and let a NetworkPolicy decide who scrapes.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from extender.core.errors import ExtenderError

log = logging.getLogger(__name__)

Probe = Callable[[], tuple[bool, dict[str, Any]]]


def _always() -> tuple[bool, dict[str, Any]]:
    return True, {}


class MetricsEndpoint:
    """Serves one registry and two probes on ``host:port`` until :meth:`close`."""

    def __init__(self, bind: str, registry: CollectorRegistry, *, alive: Probe = _always,
                 ready: Probe = _always) -> None:
        host, _, port = bind.rpartition(":")
        self.registry = registry
        self.alive = alive
        self.ready = ready
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                endpoint._answer(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # a scrape every 15 s is not news

        try:
            self.server = ThreadingHTTPServer((host or "0.0.0.0", int(port)), Handler)
        except OSError as exc:
            raise ExtenderError(f"--metrics-bind {bind}: cannot listen: {exc.strerror or exc}") from None
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="metrics-endpoint", daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> MetricsEndpoint:
        self._thread.start()
        log.info("metrics and probes on http://%s:%d (/metrics, /healthz, /readyz)",
                 self.server.server_address[0], self.port, extra={"port": self.port})
        return self

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _answer(self, request: BaseHTTPRequestHandler) -> None:
        path = request.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(request, 200, generate_latest(self.registry), CONTENT_TYPE_LATEST)
        elif path in ("/healthz", "/readyz"):
            probe = self.alive if path == "/healthz" else self.ready
            try:
                ok, detail = probe()
            except Exception as exc:  # a probe must answer, not hang up
                ok, detail = False, {"error": f"{type(exc).__name__}: {exc}"}
            body = {"status": "ok" if ok else "failing", **detail} if path == "/healthz" else {"ready": ok, **detail}
            self._send(request, 200 if ok else 503, json.dumps(body).encode(), "application/json")
        else:
            self._send(request, 404, b'{"error":"not found"}', "application/json")

    @staticmethod
    def _send(request: BaseHTTPRequestHandler, code: int, body: bytes, content_type: str) -> None:
        request.send_response(code)
        request.send_header("Content-Type", content_type)
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)
