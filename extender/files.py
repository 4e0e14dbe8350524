"""Reading documents from disk: the I/O edge in front of the pure parsers in ``extender.core``."""

from __future__ import annotations

import sys
from pathlib import Path

from extender.core.errors import DocumentError, PolicyError, Problem
from extender.core.policy import Policy, parse_policy


def read_text(path: str | Path) -> str:
    """Read a UTF-8 document; a missing or unreadable file is a located problem, not a traceback."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise DocumentError([Problem(str(path), None, "", f"cannot read: {exc.strerror or exc}")]) from exc
    except UnicodeDecodeError as exc:
        raise DocumentError([Problem(str(path), None, "", f"not UTF-8 text: {exc.reason}")]) from exc


def load_policy(path: str | Path) -> Policy:
    """Read and fully check a policy file; raises :class:`PolicyError` listing every problem."""
    try:
        text = read_text(path)
    except DocumentError as exc:
        raise PolicyError(exc.problems) from exc
    return parse_policy(text, str(path))


def load_policy_to_start(path: str | Path, command: str) -> Policy | None:
    """The policy a long-running command starts with, or ``None`` after printing why it will not.

    A service must refuse to start on an invalid policy rather than run with a guess: every problem
    goes to stderr, then one line saying the command is not starting.
    """
    try:
        return load_policy(path)
    except DocumentError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        print(f"extender {command}: not starting: {path} is invalid ({len(exc.problems)} problem(s))",
              file=sys.stderr)
        return None
