"""The policy's JSON Schema and its field reference, both generated from the pydantic models.

``extender policy schema`` prints :func:`policy_json_schema` (JSON Schema 2020-12, the input a
person writes: camelCase names, sizes, bandwidths and durations as text); ``--markdown`` prints
:func:`reference_markdown`, the page ``docs/policy-reference.md``. Both are derived from
:class:`extender.core.policy.Policy` and nothing else, so they cannot drift from what
``extender policy check`` accepts field by field; ``tests/test_policy_schema.py`` fails when the
committed copies (``docs/policy.schema.json``, ``docs/policy-reference.md``) are not current.

The schema knows each field, its type, bounds and default; it does not know the checks across
fields (a profile naming an unknown node class, a parallelism no class can hold, ...), nor every
rule of the unit parsers (a size must be a whole number of bytes): ``extender policy check``
remains the authority, an editor's squiggles are help.

Defaults are given as the policy would spell them (``7GB/s``, ``1m``), through the same
serialisers as ``extender policy show``. A field's meaning is its ``Field(description=...)``, else
the ``#:`` comment above it in the model's source (read with :mod:`inspect`, which is why this
module is not in the pure core).
"""

from __future__ import annotations

import ast
import inspect
import json
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import PydanticSerializationError, SchemaError, SchemaSerializer, core_schema

from extender.core.policy import Policy

SCHEMA_ID = "https://extender.io/schemas/policy-v1alpha1.json"
DIALECT = "https://json-schema.org/draft/2020-12/schema"


class _InputSchema(GenerateJsonSchema):
    """pydantic's generator, with defaults rendered by the fields' own serialisers (``60.0`` -> ``1m``)."""

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        json_schema = super().default_schema(schema)
        if "default" in json_schema:
            try:
                serializer = SchemaSerializer(schema["schema"])
                json_schema["default"] = serializer.to_python(self.get_default_value(schema), mode="json",
                                                              by_alias=True)
            except (SchemaError, PydanticSerializationError, TypeError, ValueError):
                pass  # a model or a reference: pydantic's own encoding already used its serialiser
        return json_schema


def _models(model: type[BaseModel], seen: dict[str, type[BaseModel]] | None = None) -> dict[str, type[BaseModel]]:
    """Every model reachable from ``model``'s fields, by class name (the schema's ``$defs`` keys)."""
    seen = {} if seen is None else seen
    if model.__name__ in seen:
        return seen
    seen[model.__name__] = model
    for field in model.model_fields.values():
        for inner in _classes(field.annotation):
            _models(inner, seen)
    return seen


