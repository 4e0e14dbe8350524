"""Load a hand-written YAML/JSON document into a pydantic model, reporting every problem with its line.

Policy files, inventory documents and simulator scenarios all go through here, so they all report
errors the same way: ``policies/x.yaml:14: profiles[1].weights.bytes: must be > 0``, every problem
at once.

How lines are found: PyYAML's composer keeps a start mark on every node. We build the plain Python
value ourselves from the node tree and record ``path -> line`` on the way; pydantic's error
locations are then looked up in that map (falling back to the nearest parent that has a line, for
a missing field). Duplicate keys, which PyYAML would silently resolve to the last one, are problems
too: two ``bytes:`` lines under one ``weights:`` is a typo, not an intention.
"""

from __future__ import annotations

import datetime
import difflib
import re
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from extender.core.errors import DocumentError, Problem
from extender.core.quoting import quote

Loc = tuple[str | int, ...]
M = TypeVar("M", bound=BaseModel)

#: Values a document may expand to once YAML aliases and merge keys are followed. A hand-written
#: policy has a few thousand; an inventory of 15,000 nodes a few hundred thousand. Without the
#: bound a 5 KB alias bomb ran for 49 s into a 6 GB MemoryError.
MAX_VALUES = 2_000_000
#: Nesting depth of a document; real ones are under 15 levels. Deeper ones overflowed the stack.
MAX_DEPTH = 64
#: Tags of the collections a document may hold: YAML's own mapping and list (no ``!!set``, no ``!custom``).
_PLAIN_TAGS = frozenset({"tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"})


def _tag(tag: str) -> str:
    """A tag as it is written: ``tag:yaml.org,2002:python/object`` -> ``!!python/object``."""
    return "!!" + tag.removeprefix("tag:yaml.org,2002:") if tag.startswith("tag:yaml.org,2002:") else tag


def _as_written(value: Any) -> str:
    """How YAML spells a value it typed: ``True`` -> ``true``, a date -> ``2024-01-01``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.date):
        return value.isoformat()
    return repr(value)


def _yaml_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, datetime.date):
        return "a date"
    return "a number" if isinstance(value, int | float) else f"a {type(value).__name__}"


#: A path part written bare (``.name``); any other is quoted (``['extender.io/workload']``, ``['bad key!']``).
_BARE_PART = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")

#: pydantic's last location part when a mapping's key, not its value, failed validation.
KEY_MARKER = "[key]"


def format_path(loc: Iterable[str | int]) -> str:
    """``('profiles', 1, 'weights', 'bytes')`` -> ``profiles[1].weights.bytes``; a part that is no plain
    name is quoted: ``('labels', 'bad key!')`` -> ``labels['bad key!']``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _BARE_PART.fullmatch(part):
            out += f"[{part!r}]"
        else:
            out += f".{part}" if out else part
    return out


def _error_place(error: ErrorDetails, model: type[BaseModel]) -> tuple[str, str]:
    """The path and message of one pydantic error; a key that failed is quoted in the path as the key
    it is and the message says it is the key (pydantic marks it with a ``[key]`` part after it)."""
    loc, message = tuple(error["loc"]), describe(error, model)
    if error["type"] == "invalid_key":  # a key that is not text, reported at its mapping
        return format_path(loc[:-1]), message
    if len(loc) >= 2 and loc[-1] == KEY_MARKER:
        key = error["input"]  # the key as read (a boolean key's location part is 1 or 0)
        shown = repr(key) if isinstance(key, str) else _as_written(key)
        return f"{format_path(loc[:-2])}[{shown}]", f"(the key) {message}"
    return format_path(loc), message


#: What PyYAML takes for a line break (its marks count lines by these).
_LINE_BREAK = re.compile("\r\n|[\r\n\x85\u2028\u2029]")


def _refused_character(text: str, exc: yaml.reader.ReaderError, source: str) -> Problem:
    """A character YAML does not allow (a control character other than tab and line ends, a lone
    surrogate, U+FFFE), at its line and column counted as PyYAML counts every other problem's."""
    at = exc.position
    breaks = list(_LINE_BREAK.finditer(text, 0, at))
    line = len(breaks) + 1
    column = at - (breaks[-1].end() if breaks else 0) + 1
    code = exc.character if isinstance(exc.character, int) else ord(str(exc.character)[:1] or "\0")
    return Problem(source, line, "", f"YAML syntax: the character U+{code:04X} at column {column} is not allowed "
                                     "in YAML (a control or non-printable character): remove it, or write it "
                                     "as an escape in a double-quoted string")


