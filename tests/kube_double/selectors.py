"""Label and field selectors, with the syntax the API server accepts.

Label selectors: ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k`` (exists),
``!k`` (absent), comma-separated (all must hold). Field selectors: ``path=v``, ``path==v``,
``path!=v`` where ``path`` is a dotted path into the object (``spec.nodeName``,
``status.phase``, ``metadata.name``); a missing field compares as the empty string, as in the real
server.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Predicate = Callable[[Mapping[str, Any]], bool]

_SET = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


class SelectorError(ValueError):
    """A selector the double (and the real server) cannot parse."""


def _split(selector: str) -> list[str]:
    """Split at commas outside parentheses."""
    terms, depth, current = [], 0, ""
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += ch
    terms.append(current)
    return [t.strip() for t in terms if t.strip()]


def _label_term(term: str) -> Callable[[Mapping[str, str]], bool]:
    match = _SET.match(term)
    if match:
        key, op, values = match.group(1), match.group(2), {v.strip() for v in match.group(3).split(",")}
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    for op in ("!=", "==", "="):
        if op in term:
            key, _, value = (s.strip() for s in term.partition(op))
            if not key:
                raise SelectorError(f"invalid label selector term {term!r}")
            if op == "!=":
                return lambda labels: labels.get(key) != value
            return lambda labels: labels.get(key) == value
    if term.startswith("!"):
        key = term[1:].strip()
        return lambda labels: key not in labels
    return lambda labels: term in labels


def label_selector(selector: str | None) -> Predicate:
    """A predicate on objects for a label selector (``None`` or empty: everything)."""
    if not selector:
        return lambda _obj: True
    terms = [_label_term(t) for t in _split(selector)]

    def matches(obj: Mapping[str, Any]) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(t(labels) for t in terms)

    return matches


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The value at a dotted path, as a string ("" when absent)."""
    current: Any = obj
    for part in path.split("."):
        if not isinstance(current, Mapping) or part not in current:
            return ""
        current = current[part]
    if current is None:
        return ""
    if isinstance(current, bool):
        return "true" if current else "false"
    return str(current)


def field_selector(selector: str | None) -> Predicate:
    """A predicate on objects for a field selector (``None`` or empty: everything)."""
    if not selector:
        return lambda _obj: True
    terms: list[tuple[str, bool, str]] = []
    for term in _split(selector):
        for op in ("!=", "==", "="):
            if op in term:
                path, _, value = (s.strip() for s in term.partition(op))
                terms.append((path, op != "!=", value))
                break
        else:
            raise SelectorError(f"invalid field selector term {term!r}")

    def matches(obj: Mapping[str, Any]) -> bool:
        return all((field_value(obj, path) == value) == equal for path, equal, value in terms)

    return matches
