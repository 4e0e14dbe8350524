"""``extender scale --policy FILE`` (the predictive scaler) and ``extender scale explain WORKLOAD``.

Wire into the CLI with :func:`register`::

    from extender.scaler import commands as scale_commands
    scale_commands.register(sub)   # sub = parser.add_subparsers(...)

Modes of ``scale``:

* default: gunicorn serves the External Metrics API (TLS) and runs the loop in its worker
  (:mod:`extender.scaler.serve`);
* ``--no-metrics-api``: the loop alone, in the foreground (SIGTERM/SIGINT: finish the tick,
  release the lock, exit);
* ``--no-loop``: the API alone (more API replicas than loop candidates, or debugging);
* ``--once``: one tick in the foreground, the decisions printed, then exit (as leader or standby).

Authentication of the API (:mod:`extender.api.external_metrics.auth`): the CAs and header names come
from the flags (``--tls-client-ca``, ``--tls-front-proxy-ca``, ``--front-proxy-*``), else from the
cluster's ``kube-system/extension-apiserver-authentication`` ConfigMap (skip with
``--no-auth-configmap``); bearer tokens and authorization go through TokenReview and
SubjectAccessReview unless ``--no-delegated-auth``. ``--insecure-no-auth`` turns all of it off and
allows plain HTTP: for a laptop only. kube-apiserver's names for these flags
(``--client-ca-file``, ``--requestheader-client-ca-file``, ``--requestheader-allowed-names``, ...,
``--authentication-skip-lookup``) still work, with a deprecation warning.

``explain`` prints the latest recorded decision of a workload with every input and reason
(``--last N`` adds a table of the N latest, ``--json`` the raw records).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from extender.arguments import (
    FLAG_CHECK,
    MAX_THREADS,
    SHORT_ACTION,
    add_kube_options,
    add_renamed,
    add_store_options,
    add_tls_options,
    bind_address,
    data_dir_from_args,
    duration,
    file_name,
    flag_problem,
    image_reference,
    positive_int,
    prefix_from_args,
    redis_url,
    redis_url_from_args,
    threads,
    tls_problem,
)
from extender.core.errors import ExtenderError, StateError
from extender.core.policy import Policy
from extender.core.scaler import Decision
from extender.core.schema import read_stored
from extender.files import load_policy_to_start, read_text
from extender.process import configure_logging, escape_controls, report

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    """Add ``scale`` (with its ``explain`` action) to an ``add_subparsers()`` object."""
    scale = subparsers.add_parser(
        "scale", help="predictive scaler: forecast demand one startup ahead, publish desired replicas to the HPA",
        description="Run the predictive scaler loop and serve its External Metrics API; "
                    "'extender scale explain WORKLOAD' shows why it decided what it did.",
    )
    scale.add_argument("--policy", metavar="FILE", help="policy file (profiles with an autoscaling section)")
    scale.add_argument("--tick", type=duration, metavar="DURATION",
                       help="time between decisions (default: the policy's scaling.tick, 15s)")
    scale.add_argument("--lease-ttl", type=duration, metavar="DURATION",
                       help="a leader that stops renewing is replaced after this long (default: three ticks)")
    scale.add_argument("--identity", metavar="ID",
                       help="this candidate's name in the leader lock (default: $POD_NAME or host, pid, random)")
    scale.add_argument("--history-max-age", type=duration, metavar="DURATION",
                       help="demand history kept per workload (default: 3d)")
    scale.add_argument("--history-max-points", type=positive_int, metavar="N",
                       help="samples kept per workload (default: 20000)")
    scale.add_argument("--warm-helper-image", type=image_reference, metavar="IMAGE",
                       help="image of the warm Jobs' own steps when the policy sets no warming.helperImage "
                            "(the chart passes the image it runs)")
    add_store_options(scale)
    add_kube_options(scale)
    mode = scale.add_argument_group("mode")
    mode.add_argument("--once", action="store_true", help="run one tick in the foreground, print it, exit")
    mode.add_argument("--no-metrics-api", action="store_true",
                      help="run the loop alone in the foreground, without the External Metrics API")
    mode.add_argument("--no-loop", action="store_true", help="serve the External Metrics API only")
    mode.add_argument("--metrics-bind", type=bind_address, default=None, metavar="HOST:PORT",
                      help="with --no-metrics-api: serve /metrics, /healthz and /readyz over plain HTTP here "
                           "(with the API, /metrics is on --bind)")
    api = scale.add_argument_group("External Metrics API")
    api.add_argument("--bind", default="0.0.0.0:6443", type=bind_address, metavar="HOST:PORT",
                     help="listen address (default: 0.0.0.0:6443)")
    api.add_argument("--threads", default=4, type=threads, metavar="N",
                     help=f"request threads, 1 to {MAX_THREADS} (default: 4); the process runs one thread's Python "
                          "at a time")
    api.add_argument("--request-timeout", default=5.0, type=duration, metavar="DURATION",
                     help="bound on each TLS handshake, and on reading each request's headers and body (default: 5s)")
    add_tls_options(api, client_ca_old=("--client-ca-file",),
                    client_ca_help="CA of client certificates accepted directly (default: from the ConfigMap)")
    add_renamed(api, "--tls-front-proxy-ca", "--requestheader-client-ca-file", type=file_name, metavar="FILE",
                text="CA of the front proxy's (the aggregator's) client certificate (default: from the ConfigMap)")
    add_renamed(api, "--front-proxy-allowed-names", "--requestheader-allowed-names", metavar="a,b",
                text="common names the front proxy's certificate may carry (empty: any; default: from the ConfigMap)")
    add_renamed(api, "--front-proxy-user-headers", "--requestheader-username-headers", metavar="H,..",
                text="headers carrying the user name the front proxy authenticated (default: X-Remote-User)")
    add_renamed(api, "--front-proxy-group-headers", "--requestheader-group-headers", metavar="H,..",
                text="headers carrying the user's groups (default: X-Remote-Group)")
    add_renamed(api, "--front-proxy-extra-headers-prefix", "--requestheader-extra-headers-prefix", metavar="P,..",
                text="prefixes of headers carrying the user's extra attributes (default: X-Remote-Extra-)")
    add_renamed(api, "--no-auth-configmap", "--authentication-skip-lookup", flag=True,
                text="do not read kube-system/extension-apiserver-authentication for what the flags leave unset")
    api.add_argument("--no-delegated-auth", action="store_true",
                     help="no TokenReview / SubjectAccessReview: certificates only, every authenticated caller allowed")
    api.add_argument("--insecure-no-auth", action="store_true",
                     help="LOCAL USE ONLY: no authentication at all, plain HTTP allowed")
    scale.set_defaults(handler=_scale, **{FLAG_CHECK: check_scale_flags})

    actions = scale.add_subparsers(dest="scale_command", metavar="ACTION")
    explain = actions.add_parser("explain", help="why the scaler decided what it did for a workload")
    explain.add_argument("workload", metavar="WORKLOAD", help="the profile's name")
    explain.add_argument("--last", type=positive_int, default=1, metavar="N",
                         help="also list the N latest decisions (default: 1, the latest only)")
    explain.add_argument("--json", action="store_true", help="print the stored records as JSON")
    # SUPPRESS: without a value here, argparse must not overwrite what was given before 'explain'
    explain.add_argument("--redis-url", type=redis_url, default=argparse.SUPPRESS, metavar="URL", help="as for scale")
    explain.add_argument("--data-dir", default=argparse.SUPPRESS, metavar="DIR", help="as for scale")
    explain.add_argument("--prefix", default=argparse.SUPPRESS, metavar="PREFIX", help="as for scale")
    explain.set_defaults(handler=_explain, **{FLAG_CHECK: None, SHORT_ACTION: True})


# ---- helpers -------------------------------------------------------------------------------------


def _store(args: argparse.Namespace) -> tuple[str | None, Path]:
    return redis_url_from_args(args), Path(data_dir_from_args(args))


def _usage(message: str) -> int:
    report(f"extender scale: {message}")
    return 2


def _list(text: str | None) -> tuple[str, ...] | None:
    from extender.api.external_metrics.auth import parse_list

    return None if text is None else parse_list(text)


def resolve_auth(args: argparse.Namespace) -> Any:
    """The API's :class:`~extender.scaler.serve.AuthSettings`: flags first, then the cluster's ConfigMap."""
    from extender.scaler.serve import AuthSettings

    if args.insecure_no_auth:
        return AuthSettings(insecure=True, delegated=False)
    requestheader = read_text(args.tls_front_proxy_ca) if args.tls_front_proxy_ca else None
    client_ca = read_text(args.tls_client_ca) if args.tls_client_ca else None
    names = _list(args.front_proxy_allowed_names)
    users = _list(args.front_proxy_user_headers)
    groups = _list(args.front_proxy_group_headers)
    extras = _list(args.front_proxy_extra_headers_prefix)
    delegated = not args.no_delegated_auth
    wanted = (requestheader, client_ca, names, users, groups, extras)
    # the ConfigMap's CAs serve --no-delegated-auth too: certificates are what it still checks
    if not args.no_auth_configmap and any(v is None for v in wanted):
        from extender.kube.delegation import AUTH_CONFIGMAP_NAME, AUTH_CONFIGMAP_NAMESPACE, Delegation

        try:
            delegation = Delegation.connect(args.kubeconfig, context=args.context)
            try:
                data = delegation.authentication_config()
            finally:
                delegation.close()
        except ExtenderError as exc:
            # as the generic apiserver does: go on with what the flags gave
            report(f"extender scale: warning: cannot read {AUTH_CONFIGMAP_NAMESPACE}/{AUTH_CONFIGMAP_NAME} "
                   f"({exc}); continuing with the flags only", level=logging.WARNING)
            data = {}
        requestheader = requestheader if requestheader is not None else data.get("requestheader-client-ca-file")
        client_ca = client_ca if client_ca is not None else data.get("client-ca-file")
        names = names if names is not None else _list(data.get("requestheader-allowed-names"))
        users = users if users is not None else _list(data.get("requestheader-username-headers"))
        groups = groups if groups is not None else _list(data.get("requestheader-group-headers"))
        extras = extras if extras is not None else _list(data.get("requestheader-extra-headers-prefix"))
    defaults = AuthSettings()
    return AuthSettings(
        requestheader_ca_pem=requestheader or "",
        client_ca_pem=client_ca or "",
        allowed_names=names or (),
        username_headers=users or defaults.username_headers,
        group_headers=groups or defaults.group_headers,
        extra_prefixes=extras or defaults.extra_prefixes,
        delegated=delegated,
    )


# ---- scale ---------------------------------------------------------------------------------------


def check_scale_flags(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """What ``scale`` refuses to start with (exit 2), or ``None``: a policy, one mode, the ``--tls-*``
    family, and TLS whenever the External Metrics API is served (unless ``--insecure-no-auth``)."""
    if not args.policy:
        return "--policy FILE is required (or use 'extender scale explain WORKLOAD')"
    if problem := tls_problem(args):
        return problem
    modes = [m for m in ("once", "no_metrics_api", "no_loop") if getattr(args, m)]
    if len(modes) > 1:
        return "--once, --no-metrics-api and --no-loop exclude each other"
    if args.metrics_bind and not args.no_metrics_api:
        # it was ignored: with the API, /metrics is on --bind; --once serves nothing
        return ("--metrics-bind goes with --no-metrics-api only (with the External Metrics API, /metrics "
                "is served on --bind; --once serves nothing)")
    serving = not (args.once or args.no_metrics_api)
    if serving and not args.tls_cert and not args.insecure_no_auth:
        return ("the External Metrics API is served over TLS (give --tls-cert and --tls-key); "
                "--insecure-no-auth serves plain HTTP without authentication, for local use only")
    return None


def _scale(args: argparse.Namespace) -> int:
    if problem := flag_problem(args):
        return _usage(problem)
    serving = not (args.once or args.no_metrics_api)
    started = scaled_policy_to_start(args.policy, "scale", nothing="nothing to scale")
    if started is None:
        return 1
    policy, version = started

    from extender.scaler.prometheus import check_credentials
    from extender.scaler.serve import AuthSettings, ScaleSettings, default_identity

    unusable = check_credentials(policy)
    for problem in unusable:
        report(f"extender scale: {problem}")
    if unusable:
        report("extender scale: not starting: the prometheus signal's files above cannot be used")
        return 1
    url, data_dir = _store(args)
    settings = ScaleSettings(
        policy=policy, redis_url=url, data_dir=data_dir.resolve(), prefix=prefix_from_args(args),
        kubeconfig=args.kubeconfig, kube_context=args.context, tick_s=args.tick, lease_ttl_s=args.lease_ttl,
        identity=args.identity or default_identity(), run_loop=not args.no_loop,
        auth=resolve_auth(args) if serving else AuthSettings(delegated=False),
        policy_path=Path(args.policy), policy_version=version, warm_helper_image=args.warm_helper_image,
        **({"history_max_age_s": args.history_max_age} if args.history_max_age else {}),
        **({"history_max_points": args.history_max_points} if args.history_max_points else {}),
    )
    if settings.auth.insecure:
        report("extender scale: WARNING: --insecure-no-auth: the External Metrics API answers anyone",
               level=logging.WARNING)
    if args.once:
        return _once(settings)
    if args.no_metrics_api:
        return _foreground(settings, args.metrics_bind)
    trouble = _preflight(settings)
    if trouble:
        report(f"extender scale: not starting: {trouble}")
        return 1
    return _serve(settings, args)


def _preflight(settings: Any) -> str:
    """Connect once to what the gunicorn worker will need, so a mistake is one clear line, not a worker crash."""
    from extender.kube.client import KubeClient
    from extender.kube.delegation import Delegation
    from extender.state import connect

    try:
        connect(settings.redis_url, settings.data_dir).close()
        if settings.run_loop:
            KubeClient.connect(settings.kubeconfig, context=settings.kube_context).close()
    except ExtenderError as exc:
        return str(exc)
    if not settings.auth.insecure:
        # what the worker checks at boot, checked here: a refusal is one line before start, not a
        # traceback in every worker gunicorn keeps restarting
        try:
            config = settings.auth.config()
            config.check()
        except ValueError as exc:
            return str(exc)
        if not settings.auth.delegated and not config.client_cas and not config.requestheader_cas:
            return ("the External Metrics API could authenticate no caller: --no-delegated-auth turns off "
                    "tokens, and there is no client CA or front-proxy CA (--tls-client-ca, --tls-front-proxy-ca, "
                    "or the cluster's extension-apiserver-authentication ConfigMap unless --no-auth-configmap); "
                    "every request would be answered 401")
    if settings.auth.delegated and not settings.auth.insecure:
        try:
            Delegation.connect(settings.kubeconfig, context=settings.kube_context).close()
        except ExtenderError as exc:
            return f"{exc} (TokenReview/SubjectAccessReview need it; --no-delegated-auth checks certificates only)"
    return ""


def _once(settings: Any) -> int:
    from extender.scaler.serve import build_loop
    from extender.state import connect

    loop = build_loop(settings, connect(settings.redis_url, settings.data_dir))
    tick = loop.tick()
    loop.step_down()
    if tick.error and not tick.leader:
        report(f"extender scale: {tick.error}")
        return 1
    if not tick.leader:
        print(f"standby: {tick.holder} leads (fencing token {tick.token})")
        return 0
    print(f"leader {tick.holder} (fencing token {tick.token})")
    for result in tick.results:  # notes quote what pods and Prometheus answered: no terminal escapes
        if result.decision is None:
            print(escape_controls(f"{result.workload}: no decision: {result.error}"))
        else:
            print(escape_controls(result.decision.explain()))
    if tick.fenced_out:
        print(f"stepped down: {tick.error}")
    # a tick that decided nothing for some workload failed at what it was run for
    return 1 if tick.fenced_out or any(r.decision is None for r in tick.results) else 0


def _foreground(settings: Any, metrics_bind: str | None = None) -> int:
    from extender.scaler.loop import LoopThread, TickReport
    from extender.scaler.metrics import ScalerMetrics
    from extender.scaler.serve import build_loop, scaler_registry
    from extender.state import connect
    from extender.telemetry.endpoint import MetricsEndpoint

    configure_logging()
    registry = scaler_registry()
    loop = build_loop(settings, connect(settings.redis_url, settings.data_dir), registry=registry)
    metrics = ScalerMetrics(registry, settings.policy)
    loop.on_policy.append(metrics.set_policy)
    last: list[TickReport] = []

    def on_report(report: TickReport) -> None:
        last[:] = [report]
        metrics.observe(report)

    runner = LoopThread(loop, on_report=on_report, policy_file=settings.policy_file())
    endpoint = None
    if metrics_bind:
        def ready() -> tuple[bool, dict[str, Any]]:
            report = last[0] if last else None
            return report is not None and not report.error, {"leader": report.holder if report else None}

        endpoint = MetricsEndpoint(metrics_bind, registry, ready=ready).start()

    def stop(signum: int, frame: Any) -> None:
        runner.stop(timeout_s=0)  # run() notices at its next wait, finishes the tick, releases the lock

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("scaler %s: ticking every %gs (lock ttl %gs), no External Metrics API",
             settings.identity, settings.tick, settings.lease_ttl, extra={"identity": settings.identity})
    try:
        runner.run()
    finally:
        if endpoint is not None:
            endpoint.close()
    return 0


def _serve(settings: Any, args: argparse.Namespace) -> int:
    from extender.api.asgi import TLSASGIWorker, whole_requests
    from extender.api.external_metrics.app import status_json
    from extender.api.launcher import ServeOptions, run
    from extender.scaler.serve import MAX_BODY_BYTES, create_worker_app, gunicorn_overrides

    options = ServeOptions(
        bind=args.bind, workers=1, threads=args.threads, worker_model="asgi",
        tls_cert=Path(args.tls_cert) if args.tls_cert else None,
        tls_key=Path(args.tls_key) if args.tls_key else None,
    )
    TLSASGIWorker.request_timeout_s = args.request_timeout  # set before gunicorn forks the worker
    TLSASGIWorker.error_body = status_json  # gunicorn's own 400/414/431/501 as metav1.Status too
    run(lambda: whole_requests(create_worker_app(settings), MAX_BODY_BYTES, args.threads, args.request_timeout,
                               error_body=status_json),  # 408 and 413 as metav1.Status, like every error
        options, overrides=gunicorn_overrides(settings))
    return 0


# ---- explain -------------------------------------------------------------------------------------


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def render_record(record: dict[str, Any]) -> str:
    """The latest decision of a workload, as ``extender scale explain`` prints it.

    Fields this release does not know are ignored: the scaler that wrote the record may be newer
    (a rolling upgrade, a rollback), and explaining its decision must not fail on them.
    """
    decision = read_stored(Decision, record["decision"])
    sig, pods, place, pub = record["signal"], record["pods"], record["placement"], record["published"]
    answered = f"{sig['answered']} of {sig['expected']} answered"
    complete = "complete" if sig["complete"] else "incomplete: a lower bound"
    lines = [
        f"decided {_when(float(record['t']))} by {record['holder']} (fencing token {record['token']})",
        decision.explain(),
        f"  signal: {sig['source']}, {answered}, {complete}" + (f"; {sig['note']}" if sig["note"] else ""),
        f"  pods: {pods['listed']} listed, {pods['ready']} ready, {pods['starting']} starting",
        f"  next replica: {place['node'] or '(no node yet)'} ({place['nodeClass'] or '?'}), "
        f"estimated startup {float(place['startupSeconds']):.0f}s, {place['cache']}",
        f"  published: extender-desired-replicas {pub['desired']}, extender-forecast-load "
        f"{float(pub['load']):.3g} {pub['unit']}"
        + ("" if pub.get("unshared") is None else f" (cut from {pub['unshared']} by sharing the fleet)")
        + f", extender-standby-replicas {pub.get('standby', 0)}",
    ]
    return "\n".join(lines)


def render_table(records: list[dict[str, Any]]) -> str:
    """One line per decision, newest first."""
    head = f"{'time (UTC)':<19} {'action':<10} {'desired':>7} {'current':>7} {'demand':>9} {'p-upper':>9} " \
           f"{'horizon':>8}  driver"
    rows = [head]
    for r in records:
        d = r["decision"]
        i = d["inputs"]
        demand = "-" if i["demand"] is None else f"{i['demand']:.3g}"
        upper = "-" if i["forecast"] is None else f"{i['forecast']['upper']:.3g}"
        when = datetime.fromtimestamp(float(r["t"]), UTC).strftime("%Y-%m-%d %H:%M:%S")
        rows.append(f"{when:<19} {d['action']:<10} {d['desired']:>7} {d['current']:>7} {demand:>9} {upper:>9} "
                    f"{i['horizon']['seconds']:>7.0f}s  {d['driver']}"
                    + ("" if d.get("unshared") is None else f", shared: cut from {d['unshared']}"))
    return "\n".join(rows)


def _explain(args: argparse.Namespace) -> int:
    from extender.state import connect
    from extender.state.decisions import DecisionStore

    url, data_dir = _store(args)
    store = DecisionStore(connect(url, data_dir), prefix=prefix_from_args(args))
    records = store.records(args.workload, args.last)
    if args.json:  # with none, still a document ([] or null) for a pipe, and the reason on stderr
        print(json.dumps(records if args.last > 1 else (records[0] if records else None), indent=2))
    if not records:
        report(f"extender scale explain: no decision recorded for {args.workload!r} (is 'extender scale' running "
               "with a policy that autoscales it, against this Redis?)", workload=args.workload)
        return 1
    if args.json:
        return 0
    try:
        text = render_record(records[0]) + ("\n\n" + render_table(records) if args.last > 1 else "")
    except (ValueError, KeyError, TypeError, OverflowError) as exc:  # pydantic's ValidationError is a ValueError
        # (OverflowError: a time past what a datetime holds, as 1e20 or 1e400 read from the JSON)
        # a record a newer scaler wrote in a shape this release cannot show (a new action, say)
        if isinstance(exc, ValidationError):
            first = exc.errors(include_url=False)[0]
            why = f"decision.{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
        else:
            why = f"{type(exc).__name__}: {exc}"
        raise StateError(f"the decision log of {args.workload!r} holds a record this release cannot show "
                         f"({why}); --json prints it as stored") from exc
    # the notes quote what the workload's pods and Prometheus answered: what a pod chose must not
    # reach the reader's terminal as an escape sequence
    print(escape_controls(text))
    return 0


def scaled_policy_to_start(path: str, command: str, *, nothing: str) -> tuple[Policy, str] | None:
    """The policy and its version for a command that serves the scaler's decisions (``scale``,
    ``keda-scaler``); ``None``, with the reason told, when it is invalid or autoscales nothing."""
    started = load_policy_to_start(path, command)
    if started is None:
        return None
    from extender.scaler.loop import scaled_profiles

    if not scaled_profiles(started[0]):
        report(f"extender {command}: {path} has no profile with an autoscaling section (and a capacity): "
               f"{nothing}")
        return None
    return started
