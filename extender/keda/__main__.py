"""``python -m extender.keda keda-scaler ...``: the same as ``extender keda-scaler ...``."""

from __future__ import annotations

import sys

from extender.cli import main

sys.exit(main())
