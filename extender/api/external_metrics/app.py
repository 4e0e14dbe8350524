"""The External Metrics API (``external.metrics.k8s.io/v1beta1``) that the stock HPA reads the scaler through.

Served by ``extender scale`` on its own port; paths, JSON and status codes follow docs/kubernetes-interfaces.md
section 4 to the letter:

* discovery: ``GET /apis`` (APIGroupList), ``GET /apis/external.metrics.k8s.io`` (APIGroup),
  ``GET /apis/external.metrics.k8s.io/v1beta1`` (APIResourceList, one resource per metric);
* ``GET /apis/external.metrics.k8s.io/v1beta1/namespaces/{ns}/{metric}?labelSelector=...``:
  an ``ExternalMetricValueList`` with one item per workload the selector matches;
* errors are ``metav1.Status`` objects with the matching HTTP code, every reply is
  ``Content-Type: application/json`` (client-go decodes by that header, and the HPA's client asks
  for protobuf first);
* ``/healthz``, ``/livez``, ``/readyz`` need no authentication (the kubelet probes them), nor does
  ``/metrics`` (the scaler's and the warmer's metrics, for Prometheus: docs/monitoring.md).

Three metrics, one item per workload, labelled ``workload=<profile name>``:

==============================  ================================  ==================================
metric                          value                             HPA target
==============================  ================================  ==================================
``extender-desired-replicas``   the scaler's desired replicas     ``AverageValue: 1``
``extender-forecast-load``      the demand the decision sized     ``AverageValue: <capacity per
                                for (rate, in the profile unit)   replica>``
``extender-standby-replicas``   placeholder replicas to keep      ``AverageValue: 1``, on the
                                (extender.core.warming.           placeholder Deployment
                                standby_replicas)                 (docs/scaler.md)
==============================  ================================  ==================================

A workload the scaler has not decided for yet is served as one item with value ``"0"`` (an empty
list is an error to the HPA). That, and a decision served however old, are silent to the HPA, so
each item served is recorded (:mod:`extender.telemetry.served`, ``api="external-metrics"``: the
served decision's time and window per workload, and the items served without one;
docs/monitoring.md). A selector that matches no autoscaled workload of the namespace is a ``404``:
a typo in an HPA must show up as ``FailedGetExternalMetric``, not as a silent zero; its message
lists the workloads served in that namespace only. A selected workload whose published entry cannot be decoded
(:class:`~extender.state.decisions.Unreadable`) is a ``404`` too, saying so: there is no value to
serve for it, and the HPA keeps its replicas; the other workloads are served as usual. ``503`` is
for a store that cannot be read at all.
Values are Kubernetes quantity strings in milli-units (``"3"``, ``"1500m"``), which is the
precision the HPA reads them in (``MilliValue``).
"""

from __future__ import annotations

import json
import math
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from flask import Blueprint, Flask, Response, current_app, g, request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from werkzeug.exceptions import HTTPException, MethodNotAllowed

from extender.api.external_metrics.auth import Access, Authenticator, AuthError, User
from extender.api.external_metrics.label_selector import SelectorError, parse_selector
from extender.core.errors import ExtenderError
from extender.state.decisions import Published, Unreadable
from extender.telemetry.served import ServedMetrics

GROUP = "external.metrics.k8s.io"
VERSION = "v1beta1"
GROUP_VERSION = f"{GROUP}/{VERSION}"
JSON_TYPE = "application/json"

#: Metric name (the path's resource segment) -> which published value it serves.
METRICS: Mapping[str, Callable[[Published], float]] = {
    "extender-desired-replicas": lambda p: float(p.desired),
    "extender-forecast-load": lambda p: p.load,
    "extender-standby-replicas": lambda p: float(p.standby),
}
#: The label every item carries and HPAs select on.
WORKLOAD_LABEL = "workload"

#: Paths served without authentication (probes, and the metrics Prometheus scrapes: docs/monitoring.md).
OPEN_PATHS = frozenset({"/healthz", "/livez", "/readyz", "/metrics"})

#: Environ key under which a server other than gunicorn (or a test) hands over the verified peer
#: certificate (the ``ssl`` module's ``getpeercert()`` dict). Clients cannot set environ keys.
PEER_CERT_ENVIRON = "extender.peer_cert"