def _classes(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        yield from _classes(arg)


def field_comments(model: type[BaseModel]) -> dict[str, str]:
    """``{wire name: the #: comment above the field}`` over the model's classes (inherited fields too)."""
    found: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            continue
        lines = source.splitlines()
        body = ast.parse(inspect.cleandoc("\n" + source) if source.startswith(" ") else source).body[0]
        assert isinstance(body, ast.ClassDef)
        for node in body.body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            comment: list[str] = []
            row = node.lineno - 2
            while row >= 0 and lines[row].strip().startswith("#:"):
                comment.insert(0, lines[row].strip()[2:].strip())
                row -= 1
            field = model.model_fields.get(node.target.id)
            if comment and field is not None:
                found[field.alias or node.target.id] = " ".join(comment)
    return found


def _first_sentence(doc: str) -> str:
    text = " ".join(doc.split("\n\n", 1)[0].split())
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


def policy_json_schema() -> dict[str, Any]:
    """The JSON Schema of a policy file (module docstring)."""
    schema = Policy.model_json_schema(by_alias=True, mode="validation", schema_generator=_InputSchema)
    models = _models(Policy)
    for name, body in [(schema["title"], schema), *schema["$defs"].items()]:
        comments = field_comments(models[name]) if name in models else {}
        for field, prop in body.get("properties", {}).items():
            if "description" not in prop and field in comments:
                prop["description"] = comments[field]
            elif "description" not in prop:
                refs = list(dict.fromkeys(_refs(prop)))
                if len(refs) == 1 and refs[0] in models and models[refs[0]].__doc__:
                    prop["description"] = _first_sentence(models[refs[0]].__doc__ or "")
    return {"$schema": DIALECT, "$id": SCHEMA_ID, **schema}


def schema_text() -> str:
    """:func:`policy_json_schema` as the committed file holds it (indented, newline at the end)."""
    return json.dumps(policy_json_schema(), indent=2, ensure_ascii=False) + "\n"


# ---- the reference page ----------------------------------------------------------------------------

UNITS = """\
## Units

* **size**: bytes. Decimal prefixes are powers of 1000 (`kB`, `MB`, `GB`, `TB`, `PB`), binary
  prefixes powers of 1024 (`KiB` .. `PiB`, or Kubernetes' `Ki` .. `Pi`); a plain number is bytes;
  a bare `64G` is refused as ambiguous. Examples: `64GiB`, `3.9GB`, `512Mi`, `1e12`.
* **bandwidth**: bits per second (`Mbps`, `Gbps`, `Gbit/s`) or bytes per second (`MB/s`, `GB/s`,
  `GiB/s`); a plain number and `GBps` are refused. Examples: `40Gbps`, `7GB/s`. Sizes and
  bandwidths take an exponent as JSON does (`1e12`, `3.2e3Gbps`).
* **duration**: `ms`, `s`, `m`/`min`, `h`, `d` and compounds; a plain number is seconds; `5M` is
  refused; at most `365d` in a policy. Examples: `53s`, `5m`, `1h30m`, `250ms`.
* **quantity**: a Kubernetes resource quantity, as the API server reads it: `100m`, `2`, `4Gi`,
  `4G` (a plain number is accepted, as in a pod spec; `4GB` is not a quantity).
* **numbers**: NaN and infinity (`.nan`, `.inf`) are refused everywhere, and so is a boolean where a
  number is expected: YAML reads unquoted `yes`, `no`, `on`, `off`, `true` and `false` as booleans.
  A plain number is at most 10^15 in size, a size at most `1024PiB`, a bandwidth at most `1PB/s`
  and, unless 0, at least `0.001B/s`.
"""


def _anchor(name: str) -> str:
    return name.lower()


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _bounds(schema: dict[str, Any]) -> list[str]:
    words = []
    for key, sign in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<")):
        if key in schema:
            words.append(f"{sign} {schema[key]}")
    if "minLength" in schema and schema["minLength"] > 0:
        words.append("not empty" if schema["minLength"] == 1 else f"at least {schema['minLength']} characters")
    if "minItems" in schema:
        words.append(f"at least {schema['minItems']} item(s)")
    return words


def type_text(schema: dict[str, Any]) -> str:
    """How the reference names a schema's type: ``size``, ``list of [NodeClass](#nodeclass)``, ``integer >= 1``."""
    if "x-unit" in schema:
        return f"[{schema['x-unit']}](#units)"
    if "$ref" in schema:
        name = _ref_name(schema["$ref"])
        return f"[{name}](#{_anchor(name)})"
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    if "enum" in schema:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    if "anyOf" in schema:
        parts = [type_text(s) for s in schema["anyOf"] if s.get("type") != "null"]
        return " or ".join(dict.fromkeys(parts))
    kind = schema.get("type")
    if kind == "array":
        items = schema.get("items") or {}
        text = f"list of {type_text(items)}" if items else "list"
    elif kind == "object":
        values = schema.get("additionalProperties")
        text = f"map of string to {type_text(values)}" if isinstance(values, dict) else "object"
    else:
        text = str(kind or "any")
    bounds = _bounds(schema)
    return ", ".join([text, *bounds])


def _markdown(text: str) -> str:
    """Docstring prose as markdown: ``code`` becomes `code`."""
    return text.replace("``", "`")


def _cell(text: str) -> str:
    return _markdown(" ".join(text.split())).replace("|", "\\|")


def _default_text(schema: dict[str, Any], required: bool) -> str:
    if required:
        return "required"
    if "default" not in schema:
        return ""
    value = schema["default"]
    if value is None:
        return "unset"
    if isinstance(value, dict) and value and any(_refs(schema)):  # a section's defaults are listed there
        return "see its section"
    return f"`{json.dumps(value, ensure_ascii=False)}`"


def _order(schema: dict[str, Any]) -> Iterator[str]:
    """The models' names, the root first, then breadth first in the order their fields name them."""
    defs = schema["$defs"]
    queue, seen = [schema["title"]], {schema["title"]}
    while queue:
        name = queue.pop(0)
        yield name
        body = schema if name == schema["title"] else defs[name]
        for prop in body.get("properties", {}).values():
            for ref in _refs(prop):
                if ref not in seen:
                    seen.add(ref)
                    queue.append(ref)


def _refs(schema: Any) -> Iterator[str]:
    if isinstance(schema, dict):
        if "$ref" in schema:
            yield _ref_name(schema["$ref"])
        for value in schema.values():
            yield from _refs(value)
    elif isinstance(schema, list):
        for value in schema:
            yield from _refs(value)


def reference_markdown() -> str:
    """``docs/policy-reference.md``: every section of a policy, every field with type, default and meaning."""
    schema = policy_json_schema()
    defs = schema["$defs"]
    lines = [
        "# Policy reference",
        "",
        "Every field of a policy file, generated from the models that validate it "
        "(`extender/core/policy.py`) by `extender policy schema --markdown`; "
        "`tests/test_policy_schema.py` fails when this page is not current. The same models give the "
        "JSON Schema (`extender policy schema`, committed as [policy.schema.json](policy.schema.json)) "
        "for editors: see [Editors](#editors). Checks across fields (a profile naming an unknown node "
        "class, ...) are described in the sections' text; `extender policy check` applies them all.",
        "",
        "## Editors",
        "",
        "Editors with the YAML language server (VS Code's YAML extension, Neovim, Helix, ...) "
        "complete and check a policy against the schema when the file's first line names it:",
        "",
        "```yaml",
        "# yaml-language-server: $schema=https://example.invalid/policy.schema.json",
        "```",
        "",
        "with the schema's path or URL after `$schema=`: a path is relative to the policy file (the "
        "example policies in `policies/` use `../docs/policy.schema.json`). Write a copy with "
        "`extender policy schema > policy.schema.json`.",
        "",
        UNITS,
    ]
    for name in _order(schema):
        body = schema if name == schema["title"] else defs[name]
        lines += [f"## {name}", ""]
        if body.get("description"):
            lines += [_markdown(body["description"]), ""]
        required = set(body.get("required", ()))
        props = body.get("properties", {})
        if not props:
            continue
        lines += ["| field | type | default | meaning |", "|---|---|---|---|"]
        for field, prop in props.items():
            meaning = _cell(prop.get("description", ""))
            lines.append(f"| `{field}` | {type_text(prop)} | {_default_text(prop, field in required)} | {meaning} |")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"
