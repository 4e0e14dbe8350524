"""Kubernetes label selectors in their string form, parsed and matched as ``k8s.io/apimachinery/pkg/labels`` does.

The HPA sends its ``metric.selector`` to the External Metrics API as ``labels.Selector.String()``
(docs/kubernetes-interfaces.md 4.1): comma-joined requirements, sorted by key. Every form is accepted::

    key=value   key==value   key!=value        equality (``!=`` also matches a missing key)
    key in (a,b)      key notin (a,b)          set membership (``notin`` also matches a missing key)
    key               !key                     existence
    key>5             key<5                    integer comparison (the key must exist)

Whitespace (space, tab, CR, LF: no other character separates tokens) around tokens is ignored;
``key=`` selects the empty value, and so does ``key in ()``, which is how ``labels.Selector.String()``
writes a set holding only the empty value. In a value set a run of commas stands for empty values
as apimachinery reads it: ``(a,,b)`` and ``(a,,,)`` hold ``""``, while a comma pair right before
``)`` (``(a,,)``, ``(,,)``) is refused. Keys are qualified names (optional DNS-subdomain prefix and
``/``, then a name of at most 63 characters); values are empty or at most 63 characters of
``[A-Za-z0-9._-]`` starting and ending alphanumeric; the bound of ``>``/``<`` is such a value that
is also a 64-bit integer (so ``-5`` is refused, as upstream). A malformed selector raises
:class:`SelectorError` (the API answers ``400 BadRequest``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from extender.core.errors import ExtenderError

Operator = Literal["=", "!=", "in", "notin", "exists", "!", ">", "<"]

_NAME = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_INTEGER = re.compile(r"[+-]?[0-9]+")
#: The range of Go's ``strconv.ParseInt(..., 10, 64)``, which reads both the bound and the label.
_INT64 = range(-(2**63), 2**63)
#: The only characters the apimachinery lexer skips as whitespace (any other one is part of a word).
_WHITESPACE = frozenset(" \t\n\r")
#: characters that end an identifier (the apimachinery lexer's special symbols and whitespace)
_SPECIAL = set("!=(),<>") | _WHITESPACE
_OPERATOR_TOKENS = frozenset({"!", "=", "==", "!=", "(", ")", ",", "<", ">"})


class SelectorError(ExtenderError, ValueError):
    """A label selector that does not parse or names an invalid key or value."""


@dataclass(frozen=True)
class Requirement:
    """One ``key op values`` term."""

    key: str
    op: Operator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        value = labels.get(self.key, "")
        if self.op == "=":
            return has and value == self.values[0]
        if self.op == "!=":
            return not has or value != self.values[0]
        if self.op == "in":
            return has and value in self.values
        if self.op == "notin":
            return not has or value not in self.values
        if self.op == "exists":
            return has
        if self.op == "!":
            return not has
        # > and <: a 64-bit integer label compared with the bound; anything else does not match
        label, bound = _int64(value) if has else None, _int64(self.values[0])
        if label is None or bound is None:
            return False
        return label > bound if self.op == ">" else label < bound

    def __str__(self) -> str:
        if self.op == "exists":
            return self.key
        if self.op == "!":
            return f"!{self.key}"
        if self.op in ("in", "notin"):
            return f"{self.key} {self.op} ({','.join(self.values)})"
        return f"{self.key}{self.op}{self.values[0]}"


@dataclass(frozen=True)
class Selector:
    """A conjunction of requirements; the empty selector matches everything."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.requirements)


def _int64(text: str) -> int | None:
    """``text`` as Go's ``strconv.ParseInt(text, 10, 64)`` reads it, or ``None``."""
    if not _INTEGER.fullmatch(text):
        return None
    number = int(text)
    return number if number in _INT64 else None


