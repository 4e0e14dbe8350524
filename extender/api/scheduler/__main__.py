"""``python -m extender.api.scheduler serve|explain``: the same as ``extender serve|explain``."""

from __future__ import annotations

import sys

from extender.cli import main

sys.exit(main())
