"""``python -m extender.scaler scale ...``: the scaler commands without the full CLI."""

from __future__ import annotations

import sys

from extender.scaler.commands import main

sys.exit(main())
