"""``extender inventory load FILE``, ``extender inventory show [NODE]`` and ``extender inventory acl``.

``load`` validates the whole file first (every problem reported as ``file:line: path: message``)
and only then writes, all nodes in one transaction, so a broken file changes nothing. ``show``
prints what is stored: a table, or JSON that ``load`` accepts back. ``acl`` prints each component's
Redis user (:mod:`extender.state.acl`), touching no store.

Store options, on every subcommand: ``--redis-url`` (default ``$REDIS_URL``), ``--data-dir``
for the embedded server (default ``$EXTENDER_DATA_DIR``, else ``./var/redis``) and ``--prefix``.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

from extender.arguments import (
    DEFAULT_PREFIX,
    Parser,
    add_store_options,
    connect_from_args,
    inventory_from_args,
    prefix_from_args,
)
from extender.core.document import compose, line_of, validate
from extender.core.errors import DocumentError, InvalidValueError, Problem, UnknownNameError
from extender.core.inventory import InventoryDocument, NodeState
from extender.core.units import format_bytes
from extender.files import read_text
from extender.process import report
from extender.state import acl as acl_rules
from extender.state.connection import describe


def parse_inventory(text: str, source: str) -> InventoryDocument:
    """Parse and check an inventory document; :class:`DocumentError` lists every problem with its line.

    Beyond the schema: node names must be unique, and free GPUs / free NVMe cannot exceed the totals.
    These are checked even when the schema refuses some records, so one run reports every problem:
    names on every record that has one, free against total on every record the schema accepts.
    """
    data, lines = compose(text, source)
    try:
        document = validate(InventoryDocument, data, lines, source)
    except DocumentError as exc:
        problems, document = list(exc.problems), None
    else:
        problems = []
    raw = data.get("nodes") if isinstance(data, dict) else None
    records: list[Any] = raw if isinstance(raw, list) else []
    first_seen: dict[str, int] = {}

    def problem(index: int, field: str, message: str) -> None:
        loc = ("nodes", index, field)
        problems.append(Problem(source, line_of(lines, loc), f"nodes[{index}].{field}", message))

    for i, record in enumerate(records):
        name = record.get("name") if isinstance(record, dict) else None
        if not isinstance(name, str):
            continue
        if name in first_seen:
            where = line_of(lines, ("nodes", first_seen[name], "name"))
            problem(i, "name", f"duplicate node name {name!r} (first at nodes[{first_seen[name]}]"
                    + (f", line {where})" if where else ")"))
        else:
            first_seen[name] = i
    for i, node in enumerate(document.nodes) if document is not None else _valid_records(records):
        if node.gpus_free > node.gpus:
            problem(i, "gpusFree", f"must be <= gpus ({node.gpus}), got {node.gpus_free}")
        if node.nvme_free > node.nvme_total:
            problem(i, "nvmeFree", f"must be <= nvmeTotal ({format_bytes(node.nvme_total)}), "
                    f"got {format_bytes(node.nvme_free)}")
    if problems:
        problems.sort(key=lambda p: (p.line or 0, p.path))
        raise DocumentError(problems)
    assert document is not None
    return document


def _valid_records(records: Sequence[Any]) -> Iterator[tuple[int, NodeState]]:
    """``(index, node)`` of each record the schema accepts on its own (the others were reported)."""
    for i, record in enumerate(records):
        try:
            yield i, NodeState.model_validate(record)
        except ValueError:  # pydantic's ValidationError: already among the schema's problems
            continue


def stamp_heartbeats(nodes: Sequence[NodeState], now: float) -> list[NodeState]:
    """Records whose file gives no ``heartbeat`` get ``now``: a loaded file is news as of loading.

    An explicit ``heartbeat`` (0 included) is kept, so a file can also describe stale nodes.
    """
    return [n if "heartbeat" in n.model_fields_set else n.model_copy(update={"heartbeat": now}) for n in nodes]


# ---- handlers ---------------------------------------------------------------------------------------


def load(args: argparse.Namespace) -> int:
    """``inventory load FILE [--replace]``: validate everything, then write in one transaction."""
    document = parse_inventory(read_text(args.file), args.file)
    nodes = stamp_heartbeats(document.nodes, time.time())
    client = connect_from_args(args)
    try:
        store = inventory_from_args(args, client)
        if args.replace:
            version = store.replace(nodes, document.compile_registry)
        else:
            version = store.put_many(nodes, registry=document.compile_registry)
    finally:
        client.close()
    mode = "replaced the inventory with" if args.replace else "loaded"
    print(
        f"{args.file}: {mode} {len(nodes)} node(s) and {len(document.compile_registry)} compile-registry key(s)"
        f" into {describe(client)}; inventory version {version}"
    )
    return 0


def show(args: argparse.Namespace) -> int:
    """``inventory show [NODE] [--json]``: what is stored, as a table or as a loadable document."""
    client = connect_from_args(args)
    try:
        store = inventory_from_args(args, client)
        if args.node:
            state = store.get(args.node)
            if state is None:
                known = len(store.names())
                raise UnknownNameError(
                    f"node {args.node!r} is not in the inventory at {describe(client)} ({known} node(s) stored)"
                )
            version, nodes, registry = 0, [state], frozenset[str]()  # version: only printed for all
        else:
            version, nodes, registry = store.load_all()
            for key, reason in sorted(store.corrupt.items()):
                # quoted as Python quotes it: a name is anyone's text, and a line feed in it must not
                # start a line of its own
                report(f"warning: skipped corrupt record {key!r}: {reason}", level=logging.WARNING, key=key)
    finally:
        client.close()
    if args.json:
        if args.node:
            print(json.dumps(nodes[0].model_dump(mode="json", by_alias=True), indent=2))
        else:
            print(json.dumps(_document(nodes, registry), indent=2))
        return 0
    now = time.time()
    if not args.node:
        print(f"inventory version {version} at {describe(client)}: {len(nodes)} node(s), "
              f"{len(registry)} compile-registry key(s)")
    if nodes:
        print(render_table(nodes, now))
    if args.node:
        print(render_details(nodes[0]))
    return 0


def _redis_version(text: str) -> tuple[int, int]:
    """``--redis-version``'s type: :func:`extender.state.acl.redis_version`, a bad one a usage error."""
    try:
        return acl_rules.redis_version(text)
    except InvalidValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def acl(args: argparse.Namespace) -> int:
    """``inventory acl [--prefix P] [--component NAME] [--format setuser|aclfile] [--redis-version V]``: one
    user per line, no password."""
    prefix = prefix_from_args(args)
    names = [args.component] if args.component else [r.name for r in acl_rules.ROLES]
    line = acl_rules.aclfile_line if args.format == "aclfile" else acl_rules.setuser_line
    lines = [line(prefix, name, args.redis_version) for name in names]  # every line checked before any is printed
    print("\n".join(lines))
    return 0