def compose(text: str, source: str) -> tuple[Any, dict[Loc, int]]:
    """Parse YAML (JSON is YAML) into plain Python values plus a ``path -> 1-based line`` map.

    Raises :class:`DocumentError` for syntax errors, several documents in one file, duplicate keys
    and values YAML cannot build (an unknown ``!tag``, an integer of thousands of digits): all of
    them, each at its line. Merge keys (``<<: *anchor``) follow YAML: a key written in the mapping
    overrides the same key merged in.
    """
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        # PyYAML's context says what it expected ("expected a single document in the stream"),
        # the problem what it found ("but found another document"): one is half a sentence
        said = ", ".join(str(part) for part in (exc.context, exc.problem) if part) or str(exc)
        raise DocumentError([Problem(source, line, "", f"YAML syntax: {said}")]) from exc
    except yaml.reader.ReaderError as exc:  # a character YAML refuses; its str() is two lines, with no line number
        raise DocumentError([_refused_character(text, exc, source)]) from exc
    except yaml.YAMLError as exc:
        raise DocumentError([Problem(source, None, "", f"YAML syntax: {exc}")]) from exc
    except RecursionError:  # PyYAML's composer recurses once per level
        raise DocumentError([Problem(source, None, "", f"nested deeper than {MAX_DEPTH} levels")]) from None
    if node is None:
        return None, {}
    check_expansion(node, source)
    lines: dict[Loc, int] = {}
    problems: list[Problem] = []
    constructor = yaml.SafeLoader("")

    def scalar(n: yaml.Node, loc: Loc) -> Any:
        """The value of a scalar node; a value YAML cannot build is a problem at its line (and ``None``)."""
        try:
            return constructor.construct_object(n, deep=True)
        except yaml.constructor.ConstructorError as exc:
            message = f"YAML: {exc.problem}" if exc.problem else f"YAML: {exc}"
            if exc.problem and "constructor for the tag" in exc.problem:
                message = (f"unsupported YAML tag {_tag(n.tag)!r}: only the standard types are read (remove the tag, "
                           "or quote the value to keep it as text)")
        except ValueError as exc:  # int() of more than 4300 digits, a malformed !!int or !!timestamp
            kind = n.tag.rsplit(":", 1)[-1]
            message = ("an integer of thousands of digits, far larger than any field takes" if "digits" in str(exc)
                       else f"YAML cannot read {quote(str(n.value), 40)} as {kind}")
        problems.append(Problem(source, n.start_mark.line + 1, format_path(loc), message))
        return None

    def collection_tag(n: yaml.Node, loc: Loc) -> None:
        if n.tag not in _PLAIN_TAGS:
            problems.append(Problem(source, n.start_mark.line + 1, format_path(loc),
                                    f"unsupported YAML tag {_tag(n.tag)!r}: only plain mappings and lists are read "
                                    "(remove the tag)"))

    def mapping(n: yaml.MappingNode, loc: Loc) -> dict[Any, Any]:
        merged: dict[Any, Any] = {}
        explicit: list[tuple[yaml.Node, yaml.Node]] = []
        for key_node, value_node in n.value:
            if key_node.tag != "tag:yaml.org,2002:merge":
                explicit.append((key_node, value_node))
                continue
            sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for source_node in reversed(sources):  # the first mapping listed wins, as in YAML
                if not isinstance(source_node, yaml.MappingNode):
                    problems.append(Problem(source, source_node.start_mark.line + 1, format_path(loc),
                                            "a merge key (<<) takes a mapping or a list of mappings"))
                    continue
                merged.update(build(source_node, loc))
        lines[loc] = n.start_mark.line + 1
        out: dict[Any, Any] = {}
        for key_node, value_node in explicit:
            # only scalar keys are constructed: an alias key could stand for any structure
            key = scalar(key_node, loc) if isinstance(key_node, yaml.ScalarNode) else []
            if not isinstance(key, str | int | float | bool) and key is not None:
                problems.append(Problem(source, key_node.start_mark.line + 1, format_path(loc),
                                        "mapping keys must be plain scalars"))
                continue
            if key in out:
                problems.append(Problem(source, key_node.start_mark.line + 1, format_path((*loc, str(key))),
                                        f"duplicate key (first set on line {lines[(*loc, str(key))]})"))
                continue
            out[key] = build(value_node, (*loc, str(key)))
            # a field's problems point at its key line, not at the line its value starts on; a key
            # that is no string (``true:``) is also found under itself, as the validator reports it
            lines[(*loc, str(key))] = key_node.start_mark.line + 1
            if isinstance(key, int):  # True and 1 are one key to pydantic, and to this map
                lines[(*loc, key)] = key_node.start_mark.line + 1
        # keys written in the mapping override the merged ones (YAML merge semantics)
        return {**merged, **out}

    def build(n: yaml.Node, loc: Loc) -> Any:
        lines[loc] = n.start_mark.line + 1
        if isinstance(n, yaml.MappingNode):
            collection_tag(n, loc)
            return mapping(n, loc)
        if isinstance(n, yaml.SequenceNode):
            collection_tag(n, loc)
            return [build(item, (*loc, i)) for i, item in enumerate(n.value)]
        return scalar(n, loc)

    data = build(node, ())
    if problems:
        # a merged or aliased mapping is built once per use: say each of its problems once
        raise DocumentError(list(dict.fromkeys(problems)))
    return data, lines


