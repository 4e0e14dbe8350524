"""``extender serve`` and ``extender explain``.

``serve`` checks the policy first and refuses to start on an invalid one (every problem printed,
exit 1); after that it hands over to gunicorn (:mod:`extender.api.launcher`). ``explain`` reads
the live inventory once and prints, per node, the phase breakdown, the score and the filter verdict.

Wire into the CLI with :func:`register`::

    from extender.api.scheduler import commands as server_commands
    server_commands.register(sub)   # sub = parser.add_subparsers(...)

Handlers return an exit code and raise :class:`~extender.core.errors.DocumentError` /
:class:`~extender.core.errors.ExtenderError` for the CLI's usual reporting.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from extender.arguments import (
    FLAG_CHECK,
    MAX_THREADS,
    MAX_WORKERS,
    add_store_options,
    add_tls_options,
    bind_address,
    comma_list,
    data_dir_from_args,
    duration,
    flag_problem,
    inventory_from_args,
    prefix_from_args,
    redis_url_from_args,
    size,
    threads,
    tls_problem,
    workers,
)
from extender.core.document import compose
from extender.core.errors import DocumentError, Problem
from extender.files import load_policy, load_policy_to_start, read_text
from extender.process import report

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    """Add ``serve`` and ``explain`` to an ``add_subparsers()`` object."""
    serve = subparsers.add_parser(
        "serve", help="run the scheduler extender (filter/prioritize for kube-scheduler) under gunicorn"
    )
    serve.add_argument("--policy", required=True, metavar="FILE", help="policy file (reloaded when it changes)")
    serve.add_argument("--bind", default="127.0.0.1:8888", type=bind_address, metavar="HOST:PORT",
                       help="listen address (default: 127.0.0.1:8888, the scheduler on the same host; elsewhere "
                            "give --tls-client-ca too)")
    serve.add_argument("--workers", default=2, type=workers, metavar="N",
                       help=f"worker processes, 1 to {MAX_WORKERS} (default: 2); each holds its own copy of the "
                            "inventory and polls Redis, and kube-scheduler asks about one pod at a time")
    serve.add_argument("--threads", default=4, type=threads, metavar="N",
                       help=f"threads per worker that run requests, 1 to {MAX_THREADS} (default: 4); each holds a "
                            "whole request body, and a worker runs one thread's Python at a time")
    serve.add_argument("--worker-model", choices=("asgi", "gthread"), default="asgi",
                       help="asgi (default): an event loop reads each request whole, so slow clients hold no "
                            "thread; gthread: a thread pool reads requests itself")
    add_store_options(serve)
    tls = serve.add_argument_group("TLS (kube-scheduler: enableHTTPS, tlsConfig)")
    add_tls_options(tls, client_ca_help="require client certificates signed by this CA (mutual TLS)")
    knobs = serve.add_argument_group("fail-open bounds")
    knobs.add_argument("--max-snapshot-age", type=duration, default=15.0, metavar="DURATION",
                       help="answer neutrally when the inventory snapshot is older (default: 15s)")
    knobs.add_argument("--request-budget", type=duration, default=0.5, metavar="DURATION",
                       help="answer neutrally when one request takes longer (default: 500ms)")
    knobs.add_argument("--poll-interval", type=duration, default=0.5, metavar="DURATION",
                       help="how often each worker checks the store version (default: 500ms)")
    knobs.add_argument("--min-rebuild-interval", type=duration, default=2.0, metavar="DURATION",
                       help="rebuild the snapshot at most this often while the store keeps changing (default: 2s)")
    knobs.add_argument("--max-body", type=size, default=64 * 2**20, metavar="SIZE",
                       help="largest request body; larger ones get HTTP 413 (default: 64MiB)")
    serve.add_argument("--access-log", action="store_true", help="log every request (off: it costs latency)")
    serve.add_argument("--metrics-bind", type=bind_address, default=None, metavar="HOST:PORT",
                       help="also serve /metrics (every worker's, aggregated) over plain HTTP here, from the "
                            "gunicorn master: for Prometheus when --bind is loopback (default: only on --bind)")
    serve.set_defaults(handler=_serve, **{FLAG_CHECK: check_serve_flags})

    explain = subparsers.add_parser(
        "explain", help="per node: startup phases, score and filter verdict for a pod, from the live inventory"
    )
    explain.add_argument("--policy", required=True, metavar="FILE", help="policy file")
    explain.add_argument("--pod", required=True, metavar="POD.json",
                         help="a Pod (JSON or YAML), e.g. kubectl get pod -o json")
    explain.add_argument("--nodes", metavar="a,b,c", type=_node_names,
                         help="only these nodes (default: every node in the inventory)")
    explain.add_argument("--json", action="store_true", help="print the report as JSON (same as GET /explain)")
    add_store_options(explain)
    explain.set_defaults(handler=_explain)


def check_serve_flags(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """What ``serve`` refuses to start with (exit 2), or ``None``: the ``--tls-*`` family."""
    return tls_problem(args)


def exposure_warning(bind: str, client_ca: str | None) -> str | None:
    """What ``serve`` warns about at start, or ``None``: a listener beyond loopback without mutual TLS.

    The scheduler sends no credentials (docs/kubernetes-interfaces.md 2.1), so the extender trusts
    whoever connects: anyone who reaches such an address can call ``/explain`` (every node's cache
    contents and the policy's profiles), and keep the workers busy with 64 MiB bodies, which the
    scheduler's own calls then wait behind (they fail open: scheduling goes on without the extender).
    """
    host = bind.rpartition(":")[0].strip("[]")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        loopback = False
    if loopback or client_ca:
        return None
    return (f"listening on {bind} without --tls-client-ca: anyone who reaches it can call /filter, /prioritize "
            "and /explain (which shows the inventory and the policy); bind 127.0.0.1 beside the scheduler, or "
            "require the scheduler's client certificate")


def _serve(args: argparse.Namespace) -> int:
    if problem := flag_problem(args):
        report(f"extender serve: {problem}")
        return 2
    if warning := exposure_warning(args.bind, args.tls_client_ca):
        log.warning("extender serve: %s", warning, extra={"bind": args.bind})
    started = load_policy_to_start(args.policy, "serve")
    if started is None:
        return 1
    policy, version = started
    url, data_dir = redis_url_from_args(args), Path(data_dir_from_args(args))

    from extender.api.launcher import ServeOptions, prepare_metrics_dir, run

    prepare_metrics_dir()  # before anything imports prometheus_client
    from extender.api.scheduler.app import create_app
    from extender.api.scheduler.settings import Settings

    settings = Settings(
        # absolute, not resolved: with a ConfigMap volume the path is a symlink chain through
        # ..data that kubelet swaps on every update; resolving it once pinned the first version
        policy_path=Path(args.policy).absolute(),
        policy=policy,
        policy_version=version,
        redis_url=url,
        data_dir=data_dir.resolve(),
        key_prefix=prefix_from_args(args),
        poll_interval_s=args.poll_interval,
        min_rebuild_interval_s=args.min_rebuild_interval,
        max_snapshot_age_s=args.max_snapshot_age,
        startup_grace_s=args.max_snapshot_age,
        request_budget_s=args.request_budget,
        max_body_bytes=args.max_body,
    )
    options = ServeOptions(
        bind=args.bind,
        workers=args.workers,
        threads=args.threads,
        tls_cert=Path(args.tls_cert) if args.tls_cert else None,
        tls_key=Path(args.tls_key) if args.tls_key else None,
        tls_client_ca=Path(args.tls_client_ca) if args.tls_client_ca else None,
        access_log=args.access_log,
        worker_model=args.worker_model,
    )
    if args.metrics_bind:
        from extender.api.scheduler.metrics import aggregated_registry
        from extender.telemetry.endpoint import MetricsEndpoint

        # in the master: started before gunicorn forks, so its thread runs there only
        MetricsEndpoint(args.metrics_bind, aggregated_registry()).start()
    if args.worker_model == "asgi":
        from extender.api.asgi import whole_requests

        run(lambda: whole_requests(create_app(settings), settings.max_body_bytes, args.threads), options)
    else:
        run(lambda: create_app(settings), options)
    return 0


def _node_names(text: str) -> list[str]:
    """``--nodes``: comma-separated node names; one that names none is a usage error."""
    if names := comma_list(text):
        return names
    raise argparse.ArgumentTypeError(f"{text!r} names no node")


def _read_pod(path: str) -> dict[str, Any]:
    data, _ = compose(read_text(path), path)  # JSON is YAML; errors one line each, at their line
    if not isinstance(data, dict):
        raise DocumentError([Problem(path, 1, "", "a Pod must be an object with metadata and spec")])
    if str(data.get("kind", "Pod")) != "Pod":
        raise DocumentError([Problem(path, 1, "kind", f"expected a Pod, got {data.get('kind')!r}")])
    return data


def _explain(args: argparse.Namespace) -> int:
    from extender.api.scheduler.engine import Engine, explain_report
    from extender.api.scheduler.wire import NodeInfo, PodInfo
    from extender.core.inventory import InventorySnapshot
    from extender.state.observations import CalibratedPolicy, ObservationStore

    policy = load_policy(args.policy)
    pod = PodInfo.from_object(_read_pod(args.pod))
    now = time.time()
    store = inventory_from_args(args)
    version, records, registry = store.load_all()
    # as `serve` estimates: with the calibration in effect
    policy, factors = CalibratedPolicy(ObservationStore(store.client, prefix=store.keys.prefix)).calibration_for(policy)
    engine = Engine(policy, InventorySnapshot.build(policy, records, version=version, taken_at=now, registry=registry),
                    nodes=factors)
    nodes = [NodeInfo(n, {}, ()) for n in args.nodes] if args.nodes is not None else None
    report = explain_report(engine, pod, nodes, now)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    return 0


def print_report(report: dict[str, Any]) -> None:
    """The explain report as a table a person reads in a terminal."""
    print(f"pod {report['pod']}: profile {report['profile'] or '(none)'}; policy {report['policy'] or '(unnamed)'}; "
          f"inventory version {report['snapshot']['version']} ({report['snapshot']['nodes']} nodes)")
    if report["profile"] is None:
        print(report["note"])
        return
    scale = report["scale"]
    print(f"score = clamp(round(({scale['referenceSeconds']:.1f} s - estimate) / {scale['secondsPerPoint']:.1f} s), "
          f"0, 10), minus the NVMe-pressure penalty")
    if not report["nodes"]:
        print("no nodes to explain (the inventory is empty; pass --nodes to see unknown nodes as cold)")
        return
    phases = ["queue_s", "image_s", "weights_s", "compile_s", "graph_s", "init_s", "restore_s"]
    width = max(12, *(len(n["node"]) for n in report["nodes"]))
    head = f"{'node':<{width}} {'class':<14} {'state':<7}" + "".join(f"{p.removesuffix('_s'):>8}" for p in phases)
    print(head + f"{'total':>9} {'score':>5}  verdict")
    for n in report["nodes"]:
        state = "fresh" if n["fresh"] else ("stale" if n["known"] else "unknown")
        row = f"{n['node']:<{width}} {n['class']:<14} {state:<7}" + "".join(f"{n['phases'][p]:>8.1f}" for p in phases)
        mark = "*" if n["nvmePressure"] else " "
        print(row + f"{n['totalSeconds']:>9.1f} {n['score']:>4}{mark}  {n['verdict']}")
        if n["reason"]:
            print(f"{'':<{width}}   reason: {n['reason']}")
        if n["note"]:
            print(f"{'':<{width}}   note: {n['note']}")
        if n.get("nodeFactor", 1.0) != 1.0:
            print(f"{'':<{width}}   node factor: {n['nodeFactor']:.2f} (per-node calibration: its starts against its "
                  "peers'; in the phases above)")
    if any(n["nvmePressure"] for n in report["nodes"]):
        print("* NVMe pressure: free NVMe cannot hold the missing weights; penalty applied")
