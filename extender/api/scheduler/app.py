"""The Flask application factory of the scheduler extender.

``create_app(settings)`` runs once per gunicorn worker, after the fork (the launcher does not preload
the app), so every worker builds its own metrics, its own store client and its own refresher
thread; nothing is shared across the fork and nothing happens at import time.

Besides the scheduler verbs (:mod:`extender.api.scheduler.verbs`):

* ``GET /healthz``: the process serves and its refresher thread is alive (liveness);
* ``GET /readyz``: a snapshot is loaded, or the startup grace has passed and the worker declares
  fail-open mode (neutral replies are still a service: the scheduler is better off with them than
  with connection errors);
* ``GET /metrics``: Prometheus text, aggregated over every worker.
"""

from __future__ import annotations

import json
import logging
import os
import time

from flask import Flask, Response, request
from prometheus_client import CONTENT_TYPE_LATEST
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from extender.api.scheduler.metrics import Metrics
from extender.api.scheduler.refresher import Refresher, Throttle
from extender.api.scheduler.settings import Settings
from extender.api.scheduler.verbs import JSON, SchedulerService, bp
from extender.files import read_policy

log = logging.getLogger(__name__)


def create_app(settings: Settings) -> Flask:
    """Build the extender app for one worker process (starts its refresher unless told not to)."""
    if settings.policy is not None:
        policy, version = settings.policy, settings.policy_version
    else:
        policy, version = read_policy(settings.policy_path)
    metrics = Metrics()
    throttle = Throttle(settings.log_interval_s)
    refresher = Refresher(settings, policy, metrics, throttle, version=version)
    # A worker gunicorn (re)starts after a hot reload gets the launch-time policy in its settings;
    # it must serve the file's current one from its first request, like the workers that reloaded.
    refresher.check_policy()
    service = SchedulerService(settings, refresher, metrics, throttle)

    app = Flask("extender.api.scheduler")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.extensions["extender"] = service
    # werkzeug answers `//filter` with a 308 redirect in HTML that no error handler sees: such a path
    # simply does not match (a JSON 404, like every other unknown path)
    app.url_map.merge_slashes = False
    app.register_blueprint(bp)

    @app.errorhandler(RequestEntityTooLarge)
    def too_large(exc: RequestEntityTooLarge) -> Response:
        message = f"request body is larger than the {settings.max_body_bytes} byte limit"
        return Response(json.dumps({"error": message}), status=413, mimetype=JSON)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Response:
        return Response(json.dumps({"error": exc.description or exc.name}), status=exc.code or 500, mimetype=JSON)

    @app.errorhandler(Exception)
    def unexpected(exc: Exception) -> Response:
        # A bug outside the fail-open guard of the verbs. Flask would log a traceback per request
        # and leave the reply out of the metrics; count it, and log one traceback per interval.
        rule = request.url_rule
        route = rule.rule.strip("/") if rule is not None else "other"
        metrics.requests.labels(route, "error").inc()
        held = throttle.allow(f"error:{route}:{type(exc).__name__}")
        if held is not None:
            log.error("%s %s failed with an unexpected error%s", request.method, request.path,
                      f" [{held} similar failures not logged]" if held else "", exc_info=exc,
                      extra={"method": request.method, "path": request.path, "suppressed": held})
        return Response(json.dumps({"error": f"internal error: {type(exc).__name__}"}), status=500, mimetype=JSON)

    @app.get("/healthz")
    def healthz() -> Response:
        if not refresher.alive():
            return Response(json.dumps({"status": "refresher thread died"}), status=503, mimetype=JSON)
        return Response('{"status":"ok"}', mimetype=JSON)

    @app.get("/readyz")
    def readyz() -> Response:
        now = time.time()
        ok, mode = refresher.ready(now)
        health = refresher.health(now)
        engine = refresher.engine
        body = {
            "ready": ok,
            "mode": mode,
            "failOpen": health.fail_open,
            "snapshotVersion": engine.snapshot.version if engine else None,
            "snapshotAgeSeconds": round(health.age_s, 3),
            "nodes": len(engine.snapshot) if engine else 0,
            "policy": health.policy.metadata.name,
            "policyVersion": refresher.serving_version,
            "worker": os.getpid(),
            "storeError": refresher.error[1] if refresher.error else None,
        }
        return Response(json.dumps(body), status=200 if ok else 503, mimetype=JSON)

    @app.get("/metrics")
    def metrics_endpoint() -> Response:
        return Response(metrics.exposition(), content_type=CONTENT_TYPE_LATEST)

    if settings.start_refresher:
        refresher.start()
    return app