def check_expansion(root: yaml.Node, source: str) -> None:
    """Refuse a node graph that expands past :data:`MAX_VALUES` values or :data:`MAX_DEPTH` levels.

    Aliases make the composed graph a DAG (or, with an alias inside its own anchor, a cycle) whose
    expansion can be exponential in the text. Sizes are counted once per distinct node, so the
    check costs as much as the text, whatever the expansion. Merge keys count like the values they
    copy, which is what flattening them costs.
    """
    sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded values, depth)
    active: set[int] = set()

    def measure(n: yaml.Node) -> tuple[int, int]:
        key = id(n)
        known = sizes.get(key)
        if known is not None:
            return known
        if key in active:
            raise DocumentError([Problem(source, n.start_mark.line + 1, "", "a YAML alias refers to itself")])
        if len(active) >= MAX_DEPTH:
            raise DocumentError([Problem(source, n.start_mark.line + 1, "", f"nested deeper than {MAX_DEPTH} levels")])
        active.add(key)
        if isinstance(n, yaml.MappingNode):
            children = [c for pair in n.value for c in pair]
        elif isinstance(n, yaml.SequenceNode):
            children = list(n.value)
        else:
            children = []
        total, depth = 1, 0
        for child in children:
            size, child_depth = measure(child)
            total += size
            depth = max(depth, child_depth + 1)
            if total > MAX_VALUES:
                raise DocumentError([Problem(source, None, "", f"expands to more than {MAX_VALUES:,} values "
                                                               "(YAML aliases repeated many times?)")])
        active.discard(key)
        sizes[key] = (total, depth)
        return total, depth

    measure(root)


def line_of(lines: dict[Loc, int], loc: Loc) -> int | None:
    """The line of ``loc``, or of its nearest ancestor that appears in the file."""
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None


def _unwrap(annotation: Any) -> list[Any]:
    """The concrete types behind Optional/Union/Annotated."""
    origin = get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return [t for a in get_args(annotation) for t in _unwrap(a)]
    return [annotation]


def allowed_fields(model: type[BaseModel], loc: Loc) -> list[str]:
    """The field names (as written in files) accepted by the mapping at ``loc`` inside ``model``."""
    current: list[Any] = [model]
    for part in loc:
        nxt: list[Any] = []
        for tp in current:
            if isinstance(tp, type) and issubclass(tp, BaseModel) and isinstance(part, str):
                for name, field in tp.model_fields.items():
                    if (field.alias or name) == part:
                        nxt.extend(_unwrap(field.annotation))
            elif get_origin(tp) in (list, tuple) and isinstance(part, int):
                nxt.extend(_unwrap(get_args(tp)[0]))
            elif get_origin(tp) is dict:
                nxt.extend(_unwrap(get_args(tp)[1]))
        current = nxt
    names: list[str] = []
    for tp in current:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            names.extend(f.alias or n for n, f in tp.model_fields.items())
    return names


def describe(error: ErrorDetails, model: type[BaseModel]) -> str:
    """A short message in our words for one pydantic error."""
    kind, ctx, loc = error["type"], error.get("ctx", {}), error["loc"]
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        allowed = allowed_fields(model, tuple(loc[:-1]))
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"unknown field{hint} (allowed: {', '.join(allowed)})" if allowed else "unknown field"
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
    if kind in bounds:
        bound = next(iter(ctx.values()))
        return f"must be {bounds[kind]} {bound}, got {error['input']!r}"
    if kind == "literal_error":
        return f"must be {ctx.get('expected')}, got {error['input']!r}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"must be a whole number, got {error['input']!r}"
    if kind == "invalid_key":
        return (f"the key {_as_written(error['input'])} is {_yaml_type(error['input'])} to YAML, not text: "
                f"quote it ('{_as_written(error['input'])}')")
    if kind == "string_type" and isinstance(error["input"], bool | int | float | datetime.date):
        # YAML types unquoted scalars: `version: 2024-01-01` is a date, `app: yes` a boolean
        return (f"must be text, got {_yaml_type(error['input'])} ({_as_written(error['input'])}): "
                f"quote it to keep it as text ('{_as_written(error['input'])}')")
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"must be a mapping (key: value), got {type(error['input']).__name__}"
    if kind in ("list_type", "tuple_type"):
        return f"must be a list, got {type(error['input']).__name__}"
    message = error["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    return message[:1].lower() + message[1:]


def validate(
    model: type[M],
    data: Any,
    lines: dict[Loc, int],
    source: str,
    *,
    error: Callable[[list[Problem]], DocumentError] = DocumentError,
) -> M:
    """Validate plain data against ``model``; every problem becomes a located :class:`Problem`."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        within = {tuple(e["loc"][:i]) for e in errors for i in range(len(e["loc"]))}
        problems = [
            Problem(source, line_of(lines, tuple(e["loc"])), *_error_place(e, model))
            for e in errors
            # a list too short only because its items are invalid: pydantic counts the valid ones
            if not (e["type"] == "too_short" and tuple(e["loc"]) in within)
        ]
        problems.sort(key=lambda p: (p.line or 0, p.path))
        raise error(problems) from exc