def _document(nodes: Sequence[NodeState], registry: frozenset[str]) -> dict[str, Any]:
    # The same shape `inventory load` reads, so `show --json > f && load f` round-trips.
    return {
        "apiVersion": "extender.io/v1alpha1",
        "kind": "Inventory",
        "nodes": [n.model_dump(mode="json", by_alias=True) for n in nodes],
        "compileRegistry": sorted(registry),
    }


# ---- rendering -------------------------------------------------------------------------------------

COLUMNS = ("NODE", "CLASS", "STATE", "GPUS", "NVME FREE/TOTAL", "IMAGES", "WEIGHTS", "COMPILE", "SNAPSHOTS")


_DECIMAL_UNITS = ("B", "kB", "MB", "GB", "TB", "PB")


def human_bytes(n: int) -> str:
    """``format_bytes`` for a table: exact when short (``64GiB``), else ~3 significant digits."""
    exact = format_bytes(n)
    if len(exact) <= 7:
        return exact
    rounded = int(float(f"{n:.3g}"))  # round first, so 999.6kB becomes 1MB, not 1e+03kB
    exponent = min(len(_DECIMAL_UNITS) - 1, (len(str(rounded)) - 1) // 3)
    return f"~{rounded / 1000**exponent:.3g}{_DECIMAL_UNITS[exponent]}"


def age(seconds: float) -> str:
    """A compact age for people: ``42s``, ``5m``, ``3h``, ``2d`` (whole units, rounded down)."""
    s = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= 2 * size:
            return f"{s // size}{unit}"
    return f"{s}s"


def freshness(node: NodeState, now: float) -> str:
    """``fresh 12s`` / ``stale 5m`` (age of the last report), ``stale never`` without any report.

    A heartbeat in the future (the writer's clock runs ahead of ours) says how far: ``fresh ahead
    20s`` within the TTL, ``stale ahead 5m`` beyond it (:meth:`NodeState.fresh`: the record is then
    cold). Less than a second ahead on a fresh record is shown as age ``0s``: clocks that agree to a
    fraction of a second are no news.
    """
    if node.heartbeat <= 0:
        return "stale never"
    fresh = node.fresh(now)
    state = "fresh" if fresh else "stale"
    behind = now - node.heartbeat
    if behind >= 0 or (fresh and behind > -1):
        return f"{state} {age(behind)}"
    return f"{state} ahead {age(-behind)}"


def render_table(nodes: Sequence[NodeState], now: float) -> str:
    """One row per node, columns padded to the widest cell."""
    rows = [COLUMNS] + [
        (
            n.name,
            n.node_class or "-",
            freshness(n, now),
            f"{n.gpus_free}/{n.gpus}",
            f"{human_bytes(n.nvme_free)}/{human_bytes(n.nvme_total)}",
            str(len(n.images)),
            str(len(n.weights)),
            str(len(n.compile_keys)),
            str(len(n.snapshots)),
        )
        for n in nodes
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def render_details(node: NodeState) -> str:
    """Everything the table only counts, for ``show NODE``."""
    lines = [
        f"labels:       {', '.join(f'{k}={v}' for k, v in sorted(node.labels.items())) or '-'}",
        f"pulling:      {human_bytes(node.pulling_bytes)}",
        f"heartbeat:    {node.heartbeat:.3f} (ttl {node.ttl:g}s)",
        "images:" + ("" if node.images else "       -"),
        *(f"  {image}" for image in node.images),
        "weights:" + ("" if node.weights else "      -"),
        *(f"  {key}  {human_bytes(size)}" for key, size in sorted(node.weights.items())),
        "compile keys:" + ("" if node.compile_keys else " -"),
        *(f"  {key}" for key in node.compile_keys),
        "snapshots:" + ("" if node.snapshots else "    -"),
        *(f"  {workload}" for workload in node.snapshots),
    ]
    return "\n".join(lines)


# ---- argparse wiring -------------------------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction[Parser]) -> None:
    """Add ``inventory load``, ``inventory show`` and ``inventory acl`` to the top-level ``extender`` parser."""
    inventory = subparsers.add_parser(
        "inventory", help="load or show node states in the inventory store (Redis), print its ACL users")
    actions = inventory.add_subparsers(dest="inventory_command", required=True, metavar="ACTION")

    load_parser = actions.add_parser(
        "load",
        help="write node states from a YAML or JSON inventory document (all or nothing)",
        description="Validate FILE (every problem reported with its line), then write every node in one "
        "transaction. Nodes without a heartbeat in the file get the current time. Nodes not in FILE are "
        "left alone unless --replace is given.",
    )
    load_parser.add_argument("file", metavar="FILE", help="inventory document (YAML or JSON)")
    load_parser.add_argument(
        "--replace",
        action="store_true",
        help="make the inventory exactly FILE: delete nodes it does not list, replace the compile registry",
    )
    add_store_options(load_parser)
    load_parser.set_defaults(handler=load)

    show_parser = actions.add_parser("show", help="print the stored node states (table, or JSON with --json)")
    show_parser.add_argument("node", nargs="?", metavar="NODE", help="show only this node, with details")
    show_parser.add_argument("--json", action="store_true", help="print JSON (an inventory document `load` accepts)")
    add_store_options(show_parser)
    show_parser.set_defaults(handler=show)

    acl_parser = actions.add_parser(
        "acl",
        help="print the least-privilege Redis ACL user of each component (no password; nothing is connected)",
        description="Print one ACL user per component (agent, sync, extender, scaler, keda, publish, cli): the "
        "keys under --prefix it may touch and the commands it may send, as ACL SETUSER commands for redis-cli "
        "or as lines of an ACL file. No line holds a password: a new user cannot log in until you give it one "
        "(ACL SETUSER NAME >PASSWORD), and applying the lines again keeps it. With --redis-version 7.0 (for Redis 7 "
        "and later), the keys a component only reads are granted read-only. See docs/inventory.md.",
    )
    acl_parser.add_argument("--component", choices=[r.name for r in acl_rules.ROLES],
                            help="print only this component's user (default: all)")
    acl_parser.add_argument("--format", choices=("setuser", "aclfile"), default="setuser",
                            help="setuser: 'ACL SETUSER NAME RULES...' commands (default); "
                            "aclfile: 'user NAME RULES...' lines of an ACL file")
    acl_parser.add_argument("--prefix", metavar="PREFIX",
                            help=f"prefix of every Redis key, as the components are given it "
                            f"(default: {DEFAULT_PREFIX})")
    acl_parser.add_argument("--redis-version", metavar="VERSION", type=_redis_version,
                            default=acl_rules.OLDEST,
                            help="the oldest Redis the users will be created on (default: 6.2, which every "
                            "version since accepts); from 7.0, the keys a component only reads are granted "
                            "read-only (%%R~), which Redis 6.2 refuses")
    acl_parser.set_defaults(handler=acl)
