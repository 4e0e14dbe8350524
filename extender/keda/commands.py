"""``extender keda-scaler --policy FILE``: serve the scaler's decisions to KEDA over gRPC.

Wire into the CLI with :func:`register`. The process only reads: the decisions come from Redis,
where ``extender scale`` (any mode with the loop, e.g. ``--no-metrics-api``) publishes them. TLS
is the default expectation: ``--tls-cert``/``--tls-key`` (plus ``--tls-client-ca`` for mutual TLS), or
``--plaintext`` said out loud.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from extender.arguments import (
    FLAG_CHECK,
    add_metrics_bind_option,
    add_store_options,
    add_tls_options,
    bind_address,
    connect_from_args,
    duration,
    flag_problem,
    prefix_from_args,
    tls_problem,
)
from extender.scaler.commands import scaled_policy_to_start

#: Where the server listens unless told (docs/scaler.md, "KEDA or the External Metrics API").
DEFAULT_LISTEN = "0.0.0.0:9090"


def register(subparsers: Any) -> None:
    """Add ``keda-scaler`` to an ``add_subparsers()`` object."""
    cmd = subparsers.add_parser(
        "keda-scaler", help="serve the predictive scaler's desired replicas to KEDA (external scaler gRPC)",
        description="KEDA's external scaler (externalscaler.proto) over the decisions 'extender scale' "
                    "publishes in Redis: a ScaledObject trigger with metadata 'workload: <profile>' scales on them.",
    )
    cmd.add_argument("--policy", required=True, metavar="FILE", help="policy file (the autoscaled profiles)")
    cmd.add_argument("--listen", default=DEFAULT_LISTEN, type=bind_address, metavar="HOST:PORT",
                     help=f"gRPC listen address (default: {DEFAULT_LISTEN})")
    cmd.add_argument("--watch-interval", default=1.0, type=duration, metavar="DURATION",
                     help="how often StreamIsActive streams look for a changed decision (default: 1s)")
    cmd.add_argument("--grace", default=5.0, type=duration, metavar="DURATION",
                     help="time calls in flight get to finish on SIGTERM (default: 5s)")
    cmd.add_argument("--health-listen", type=bind_address, metavar="HOST:PORT",
                     help="also serve the gRPC health service alone, in plaintext, here (kubelet's grpc "
                          "probe speaks no TLS); default: health only on --listen")
    add_store_options(cmd)
    add_metrics_bind_option(cmd)
    tls = cmd.add_argument_group("TLS")
    add_tls_options(tls, client_ca_old=("--client-ca",),
                    client_ca_help="CA bundle (PEM): client certificates are required and verified against it "
                                   "(mutual TLS)")
    tls.add_argument("--plaintext", action="store_true", help="serve without TLS (no --tls-cert)")
    cmd.set_defaults(handler=_keda_scaler, **{FLAG_CHECK: check_flags})


def check_flags(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """What ``keda-scaler`` refuses to start with (exit 2), or ``None``: the ``--tls-*`` family
    (:func:`~extender.arguments.tls_problem`), and TLS or ``--plaintext``, one of them, said out loud."""
    if problem := tls_problem(args):
        return problem
    if args.plaintext and args.tls_cert:
        return "--plaintext and --tls-cert exclude each other"
    if not args.plaintext and not args.tls_cert:
        return ("give --tls-cert and --tls-key (and --tls-client-ca for mutual TLS), or --plaintext to serve "
                "without TLS")
    if args.health_listen is not None and args.health_listen == args.listen:
        return "--health-listen must differ from --listen (it is a second, plaintext listener)"
    if args.metrics_bind is not None and args.metrics_bind in (args.listen, args.health_listen):
        return "--metrics-bind must differ from --listen and --health-listen (each is a listener of its own)"
    return None


def _usage(message: str) -> int:
    print(f"extender keda-scaler: {message}", file=sys.stderr)
    return 2


def _keda_scaler(args: argparse.Namespace) -> int:
    if problem := flag_problem(args):
        return _usage(problem)
    started = scaled_policy_to_start(args.policy, "keda-scaler", nothing="nothing to serve")
    if started is None:
        return 1
    policy, version = started

    from extender.keda.server import KedaSettings, TlsFiles, run
    from extender.state.decisions import DecisionStore

    tls = None
    if args.tls_cert:
        client_ca = Path(args.tls_client_ca) if args.tls_client_ca else None
        tls = TlsFiles(Path(args.tls_cert), Path(args.tls_key), client_ca)
        tls.read()  # a missing or empty file is one line now, not a failure at the first handshake
    settings = KedaSettings(policy=policy, listen=args.listen, tls=tls, watch_interval_s=args.watch_interval,
                            grace_s=args.grace, health_listen=args.health_listen, policy_path=Path(args.policy),
                            policy_version=version, metrics_bind=args.metrics_bind)
    store = DecisionStore(connect_from_args(args), prefix=prefix_from_args(args))
    run(settings, store)
    return 0
