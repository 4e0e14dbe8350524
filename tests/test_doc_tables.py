"""The simulator tables in the docs are what the simulator prints today, and so is the README's
``extender estimate`` example.

README.md ("What the demo shows", the flagship) and docs/simulator.md (the mixed-fleet example)
each hold a copy of one run. This runs the same simulations (seeded, so deterministic) and compares
the tables, so a change to the simulator or a scenario cannot leave a stale table behind. To
refresh one, run the scenario (``./scripts/demo --out report/`` for the flagship, then copy the two
plots into docs/img/ as the README says) and paste its table.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import NamedTuple

import pytest

from extender import cli

ROOT = Path(__file__).resolve().parents[1]


class Copy(NamedTuple):
    doc: str
    scenario: str


COPIES = [Copy("README.md", "scenarios/flagship.yaml"), Copy("docs/simulator.md", "scenarios/mixed-fleet.yaml")]


def _table(text: str, name: str) -> list[str]:
    """The lines from the ``<name>:`` header to the ``gap closed`` line after it, right-stripped."""
    lines = [line.rstrip() for line in text.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{name}: "))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("gap closed:"))
    return lines[start:end + 1]


@pytest.mark.parametrize("copy", COPIES, ids=[c.doc for c in COPIES])
def test_the_docs_show_what_the_simulator_prints(copy: Copy, capsys: pytest.CaptureFixture[str]) -> None:
    name = Path(copy.scenario).stem
    shown = _table((ROOT / copy.doc).read_text(), name)
    assert cli.main(["simulate", str(ROOT / copy.scenario)]) == 0
    assert _table(capsys.readouterr().out, name) == shown


def _console_example(text: str, command: str) -> tuple[list[str], list[str]]:
    """The ``$ <command> ...`` line of a ``console`` block and the output lines after it (right-stripped)."""
    lines = [line.rstrip() for line in text.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith(f"$ {command} "))
    end = next(i for i in range(start, len(lines)) if lines[i] == "```")
    return shlex.split(lines[start].removeprefix("$ "))[1:], lines[start + 1:end]


#: Console examples whose output is deterministic (the policy alone, or nothing): ``(doc, command)``.
EXAMPLES = [pytest.param("README.md", "extender estimate", id="README.md: extender estimate"),
            pytest.param("docs/inventory.md", "extender inventory acl", id="docs/inventory.md: extender inventory acl"),
            pytest.param("docs/inventory.md", "extender inventory acl --component keda --redis-version",
                         id="docs/inventory.md: extender inventory acl --redis-version")]


@pytest.mark.parametrize(("doc", "command"), EXAMPLES)
def test_the_docs_show_what_the_command_prints(doc: str, command: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv, shown = _console_example((ROOT / doc).read_text(), command)
    assert cli.main([str(ROOT / a) if (ROOT / a).is_file() else a for a in argv]) == 0  # paths from the repo's root
    printed = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    while printed and not printed[-1]:
        printed.pop()
    assert printed == shown
