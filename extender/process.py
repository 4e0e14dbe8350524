"""Process plumbing shared by the commands: signals, and the one log format of every command.

Logs go to stderr, one record per line, in one of two formats chosen with ``--log-format``:

``text`` (the default, for people)::

    2026-05-04T10:00:00.123Z INFO [4242] extender.agent.loop: inventory store is back node=gpu-a

``json`` (for log pipelines): one JSON object per line with ``time`` (ISO 8601, UTC, milliseconds),
``level``, ``logger``, ``message``, ``pid``, then every structured field the call gave with
``extra=`` (``node``, ``workload``, ``decision``, ...), and ``exc_info`` with the traceback when
there is one. A traceback in text is several lines, indented below its record; in JSON it stays
inside one string. In text, control characters are escaped and a line that does not start with a
blank always starts a record (:func:`one_record`), whatever the values a message quotes.

The JSON lines are written by python-json-logger (a maintained formatter on stdlib logging: it
tells a record's own attributes from the fields a call added, and encodes dates, exceptions and
dataclasses); the text lines by a small :class:`logging.Formatter` that uses the same notion of
"structured field". gunicorn's error and access logs are routed into the same handler
(:mod:`extender.api.launcher`), so ``extender serve`` and ``extender scale`` write one format too.

What a short command reports to the person who ran it (``extender policy check``'s problems,
``extender: <error>``) goes through the ``extender.cli`` logger: as the bare message in text (a
compiler-style ``file:line: message`` line, no timestamp), as a JSON object like any other record
with ``--log-format json``. So with JSON every line on stderr is a JSON object, from every command.
"""

from __future__ import annotations

import json
import logging
import math
import re
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from types import FrameType
from typing import Any, TextIO

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter

from extender.core.errors import DocumentError, InvalidValueError

#: ``--log-level`` choices, lowest first.
LOG_LEVELS = ("debug", "info", "warning", "error")
#: ``--log-format`` choices.
LOG_FORMATS = ("text", "json")
#: Logger of what a command reports to its user (module docstring).
CLI_LOGGER = "extender.cli"

#: Attributes of a LogRecord that are not fields a call added (the library's list, plus
#: ``taskName``, which Python 3.12 adds and the library lists only when it runs there).
_RESERVED = frozenset(RESERVED_ATTRS) | {"taskName"}


@contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """Set ``stop`` on SIGTERM/SIGINT while the block runs (main thread only), then restore the handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, handle) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


# ---- formats -----------------------------------------------------------------------------------------


def record_time(record: logging.LogRecord) -> str:
    """``2026-05-04T10:00:00.123Z``: the record's creation time in UTC, to the millisecond."""
    return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields a log call added with ``extra=`` (``node``, ``workload``, ...), in call order."""
    return {k: v for k, v in record.__dict__.items() if k not in _RESERVED and not k.startswith("_")}


#: Characters a terminal or a log reader may act on: C0 and C1 controls (ESC starts a terminal escape
#: sequence, CR returns to the start of the line), and the Unicode line and paragraph separators.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")
#: A line break followed by a character that is not blank: the start of a line that would read as a record.
#: Blank is ASCII (space, tab, and the line breaks): a collector joins a record's lines by a leading
#: ``\s`` of Go's or Ruby's regexes, which is ASCII, so a line led by a no-break or ideographic space
#: starts a record for it, and gets indented like any other.
_UNINDENTED = re.compile(r"\n(?=[^\s])", re.ASCII)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return "\\r" if code == 0x0D else f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """``text`` with every control character (:data:`_CONTROL`) written as its escape (``\\x1b``, ``\\r``);
    line feeds and tabs are kept."""
    return _CONTROL.sub(_escape, text)


def one_record(text: str) -> str:
    """A text log record as written: control characters escaped, and every line after the first
    indented (two spaces where it does not start with an ASCII blank already: a space or a tab).

    Messages quote names that others choose (directories a serving pod created in a shared cache,
    what a scraped pod answered, a policy's values): a line feed in one must not start a line that
    reads as a record of its own (``2026-... ERROR ...``), nor an escape sequence rewrite the
    reader's terminal. So in ``text`` a line that does not start with a blank is always the start
    of a record, which is also the rule log collectors use to join a record's lines (a traceback's
    first and last lines are indented too)."""
    return _UNINDENTED.sub("\n  ", escape_controls(text))


def _text_value(value: Any) -> str:
    if isinstance(value, str) and value and not any(c.isspace() or c in '"=' for c in value) \
            and not _CONTROL.search(value):
        return value
    if isinstance(value, bool | int | float) or value is None:
        return json.dumps(value)
    if not isinstance(value, str):
        try:
            return json.dumps(value, separators=(",", ":"), default=str)
        except ValueError:  # a circular structure
            return json.dumps(str(value))
    return json.dumps(value)


class TextFormatter(logging.Formatter):
    """``<time> <LEVEL> [<pid>] <logger>: <message> key=value ...`` (values with spaces, quotes or control
    characters quoted as JSON strings), then the traceback; written by :func:`one_record`."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        line = f"{record_time(record)} {record.levelname} [{record.process}] {record.name}: {message}"
        extra = fields(record)
        if extra:
            line += " " + " ".join(f"{k}={_text_value(v)}" for k, v in extra.items())
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line += "\n" + record.exc_text
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return one_record(line)