def format_quantity(value: float) -> str:
    """A Kubernetes quantity string for ``value`` at milli precision: ``"3"``, ``"1500m"``, ``"0"``.

    Non-finite and negative values (which no decision produces) are served as ``"0"``.
    """
    if not math.isfinite(value) or value <= 0:
        return "0"
    milli = math.floor(value * 1000 + 0.5)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def rfc3339(t: float) -> str:
    """Unix seconds as ``metav1.Time`` JSON: RFC 3339, UTC, whole seconds."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


#: ``metav1.Status`` reasons of the codes the server answers before the app sees a request
#: (:mod:`extender.api.asgi`: a body too slow or too large; gunicorn: a request it cannot parse).
TRANSPORT_REASONS: Mapping[int, str] = {400: "BadRequest", 408: "RequestTimeout", 413: "RequestEntityTooLarge",
                                        414: "RequestURITooLong", 431: "RequestHeaderFieldsTooLarge",
                                        501: "NotImplemented"}


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    """A ``metav1.Status`` failure object."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


def status(code: int, reason: str, message: str) -> Response:
    """A ``metav1.Status`` failure reply."""
    return Response(json.dumps(status_body(code, reason, message)), status=code, mimetype=JSON_TYPE)


def status_json(code: int, message: str) -> bytes:
    """The body of a reply written before the app sees the request (:data:`TRANSPORT_REASONS`): a ``metav1.Status``."""
    return json.dumps(status_body(code, TRANSPORT_REASONS.get(code, "InternalError"), message)).encode()


def _json(body: Any) -> Response:
    return Response(json.dumps(body, separators=(",", ":")), mimetype=JSON_TYPE)


def group_document() -> dict[str, Any]:
    gv = {"groupVersion": GROUP_VERSION, "version": VERSION}
    return {"name": GROUP, "versions": [gv], "preferredVersion": gv}


@dataclass
class ExternalMetricsApi:
    """What the blueprint serves from: published values, the autoscaled workloads, and auth.

    ``published`` reads every workload's values (``DecisionStore.published_entries``; may raise
    our errors, answered with 503). ``workloads`` maps each autoscaled workload to its namespace
    (``None``: served in every namespace); change it with :meth:`set_workloads`, which keeps
    ``served_metrics`` to the same workloads.
    """

    published: Callable[[], Mapping[str, Published | Unreadable]]
    workloads: Mapping[str, str | None]
    auth: Authenticator
    clock: Callable[[], float] = time.time
    ready: Callable[[], tuple[bool, dict[str, Any]]] | None = None
    #: What ``/metrics`` serves (the scaler's and its warmer's families); ``None``: 404.
    registry: CollectorRegistry | None = None
    #: Where each item served is recorded (on :attr:`registry`, usually); ``None``: nowhere.
    served_metrics: ServedMetrics | None = None

    def set_workloads(self, workloads: Mapping[str, str | None]) -> None:
        """Serve ``workloads`` from now on (a policy edit), and label the served metrics with them alone."""
        self.workloads = workloads
        if self.served_metrics is not None:
            self.served_metrics.set_workloads(workloads)


bp = Blueprint("external_metrics", __name__)


def _api() -> ExternalMetricsApi:
    api: ExternalMetricsApi = current_app.extensions["external_metrics"]
    return api


def peer_certificate(environ: Mapping[str, Any]) -> dict[str, Any] | None:
    """The verified client certificate of this request's connection, if any."""
    given = environ.get(PEER_CERT_ENVIRON)
    if given is not None:
        return dict(given)
    sock = environ.get("gunicorn.socket")
    if isinstance(sock, ssl.SSLSocket):
        cert = sock.getpeercert()
        return dict(cert) if cert else None
    return None


@bp.before_request
def _authenticate() -> Response | None:
    if request.path in OPEN_PATHS:
        return None
    try:
        g.user = _api().auth.authenticate(peer_certificate(request.environ), request.headers)
    except AuthError as exc:
        return status(exc.code, exc.reason, str(exc))
    return None


@bp.get("/apis")
def api_groups() -> Response:
    return _json({"kind": "APIGroupList", "apiVersion": "v1", "groups": [group_document()]})


@bp.get(f"/apis/{GROUP}")
def api_group() -> Response:
    return _json({"kind": "APIGroup", "apiVersion": "v1", **group_document()})


@bp.get(f"/apis/{GROUP_VERSION}")
def api_resources() -> Response:
    resources = [{"name": name, "singularName": "", "namespaced": True, "kind": "ExternalMetricValueList",
                  "verbs": ["get"]} for name in METRICS]
    return _json({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": GROUP_VERSION,
                  "resources": resources})


