"""``extender policy schema``: the JSON Schema and the field reference, both from the policy's models.

The committed copies (``docs/policy.schema.json``, ``docs/policy-reference.md``) must equal what
the command prints now; every example policy must validate against the schema (with the
``jsonschema`` library, as an editor would), and typical mistakes must not; the unit patterns
must agree with the unit parsers on a table of spellings; every field must have a meaning.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from extender import cli
from extender.core.errors import UnitError
from extender.core.units import (
    BANDWIDTH_PATTERN,
    DURATION_PATTERN,
    QUANTITY_PATTERN,
    SIZE_PATTERN,
    parse_bandwidth,
    parse_bytes,
    parse_duration,
    parse_quantity,
)
from extender.policy_schema import policy_json_schema, reference_markdown, schema_text

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
POLICY_FILES = [*sorted((ROOT / "policies").glob("*.yaml")), ROOT / "scenarios" / "mixed-fleet-policy.yaml"]
REGENERATE = ("regenerate with: extender policy schema > docs/policy.schema.json && "
              "extender policy schema --markdown > docs/policy-reference.md")


@functools.cache
def validator() -> jsonschema.Draft202012Validator:
    schema = policy_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_committed_schema_is_current() -> None:
    assert (DOCS / "policy.schema.json").read_text() == schema_text(), REGENERATE


def test_the_committed_reference_is_current() -> None:
    assert (DOCS / "policy-reference.md").read_text() == reference_markdown(), REGENERATE


def test_the_command_prints_both(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["policy", "schema"]) == 0
    assert json.loads(capsys.readouterr().out) == policy_json_schema()
    assert cli.main(["policy", "schema", "--markdown"]) == 0
    assert capsys.readouterr().out == reference_markdown()


@pytest.mark.parametrize("path", POLICY_FILES, ids=[p.name for p in POLICY_FILES])
def test_every_example_policy_validates_and_names_the_schema(path: Path) -> None:
    text = path.read_text()
    errors = [e.message for e in validator().iter_errors(yaml.safe_load(text))]
    assert not errors
    assert text.splitlines()[0] == "# yaml-language-server: $schema=../docs/policy.schema.json"


BASE = (ROOT / "policies" / "g5-pcie-fleet.yaml").read_text()


@dataclass(frozen=True)
class Mistake:
    id: str
    old: str
    new: str


MISTAKES = [
    Mistake("bytes per second spelled GBps", "readBandwidth: 7GB/s", "readBandwidth: 7GBps"),
    Mistake("ambiguous size", "capacity: 3800GB", "capacity: 3800G"),
    Mistake("minutes or months", "kind: Policy", "kind: Policy\nscaling: {tick: 5M}"),
    Mistake("a typo in a field name", "kind: Policy", "kind: Policy\nscorring: {}"),
    Mistake("wrong kind", "kind: Policy", "kind: Scenario"),
    Mistake("a bandwidth without a unit", "readBandwidth: 7GB/s", "readBandwidth: 7000"),
    Mistake("an unknown forecaster", "kind: Policy", "kind: Policy\nscaling: {forecaster: prophet}"),
    Mistake("a quantity that is no quantity", "kind: Policy",
            "kind: Policy\nwarming: {resources: {limits: {cpu: lots}}}"),
    Mistake("a size spelled GB in a quantity", "kind: Policy",
            "kind: Policy\nwarming: {resources: {limits: {memory: 4GB}}}"),
]


@pytest.mark.parametrize("case", MISTAKES, ids=[m.id for m in MISTAKES])
def test_the_schema_catches_mistakes(case: Mistake) -> None:
    assert case.old in BASE
    doc = yaml.safe_load(BASE.replace(case.old, case.new, 1))
    assert list(validator().iter_errors(doc)), f"{case.id}: the schema accepted it"


@dataclass(frozen=True)
class Spelling:
    id: str
    pattern: str
    parse: Any
    text: str


SPELLINGS = [
    *(Spelling(f"size {t}", SIZE_PATTERN, parse_bytes, t)
      for t in ["64GiB", "64Gi", "3.9GB", "512", "1_000kB", " 8 TB ", ".5KiB", "64G", "64Gb", "7GB/s", "x", "-1B",
                "1e12", "1.5E+9", "2e3GiB", "1e", "1e1234", "e3"]),
    *(Spelling(f"bandwidth {t}", BANDWIDTH_PATTERN, parse_bandwidth, t)
      for t in ["40Gbps", "7GB/s", "1GiB/s", "100Mbit/s", "5bps", "7GBps", "7000", "7 Gb", "1Gib/s", "4e1Gbps",
                "1e3"]),
    *(Spelling(f"duration {t}", DURATION_PATTERN, parse_duration, t)
      for t in ["53s", "5m", "1h30m", "250ms", "2min", "1d", "15", "0.5", "1h 30m", "5M", "soon", "1.5.2s", "-3s"]),
    *(Spelling(f"quantity {t}", QUANTITY_PATTERN, parse_quantity, t)
      for t in ["100m", "2", "4Gi", "4G", "1.5", ".5", "2.", "1e3", "5E-2", "3u", "lots", "4GB", "1K", "1ki", "-1",
                " 2", "0.1.2", ""]),
]


@pytest.mark.parametrize("case", SPELLINGS, ids=[s.id for s in SPELLINGS])
def test_unit_patterns_agree_with_the_parsers(case: Spelling) -> None:
    try:
        case.parse(case.text)
        parsed = True
    except UnitError:
        parsed = False
    assert bool(re.match(case.pattern, case.text)) == parsed


def test_every_field_has_a_meaning_and_defaults_read_as_written() -> None:
    schema = policy_json_schema()
    for name, body in [("Policy", schema), *schema["$defs"].items()]:
        for field, prop in body.get("properties", {}).items():
            assert prop.get("description"), f"{name}.{field} has no description (Field(description=) or #:)"
    scaling = schema["$defs"]["Scaling"]["properties"]
    assert (scaling["tick"]["default"], scaling["season"]["default"]) == ("15s", "1d")
    assert schema["$defs"]["Nvme"]["properties"]["readBandwidth"]["default"] == "7GB/s"


def test_a_default_is_shown_unless_its_section_lists_it() -> None:
    # a map's default (a warm Job's requests and limits) read "see its section", and no section gave it
    reference = reference_markdown()
    for row in (line for line in reference.splitlines() if "| see its section |" in line):
        assert "](#" in row.split("|")[2] and "](#units)" not in row.split("|")[2], row
    assert '| `{"cpu": "100m", "memory": "256Mi"}` |' in reference
