"""Just enough of the POSIX shell's lexer to put values into a script safely: which argument of a
command a shell parses as a script (``sh -c SCRIPT``), the quoting state at a point of a script
(outside quotes, in ``'...'``, in ``"..."``, in a ``#`` comment), and where a here-document starts.

The warm Job templates use it twice: the policy check refuses what cannot be rendered safely
(:func:`extender.core.policy.script_problem`), and :func:`extender.warm.templates.render_script`
quotes each placeholder for the state it stands in. Pure (no I/O).
"""

from __future__ import annotations

import re

#: Programs whose ``-c`` argument is a shell script (by the basename of the program).
SHELLS = frozenset({"sh", "bash", "dash", "ash", "ksh", "mksh", "zsh", "busybox"})
#: A short-option cluster that includes ``c`` (``-c``, ``-ec``, ``-lc``): the next argument is the script.
_SCRIPT_FLAG = re.compile(r"-[A-Za-z]*c[A-Za-z]*")
#: Characters after which a ``#`` starts a comment (besides whitespace): the shell's operators.
_OPERATORS = frozenset(";&|()<>")


def script_positions(argv: list[str]) -> set[int]:
    """Indexes of ``argv`` that a shell will parse as a script (after ``-c``, once a shell was named)."""
    for i, word in enumerate(argv):
        if word.rpartition("/")[2] in SHELLS:
            for j in range(i + 1, len(argv) - 1):
                if _SCRIPT_FLAG.fullmatch(argv[j]):
                    return {j + 1}
            return set()
    return set()


def _shell_walk(text: str, state: str, *, word_start: bool) -> tuple[str, int | None]:
    """The POSIX shell quoting state after ``text`` (``""``, ``"'"``, ``'"'`` or ``"#"`` in a comment),
    starting from ``state``, and where the first here-document operator outside quotes is (or ``None``).

    Inside an arithmetic expansion ``$(( ... ))`` (``arith`` counts its open parentheses) ``<<`` is a
    shift and ``#`` no comment."""
    heredoc: int | None = None
    arith = 0
    i = 0
    while i < len(text):
        c = text[i]
        if state in ("", '"') and text.startswith("$((", i):
            arith += 2
            i += 3
            continue
        if arith and state in ("", "\"") and c in "()":
            arith += 1 if c == "(" else -1
        elif arith and state == "" and c in "<#":
            pass
        elif state == "#":
            if c == "\n":
                state = ""
        elif state == "'":
            if c == "'":
                state = ""
        elif c == "\\":
            i += 1  # the next character is escaped (outside quotes and inside double quotes)
        elif state == '"':
            if c == '"':
                state = ""
        elif c in "'\"":
            state = c
        elif c == "#" and (word_start if i == 0 else (text[i - 1].isspace() or text[i - 1] in _OPERATORS)):
            state = "#"
        elif c == "<" and text.startswith("<<", i) and not text.startswith("<<<", i) and heredoc is None \
                and (i == 0 or text[i - 1] != "<"):
            heredoc = i
        i += 1
    return state, heredoc


def heredoc_at(script: str) -> int | None:
    """Where the first here-document operator (``<<``, not ``<<<``) outside quotes and comments is
    in ``script``, or ``None``."""
    return _shell_walk(script, "", word_start=True)[1]


def quote_state(text: str, state: str = "", *, word_start: bool = True) -> str:
    """The POSIX shell quoting state after ``text``, starting from ``state``: ``""`` (outside quotes),
    ``"'"``, ``'"'`` or ``"#"`` (in a comment, which quotes do not open or close). ``word_start``:
    ``text`` begins a word (a ``#`` there starts a comment)."""
    return _shell_walk(text, state, word_start=word_start)[0]
