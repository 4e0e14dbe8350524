"""The ``extender`` command line.

Each subcommand is a small function that parses its arguments, calls the library and prints.
Exit codes: 0 success, 1 invalid input (every problem printed), 2 usage errors (argparse), 130
interrupted (Ctrl-C; 128 + SIGINT, as a shell reports it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence

import yaml

from extender import __version__
from extender.arguments import (
    FLAG_CHECK,
    SHORT_ACTION,
    Parser,
    add_logging_options,
    add_store_options,
    deprecated_flags,
    store_problem,
    subparsers_of,
)
from extender.core.cachekey import compile_cache_key_of
from extender.core.caches import compile_key_material
from extender.core.errors import DocumentError, ExtenderError, UnknownNameError
from extender.core.estimate import PHASES, breakdown, estimate_pairs
from extender.files import load_policy
from extender.process import current_logging, report, report_problems, setup_logging

Handler = Callable[[argparse.Namespace], int]

#: Commands that run until stopped: they log at INFO unless told otherwise, the others at WARNING.
LONG_RUNNING = frozenset({"serve", "agent", "sync", "scale", "keda-scaler"})
#: Exit code of a command stopped by Ctrl-C (SIGINT) before it finished: 128 + 2, as shells report it.
INTERRUPTED = 130

#: Commands that also log at INFO by default because their INFO lines are part of what they report
#: (``simulate``: the demand it loaded, before minutes of simulation).
INFO_BY_DEFAULT = LONG_RUNNING | {"simulate"}


def _policy_check(args: argparse.Namespace) -> int:
    failed = False
    for path in args.files:
        try:
            policy = load_policy(path)
        except DocumentError as exc:
            failed = True
            report_problems(exc)
            continue
        print(
            f"{path}: ok: {len(policy.node_classes)} node class(es), {len(policy.profiles)} profile(s)"
            f" ({', '.join(p.name for p in policy.profiles) or 'none'})"
        )
    return 1 if failed else 0


def _policy_show(args: argparse.Namespace) -> int:
    policy = load_policy(args.file)
    doc = policy.model_dump(mode="json", by_alias=True)
    print(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, width=100), end="")
    return 0


def _policy_schema(args: argparse.Namespace) -> int:
    from extender.policy_schema import reference_markdown, schema_text

    print(reference_markdown() if args.markdown else schema_text(), end="")
    return 0


def _estimate(args: argparse.Namespace) -> int:
    if args.calibrated:
        from extender.state.calibration_commands import estimate_calibrated

        return estimate_calibrated(args)
    policy = load_policy(args.policy)
    pairs = estimate_pairs(policy, args.workload, args.node_class)
    result: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for workload, cls in pairs:
        table = breakdown(policy.profile(workload), policy.node_class(cls))
        result.setdefault(workload, {})[cls] = {
            state: {k: round(v, 3) for k, v in row.items()} for state, row in table.items()
        }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    if not pairs:
        print("no (workload, node class) pairs to show: the policy has no profiles")
    columns = [*PHASES, "total_s"]
    for workload, per_class in result.items():
        for cls, rows in per_class.items():
            print(f"{workload} on {cls}  (seconds to ready)")
            print(f"  {'state':<14}" + "".join(f"{c.removesuffix('_s'):>10}" for c in columns))
            for state, row in rows.items():
                print(f"  {state:<14}" + "".join(f"{row[c]:>10.1f}" for c in columns))
            print()
    return 0


def _cachekey(args: argparse.Namespace) -> int:
    policy = load_policy(args.policy)
    profile = policy.profile(args.workload)
    node_class = policy.node_class(args.node_class)
    material = compile_key_material(profile, node_class)
    if material is None:
        raise UnknownNameError(f"profile {profile.name!r} has no compile.key section")
    key = compile_cache_key_of(material)
    if args.verbose:
        if current_logging()[1] == "json":
            report("the inputs of the compile-cache key", level=logging.INFO, always=True, key=key, inputs=material)
        else:
            print(json.dumps(material, indent=2, sort_keys=True), file=sys.stderr)
    print(key)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    parser = Parser(
        prog="extender", description="Cache-warmth-aware scheduling and predictive pre-scaling for inference pods."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    policy = sub.add_parser("policy", help="check or show policy files, print the policy's schema")
    policy_sub = policy.add_subparsers(dest="policy_command", required=True, metavar="ACTION")
    check = policy_sub.add_parser("check", help="validate policy files; exit 1 listing every problem")
    check.add_argument("files", nargs="+", metavar="FILE", help="policy files (YAML)")
    check.set_defaults(handler=_policy_check)
    show = policy_sub.add_parser("show", help="print the policy with every default filled in")
    show.add_argument("file", metavar="FILE", help="policy file (YAML)")
    show.set_defaults(handler=_policy_show)
    schema = policy_sub.add_parser(
        "schema", help="print the policy's JSON Schema (for editors), or with --markdown its field reference",
        description="Print the JSON Schema of a policy file, generated from the models that validate it. Point "
                    "an editor at it with a first line '# yaml-language-server: $schema=PATH' in the policy.")
    schema.add_argument("--markdown", action="store_true",
                        help="print the reference of every field instead (docs/policy-reference.md)")
    schema.set_defaults(handler=_policy_schema)

    est = sub.add_parser("estimate", help="startup-time breakdown per workload, node class and cache state")
    est.add_argument("--policy", required=True, metavar="FILE", help="policy file")
    est.add_argument("--workload", metavar="NAME", help="only this profile (default: every profile)")
    est.add_argument("--node-class", metavar="NAME", help="only this node class (default: every class it runs on)")
    est.add_argument("--json", action="store_true", help="print JSON instead of tables")
    est.add_argument("--calibrated", action="store_true",
                     help="policy vs fitted phase values with their confidence, from the observed starts in the store")
    add_store_options(est)
    est.set_defaults(handler=_estimate)

    ck = sub.add_parser("cachekey", help="print the compile-cache key of a workload on a node class")
    ck.add_argument("--policy", required=True, metavar="FILE", help="policy file")
    ck.add_argument("--workload", required=True, metavar="NAME", help="profile whose compile.key section to hash")
    ck.add_argument("--node-class", required=True, metavar="NAME", help="node class (its GPU product is hashed)")
    ck.add_argument("-v", "--verbose", action="store_true", help="also print the key's inputs (stderr)")
    ck.set_defaults(handler=_cachekey)

    # Commands with I/O live beside the code they drive; importing them builds no client.
    # (extender.api.scheduler.commands imports no Flask app: `serve` must set up Prometheus' multiprocess
    # directory before the app module is imported.)
    from extender.agent import commands as agent_commands
    from extender.api.scheduler import commands as server_commands
    from extender.keda import commands as keda_commands
    from extender.kube import commands as kube_commands
    from extender.scaler import commands as scale_commands
    from extender.sim import commands as sim_commands
    from extender.state import calibration_commands
    from extender.state import commands as inventory_commands
    from extender.warm import commands as warm_commands

    inventory_commands.register(sub)
    server_commands.register(sub)
    agent_commands.register(sub)
    kube_commands.register(sub)
    sim_commands.register(sub)
    warm_commands.register(sub)
    scale_commands.register(sub)
    keda_commands.register(sub)
    calibration_commands.register(sub)
    add_logging_options(parser)
    for sub_parser in subparsers_of(parser):
        add_logging_options(sub_parser, inherited=True)
    # Long options are spelled in full (kubectl's flags are too): with prefix matching, a script's
    # --work meant --workload until an option sharing the prefix arrived and broke it.
    for p in (parser, *subparsers_of(parser)):
        p.allow_abbrev = False
    return parser


def default_level(args: argparse.Namespace) -> str:
    """The log level without ``--log-level``: ``info`` for :data:`INFO_BY_DEFAULT` (but a short action
    of one, :data:`~extender.arguments.SHORT_ACTION`), ``warning`` for the rest."""
    return "info" if args.command in INFO_BY_DEFAULT and not getattr(args, SHORT_ACTION, False) else "warning"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``extender`` console script."""
    args = build_parser().parse_args(argv)
    level = getattr(args, "log_level", None) or default_level(args)
    setup_logging(level, getattr(args, "log_format", "text"))
    for old, new in deprecated_flags(args):
        report(f"extender: {old} is deprecated; use {new}", level=logging.WARNING, flag=old, replacement=new)
    # a command with a check of its own runs it, this one included, first thing in its handler
    # (arguments.flag_problem); the others of the store options get this one here
    if getattr(args, FLAG_CHECK, None) is None and (problem := store_problem(args, os.environ)):
        report(f"extender {args.command}: {problem}")
        return 2
    handler: Handler = args.handler
    try:
        return handler(args)
    except DocumentError as exc:
        report_problems(exc)
        return 1
    except ExtenderError as exc:
        report(f"extender: {exc}", error=type(exc).__name__)
        return 1
    except BrokenPipeError:  # `extender estimate --json | head`: the reader left, nothing to report
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:  # Ctrl-C on a command that does not handle SIGINT itself: one line, no traceback
        report("extender: interrupted", error="KeyboardInterrupt")
        return INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
