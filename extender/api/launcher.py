"""Running the extender under gunicorn, in-process (``extender serve``).

Worker class: gunicorn's asyncio worker (``asgi``) for ``extender serve``, and for ``extender
scale`` with peer certificates and bounded reads (:class:`extender.api.asgi.TLSASGIWorker`);
``gthread`` on request. kube-scheduler's HTTP client keeps connections alive and sends about one
filter and one prioritize call at a time per scheduler (the scheduling cycle is sequential,
docs/kubernetes-interfaces.md 2.10). ``sync`` workers close the connection after every reply, so every call would
pay a TCP (and TLS) handshake; ``gevent``/``eventlet`` would add monkey-patching for concurrency the
CPU-bound work cannot use. ``gthread`` parks idle keep-alive connections in a selector but lets a
pool thread read each request in a blocking read, so a few clients that stall mid-request hold
every thread and the scheduler's calls wait behind them. The asyncio worker reads every connection
in its event loop and runs the Flask app only on a whole request (:mod:`extender.api.asgi`), so
a stalled client costs a buffer, not a thread. Throughput across cores comes from several worker
processes either way.

``keepalive`` is longer than Go's ``http.Transport`` idle timeout (90 s) so the client always closes
an idle connection first; if the server closed first, the scheduler could send its next POST on a
connection that is already gone, and Go does not retry a POST.

Logs: gunicorn's error log (``gunicorn.error``: start, workers booting and exiting, timeouts) and
its access log (``gunicorn.access``, with ``--access-log``) lose their own handlers and formats and
go to the process's one handler (:mod:`extender.process`), at the level of ``--log-level``; an
access record carries ``remote``, ``method``, ``path``, ``status``, ``bytes``, ``duration_s`` and
``user_agent`` as fields.

TLS: the context gunicorn's workers build from ``--tls-cert``, ``--tls-key`` and ``--tls-client-ca``
(or from ``extender scale``'s ``ssl_context`` hook) is built once in the master first
(:func:`check_tls`): a file that is missing, unreadable or not PEM is refused with one line naming
it, before gunicorn starts. (gunicorn's asyncio worker logs a context it cannot build and then
serves plain HTTP on the port; :class:`extender.api.asgi.LingeringASGIWorker` stops instead.)

The app is not preloaded: each worker imports and builds it after the fork, so clients, threads and
metric files are per worker. Prometheus multiprocess mode needs ``PROMETHEUS_MULTIPROC_DIR`` before
``prometheus_client`` is imported anywhere, so :func:`serve` sets it before importing the app.
"""

from __future__ import annotations

import atexit
import os
import shutil
import ssl
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gunicorn.app.base import BaseApplication
from gunicorn.glogging import Logger as GunicornLogger
from gunicorn.sock import ssl_context

from extender.core.errors import InvalidValueError
from extender.files import open_regular
from extender.process import configure_logging, current_logging

#: Seconds an idle keep-alive connection stays open (Go's client gives up on idle ones after 90 s).
KEEPALIVE_S = 120


@dataclass(frozen=True)
class ServeOptions:
    """How gunicorn runs: listen address, processes, threads, TLS."""

    bind: str = "0.0.0.0:8888"
    workers: int = 2
    threads: int = 4
    tls_cert: Path | None = None
    tls_key: Path | None = None
    #: CA bundle for client certificates; when set, clients must present one (mutual TLS with the
    #: certFile/keyFile of kube-scheduler's ``tlsConfig``).
    tls_client_ca: Path | None = None
    timeout_s: int = 30
    #: How long a thread may hold the GIL while another waits (CPython's default is 5 ms). The
    #: refresher's snapshot rebuild is pure-Python CPU work; with 5 ms slices a request that arrives
    #: meanwhile waits up to 5 ms at each of its hand-offs (socket read, compute, socket write) and
    #: its p99 grows fivefold. With 0.5 ms it is served nearly as if the rebuild were not running;
    #: with one busy thread, the interval costs nothing.
    switch_interval_s: float = 0.0005
    #: ``None``: the level the command's ``--log-level`` set up.
    log_level: str | None = None
    access_log: bool = False
    #: ``asgi``: gunicorn's asyncio worker reads every request whole before a thread runs the app
    #: (:mod:`extender.api.asgi`), so slow clients cost no thread; ``gthread``: threads read.
    worker_model: str = "gthread"


