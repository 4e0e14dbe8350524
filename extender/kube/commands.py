"""``extender sync``: keep the inventory's cluster view true (one replica, a Deployment).

    extender sync --policy FILE [--kubeconfig F] [--context NAME] [--gpu-resource NAME]
                  [--redis-url URL] [--data-dir DIR] [--prefix PREFIX]

Without ``--kubeconfig`` the in-cluster service account is used when running in a pod, else the
default kubeconfig. SIGTERM and SIGINT stop it cleanly (open watches are closed, threads joined).
An edit of the policy file is taken within a few seconds, without a restart
(:class:`extender.kube.sync.ClusterSync`).
"""

from __future__ import annotations

import argparse
import threading
from typing import Any

from extender.arguments import Parser, add_kube_options, add_metrics_bind_option, add_store_options, inventory_from_args
from extender.files import PolicyFile, read_policy
from extender.kube.client import KubeClient
from extender.kube.objects import DEFAULT_GPU_RESOURCE
from extender.kube.sync import ClusterSync, SyncSettings
from extender.process import configure_logging, stop_on_signals
from extender.state.sources import SourceStore


def register(subparsers: argparse._SubParsersAction[Parser]) -> None:
    """Add ``sync`` to the ``extender`` command line."""
    p = subparsers.add_parser("sync", help="list-watch Nodes and Pods into the inventory")
    p.add_argument("--policy", required=True, metavar="FILE", help="policy file (node classes, workload profiles)")
    add_kube_options(p)
    p.add_argument("--gpu-resource", default=DEFAULT_GPU_RESOURCE, metavar="NAME",
                   help=f"extended resource that counts GPUs ({DEFAULT_GPU_RESOURCE})")
    add_store_options(p)
    add_metrics_bind_option(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    policy, version = read_policy(args.policy)
    configure_logging()
    kube = KubeClient.connect(args.kubeconfig, context=args.context)

    def open_sources() -> SourceStore:
        return SourceStore(inventory_from_args(args))

    endpoint = None
    metrics = None
    if args.metrics_bind:
        from prometheus_client import CollectorRegistry

        from extender.kube.metrics import SyncMetrics
        from extender.telemetry.build import add_build_info, add_process_collectors
        from extender.telemetry.endpoint import MetricsEndpoint

        registry = CollectorRegistry(auto_describe=True)
        add_build_info(registry, "sync")
        add_process_collectors(registry)
        metrics = SyncMetrics(registry, policy)
        endpoint = MetricsEndpoint(args.metrics_bind, registry, ready=lambda: sync_ready(sync))
    sync = ClusterSync(kube, open_sources, policy, SyncSettings(gpu_resource=args.gpu_resource), metrics=metrics,
                       policy_file=PolicyFile(args.policy, version))
    stop = threading.Event()
    try:
        if endpoint is not None:
            endpoint.start()
        with stop_on_signals(stop):
            sync.run(stop)
    finally:
        if endpoint is not None:
            endpoint.close()
        kube.close()
    return 0


def sync_ready(sync: ClusterSync) -> tuple[bool, dict[str, Any]]:
    """``/readyz``: ready once both resources are listed and the store takes writes."""
    listed = sync.nodes.synced.is_set() and sync.pods.synced.is_set()
    ok = listed and not sync.outage
    return ok, {"listed": listed, "storeOutage": sync.outage, "writes": sync.flushes}