class MessageFormatter(logging.Formatter):
    """The message alone: what a command tells its user in text (its fields are for machines), written
    as :func:`one_record` writes a log record: control characters escaped and every further line
    indented, so a line feed in a quoted name (a file's, a workload's) cannot start a line at the margin."""

    def format(self, record: logging.LogRecord) -> str:
        return one_record(record.getMessage())


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: such a float becomes its name as a string (``"nan"``, ``"inf"``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


class JsonLineFormatter(JsonFormatter):
    """One JSON object per record: ``time``, ``level``, ``logger``, ``message``, ``pid``, then the fields."""

    def __init__(self) -> None:
        super().__init__(
            ["levelname", "name", "message", "process"],
            rename_fields={"levelname": "level", "name": "logger", "process": "pid"},
            reserved_attrs=sorted(_RESERVED),
            json_ensure_ascii=False,
        )

    def add_fields(self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]) -> None:
        log_data["time"] = record_time(record)
        super().add_fields(log_data, record, message_dict)

    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        return {k: _finite(v) for k, v in log_data.items()}


def formatter(log_format: str) -> logging.Formatter:
    """The formatter of ``--log-format`` (``text`` or ``json``)."""
    if log_format == "json":
        return JsonLineFormatter()
    if log_format == "text":
        return TextFormatter()
    raise InvalidValueError(f"unknown log format {log_format!r} (known: {', '.join(LOG_FORMATS)})")


# ---- setup -------------------------------------------------------------------------------------------


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at each record (a test that swaps it sees the lines)."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


_ours = "_extender_handler"  # attribute marking the handlers this module installed


def installed_here(handler: logging.Handler) -> bool:
    """Whether :func:`setup_logging` installed ``handler`` (it replaces those, and only those)."""
    return bool(getattr(handler, _ours, False))


def _install(logger: logging.Logger, handler: logging.Handler) -> None:
    for old in [h for h in logger.handlers if installed_here(h)]:
        logger.removeHandler(old)
    setattr(handler, _ours, True)
    logger.addHandler(handler)


def setup_logging(level: str = "info", log_format: str = "text") -> None:
    """Send every log record to stderr at ``level`` and above, in ``log_format`` (module docstring).

    Replaces what an earlier call installed (and nothing else: a test harness's handlers stay).
    """
    if level not in LOG_LEVELS:
        raise InvalidValueError(f"unknown log level {level!r} (known: {', '.join(LOG_LEVELS)})")
    handler = _StderrHandler()
    handler.setFormatter(formatter(log_format))
    root = logging.getLogger()
    _install(root, handler)
    root.setLevel(level.upper())
    # the command's own report to its user: the bare message in text, a JSON record in json
    cli = logging.getLogger(CLI_LOGGER)
    user = _StderrHandler()
    user.setFormatter(MessageFormatter() if log_format == "text" else handler.formatter)
    _install(cli, user)
    cli.propagate = False
    _current.update(level=level, format=log_format)


#: What :func:`setup_logging` set last (``gunicorn`` reads it to log the same way).
_current: dict[str, str] = {}


def current_logging() -> tuple[str, str]:
    """``(level, format)`` as last set up; ``("info", "text")`` if logging was never set up here."""
    return _current.get("level", "info"), _current.get("format", "text")


def configure_logging() -> None:
    """The default setup (INFO, text) unless :func:`setup_logging` ran already (the command line does)."""
    if not _current:
        setup_logging()


def report(message: str, *, level: int = logging.ERROR, always: bool = False, **extra: Any) -> None:
    """Tell the person who ran the command ``message`` (stderr; a JSON record with ``--log-format json``).

    ``always``: written whatever ``--log-level`` says, for what the person asked for by a flag
    (``extender cachekey -v``), which the text format prints whatever the level too."""
    if not _current:
        setup_logging()
    logger = logging.getLogger(CLI_LOGGER)
    if always and not logger.isEnabledFor(level):
        logger.handle(logger.makeRecord(logger.name, level, "(report)", 0, message, (), None, extra=extra))
    else:
        logger.log(level, message, extra=extra)


def report_problems(exc: DocumentError) -> None:
    """Every problem of a document, one line each (``file:line: path: message``; in JSON with its parts too)."""
    for problem in exc.problems:
        report(str(problem), file=problem.source, line=problem.line, path=problem.path, problem=problem.message)
