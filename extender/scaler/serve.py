"""Assembling ``extender scale``: the loop, the External Metrics API, and the gunicorn process they run in.

One gunicorn worker per scaler pod serves the External Metrics API and runs the loop in a thread
next to it. The worker is the asyncio one ``extender serve`` uses (:class:`extender.api.asgi.TLSASGIWorker`):
the event loop performs TLS handshakes and reads requests, so clients that stall a handshake or a
request cost a buffer, not one of the few threads (the HPA controller asks once per HPA per 15 s;
with ``gthread`` four half-sent handshakes held every thread). ``--request-timeout`` bounds each
handshake and each request's headers and body; the peer certificate comes from the TLS transport.
Every scaler pod serves the API from Redis, so the APIService's Service may route to any of them;
only the elected leader's loop writes (extender.state.lock). One worker, because each worker would
otherwise run its own loop candidate: correct (the lock still elects one), but pointless work.

TLS (docs/kubernetes-interfaces.md 4.6): the server certificate from ``--tls-cert``/``--tls-key``; client
certificates are *requested* (``CERT_OPTIONAL``) and verified against the request-header CA plus
the client CA, so the aggregator's front-proxy certificate and direct clients' certificates both
pass the handshake and :mod:`extender.api.external_metrics.auth` decides what each may do. A client
without a certificate still gets in far enough to present a bearer token. The context is built
here rather than by gunicorn's default, which would also trust the system's public CAs for
client certificates.

Everything is built inside the worker after the fork (no preload): Redis client, Kubernetes
clients, the loop thread. gunicorn's ``worker_exit`` hook stops the loop, which releases the lock
so a standby takes over at its next tick instead of waiting for the lock to expire.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import ssl
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flask import Flask
from prometheus_client import CollectorRegistry

from extender.api.external_metrics.app import ExternalMetricsApi, create_app
from extender.api.external_metrics.auth import Access, AuthConfig, Authenticator, User, ca_subjects
from extender.core.errors import ExtenderError, InvalidValueError
from extender.core.policy import Policy
from extender.files import PolicyFile
from extender.kube.client import KubeClient
from extender.kube.delegation import Delegation
from extender.scaler.loop import LEASE_TICKS, LoopThread, ScaleLoop, TickReport, scaled_profiles
from extender.scaler.metrics import ScalerMetrics
from extender.state import InventoryStore, connect
from extender.state.decisions import DecisionStore
from extender.state.history import DEFAULT_MAX_AGE_S, DEFAULT_MAX_POINTS, HistoryStore
from extender.state.lock import LeaderLock
from extender.state.observations import CalibratedPolicy, ObservationStore
from extender.telemetry.build import add_build_info, add_process_collectors
from extender.telemetry.served import ServedMetrics
from extender.warm.loop import WarmLoop

log = logging.getLogger(__name__)


def default_identity() -> str:
    """``<pod or host>-<pid>-<random>``: unique per process, so two processes never share a fencing token."""
    base = os.environ.get("POD_NAME") or socket.gethostname() or "scaler"
    return f"{base}-{os.getpid()}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class AuthSettings:
    """Where the External Metrics API's callers are verified (PEM text, resolved before the fork)."""

    insecure: bool = False
    requestheader_ca_pem: str = ""
    client_ca_pem: str = ""
    allowed_names: tuple[str, ...] = ()
    username_headers: tuple[str, ...] = ("X-Remote-User",)
    group_headers: tuple[str, ...] = ("X-Remote-Group",)
    extra_prefixes: tuple[str, ...] = ("X-Remote-Extra-",)
    #: TokenReview for bearer tokens and SubjectAccessReview for every request, through the cluster.
    delegated: bool = True

    def config(self) -> AuthConfig:
        """The checked configuration; :class:`InvalidValueError` naming the CA whose PEM holds no
        certificate (``ssl.SSLError`` was a traceback from the preflight and from every worker)."""
        return AuthConfig(
            insecure=self.insecure,
            requestheader_cas=_subjects(self.requestheader_ca_pem,
                                        "--tls-front-proxy-ca (else the ConfigMap's requestheader-client-ca-file)"),
            allowed_names=self.allowed_names,
            username_headers=self.username_headers,
            group_headers=self.group_headers,
            extra_prefixes=self.extra_prefixes,
            client_cas=_subjects(self.client_ca_pem, "--tls-client-ca (else the ConfigMap's client-ca-file)"),
        )


