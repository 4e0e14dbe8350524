"""``extender explain --pod FILE``: the Pod file is read as a policy file is, each problem one line at its line."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest

from extender.api.scheduler.commands import _read_pod
from extender.core.errors import DocumentError


class Case(NamedTuple):
    id: str
    text: str
    problem: str  # the one problem, as printed


CASES = [
    Case("yaml-unclosed-list", "kind: Pod\nmetadata:\n  name: [x\n",
         "pod:4: YAML syntax: while parsing a flow sequence, expected ',' or ']', but got '<stream end>'"),
    Case("json-unclosed-object", '{"kind": "Pod",\n "metadata": {"name": "a"}\n',
         "pod:3: YAML syntax: while parsing a flow mapping, expected ',' or '}', but got '<stream end>'"),
    Case("duplicate-key", "kind: Pod\nkind: Pod\n", "pod:2: kind: duplicate key (first set on line 1)"),
    Case("two-documents", "kind: Pod\n---\nkind: Pod\n",
         "pod:2: YAML syntax: expected a single document in the stream, but found another document"),
    Case("a-list", "- kind: Pod\n", "pod:1: a Pod must be an object with metadata and spec"),
    Case("empty", "", "pod:1: a Pod must be an object with metadata and spec"),
    Case("a-deployment", "kind: Deployment\n", "pod:1: kind: expected a Pod, got 'Deployment'"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_bad_pod_file_is_one_line_per_problem(case: Case, tmp_path: Path) -> None:
    path = tmp_path / "pod"
    path.write_text(case.text)
    with pytest.raises(DocumentError) as err:
        _read_pod(str(path))
    assert [str(p).replace(str(path), "pod") for p in err.value.problems] == [case.problem]


@pytest.mark.parametrize("text", ['{"kind": "Pod", "metadata": {"name": "a"}}', "metadata: {name: a}\n"],
                         ids=["json", "yaml-without-kind"])
def test_a_pod_file_is_json_or_yaml(text: str, tmp_path: Path) -> None:
    path = tmp_path / "pod"
    path.write_text(text)
    assert _read_pod(str(path))["metadata"] == {"name": "a"}
