"""``extender agent``: run the node agent (one per node, as a DaemonSet).

    extender agent --node-name NAME --cache-root DIR [--interval 15s] [--ttl 60s]
                   [--policy FILE] [--hub-cache DIR]... [--cri-socket PATH]
                   [--redis-url URL] [--data-dir DIR] [--prefix PREFIX]
                   [--label-nodes [--kubeconfig F] [--context C]] [--once | --dry-run]

``--node-name`` defaults to ``$NODE_NAME`` (set from ``spec.nodeName`` by the DaemonSet).
``--once`` scans and writes one report, then exits (non-zero if the write failed); ``--dry-run``
prints the report as JSON and touches neither Redis nor the API server. Both exit 1 at once when
the cache root is not a directory: a one-shot report of nothing would read as an empty node. The
loop keeps running in that case (a mount may appear later) and reports the root as unreadable.
SIGTERM and SIGINT end the loop cleanly.

``--hub-cache`` (repeatable) names Hugging Face hub caches on the node that pods fill themselves
(:mod:`extender.agent.hub`); ``--policy`` maps their repositories to profiles and is reloaded when
the file changes. An invalid policy at start is refused (exit 1); without one, hub caches are
skipped with a log line.

``--cri-socket`` names the container runtime's CRI socket: each scan lists the runtime's images
(:mod:`extender.cri.images`, bounded by a 5 s deadline) and reports all their names, so readers
see every image, not only the 50 largest of kubelet's ``status.images``. A runtime that does not
answer gives a report without the list (readers fall back to kubelet's) and one log line per
change of state; it never stops the disk report.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from extender.agent.hub import HubCaches
from extender.agent.loop import Agent, AgentSettings, Labeler
from extender.arguments import (
    FLAG_CHECK,
    Parser,
    add_kube_options,
    add_metrics_bind_option,
    add_store_options,
    directory,
    duration,
    flag_problem,
    inventory_from_args,
    unix_socket,
)
from extender.core.errors import ExtenderError, InvalidValueError
from extender.core.inventory import DEFAULT_TTL_S
from extender.core.reports import check_node_name
from extender.core.units import format_duration
from extender.files import PolicyFile, load_policy_to_start
from extender.process import configure_logging, report, stop_on_signals
from extender.state.sources import SourceStore


def register(subparsers: argparse._SubParsersAction[Parser]) -> None:
    """Add ``agent`` to the ``extender`` command line."""
    p = subparsers.add_parser("agent", help="node agent: scan the node's cache root, report it to the inventory")
    p.add_argument("--node-name", default=None, metavar="NAME", help="this node's name (default: $NODE_NAME)")
    p.add_argument("--cache-root", required=True, type=directory, metavar="DIR", help="the node's cache root")
    p.add_argument("--interval", type=duration, default=15.0, metavar="DURATION",
                   help="time between scans (default: 15s)")
    p.add_argument("--ttl", type=duration, default=DEFAULT_TTL_S, metavar="DURATION",
                   help="how long a report stays valid without a heartbeat "
                   f"(default: {format_duration(DEFAULT_TTL_S)})")
    p.add_argument("--policy", type=Path, metavar="FILE",
                   help="policy mapping hub repositories to profiles (hf:// weights sources); reloaded on change")
    p.add_argument("--hub-cache", dest="hub_caches", action="append", type=directory, default=[], metavar="DIR",
                   help="a Hugging Face hub cache (HF_HUB_CACHE) on the node to scan too; repeatable")
    p.add_argument("--cri-socket", type=unix_socket, metavar="PATH",
                   help="the container runtime's CRI socket (e.g. /run/containerd/containerd.sock): report every "
                   "image it holds, not only kubelet's 50 largest (default: no runtime list)")
    p.add_argument("--label-nodes", action="store_true",
                   help="also label the Node extender.io/<workload>.weights=ready (needs get/patch on nodes)")
    add_kube_options(p, what=" for --label-nodes")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="scan and report once, then exit")
    mode.add_argument("--dry-run", action="store_true", help="print one report as JSON; write nothing")
    add_store_options(p)
    add_metrics_bind_option(p)
    p.set_defaults(handler=run, **{FLAG_CHECK: check_flags})


def check_flags(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """What ``agent`` refuses to start with (exit 2), or ``None``: a node name, from the flag or
    ``$NODE_NAME``, that is a Kubernetes node name (the store refuses a record under any other,
    so an agent started with one could never report)."""
    name = args.node_name or environ.get("NODE_NAME")
    if not name:
        return "give --node-name or set $NODE_NAME"
    try:
        check_node_name(name)
    except InvalidValueError as exc:
        return f"{'--node-name' if args.node_name else '$NODE_NAME'}: {exc}"
    return None


def run(args: argparse.Namespace) -> int:
    if problem := flag_problem(args):
        report(f"extender agent: {problem}")
        return 2
    node = args.node_name or os.environ["NODE_NAME"]
    configure_logging()
    if (args.once or args.dry_run) and not args.cache_root.is_dir():
        what = "is not a directory" if args.cache_root.exists() else "does not exist"
        report(f"extender agent: cache root {args.cache_root} {what}: nothing to scan (mount the node's cache "
               "there, or fix --cache-root)", node=node, cache_root=str(args.cache_root))
        return 1
    settings = AgentSettings(node_name=node, cache_root=args.cache_root, interval_s=args.interval, ttl_s=args.ttl,
                             cri_socket=args.cri_socket)

    def open_reporter() -> SourceStore:
        return SourceStore(inventory_from_args(args))

    labeler: Labeler | None = None
    if args.label_nodes and not args.dry_run:
        from extender.kube.client import KubeClient
        from extender.kube.labels import NodeLabeler

        labeler = NodeLabeler(KubeClient.connect(args.kubeconfig, context=args.context), node)
    hub: HubCaches | None = None
    if args.policy is not None:
        started = load_policy_to_start(args.policy, "agent")
        if started is None:
            return 1
        policy, version = started
        hub = HubCaches(args.hub_caches, policy, PolicyFile(args.policy, version))
    elif args.hub_caches:
        hub = HubCaches(args.hub_caches)
    endpoint = None
    metrics = None
    if args.metrics_bind and not (args.once or args.dry_run):
        from extender.agent.metrics import AgentMetrics
        from extender.telemetry.endpoint import MetricsEndpoint

        registry = agent_registry()
        metrics = AgentMetrics(registry)
        endpoint = MetricsEndpoint(args.metrics_bind, registry, ready=lambda: agent_ready(agent))
    agent = Agent(settings, open_reporter, labeler=labeler, hub=hub, metrics=metrics)
    if args.dry_run:
        scanned = agent.scan()
        print(json.dumps({"node": node, **scanned.model_dump(mode="python", by_alias=True)}, indent=2))
        return 0
    if args.once:
        try:
            agent.write(agent.scan())
        except ExtenderError as exc:
            report(f"extender agent: {exc}", node=node)
            return 1
        return 0
    stop = threading.Event()
    if endpoint is not None:
        endpoint.start()
    try:
        with stop_on_signals(stop):
            agent.run(stop)
    finally:
        if endpoint is not None:
            endpoint.close()
    return 0


def agent_registry() -> Any:
    """A registry with the build info and process metrics of ``extender agent``."""
    from prometheus_client import CollectorRegistry

    from extender.telemetry.build import add_build_info, add_process_collectors

    registry = CollectorRegistry(auto_describe=True)
    add_build_info(registry, "agent")
    add_process_collectors(registry)
    return registry


def agent_ready(agent: Agent) -> tuple[bool, dict[str, Any]]:
    """``/readyz``: ready once a report was written and the last write did not fail.

    A report the store refuses as too large fails too, although the store answered (no outage, no
    backoff): the inventory keeps the node's last accepted report, not what its disk holds now.
    """
    stats = agent.stats
    ok = stats.writes > 0 and not agent.outage and agent.refused is None
    return ok, {"node": agent.settings.node_name, "scans": stats.scans, "writes": stats.writes,
                "failedWrites": stats.failed_writes, "refused": agent.refused}