def _subjects(pem: str, what: str) -> frozenset[Any]:
    """:func:`ca_subjects` of ``pem``, a PEM that is none refused naming ``what`` it came from."""
    try:
        return ca_subjects(pem)
    except ssl.SSLError as exc:
        raise InvalidValueError(f"the CA of {what} is no PEM certificate bundle: {exc.reason or exc}") from None


@dataclass(frozen=True)
class ScaleSettings:
    """Everything one ``extender scale`` process needs (decided by the command, shared by its worker)."""

    policy: Policy
    redis_url: str | None = None
    data_dir: Path = Path("var/redis")
    prefix: str = "extender"
    kubeconfig: str | None = None
    kube_context: str | None = None
    #: Seconds between ticks; ``None``: the policy's ``scaling.tick``.
    tick_s: float | None = None
    #: Seconds a leader's lock lives without renewal; ``None``: three ticks, following the policy's tick.
    lease_ttl_s: float | None = None
    identity: str = field(default_factory=default_identity)
    run_loop: bool = True
    history_max_age_s: float = DEFAULT_MAX_AGE_S
    history_max_points: int = DEFAULT_MAX_POINTS
    auth: AuthSettings = AuthSettings()
    #: The policy's file and the version of :attr:`policy`: with a path, the loop takes edits of the
    #: file from its next tick on (``None``: the policy stays as started).
    policy_path: Path | None = None
    policy_version: str = ""
    #: Seconds between looks at the policy file when the loop does not run (``--no-loop``).
    policy_check_s: float = 2.0
    #: The warm Jobs' helper image when the policy sets no ``warming.helperImage`` (the chart: its own).
    warm_helper_image: str | None = None

    def policy_file(self) -> PolicyFile | None:
        """A fresh watcher of :attr:`policy_path` (one per loop), or ``None``."""
        return PolicyFile(self.policy_path, self.policy_version) if self.policy_path is not None else None

    @property
    def tick(self) -> float:
        return self.tick_s if self.tick_s is not None else self.policy.scaling.tick

    @property
    def lease_ttl(self) -> float:
        return self.lease_ttl_s if self.lease_ttl_s is not None else LEASE_TICKS * self.tick


class KubePodLister:
    """:class:`~extender.scaler.pods.PodLister` over the official client (one selector, one namespace or all)."""

    def __init__(self, client: KubeClient) -> None:
        self.client = client

    def list_pods(self, label_selector: str, namespace: str | None = None) -> Iterable[Mapping[str, Any]]:
        """The matching pods page by page (a profile matched on annotations only, with no
        ``autoscaling.namespace``, lists every pod of the cluster each tick:
        :func:`~extender.scaler.pods.workload_pods` keeps only its own)."""
        return self.client.listing("pods", namespace=namespace, label_selector=label_selector or None)


class DelegatedReviews:
    """The External Metrics API's token and access reviewers, backed by :class:`Delegation`."""

    def __init__(self, delegation: Delegation) -> None:
        self.delegation = delegation

    def review_token(self, token: str) -> User | None:
        identity = self.delegation.review_token(token)
        if identity is None:
            return None
        return User(identity.username, identity.groups, identity.extra, method="token")

    def review_access(self, user: User, access: Access) -> tuple[bool, str]:
        return self.delegation.review_access(
            user.name, user.groups, dict(user.extra), verb=access.verb, group=access.group,
            version=access.version, resource=access.resource, namespace=access.namespace)


