"""The repository stands alone: no tracked file points at documents outside it.

What a reader needs from the field reports and the Azure trace is restated in ``docs/sources.md``,
the Kubernetes interfaces in ``docs/kubernetes-interfaces.md`` and the prior art in
``docs/prior-art.md``, each with the upstream source named; code, docs, policies and scenarios
refer to those pages, never to the files the project was started from. This test keeps it that way.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Built from pieces so that this file does not match its own patterns.
_SHARED = "shared"
_MD = ".md"
FORBIDDEN = (
    f"{_SHARED}/seeds",
    f"{_SHARED}/reference",
    f"{_SHARED}/data",
    f"../{_SHARED}",
    # the file names of the three field reports as they were stored outside the repository
    "50d9940b" + "c719df97",
    "627b0ec2" + "1ed4c548",
    "c1beb2c0" + "b95a55a4",
    # the notes and the brief the project was started from; our pages have names of their own
    *(name + _MD for name in ("protocols", "anchors", "style", "DESIGN", "real-cluster")),
)
#: The pages that restate the outside documents, and a heading each must keep.
OUR_PAGES = {
    "kubernetes-interfaces.md": ("## 2. How kube-scheduler calls an extender", "### 2.5 ", "## 3. ", "### 4.3 ",
                                 "### 4.6 "),
    "prior-art.md": ("# Part A", "### 1.1 ImageLocality", "# Part B", "### 1.2 "),
}
#: Files whose content is not ours to word (checksums of Go modules).
SKIPPED = {"go.sum"}


def tracked_files() -> list[Path]:
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run([git, "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / name for name in out.decode().split("\0") if name and Path(name).name not in SKIPPED]


def text_of(path: Path) -> str | None:
    """The file's text, or None for binary files (a NUL byte or not UTF-8) and deleted files."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def test_no_tracked_file_refers_to_documents_outside_the_repository() -> None:
    hits: list[str] = []
    for path in tracked_files():
        text = text_of(path)
        if text is None:
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            hits.extend(f"{path.relative_to(ROOT)}:{lineno}: {word}" for word in FORBIDDEN if word in line)
    assert not hits, (
        "these files refer to documents outside the repository; cite docs/sources.md, "
        "docs/kubernetes-interfaces.md or docs/prior-art.md instead:\n" + "\n".join(hits)
    )


def test_the_sources_page_names_every_report() -> None:
    text = (ROOT / "docs" / "sources.md").read_text()
    for section in ("## EKS model-loading report", "## Compile-cache and snapshot report",
                    "## HyperPod model-caching report", "## Azure LLM inference trace"):
        assert section in text, f"docs/sources.md lost its section {section!r}"


@pytest.mark.parametrize("page", sorted(OUR_PAGES))
def test_our_restating_pages_exist_and_name_upstream(page: str) -> None:
    path = ROOT / "docs" / page
    assert path.is_file(), f"docs/{page} is missing"
    text = path.read_text()
    for heading in OUR_PAGES[page]:
        assert heading in text, f"docs/{page} lost its section {heading!r}"
    assert text.count("**Upstream:**") >= 3, f"docs/{page} must name the upstream source of each section"