@bp.get(f"/apis/{GROUP_VERSION}/namespaces/<namespace>/<metric>")
def metric_values(namespace: str, metric: str) -> Response:
    api = _api()
    value_of = METRICS.get(metric)
    if value_of is None:
        return status(404, "NotFound", f"the server could not find the metric {metric!r} "
                      f"(served: {', '.join(METRICS)})")
    user: User = g.user
    try:
        api.auth.authorize(user, Access(verb="list", group=GROUP, version=VERSION, resource=metric,
                                        namespace=namespace))
    except AuthError as exc:
        return status(exc.code, exc.reason, str(exc))
    try:
        selector = parse_selector(request.args.get("labelSelector", ""))
    except SelectorError as exc:
        return status(400, "BadRequest", str(exc))
    here = sorted(w for w, ns in api.workloads.items() if ns is None or ns == namespace)
    workloads = [w for w in here if selector.matches({WORKLOAD_LABEL: w})]
    if not workloads:  # name only what this namespace may see, never other namespaces' workloads
        return status(404, "NotFound", f"no autoscaled workload in namespace {namespace!r} matches the "
                      f"selector {str(selector) or '(everything)'!r} (label {WORKLOAD_LABEL!r}; "
                      f"workloads: {', '.join(here) or 'none'})")
    try:
        published = api.published()
    except ExtenderError as exc:
        return status(503, "ServiceUnavailable", f"the scaler's metrics cannot be read: {exc}")
    unreadable = [v.reason for w in workloads if isinstance(v := published.get(w), Unreadable)]
    if unreadable:  # no value to serve (the store logged why); the other workloads are unaffected
        return status(404, "NotFound", f"{'; '.join(unreadable)}: no value until the scaler's next decision "
                      "for it")
    now = api.clock()
    items = []
    for w in workloads:
        value = published.get(w)
        item: dict[str, Any] = {"metricName": metric, "metricLabels": {WORKLOAD_LABEL: w}}
        if not isinstance(value, Published):  # not decided yet: "0", as an empty list is an error to the HPA
            item.update(timestamp=rfc3339(now), value="0")
        else:
            item.update(timestamp=rfc3339(value.t), window=value.window, value=format_quantity(value_of(value)))
        items.append(item)
        if api.served_metrics is not None:  # w is the policy's: a name a client made up was a 404 above
            api.served_metrics.record(w, value if isinstance(value, Published) else None)
    return _json({"kind": "ExternalMetricValueList", "apiVersion": GROUP_VERSION, "metadata": {}, "items": items})


@bp.get("/healthz")
@bp.get("/livez")
def healthz() -> Response:
    return _json({"status": "ok"})


@bp.get("/readyz")
def readyz() -> Response:
    ready = _api().ready
    ok, detail = ready() if ready is not None else (True, {})
    return Response(json.dumps({"ready": ok, **detail}), status=200 if ok else 503, mimetype=JSON_TYPE)


@bp.get("/metrics")
def metrics() -> Response:
    registry = _api().registry
    if registry is None:
        return status(404, "NotFound", "the server could not find the requested resource")
    return Response(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


def create_app(api: ExternalMetricsApi) -> Flask:
    """A Flask app serving only the External Metrics API (``extender scale`` builds one per worker)."""
    app = Flask("extender.external_metrics")
    app.config["MAX_CONTENT_LENGTH"] = 1 << 16  # every call is a GET; a body is a mistake
    # Flask answers OPTIONS itself with an empty text/html 200; here it is a method we do not serve (405 Status)
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    app.extensions["external_metrics"] = api
    # werkzeug answers `//` in a path with a 308 redirect in HTML that no error handler sees; an API
    # client wants a Status: such a path simply does not match (a 404)
    app.url_map.merge_slashes = False
    app.register_blueprint(bp)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Response:
        code = exc.code or 500
        reasons = {404: "NotFound", 405: "MethodNotAllowed", 413: "RequestEntityTooLarge", 400: "BadRequest"}
        message = ("the server could not find the requested resource" if code == 404
                   else exc.description or exc.name)
        allowed = sorted(exc.valid_methods or ()) if isinstance(exc, MethodNotAllowed) else []
        if allowed:
            message = f"the method {request.method} is not allowed on {request.path} (allowed: {', '.join(allowed)})"
        reply = status(code, reasons.get(code, "InternalError"), message)
        if allowed:
            reply.headers["Allow"] = ", ".join(allowed)
        return reply

    @app.errorhandler(Exception)
    def internal_error(exc: Exception) -> Response:
        current_app.logger.exception("external metrics API: unhandled error")
        return status(500, "InternalError", f"internal error: {type(exc).__name__}")

    return app
