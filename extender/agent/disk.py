"""Size and free space of the filesystem that holds the cache root (statvfs)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DiskUsage:
    """Bytes of the filesystem, as an unprivileged writer sees them."""

    total_bytes: int
    free_bytes: int


def disk_usage(path: Path) -> DiskUsage:
    """``statvfs`` of ``path``: total = blocks x fragment size; free = blocks available to non-root.

    ``f_bavail`` rather than ``f_bfree``: the blocks reserved for root (5% by default on ext4) are
    not space a cache writer running as a normal user can fill. Raises ``OSError``.
    """
    st = os.statvfs(path)
    return DiskUsage(total_bytes=st.f_blocks * st.f_frsize, free_bytes=st.f_bavail * st.f_frsize)
