"""The wire encoders' escaping shortcut, against the regular expression and ``json`` as oracles."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.api.scheduler.wire import _NEEDS_ESCAPE, encode_names, encode_uniform_priorities, plain

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
