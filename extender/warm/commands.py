"""``extender warm``: the warmer's dry run and status, and the steps its Jobs run on the nodes.

    extender warm plan --policy FILE [--expect WORKLOAD=N[@WITHIN]]... [--kubeconfig F [--context C]]
                       [--now UNIX] [--json] [--redis-url URL | --data-dir DIR]
    extender warm status [--policy FILE | --namespace NS] [--kubeconfig F [--context C]] [--json]
    extender warm prepare --root DIR --cache ID [--evict ID]... [--abandoned-after DURATION]  (inside a warm Job)
    extender warm finish --root DIR --cache ID [--source URI]       (inside a warm Job)
    extender warm publish --key KEY [--redis-url URL | --data-dir DIR]   (a sidecar that uploaded a key)

``plan`` reads the inventory (and, with ``--kubeconfig``, the warm Jobs in flight) and prints what
a tick would do, acting on nothing: no Job, Event, taint or registry write, whatever
``warming.enabled`` says. Expectations are given with ``--expect`` (``llm=2@10m``: two more
replicas of ``llm`` within ten minutes; ``@`` defaults to 10m); keep-warm workloads come from the
policy. ``status`` lists the warm Jobs and where each stands.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from extender.arguments import (
    Parser,
    add_kube_options,
    add_store_options,
    connect_from_args,
    directory,
    duration,
    finite_number,
    inventory_from_args,
    prefix_from_args,
)
from extender.core.cachekey import KEY_PATTERN
from extender.core.caches import NVME_KINDS
from extender.core.errors import ExtenderError, UnitError
from extender.core.policy import WarmRetry
from extender.core.units import format_bytes, format_duration, parse_duration, read_float, read_int
from extender.core.warming import Expectation
from extender.files import load_policy
from extender.process import report as say
from extender.warm.steps import ABANDONED_AFTER_ENV

if TYPE_CHECKING:
    from extender.warm.loop import TickReport

#: ``--expect W=N`` without ``@WITHIN``.
DEFAULT_WITHIN_S = 600.0
#: The most replicas ``--expect`` takes: Kubernetes keeps a replica count in an int32.
MAX_EXPECTED_REPLICAS = 2**31 - 1


def register(subparsers: argparse._SubParsersAction[Parser]) -> None:
    """Add ``warm`` to the ``extender`` command line."""
    warm = subparsers.add_parser("warm", help="cache warmer: dry-run plan, Jobs in flight, steps run by warm Jobs")
    sub = warm.add_subparsers(dest="warm_command", required=True, metavar="ACTION")

    p = sub.add_parser("plan", help="print what the warmer would start now (dry run: acts on nothing)")
    p.add_argument("--policy", required=True, metavar="FILE", help="policy file (warming section, profiles)")
    p.add_argument("--expect", action="append", default=[], type=parse_expectation, metavar="WORKLOAD=N[@WITHIN]",
                   help="the scaler's expectation: N more replicas of WORKLOAD within WITHIN (default 10m)")
    p.add_argument("--kubeconfig", metavar="FILE",
                   help="also read the warm Jobs in flight from this cluster (read-only; default: none read)")
    p.add_argument("--context", metavar="NAME", help="kubeconfig context (default: the current one)")
    p.add_argument("--now", type=finite_number(0), default=None, metavar="UNIX",
                   help="plan as of this time, seconds since the epoch (default: now)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    add_store_options(p)
    p.set_defaults(handler=run_plan)

    s = sub.add_parser("status", help="list the warm Jobs in flight, failed and awaiting the agent")
    where = s.add_mutually_exclusive_group()
    where.add_argument("--policy", metavar="FILE", help="take the namespace and retry timing from the policy")
    where.add_argument("--namespace", default=None, metavar="NS", help="warm Jobs' namespace (extender-warm)")
    add_kube_options(s)
    s.add_argument("--json", action="store_true", help="print the Jobs as JSON")
    s.set_defaults(handler=run_status)

    ids = ", ".join(f"{k.kind}:{'/'.join(p.upper() for p in k.parts)}" for k in NVME_KINDS)
    pre = sub.add_parser("prepare", help="(inside a warm Job) evict, then create or resume the staging directory")
    pre.add_argument("--root", required=True, type=directory, metavar="DIR", help="the node's cache root")
    pre.add_argument("--cache", required=True, metavar="ID",
                     help=f"the cache entry to prepare ({ids})")
    pre.add_argument("--evict", action="append", default=[], metavar="ID",
                     help="a cache to delete first to make room (repeatable)")
    pre.add_argument("--abandoned-after", type=abandoned_after,
                     default=_abandoned_after_from_env(), metavar="DURATION",
                     help="delete other staging directories untouched for longer than this (activeDeadline + "
                          "retry.max, as 1h30m or bare seconds, 5400: no Job can still write or resume them); "
                          f"default: ${ABANDONED_AFTER_ENV}, "
                          "which the warm Job sets, else keep them")
    pre.set_defaults(handler=run_prepare)

    fin = sub.add_parser("finish", help="(inside a warm Job) seal the staging directory and move it into place")
    fin.add_argument("--root", required=True, type=directory, metavar="DIR", help="the node's cache root")
    fin.add_argument("--cache", required=True, metavar="ID", help="the cache whose staging directory to seal")
    fin.add_argument("--source", default="", metavar="URI", help="recorded in the weights manifest")
    fin.set_defaults(handler=run_finish)

    pub = sub.add_parser("publish", help="record a compile-cache key as fetchable (after uploading it yourself)")
    pub.add_argument("--key", required=True, type=compile_key, metavar="KEY",
                     help="the compile-cache key (extender cachekey)")
    add_store_options(pub)
    pub.set_defaults(handler=run_publish)


def parse_expectation(text: str) -> Expectation:
    """``llm=2@10m`` -> Expectation(llm, 2, 600 s). Every refusal is one line naming the part at fault."""
    workload, eq, rest = text.partition("=")
    count, at, within = rest.partition("@")
    if not eq or not workload:
        raise argparse.ArgumentTypeError(f"{text!r}: expected WORKLOAD=N[@WITHIN]")
    try:
        replicas = read_int(count)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: {count!r} is not a whole number of replicas") from None
    if not 0 <= replicas <= MAX_EXPECTED_REPLICAS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: replicas must be between 0 and {MAX_EXPECTED_REPLICAS} (a workload's replica count "
            "is a 32-bit number in Kubernetes)")
    try:
        within_s = parse_duration(within) if at else DEFAULT_WITHIN_S
    except UnitError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from exc
    return Expectation(workload=workload, replicas=replicas, within_s=within_s)


def abandoned_after(text: str) -> float:
    """``--abandoned-after``: a duration > 0 in the policy's units (``1h``, ``90m``), or bare seconds as the
    warm Job writes them (``5400``, and ``1e+06`` from ``{:g}`` for a long one: a helper of this
    release must read what a warmer of any release sets)."""
    try:
        seconds = read_float(text)
    except ValueError:
        return duration(text)
    if not (math.isfinite(seconds) and seconds > 0):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite duration longer than zero")
    return seconds


@dataclass(frozen=True)
class _BadEnvironment:
    """A variable standing in for a flag whose value the flag would refuse (told when the command runs)."""

    problem: str


def _abandoned_after_from_env() -> float | _BadEnvironment | None:
    """``--abandoned-after``'s default: ``$WARM_ABANDONED_AFTER`` read as the flag would be; unset or
    empty: ``None``. Parsed here, not by argparse, whose error would blame a flag nobody gave."""
    text = os.environ.get(ABANDONED_AFTER_ENV, "").strip()
    if not text:
        return None
    try:
        return abandoned_after(text)
    except argparse.ArgumentTypeError as exc:
        return _BadEnvironment(f"${ABANDONED_AFTER_ENV} (used as --abandoned-after is not given): {exc}")


def compile_key(text: str) -> str:
    """``--key``: a compile-cache key as ``extender cachekey`` prints it (an unset ``$KEY`` in a sidecar's
    command was recorded as the empty key, exit 0)."""
    if not KEY_PATTERN.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a compile-cache key (ck1- and 32 hex digits, "
                                         "as extender cachekey prints it)")
    return text


# ---- plan ------------------------------------------------------------------------------------------


def run_plan(args: argparse.Namespace) -> int:
    from extender.state.observations import CalibratedPolicy, ObservationStore
    from extender.warm.loop import WarmLoop

    policy = load_policy(args.policy)
    now = args.now if args.now is not None else time.time()
    client = connect_from_args(args)
    kube = None
    try:
        if args.kubeconfig:
            from extender.kube.client import KubeClient

            kube = KubeClient.connect(args.kubeconfig, context=args.context)
        # as the scaler's warmer plans: with the calibration in effect, its per-node factors included
        calibrated = CalibratedPolicy(ObservationStore(client, prefix=prefix_from_args(args)))
        policy, nodes = calibrated.calibration_for(policy)
        loop = WarmLoop(policy, inventory_from_args(args, client), kube, instance="dry-run", starts_jobs=False,
                        nodes=nodes)
        report = loop.tick(now, args.expect, dry_run=True)
    finally:
        client.close()
        if kube is not None:
            kube.close()
    if report.errors:
        for e in report.errors:
            say(f"extender warm plan: {e}")
        return 1
    if args.json:
        print(json.dumps(plan_json(report), indent=2))
    else:
        print_plan(report)
    return 0


def plan_json(report: TickReport) -> dict[str, Any]:
    """The dry run as JSON: the plan's own fields (snake_case, as the planner names them), what would start, why not."""
    assert report.plan is not None
    return {
        "now": report.now,
        "enabled": report.enabled,
        "plan": report.plan.model_dump(mode="json"),
        "would_start": report.would_start,
        "not_started": [{"node": s.action.node, "cache": s.action.cache, "reason": s.reason} for s in report.skipped],
        "in_flight": [{"job": j.name, "node": j.node, "cache": j.cache, "state": j.state} for j in report.jobs],
        "notes": report.notes,
    }