def gunicorn_options(options: ServeOptions) -> dict[str, Any]:
    """The gunicorn settings for ``options``."""
    cfg: dict[str, Any] = {
        "bind": [options.bind],
        "workers": options.workers,
        "worker_class": "extender.api.asgi.LingeringASGIWorker" if options.worker_model == "asgi" else "gthread",
        "threads": options.threads if options.worker_model == "gthread" else 1,
        "keepalive": KEEPALIVE_S,
        "timeout": options.timeout_s,
        "graceful_timeout": 10,
        "preload_app": False,
        "proc_name": "extender",
        "loglevel": options.log_level or current_logging()[0],
        "errorlog": "-",
        "accesslog": "-" if options.access_log else None,
        "logger_class": OneFormatLogger,
        "child_exit": _child_exit,
        "post_fork": _switch_interval_hook(options.switch_interval_s),
        # gunicorn 25.1+ opens a control socket at one fixed path per user ($XDG_RUNTIME_DIR or
        # ~/.gunicorn), shared by every instance on the host and able to stop or resize it
        "control_socket_disable": True,
    }
    if Path("/dev/shm").is_dir():  # the heartbeat file must not sit on a slow or full disk
        cfg["worker_tmp_dir"] = "/dev/shm"
    if options.tls_cert is not None:
        cfg["certfile"] = str(options.tls_cert)
        cfg["keyfile"] = str(options.tls_key)
        if options.tls_client_ca is not None:
            cfg["ca_certs"] = str(options.tls_client_ca)
            cfg["cert_reqs"] = ssl.CERT_REQUIRED
    return cfg


class OneFormatLogger(GunicornLogger):  # type: ignore[misc]
    """gunicorn's logger writing through the process's handler, in its format (module docstring)."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        for logger in (self.error_log, self.access_log):
            for handler in [h for h in logger.handlers if getattr(h, "_gunicorn", False)]:
                logger.removeHandler(handler)
            logger.propagate = True

    def access(self, resp: Any, req: Any, environ: Any, request_time: Any) -> None:
        """One record per request: ``POST /filter 200``, with remote, method, path, status, bytes, duration_s and
        user_agent as fields."""
        if not self.access_log_enabled:
            return
        code = str(resp.status).split(None, 1)[0]
        sent = getattr(resp, "sent", None)
        seconds = request_time.seconds + request_time.microseconds / 1e6  # a timedelta, or the ASGI worker's look-alike
        method, uri = environ.get("REQUEST_METHOD"), environ.get("RAW_URI")
        fields = {"remote": environ.get("REMOTE_ADDR"), "method": method, "path": environ.get("PATH_INFO"),
                  "status": int(code) if code.isdigit() else code, "bytes": sent, "duration_s": round(seconds, 6),
                  "user_agent": environ.get("HTTP_USER_AGENT")}
        self.access_log.info("%s %s %s", method, uri, code, extra=fields)


def _switch_interval_hook(seconds: float) -> Callable[[Any, Any], None]:
    def post_fork(server: Any, worker: Any) -> None:
        sys.setswitchinterval(seconds)

    return post_fork


def _child_exit(server: Any, worker: Any) -> None:
    from extender.api.scheduler.metrics import mark_worker_dead

    mark_worker_dead(worker.pid)


class _Application(BaseApplication):  # type: ignore[misc]
    """gunicorn application that builds the WSGI app in each worker from a factory."""

    def __init__(self, factory: Callable[[], Any], options: dict[str, Any]) -> None:
        self._factory = factory
        self._options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self._options.items():
            if key in self.cfg.settings:  # a setting an older gunicorn lacks (control_socket_*) is moot there
                self.cfg.set(key, value)

    def load(self) -> Any:
        return self._factory()


def prepare_metrics_dir() -> None:
    """Point prometheus_client at a fresh multiprocess directory (ours, removed at exit) unless one is set."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return
    path = tempfile.mkdtemp(prefix="extender-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    master = os.getpid()

    def cleanup() -> None:
        if os.getpid() == master:  # forked workers inherit atexit handlers; only the master cleans up
            shutil.rmtree(path, ignore_errors=True)

    atexit.register(cleanup)


def check_tls(options: ServeOptions, cfg: Any) -> None:
    """Build the TLS context gunicorn's workers will build (``cfg``: its resolved configuration), once,
    here; raise :class:`~extender.core.errors.InvalidValueError` naming the flag and the file when a
    certificate, key or client CA cannot be read, or the context cannot be built from them."""
    if not cfg.is_ssl:
        return
    files = [("--tls-cert", options.tls_cert), ("--tls-key", options.tls_key),
             ("--tls-client-ca", options.tls_client_ca)]
    for flag, path in files:
        if path is None:
            continue
        try:
            open_regular(path).close()
        except OSError as exc:
            raise InvalidValueError(f"{flag} {path}: cannot read: {exc.strerror or exc}") from None
    try:
        ssl_context(cfg)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        given = ", ".join(f"{flag} {path}" for flag, path in files if path is not None)
        raise InvalidValueError(f"TLS: {given}: not a usable PEM certificate, private key and CA certificates "
                                f"({getattr(exc, 'reason', None) or exc})") from None


def run(factory: Callable[[], Any], options: ServeOptions, *, overrides: Mapping[str, Any] | None = None) -> None:
    """Run gunicorn with ``factory`` building the app in each worker; returns when gunicorn stops.

    ``overrides`` replace or add gunicorn settings (``extender scale`` sets its own TLS context and
    a worker-exit hook that stops its loop).
    """
    configure_logging()
    application = _Application(factory, {**gunicorn_options(options), **(overrides or {})})
    check_tls(options, application.cfg)
    application.run()
