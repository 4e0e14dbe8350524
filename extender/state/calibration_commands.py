"""``extender calibrate show`` and ``extender estimate --calibrated``: the observed starts and the fits.

    extender calibrate show --policy FILE [--workload W] [--node-class C] [--limit N] [--json]
    extender estimate --policy FILE --calibrated [--workload W] [--node-class C] [--json]

``calibrate show`` lists the stored observations (newest first: when, pod, node, what the node held,
seconds to Ready, the policy's estimate and its error), the starts not recorded and why, and each
(workload, node class) fit. ``estimate --calibrated`` shows, per pair, every parameter's policy value
beside the fitted one with its confidence, and the named cache states estimated both ways. Both
read the observations from the store (``--redis-url`` / ``--data-dir``) and fit with the policy
given, whatever its ``calibration.mode``; the mode only decides whether the components apply it.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from extender.arguments import Parser, add_store_options, connect_from_args, prefix_from_args, whole_number
from extender.core.calibration import (
    BANDWIDTH_PARAMETERS,
    NODE_SHOWN,
    PARAMETERS,
    CalibrationResult,
    Fit,
    NodeFactor,
    NodeFactors,
    Observation,
    PolicyValues,
    apply_calibration,
    calibrate,
    estimate_errors,
)
from extender.core.estimate import breakdown, estimate_pairs
from extender.core.policy import Policy
from extender.files import load_policy
from extender.state.observations import ObservationStore, Stored, observations_of


def _read(args: argparse.Namespace) -> Stored:
    client = connect_from_args(args)
    try:
        return ObservationStore(client, prefix=prefix_from_args(args)).read()
    finally:
        client.close()


def _value(j: int, value: float) -> str:
    """Bandwidths in bytes per second with three significant digits (``5.74GB/s``), seconds with one decimal."""
    if j not in BANDWIDTH_PARAMETERS:
        return f"{value:.1f}s"
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if value >= size:
            return f"{value / size:.3g}{unit}"
    return f"{value:.3g}B/s"


def fit_rows(policy: Policy, fit: Fit) -> list[dict[str, Any]]:
    """Each parameter of a fit: policy value, fitted value (bytes/s or seconds), factor, confidence, bounds."""
    base = PolicyValues.of(policy.profile(fit.workload), policy.node_class(fit.node_class))
    fitted = base.scaled(fit.factors)
    return [{"parameter": name, "unit": "B/s" if j in BANDWIDTH_PARAMETERS else "s",
             "policy": base.value(j), "fitted": fitted.value(j), "factor": fit.factors[j],
             "confidence": fit.confidence[j], "bounds": [fit.lower[j], fit.upper[j]]}
            for j, name in enumerate(PARAMETERS)]


def fit_summary(policy: Policy, fit: Fit) -> dict[str, Any]:
    """A fit as JSON: observations, errors before and after, parameters, named states both ways."""
    calibrated = apply_calibration(policy, [replace(fit, applied=True)])  # shown whatever the mode
    states_policy = breakdown(policy.profile(fit.workload), policy.node_class(fit.node_class))
    states_fit = breakdown(calibrated.profile(fit.workload), calibrated.node_class(fit.node_class))
    return {
        "workload": fit.workload, "nodeClass": fit.node_class, "observations": fit.observations,
        "applied": fit.applied and policy.calibration.mode == "apply", "enough": fit.applied,
        "medianErrorPolicy": fit.error_policy, "medianErrorFit": fit.error_fit, "spread": fit.spread,
        "parameters": fit_rows(policy, fit),
        "states": {k: {"policy": round(states_policy[k]["total_s"], 3),
                       "calibrated": round(states_fit[k]["total_s"], 3)} for k in states_policy},
    }


def _percent(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.1f}%"


def render_fit(policy: Policy, fit: Fit) -> str:
    """The parameter table and the named states of one fit, for people."""
    s = fit_summary(policy, fit)
    verdict = ("applied" if s["applied"] else
               f"not applied: mode {policy.calibration.mode}" if s["enough"] else
               f"not applied: fewer than {policy.calibration.min_observations} observations")
    lines = [f"{fit.workload} on {fit.node_class}: {fit.observations} observation(s), median error "
             f"{_percent(fit.error_policy)} with the policy, {_percent(fit.error_fit)} calibrated ({verdict})",
             f"  {'parameter':<16}{'policy':>12}{'fitted':>12}{'factor':>9}{'confidence':>12}{'bounds':>14}"]
    for j, row in enumerate(s["parameters"]):
        lo, hi = row["bounds"]
        lines.append(f"  {row['parameter']:<16}{_value(j, row['policy']):>12}{_value(j, row['fitted']):>12}"
                     f"{row['factor']:>9.2f}{row['confidence']:>12.2f}{f'{lo:.3g}-{hi:.3g}':>14}")
    lines.append(f"  {'state':<16}{'policy s':>12}{'calibrated s':>14}")
    for state, row in s["states"].items():
        lines.append(f"  {state:<16}{row['policy']:>12.1f}{row['calibrated']:>14.1f}")
    return "\n".join(lines)


def _result(policy: Policy, stored: Stored, now: float) -> CalibrationResult:
    return calibrate(policy, stored.observations, now=now)


def estimate_calibrated(args: argparse.Namespace) -> int:
    """``extender estimate --calibrated``."""
    policy = load_policy(args.policy)
    pairs = estimate_pairs(policy, args.workload, args.node_class)
    result = _result(policy, _read(args), time.time())
    out: dict[str, dict[str, Any]] = {}
    for workload, cls in pairs:
        fit = result.fits.get((workload, cls))
        out.setdefault(workload, {})[cls] = fit_summary(policy, fit) if fit is not None else None
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for workload, cls in pairs:
        fit = result.fits.get((workload, cls))
        print(render_fit(policy, fit) if fit is not None
              else f"{workload} on {cls}: no observations; the policy's values stand")
        print()
    return 0


def _words(o: Observation) -> str:
    parts = [w for w, on in (("image", o.image), ("snapshot", o.snapshot)) if on]
    if o.weights_bytes > 0:
        parts.append("weights")
    if o.compile != "absent":
        parts.append(f"compile:{o.compile}")
    return "+".join(parts) or "cold"


def show(args: argparse.Namespace) -> int:
    """``extender calibrate show``."""
    policy = load_policy(args.policy)
    now = time.time()
    stored = _read(args)
    pairs = estimate_pairs(policy, args.workload, args.node_class)
    chosen = observations_of(stored, {w for w, _ in pairs}, {c for _, c in pairs})[: args.limit]
    errors = {id(o): e for o, e in zip(chosen, _errors(policy, chosen), strict=True)}
    result = _result(policy, stored, now)
    fits = [result.fits[p] for p in pairs if p in result.fits]
    if args.json:
        print(json.dumps({
            "mode": policy.calibration.mode, "version": stored.version,
            "observations": [{**o.model_dump(mode="json", by_alias=True), "totalSeconds": o.total_s,
                              "policyEstimate": errors[id(o)]} for o in chosen],
            "discarded": dict(stored.discarded), "skipped": dict(result.skipped), "unreadable": stored.unreadable,
            "fits": [fit_summary(policy, f) for f in fits],
            "nodes": [node_summary(f) for f in result.nodes.differing(NODE_SHOWN)],
        }, indent=2))
        return 0
    print(f"calibration mode: {policy.calibration.mode}; {len(stored.observations)} observation(s) stored"
          f" (version {stored.version})")
    if stored.discarded:
        print("starts not recorded: " + ", ".join(f"{k} {v}" for k, v in sorted(stored.discarded.items())))
    if result.skipped:
        print("observations not used: " + ", ".join(f"{k} {v}" for k, v in sorted(result.skipped.items())))
    if chosen:
        print(f"\n  {'ready at (UTC)':<21}{'pod':<34}{'node':<18}{'class':<14}{'found':<26}{'seconds':>9}"
              f"{'policy s':>10}{'error':>8}")
        for o in chosen:
            estimate = errors[id(o)]
            ready = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(o.ready_at))
            est = "-" if estimate is None else f"{estimate:.1f}"
            err = "-" if estimate is None or o.total_s <= 0 else _percent((estimate - o.total_s) / o.total_s)
            print(f"  {ready:<21}{o.pod[:33]:<34}{o.node[:17]:<18}{o.node_class[:13]:<14}{_words(o)[:25]:<26}"
                  f"{o.total_s:>9.1f}{est:>10}{err:>8}")
    for fit in fits:
        print()
        print(render_fit(policy, fit))
    if result.nodes.nodes:
        print()
        print(render_nodes(result.nodes, policy.calibration.mode))
    return 0


def node_summary(f: NodeFactor) -> dict[str, Any]:
    """One node's factor as ``calibrate show --json`` lists it."""
    return {"node": f.node, "factor": round(f.factor, 4), "starts": f.starts, "confidence": round(f.confidence, 4),
            "bounds": [f.lower, f.upper]}