def print_plan(report: TickReport) -> None:
    plan = report.plan
    assert plan is not None
    state = "enabled" if report.enabled else "disabled (warming.enabled is false)"
    print(f"warming {state}; dry run: nothing is started")
    for o in plan.outlooks:
        if o.placeable == 0:
            print(f"  {o.workload}: {o.replicas} replica(s) within {format_duration(o.within_s)}: no free GPUs to warm")
            continue
        print(f"  {o.workload}: {o.replicas} replica(s) within {format_duration(o.within_s)}: mean startup "
              f"{o.before_s:.1f}s -> {o.after_s:.1f}s on {', '.join(o.nodes)}")
    if report.jobs:
        print(f"in flight: {len(report.jobs)} warm job(s) (extender warm status)")
    print(f"actions: {len(plan.actions)}")
    if plan.actions:
        rows = [("NODE", "WORKLOAD", "KIND", "PURPOSE", "BYTES", "TAKES", "SAVES", "EVICTS")]
        rows += [(a.node, a.workload, a.kind, a.purpose, format_bytes(a.bytes), f"{a.duration_s:.0f}s",
                  f"{a.saved_s:.1f}s", ", ".join(e.cache for e in a.evictions) or "-") for a in plan.actions]
        _table(rows)
    if plan.skipped:
        print("ruled out by a limit:")
        for s in plan.skipped:
            print(f"  {s.node} {s.workload} {s.kind} ({s.purpose}): {s.reason}, would save {s.saved_s:.1f}s")
    if plan.cluster_full:
        print("  (maxConcurrent reached with valuable actions left)")
    for n in report.skipped:
        print(f"not started: {n.action.cache} on {n.action.node}: {n.reason}")
    for note in report.notes:
        print(f"note: {note}")


