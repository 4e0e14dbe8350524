"""``python -m extender.scaler scale ...``: the same as ``extender scale ...``."""

from __future__ import annotations

import sys

from extender.cli import main

sys.exit(main())
