"""Command-line pieces shared by the commands: argparse value types (each rejects a bad value with a
message that says why) and the inventory store options."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from extender.state.connection import Client


def positive_float(text: str) -> float:
    """A number > 0 (seconds, intervals)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:  # also rejects NaN
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return value


def positive_int(text: str) -> int:
    """A whole number >= 1 (workers, threads)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return value


def bind_address(text: str) -> str:
    """``HOST:PORT`` or ``:PORT`` (all interfaces), as gunicorn's ``--bind`` takes it."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return text if host else f"0.0.0.0:{port}"


#: Where the embedded Redis keeps its data when neither --data-dir nor $EXTENDER_DATA_DIR is set.
DEFAULT_DATA_DIR = "./var/redis"


def add_store_options(parser: argparse.ArgumentParser) -> None:
    """``--redis-url`` and ``--data-dir``; environment defaults are read when the command runs."""
    group = parser.add_argument_group("inventory store")
    group.add_argument(
        "--redis-url",
        metavar="URL",
        help="redis://, rediss:// or unix:// URL, credentials inside (default: $REDIS_URL; "
        "without either, an embedded Redis is started in --data-dir)",
    )
    group.add_argument(
        "--data-dir",
        metavar="DIR",
        help=f"data directory of the embedded Redis (default: $EXTENDER_DATA_DIR, else {DEFAULT_DATA_DIR})",
    )


def data_dir_from_args(args: argparse.Namespace) -> str:
    """The embedded Redis's data directory: ``--data-dir``, then ``$EXTENDER_DATA_DIR``, then the default."""
    return getattr(args, "data_dir", None) or os.environ.get("EXTENDER_DATA_DIR") or DEFAULT_DATA_DIR


def connect_from_args(args: argparse.Namespace) -> Client:
    """The client selected by the store options (flag, then environment, then embedded default)."""
    url = args.redis_url or os.environ.get("REDIS_URL") or None
    data_dir = data_dir_from_args(args)
    from extender.state import connect  # Redis only when a command needs the store

    return connect(url, data_dir)


# ---- the inventory document ------------------------------------------------------------------------