def _table(rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


# ---- status ----------------------------------------------------------------------------------------


def run_status(args: argparse.Namespace) -> int:
    from extender.kube.client import KubeClient
    from extender.warm.executor import Executor, retry_delay

    retry = WarmRetry()
    namespace = args.namespace or "extender-warm"
    confirm_within = 300.0
    if args.policy:
        policy = load_policy(args.policy)
        namespace, retry, confirm_within = (policy.warming.namespace, policy.warming.retry,
                                            policy.warming.confirm_within)
    kube = KubeClient.connect(args.kubeconfig, context=args.context)
    try:
        views = Executor(kube, namespace).jobs()
    finally:
        kube.close()
    now = time.time()
    rows: list[dict[str, Any]] = []
    for v in sorted(views, key=lambda v: (v.node, v.name)):
        detail = ""
        if v.state == "active":
            state = "running"
        elif v.state == "succeeded":
            state = "succeeded"
            waited = now - (v.finished_at or now)
            detail = f"awaiting the agent ({format_duration(max(0.0, waited))} of {format_duration(confirm_within)})"
        else:
            state = "failed"
            retry_at = (v.finished_at or now) + retry_delay(retry, v.attempt)
            detail = f"{v.reason or 'Failed'}; retry in {format_duration(max(0.0, retry_at - now))}"
        rows.append({"job": v.name, "node": v.node, "workload": v.action.workload if v.action else
                     (v.publish.workload if v.publish else ""), "kind": v.kind, "cache": v.cache,
                     "state": state, "attempt": v.attempt, "detail": detail})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no warm jobs in namespace {namespace}")
        return 0
    table = [("JOB", "NODE", "WORKLOAD", "KIND", "STATE", "ATTEMPT", "DETAIL")]
    table += [(r["job"], r["node"], r["workload"], r["kind"], r["state"], str(r["attempt"]), r["detail"])
              for r in rows]
    _table(table)
    return 0


# ---- steps inside warm Jobs ------------------------------------------------------------------------


def run_prepare(args: argparse.Namespace) -> int:
    from extender.warm.steps import prepare

    if isinstance(args.abandoned_after, _BadEnvironment):
        say(f"extender warm prepare: {args.abandoned_after.problem}", cache=args.cache)
        return 2
    try:
        staging = prepare(args.root, args.cache, args.evict, abandoned_after=args.abandoned_after)
    except (OSError, ExtenderError) as exc:
        say(f"extender warm prepare: {_step_failure(exc, args)}", cache=args.cache)
        return 1
    print(staging)
    return 0


def run_finish(args: argparse.Namespace) -> int:
    from extender.warm.steps import finish

    try:
        dest = finish(args.root, args.cache, source=args.source)
    except (OSError, ExtenderError) as exc:
        say(f"extender warm finish: {_step_failure(exc, args)}", cache=args.cache)
        return 1
    print(dest)
    return 0


def _step_failure(exc: OSError | ExtenderError, args: argparse.Namespace) -> str:
    """One line for a node step that failed: an operating-system error says which entry and root it
    hit, and the file when it names one (``No space left on device`` alone says neither)."""
    if not isinstance(exc, OSError):
        return str(exc)
    where = f" ({exc.filename})" if exc.filename is not None else ""
    return f"{args.cache} under {args.root}: {exc.strerror or exc}{where}"


def run_publish(args: argparse.Namespace) -> int:
    """Add a key to the registry set, bumping the inventory version so every reader notices."""

    client = connect_from_args(args)
    try:
        version = inventory_from_args(args, client).add_registry(args.key)
    finally:
        client.close()
    print(f"{args.key}: in the compile registry (inventory version {version})")
    return 0
