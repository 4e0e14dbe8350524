"""The ``extender keda-scaler`` process: one grpc.aio server with KEDA's external scaler and gRPC health.

* **Services.** ``externalscaler.ExternalScaler`` (:mod:`extender.keda.service`) and the standard
  ``grpc.health.v1.Health`` (grpcio-health-checking), so a kubelet ``grpc:`` probe or
  ``grpc_health_probe`` can ask. Health is ``SERVING`` for the server (``""``) and for
  ``externalscaler.ExternalScaler`` while the published decisions can be read, ``NOT_SERVING``
  while Redis cannot be read (as the External Metrics API's ``/readyz`` answers 503) and from the
  start of a shutdown on: the readiness answer. ``liveness`` (:data:`LIVENESS_SERVICE`) is
  ``SERVING`` from the start until the shutdown, whatever Redis does: the liveness answer (a
  restart does not bring Redis back). kubelet's gRPC probe speaks no TLS, so ``health_listen`` adds a
  second, plaintext listener that serves the health service only (it tells nothing but the status).
* **TLS** (optional): the serving certificate and key; with a client CA, client certificates are
  *required* and verified against it (mutual TLS, what KEDA's ``tlsClientCert``/``tlsClientKey``
  authentication parameters present). The files are watched: a changed certificate, key or CA
  (a cert-manager renewal, a Secret volume's ``..data`` swap) is used from the next handshake on,
  without a restart. A change that does not load keeps the old configuration and is logged.
* **Shutdown** (SIGTERM, SIGINT): health goes ``NOT_SERVING``, open streams end with ``OK`` (KEDA
  reconnects, through the Service, to a replica still running), the listener closes and calls in
  flight get ``grace_s`` seconds to finish; then the process exits 0.
* The listener is bound without ``SO_REUSEPORT`` (gRPC sets it by default), so a port already in
  use is an error at start instead of two servers silently sharing it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from extender.core.errors import ExtenderError
from extender.core.policy import Policy
from extender.files import PolicyFile, read_regular
from extender.keda import externalscaler_pb2_grpc as pb_grpc
from extender.keda.commands import DEFAULT_LISTEN
from extender.keda.metrics import KedaMetrics
from extender.keda.reading import served_workloads
from extender.keda.service import SERVICE_NAME, Board, ExternalScalerService, PublishedSource
from extender.telemetry.build import add_build_info, add_process_collectors
from extender.telemetry.endpoint import MetricsEndpoint
from extender.telemetry.served import ServedMetrics

log = logging.getLogger(__name__)

#: The health service name that answers whether the process is alive, Redis or not (module docstring).
LIVENESS_SERVICE = "liveness"

#: Largest certificate, key or CA bundle read (a CA bundle of a few hundred certificates fits).
MAX_PEM_BYTES = 1 << 20


class ServeError(ExtenderError):
    """The KEDA scaler cannot start serving: an address that cannot be bound, unreadable TLS files."""


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: serving certificate (chain) and key; ``client_ca`` makes client certificates required."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    @property
    def paths(self) -> tuple[Path, ...]:
        return (self.cert, self.key) + ((self.client_ca,) if self.client_ca is not None else ())

    def signature(self) -> tuple[tuple[int, int, int] | None, ...]:
        """``(mtime, size, inode)`` of each file (``None``: missing); the paths are not resolved."""
        out: list[tuple[int, int, int] | None] = []
        for path in self.paths:
            try:
                st = os.stat(path)
            except OSError:
                out.append(None)
                continue
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(out)

    def read(self) -> tuple[bytes, bytes, bytes | None]:
        """``(cert, key, client CA)`` bytes; raises :class:`ServeError` naming the file that cannot be read."""
        loaded: list[bytes] = []
        for path in self.paths:
            try:
                data = read_regular(path, MAX_PEM_BYTES)
            except OSError as exc:
                raise ServeError(f"cannot read {path}: {exc.strerror or exc}") from exc
            if b"-----BEGIN" not in data:
                raise ServeError(f"{path} holds no PEM block")
            loaded.append(data)
        return loaded[0], loaded[1], loaded[2] if self.client_ca is not None else None


def server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    """Credentials that re-read ``tls`` when its files change (module docstring)."""
    cert, key, ca = tls.read()
    seen = {"signature": tls.signature()}

    def configuration(cert: bytes, key: bytes, ca: bytes | None) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        signature = tls.signature()
        if signature == seen["signature"]:
            return None
        seen["signature"] = signature
        try:
            config = configuration(*tls.read())
        except ServeError as exc:
            log.error("KEDA scaler: TLS files changed but cannot be used (%s); keeping the previous ones", exc)
            return None
        log.info("KEDA scaler: TLS files changed; new handshakes use them")
        return config

    # the stub says the callback returns a configuration; gRPC documents None as "unchanged"
    return grpc.dynamic_ssl_server_credentials(configuration(cert, key, ca), fetch,  # type: ignore[arg-type]
                                               require_client_authentication=ca is not None)


@dataclass(frozen=True)
class KedaSettings:
    """Everything one ``extender keda-scaler`` process needs."""

    policy: Policy
    listen: str = DEFAULT_LISTEN
    tls: TlsFiles | None = None
    #: Seconds between the streams' reads of the published decisions (and looks at the policy file).
    watch_interval_s: float = 1.0
    #: Seconds calls in flight get to finish at shutdown.
    grace_s: float = 5.0
    #: A plaintext listener for the health service alone (kubelet gRPC probes), or ``None``.
    health_listen: str | None = None
    #: With a path, policy edits are taken while running (workloads added or removed).
    policy_path: Path | None = None
    policy_version: str = ""
    #: ``HOST:PORT`` for ``/metrics``, ``/healthz`` and ``/readyz`` over plain HTTP, or ``None``.
    metrics_bind: str | None = None


class KedaServer:
    """One server on one event loop: :meth:`start`, then :meth:`stop` (module docstring)."""

    def __init__(self, settings: KedaSettings, source: PublishedSource,
                 registry: CollectorRegistry | None = None) -> None:
        self.settings = settings
        self.source = source
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.metrics = KedaMetrics(self.registry)
        #: What ``GetMetrics`` served, per workload of the policy (kept to its edits by the board).
        self.served = ServedMetrics(self.registry, "keda", served_workloads(settings.policy))
        self.port = 0
        self._server: grpc.aio.Server | None = None
        self._health_server: grpc.aio.Server | None = None
        self.health_port = 0
        self._health: health.aio.HealthServicer | None = None
        self._board: Board | None = None
        self._watch: asyncio.Task[None] | None = None

    @property
    def board(self) -> Board:
        """The state the streams share (after :meth:`start`)."""
        assert self._board is not None, "start() first"
        return self._board

    async def _set_health(self, serving: bool) -> None:
        assert self._health is not None
        self.metrics.readable.set(1 if serving else 0)
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE_NAME):
            await self._health.set(name, status)

    async def start(self) -> int:
        """Bind, start serving and watching; the port bound (useful with port 0)."""
        settings = self.settings
        policy_file = (PolicyFile(settings.policy_path, settings.policy_version)
                       if settings.policy_path is not None else None)
        self._health = health.aio.HealthServicer()
        await self._health.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)
        self._board = Board(served_workloads(settings.policy), self.source, interval_s=settings.watch_interval_s,
                            policy_file=policy_file, on_health=self._set_health,
                            on_workloads=self.served.set_workloads)
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        pb_grpc.add_ExternalScalerServicer_to_server(ExternalScalerService(self._board, self.metrics, self.served),
                                                     server)
        self.metrics.workloads.set_function(lambda: len(self.board.workloads))
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        self.port = _bind(server, settings.listen, server_credentials(settings.tls) if settings.tls else None)
        self._server = server
        if settings.health_listen is not None:
            probes = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
            health_pb2_grpc.add_HealthServicer_to_server(self._health, probes)
            self.health_port = _bind(probes, settings.health_listen, None)
            self._health_server = probes
            await probes.start()
        await server.start()
        await self._board.poll()  # health and the first snapshot before the first stream opens
        self._watch = asyncio.create_task(self._board.run(), name="keda-board")
        log.info("KEDA scaler: serving %s on %s (%s), %d workload(s): %s", SERVICE_NAME, settings.listen,
                 "mutual TLS" if settings.tls and settings.tls.client_ca else "TLS" if settings.tls else "plaintext",
                 len(self._board.workloads), ", ".join(sorted(self._board.workloads)))
        return self.port

    def ready(self) -> tuple[bool, dict[str, Any]]:
        """``/readyz``: serving, and the scaler's decisions can be read."""
        board = self._board
        ok = board is not None and bool(board.healthy) and not board.closed
        return ok, {"workloads": len(board.workloads) if board is not None else 0}

    async def stop(self) -> None:
        """Graceful stop (module docstring); safe to call twice."""
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if self._board is not None:
            await self._board.close()
        if self._server is not None:
            await self._server.stop(self.settings.grace_s)
            self._server = None
        if self._health_server is not None:
            await self._health_server.stop(0)
            self._health_server = None
        if self._watch is not None:
            await self._watch
            self._watch = None


def _bind(server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None) -> int:
    """Add a listener; the port bound, or :class:`ServeError` naming the address."""
    try:
        port = (server.add_secure_port(address, credentials) if credentials is not None
                else server.add_insecure_port(address))
    except RuntimeError as exc:
        raise ServeError(f"cannot listen on {address}: {exc}") from exc
    if not port:
        raise ServeError(f"cannot listen on {address}")
    return port


def run(settings: KedaSettings, source: PublishedSource,
        on_started: Callable[[int], None] | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then stop gracefully (the ``extender keda-scaler`` foreground)."""

    async def main() -> None:
        registry = CollectorRegistry(auto_describe=True)
        add_build_info(registry, "keda-scaler")
        add_process_collectors(registry)
        server = KedaServer(settings, source, registry)
        endpoint = None
        if settings.metrics_bind is not None:
            endpoint = MetricsEndpoint(settings.metrics_bind, registry, ready=server.ready).start()
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stopping.set)
        try:
            port = await server.start()
            if on_started is not None:
                on_started(port)
            await stopping.wait()
            log.info("KEDA scaler: stopping (grace %gs)", settings.grace_s)
        finally:
            await server.stop()
            if endpoint is not None:
                endpoint.close()

    asyncio.run(main())