def validate_key(key: str) -> None:
    """Raise :class:`SelectorError` unless ``key`` is a valid label key."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        raise SelectorError(f"invalid label key {key!r}: the prefix must be a DNS subdomain of at most 253 characters")
    if not name or len(name) > 63 or not _NAME.fullmatch(name):
        raise SelectorError(f"invalid label key {key!r}: the name must be 1-63 characters of [A-Za-z0-9._-], "
                            "starting and ending with a letter or digit")


def validate_value(value: str) -> None:
    """Raise :class:`SelectorError` unless ``value`` is a valid label value (empty is valid)."""
    if value and (len(value) > 63 or not _NAME.fullmatch(value)):
        raise SelectorError(f"invalid label value {value!r}: at most 63 characters of [A-Za-z0-9._-], "
                            "starting and ending with a letter or digit")


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in _WHITESPACE:
            i += 1
        elif text.startswith(("==", "!="), i):
            out.append(text[i:i + 2])
            i += 2
        elif c in "!=(),<>":
            out.append(c)
            i += 1
        else:
            j = i
            while j < n and text[j] not in _SPECIAL:
                j += 1
            out.append(text[i:j])
            i = j
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str | None:
        token = self.peek()
        self.pos += 1
        return token

    def fail(self, what: str) -> SelectorError:
        return SelectorError(f"unable to parse label selector {self.text!r}: {what}")

    def identifier(self, what: str) -> str:
        token = self.take()
        if token is None or token in _OPERATOR_TOKENS:
            raise self.fail(f"expected {what}, found {token or 'end of input'!r}")
        return token

    def requirement(self) -> Requirement:
        if self.peek() == "!":
            self.take()
            key = self.identifier("a label key after '!'")
            validate_key(key)
            return Requirement(key, "!")
        key = self.identifier("a label key")
        validate_key(key)
        op = self.peek()
        if op is None or op == ",":
            return Requirement(key, "exists")
        self.take()
        if op in ("=", "==", "!="):
            value = self.peek()
            if value is None or value == ",":
                return Requirement(key, "!=" if op == "!=" else "=", ("",))
            value = self.identifier("a label value")
            validate_value(value)
            return Requirement(key, "!=" if op == "!=" else "=", (value,))
        if op in ("in", "notin"):
            return Requirement(key, op, self.values())  # type: ignore[arg-type]
        if op in (">", "<"):
            value = self.identifier("an integer")
            if _int64(value) is None:
                raise self.fail(f"{key}{op}{value}: the value of '{op}' must be a 64-bit integer")
            validate_value(value)
            return Requirement(key, op, (value,))  # type: ignore[arg-type]
        raise self.fail(f"expected an operator after {key!r}, found {op!r}")

    def values(self) -> tuple[str, ...]:
        """A value set, ``(`` to ``)``. ``()`` is the empty value alone. A comma read where a value
        could be adds the empty value, and so does a second comma right behind it, which is then
        skipped: apimachinery's reading, so ``(a,,)`` and ``(,,)`` end on a value-less ``)``."""
        if self.take() != "(":
            raise self.fail("expected '(' after in/notin")
        if self.peek() == ")":
            self.take()
            return ("",)
        values: set[str] = set()
        while True:
            token = self.take()
            if token == ",":
                if not values or self.peek() == ")":
                    values.add("")
                if self.peek() == ")":
                    break
                if self.peek() == ",":
                    self.take()
                    values.add("")
                continue
            if token is None:
                raise self.fail("unclosed '('")
            if token in _OPERATOR_TOKENS:
                raise self.fail("expected a value after ',' before ')'" if token == ")" else
                                f"expected a value or ',' in a value set, found {token!r}")
            validate_value(token)
            values.add(token)
            if self.peek() == ")":
                break
            if self.peek() != ",":
                found = self.peek()
                raise self.fail("unclosed '('" if found is None else f"expected ',' or ')' in a value set, "
                                f"found {found!r}")
        self.take()  # the ')'
        return tuple(sorted(values))

    def parse(self) -> Selector:
        if self.peek() is None:
            return Selector()
        requirements = [self.requirement()]
        while (token := self.take()) is not None:
            if token != ",":
                raise self.fail(f"expected ',' between requirements, found {token!r}")
            requirements.append(self.requirement())
        return Selector(tuple(sorted(requirements, key=lambda r: r.key)))


def parse_selector(text: str) -> Selector:
    """Parse a selector string (module docstring); ``""`` is the selector that matches everything."""
    return _Parser(text).parse()
