"""Quoting a caller's string in a message, cut short (extender.core.quoting)."""

from __future__ import annotations

import pytest

from extender.core.quoting import clip, quote

#: (text, limit, clip's result, quote's result)
ROWS = [
    pytest.param("", 3, "", "''", id="empty"),
    pytest.param("abc", 3, "abc", "'abc'", id="exactly-the-limit"),
    pytest.param("abcd", 3, "abc... (+1 more characters)", "'abc' (+1 more characters)", id="one-over"),
    pytest.param("a\nb'c", 2, "a\n... (+3 more characters)", "'a\\n' (+3 more characters)", id="quote-escapes"),
    pytest.param("x" * 3_000_000, 100, "x" * 100 + "... (+2999900 more characters)",
                 repr("x" * 100) + " (+2999900 more characters)", id="three-million"),
]


@pytest.mark.parametrize(("text", "limit", "clipped", "quoted"), ROWS)
def test_what_is_left_out_is_counted(text: str, limit: int, clipped: str, quoted: str) -> None:
    assert (clip(text, limit), quote(text, limit)) == (clipped, quoted)
