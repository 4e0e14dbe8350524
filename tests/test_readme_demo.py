"""The README's demo table is what the demo prints today.

The flagship's figures in README.md ("What the demo shows") are a copy of one run of
``./scripts/demo``; this runs the same simulation (seeded, so deterministic) and compares the
table, so a change to the simulator or the scenario cannot leave a stale table behind. To refresh
it, run ``./scripts/demo --out report/`` and paste the table (and copy the two plots into
docs/img/, as the README says).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from extender import cli

ROOT = Path(__file__).resolve().parents[1]


def _table(text: str) -> list[str]:
    """The lines from the ``flagship:`` header to the ``gap closed`` line, right-stripped."""
    lines = [line.rstrip() for line in text.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("flagship: "))
    end = next(i for i, line in enumerate(lines) if line.startswith("gap closed:"))
    return lines[start:end + 1]


def test_the_readme_shows_what_the_demo_prints(capsys: pytest.CaptureFixture[str]) -> None:
    readme = _table((ROOT / "README.md").read_text())
    assert cli.main(["simulate", str(ROOT / "scenarios/flagship.yaml")]) == 0
    printed = _table(capsys.readouterr().out)
    assert printed == readme
