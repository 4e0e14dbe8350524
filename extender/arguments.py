"""argparse value types shared by the commands: each rejects a bad value with a message that says why."""

from __future__ import annotations

import argparse


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