def build_loop(settings: ScaleSettings, client: Any, pods: KubePodLister | None = None,
               kube: KubeClient | None = None, registry: CollectorRegistry | None = None) -> ScaleLoop:
    """The loop of one candidate, on a Redis client from :func:`extender.state.connect`.

    The cache warmer runs inside the leader's tick (one leader for both: two warmers would race
    for the same nodes' NVMe), fed with that tick's decisions. It is attached only with a
    Kubernetes client (``kube``); without ``warming.enabled`` it plans and acts on nothing.
    ``registry``: where the warmer's metrics go (the one the process serves); ``None``: a private one.
    """
    if pods is None:
        kube = kube or KubeClient.connect(settings.kubeconfig, context=settings.kube_context)
        pods = KubePodLister(kube)
    inventory = InventoryStore(client, prefix=settings.prefix)
    loop = ScaleLoop(
        policy=settings.policy,
        lock=LeaderLock(client, settings.identity, ttl_s=settings.lease_ttl, prefix=settings.prefix),
        history=HistoryStore(client, prefix=settings.prefix, max_age_s=settings.history_max_age_s,
                             max_points=settings.history_max_points),
        decisions=DecisionStore(client, prefix=settings.prefix),
        pods=pods,
        inventory=inventory,
        # only a --tick is fixed: the policy's scaling.tick, and the lease of three ticks with it,
        # follow its edits (a tick fixed here kept the first policy's until a restart)
        tick_s=settings.tick_s,
        lease_ticks=LEASE_TICKS if settings.lease_ttl_s is None else None,
        calibration=CalibratedPolicy(ObservationStore(client, prefix=settings.prefix)),
    )
    if kube is not None:
        warm = WarmLoop(settings.policy, inventory, kube, instance=settings.identity, registry=registry,
                        helper_image=settings.warm_helper_image)

        def warm_after(report: TickReport) -> None:
            # the token is new at each acquisition of the lock: a replica that leads again after
            # another one did starts from what the cluster says, not what it learnt before
            warm.tick(report.now, report.expectations(), term=report.token)

        loop.on_leader_tick.append(warm_after)
        # the policy, calibrated when its mode is apply, and the per-node factors of the same fit
        loop.on_estimator_policy.append(warm.set_policy)
    return loop


def workload_namespaces(policy: Policy) -> Mapping[str, str | None]:
    """Autoscaled workload -> the namespace its metrics are served in (``None``: every namespace)."""
    return {p.name: p.autoscaling.namespace if p.autoscaling else None for p in scaled_profiles(policy)}


def scaler_registry() -> CollectorRegistry:
    """The registry ``extender scale`` serves at ``/metrics``: build info and process metrics to start with.

    One worker per process (:func:`gunicorn_overrides`), so an ordinary registry is the whole truth.
    """
    registry = CollectorRegistry(auto_describe=True)
    add_build_info(registry, "scale")
    add_process_collectors(registry)
    return registry


