"""Links between our pages resolve: every relative markdown link in README.md and docs/ names a file
that exists and, when it has a ``#fragment``, a heading of that file (GitHub's anchor rules)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped (not '-' or '_'), spaces to '-'."""
    found, fenced = set(), False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            text = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return found


def links(page: Path) -> list[tuple[int, str]]:
    out, fenced = [], False
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out += [(number, target) for target in LINK.findall(line)]
    return out


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for number, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{number}: {target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{number}: {target}: no heading #{fragment} in {dest.name}")
    assert not broken, f"{page.relative_to(ROOT)}:\n" + "\n".join(broken)


#: A test named in a page: ``tests/test_x.py::test_name``, or ``::test_name`` for one more test of
#: the file named last in that paragraph or table row (with a test, or alone: ``tests/test_x.py``).
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?`|`::(\w+)`")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_test_a_page_names_exists(page: Path) -> None:
    # the reliability table promises each behaviour by the tests that hold it: a renamed or removed
    # test left its row naming nothing, and no one would notice
    missing, module = [], None
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("|"):  # a paragraph or a table row names its own file
            module = None
        for path, first, more in TEST_REF.findall(line):
            module, name = path or module, first or more
            if not name:
                continue
            if module is None:
                missing.append(f"{number}: ::{name} names no file before it")
                continue
            source = ROOT / module
            defined = rf"^\s*(async )?def {name}\(|^class {name}\b"
            if not source.exists() or not re.search(defined, source.read_text(), re.M):
                missing.append(f"{number}: {module}::{name}")
    assert not missing, f"{page.relative_to(ROOT)}: tests named that do not exist:\n" + "\n".join(missing)
