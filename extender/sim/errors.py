"""The simulator's errors, both documents with located problems (``file:line: path: message``).

They derive from :class:`extender.core.errors.DocumentError`, so the CLI prints them the way it
prints every other invalid document, one problem per line, and exits 1.
"""

from __future__ import annotations

from extender.core.errors import DocumentError


class ScenarioError(DocumentError):
    """A scenario file is invalid, or names a policy, workload or node class that does not fit it."""


class TraceError(DocumentError):
    """A demand trace (CSV) cannot be read: empty, a bad row (with its line), an unknown column."""
