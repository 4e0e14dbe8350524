"""The project's own exception hierarchy.

The rule: every error we raise on purpose derives from :class:`ExtenderError`, so callers (the CLI,
the HTTP layer, the agent loop) can tell our failures from bugs.

* A value a field, flag or function does not accept raises :class:`InvalidValueError` (also a
  ``ValueError``, which pydantic validators and argparse types expect), never a bare ``ValueError``.
* An unknown name raises :class:`UnknownNameError` (also a ``KeyError``).
* Third-party exceptions (redis, kubernetes, yaml) are mapped to these at the module that talks to
  the library, with the original chained as ``__cause__``.

``tests/test_layering.py`` keeps the rule: no ``raise`` of a built-in exception class in the package.
"""

from __future__ import annotations

from dataclasses import dataclass


class ExtenderError(Exception):
    """Base of every error raised on purpose by extender."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a document: where it is and what is wrong.

    ``path`` is the dotted path as a person reads it (``profiles[1].weights.bytes``); ``line`` is
    1-based, or ``None`` when the problem has no single place in the file (an empty file).
    """

    source: str
    line: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = self.source if self.line is None else f"{self.source}:{self.line}"
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class DocumentError(ExtenderError):
    """A hand-written document (policy, inventory, scenario) is invalid; carries every problem."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class PolicyError(DocumentError):
    """A policy file is invalid."""


class InvalidValueError(ExtenderError, ValueError):
    """A value outside what a field, a flag or a function accepts.

    Also a ``ValueError``: pydantic turns it into a field error with its location, argparse into a
    usage error naming the flag, and code that already catches ``ValueError`` keeps working.
    """


class UnreadableFileError(ExtenderError, OSError):
    """A file we refuse to read (not a regular file, too large); also an ``OSError`` with its errno,
    so a reader handles it like any other file it cannot open."""


class UnitError(ExtenderError, ValueError):
    """A human-unit quantity (``64GiB``, ``40Gbps``, ``53s``) could not be parsed."""


class UnknownNameError(ExtenderError, KeyError):
    """A name (workload, node class, forecaster, signal source) is not known."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class StateError(ExtenderError):
    """The inventory store failed or holds something unreadable."""


class StoreUnavailableError(StateError):
    """The inventory store (Redis) cannot be reached."""


class OversizedRecordError(StateError):
    """A record is larger than the store keeps (``MAX_RECORD_BYTES``): the store answered, so this is
    no outage, and retrying the same write cannot succeed."""


class KubeError(ExtenderError):
    """A call to the Kubernetes API failed."""


class FencedOutError(StateError):
    """A write carried a fencing token that is no longer current: another scaler took the lead.

    The writer must stop acting as leader at once; nothing of the rejected write was applied.
    """


class SignalError(ExtenderError):
    """A demand signal could not be read (a scrape or a Prometheus query failed)."""