def create_worker_app(settings: ScaleSettings) -> Flask:
    """The WSGI app of one ``extender scale`` worker: the External Metrics API, plus the loop thread."""
    client = connect(settings.redis_url, settings.data_dir)
    decisions = DecisionStore(client, prefix=settings.prefix)
    reviews = None
    if settings.auth.delegated and not settings.auth.insecure:
        reviews = DelegatedReviews(Delegation.connect(settings.kubeconfig, context=settings.kube_context))
    auth = Authenticator(settings.auth.config(), tokens=reviews, access=reviews)
    runner: LoopThread | None = None
    last: dict[str, TickReport] = {}
    registry = scaler_registry()

    def ready() -> tuple[bool, dict[str, Any]]:
        detail: dict[str, Any] = {"identity": settings.identity}
        try:
            decisions.published_entries()  # an unreadable entry spoils its own workload, not readiness
        except ExtenderError as exc:
            return False, {**detail, "store": str(exc)}
        if runner is None:
            return True, {**detail, "loop": "off"}
        report = last.get("report")
        detail.update(loop="running" if runner.alive() else "stopped",
                      leader=report.holder if report else None, token=report.token if report else None)
        return runner.alive(), detail

    workloads = workload_namespaces(settings.policy)
    api = ExternalMetricsApi(published=decisions.published_entries, workloads=workloads, auth=auth, ready=ready,
                             registry=registry, served_metrics=ServedMetrics(registry, "external-metrics", workloads))

    def take(policy: Policy) -> None:
        api.set_workloads(workload_namespaces(policy))

    watch: PolicyWatch | None = None
    if settings.run_loop:
        loop = build_loop(settings, client, registry=registry)
        metrics = ScalerMetrics(registry, settings.policy)
        loop.on_policy.append(take)
        loop.on_policy.append(metrics.set_policy)

        def on_report(report: TickReport) -> None:
            last["report"] = report
            metrics.observe(report)

        runner = LoopThread(loop, on_report=on_report, policy_file=settings.policy_file())
        runner.start()
    else:
        policy_file = settings.policy_file()
        if policy_file is not None:  # no loop to follow the file: the API follows it itself
            watch = PolicyWatch(policy_file, settings.policy_check_s, take)
            watch.start()
    app = create_app(api)
    app.extensions["scaler_runner"] = runner
    app.extensions["scaler_policy_watch"] = watch
    return app


class PolicyWatch:
    """Polls a :class:`PolicyFile` in a daemon thread and hands each new valid policy to ``on_policy``.

    What ``extender scale --no-loop`` uses in place of the loop's per-tick look: the workloads the
    External Metrics API serves, and their namespaces, follow edits of the file (ConfigMap ``..data``
    swaps included) within ``interval_s``, without a restart. An invalid edit keeps the last good
    policy (the watcher logs it once).
    """

    def __init__(self, policy_file: PolicyFile, interval_s: float, on_policy: Callable[[Policy], None]) -> None:
        self.policy_file = policy_file
        self.interval_s = interval_s
        self.on_policy = on_policy
        #: Policies taken since start (tests and logs).
        self.reloads = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> bool:
        """Look once; True when a new policy was taken. Never raises (a bad file is the watcher's to report)."""
        try:
            policy = self.policy_file.poll().policy
            if policy is None:
                return False
            self.on_policy(policy)
        except Exception:
            log.exception("policy watch failed; keeping the last good policy")
            return False
        self.reloads += 1
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="scaler-policy-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()


def tls_context_hook(ca_pem: str) -> Any:
    """gunicorn ``ssl_context`` hook: our certificate, TLS >= 1.2, client certificates optional (module docstring)."""

    def ssl_context(conf: Any, default_ssl_context_factory: Any) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(certfile=conf.certfile, keyfile=conf.keyfile)
        if ca_pem.strip():
            context.load_verify_locations(cadata=ca_pem)
            context.verify_mode = ssl.CERT_OPTIONAL
        return context

    return ssl_context


#: Largest request body the API reads (its requests are GETs; anything larger is not a client of ours).
MAX_BODY_BYTES = 1 << 20


def _worker_exit(server: Any, worker: Any) -> None:
    app = getattr(worker, "asgi", None) or getattr(worker, "wsgi", None)
    if not isinstance(app, Flask):
        app = getattr(app, "wsgi_app", None)  # the Flask app behind extender.api.asgi.whole_requests
    runner = app.extensions.get("scaler_runner") if isinstance(app, Flask) else None
    if isinstance(runner, LoopThread):
        runner.stop()


def gunicorn_overrides(settings: ScaleSettings) -> dict[str, Any]:
    """The gunicorn settings ``extender scale`` changes from ``extender serve``'s (module docstring)."""
    ca = "\n".join(p.strip() for p in (settings.auth.requestheader_ca_pem, settings.auth.client_ca_pem) if p.strip())
    return {"workers": 1, "ssl_context": tls_context_hook(ca), "worker_exit": _worker_exit,
            "worker_class": "extender.api.asgi.TLSASGIWorker", "proc_name": "extender-scale"}
