"""``python -m extender.server serve|explain``: the server commands without the full CLI."""

from __future__ import annotations

import sys

from extender.server.commands import main

sys.exit(main())
