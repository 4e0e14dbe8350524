"""The wire encoders' escaping shortcut, against the regular expression and ``json`` as oracles; the
decoder's messages for bodies it refuses."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.api.scheduler.wire import (
    _NEEDS_ESCAPE,
    BadRequestError,
    encode_names,
    encode_uniform_priorities,
    parse_args,
    plain,
)

#: Text that reaches every branch: ASCII with control characters, quotes and backslashes, and beyond.
names = st.lists(st.text(alphabet=st.characters(max_codepoint=0x3000, exclude_categories=["Cs"]), max_size=12),
                 max_size=6)


@given(names)
def test_plain_agrees_with_the_regular_expression(values: list[str]) -> None:
    assert plain(values) == (_NEEDS_ESCAPE.search("".join(values)) is None)


@given(names)
def test_encoded_names_decode_to_the_names(values: list[str]) -> None:
    assert json.loads(encode_names(values)) == values
    assert json.loads(encode_uniform_priorities(values, 3)) == [{"Host": v, "Score": 3} for v in values]


@pytest.mark.parametrize(("value", "expected"), [
    pytest.param("ip-10-0-1-2.us-west-2.compute.internal", True, id="a-real-node-name"),
    pytest.param("", True, id="empty"),
    pytest.param("a\x00b", False, id="nul"),
    pytest.param("a\x1fb", False, id="unit-separator"),
    pytest.param("a\x7fb", False, id="delete"),
    pytest.param('a"b', False, id="quote"),
    pytest.param("a\\b", False, id="backslash"),
    pytest.param("a\x80b", True, id="c1-control-needs-no-json-escape"),
    pytest.param("nœud", True, id="non-ascii-printable"),
])
def test_plain_edge_cases(value: str, expected: bool) -> None:
    assert plain([value]) is expected


ESCAPING = [
    pytest.param(["a", 'b","Score":3},{"Host":"c'], id="a-name-holding-the-separator"),
    pytest.param(['"'], id="a-lone-quote"),
    pytest.param(["a\\", "b"], id="a-trailing-backslash"),
    pytest.param(["a\nb"], id="a-newline"),
    pytest.param(["nœud", "b"], id="non-ascii"),
    pytest.param(["x"] * 3, id="plain"),
]


@pytest.mark.parametrize("names", ESCAPING)
def test_the_encoders_escape_whatever_needs_it(names: list[str]) -> None:
    # no hint: the encoder checks the joined text; with the right hint it takes the caller's word
    for hint in (None, plain(names)):
        assert json.loads(encode_names(names, hint)) == names
        assert json.loads(encode_uniform_priorities(names, 0, hint)) == [{"Host": n, "Score": 0} for n in names]


def _nodes(*items: object) -> bytes:
    return json.dumps({"Pod": {}, "Nodes": {"items": list(items)}}).encode()


GOOD = {"metadata": {"name": "a"}}

#: A refused body's message names where the problem is (an index) and the JSON type found, never a
#: Python type name; each row's words were missing before (a name of the wrong type read as no name).
REFUSED = [
    pytest.param(_nodes(GOOD, GOOD, GOOD, {"metadata": {"name": 5}}),
                 "Nodes.items[3].metadata.name must be a non-empty string, got number", id="name-is-a-number"),
    pytest.param(_nodes({"metadata": {"name": ""}}), "Nodes.items[0].metadata.name must be a non-empty string, "
                 "got an empty string", id="name-is-empty"),
    pytest.param(_nodes(GOOD, {"metadata": {}}), "Nodes.items[1] has no metadata.name", id="name-missing"),
    pytest.param(_nodes(GOOD, {}), "Nodes.items[1] has no metadata.name", id="metadata-missing"),
    pytest.param(_nodes({"metadata": ["a"]}), "Nodes.items[0].metadata must be an object, got array",
                 id="metadata-is-an-array"),
    pytest.param(_nodes(GOOD, "b"), "Nodes.items[1] is string", id="item-is-a-string"),
    pytest.param(json.dumps({"Pod": {}, "Nodes": {"items": 7}}).encode(), "Nodes.items is number, not an array",
                 id="items-is-a-number"),
    pytest.param(json.dumps({"Pod": {}, "Nodes": "abc"}).encode(), "whose items are Node objects, got string",
                 id="nodes-is-a-string"),
    pytest.param(json.dumps({"Pod": {}, "NodeNames": ["a", None]}).encode(), "NodeNames[1] is null",
                 id="a-null-name"),
    pytest.param(json.dumps({"Pod": {}, "NodeNames": ["a", "b", True]}).encode(), "NodeNames[2] is boolean",
                 id="a-boolean-name"),
    pytest.param(json.dumps({"Pod": {}, "NodeNames": {"a": 1}}).encode(), "array of strings, got object",
                 id="names-is-an-object"),
    pytest.param(b"null", "got null", id="body-null"),
    pytest.param(b"[]", "got array", id="body-array"),
    pytest.param(b'"x"', "got string", id="body-string"),
    pytest.param(b"5.5", "got number", id="body-number"),
    pytest.param(b"false", "got boolean", id="body-boolean"),
]


@pytest.mark.parametrize(("body", "words"), REFUSED)
def test_a_refused_body_says_where_and_what_json_type(body: bytes, words: str) -> None:
    with pytest.raises(BadRequestError) as refused:
        parse_args(body)
    assert words in str(refused.value)