def render_nodes(nodes: NodeFactors, mode: str) -> str:
    """The nodes whose starts differ from their peers' by more than :data:`NODE_SHOWN`, as a table."""
    far = nodes.differing(NODE_SHOWN)
    use = "applied" if mode == "apply" else f"not applied: mode {mode}"
    if not far:
        return (f"nodes: none of the {len(nodes.nodes)} node(s) with starts is estimated more than "
                f"{NODE_SHOWN:.0%} off its class ({use})")
    lines = [f"nodes estimated more than {NODE_SHOWN:.0%} off their class, from their starts against their peers' "
             f"({use}):", f"  {'node':<30}{'factor':>8}{'starts':>8}{'confidence':>12}{'bounds':>14}"]
    for f in far:
        lines.append(f"  {f.node[:29]:<30}{f.factor:>8.2f}{f.starts:>8}{f.confidence:>12.2f}"
                     f"{f'{f.lower:.3g}-{f.upper:.3g}':>14}")
    return "\n".join(lines)


def _errors(policy: Policy, observations: Sequence[Observation]) -> list[float | None]:
    """The policy's estimate of each observation (``None`` for a workload or class it does not know)."""
    out: list[float | None] = []
    for o in observations:
        found = estimate_errors(policy, [o])
        out.append(found[0].estimated_s if found else None)
    return out


def register(subparsers: argparse._SubParsersAction[Parser]) -> None:
    """Add ``calibrate`` to the ``extender`` command line."""
    cal = subparsers.add_parser("calibrate", help="observed replica starts and the phase times fitted to them")
    actions = cal.add_subparsers(dest="calibrate_command", required=True, metavar="ACTION")
    p = actions.add_parser("show", help="list the observed starts and the fit of each (workload, node class)")
    p.add_argument("--policy", required=True, metavar="FILE", help="the policy to fit (its values are the prior)")
    p.add_argument("--workload", metavar="NAME", help="only this workload profile (default: every one)")
    p.add_argument("--node-class", metavar="NAME", help="only this node class (default: every one)")
    p.add_argument("--limit", type=whole_number(0), default=50, metavar="N",
                   help="observations listed, newest first (50; 0: the fits only)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    add_store_options(p)
    p.set_defaults(handler=show)
