"""Where Debian's prometheus package put its programs (``prometheus``, ``promtool``).

scripts/test installs the package when it runs as root; elsewhere a test that needs it fails with the
command that installs it, rather than skipping.
"""

from __future__ import annotations

import shutil

import pytest


def prometheus_tool(name: str) -> str:
    """The path of ``name`` (``prometheus`` or ``promtool``), or fail the test saying how to get it."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed; run scripts/test as root (it installs Debian's prometheus "
                    "package), or: apt-get update && apt-get install -y prometheus")
    return path
