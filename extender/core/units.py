"""Human units: one exact parser for sizes, bandwidths and durations, and its inverse.

People type numbers into policy files the way they say them: ``64GiB``, ``3.9GB``, ``40Gbps``,
``7GB/s``, ``53s``, ``5m``. Internally everything is SI base units: bytes (int), bytes per second
(float), seconds (float).

Rules (each exists because the other reading is a real, costly mistake):

* In sizes and bandwidths a number may carry an exponent, as in JSON and Kubernetes quantities:
  ``1e12`` is a size of 10^12 bytes, ``1.5e3GB/s`` a bandwidth (YAML reads an unquoted ``1e12`` as
  text, not a number).
* Sizes are bytes. Decimal prefixes are powers of 1000 (``kB``/``KB``, ``MB``, ``GB``, ``TB``,
  ``PB``); binary prefixes are powers of 1024 (``KiB`` .. ``PiB``, or the Kubernetes quantity
  spellings ``Ki`` .. ``Pi``). A bare prefix (``64G``) is rejected: it is 8% away from ``64Gi``,
  which is the size of a shard file. A plain number is bytes.
* Bandwidth is either bits per second (``Gbps``, ``Gbit/s``: network links are sold in bits) or
  bytes per second (``GB/s``, ``GiB/s``: disks and loaders report bytes). ``GBps`` and a plain
  number are rejected: one capital letter would change the value eightfold.
* Durations: ``ms``, ``s``, ``m``/``min``, ``h``, ``d``, and compounds such as ``1h30m``. A plain
  number is seconds. ``M`` (minutes or months?) is rejected.
* Arithmetic is exact (:class:`decimal.Decimal`): ``3.9GB`` is 3,900,000,000 bytes, not a float
  that rounds. A size that is not a whole number of bytes is an error.
* Negative quantities are rejected everywhere; zero is allowed (schemas add ``> 0`` where needed).
* So are NaN, infinity and values past :data:`MAX_BYTES`, :data:`MAX_BANDWIDTH` and
  :data:`MAX_DURATION_S`: ``.inf`` or a 5000-digit number is a typo, and it broke arithmetic
  (``int(inf)``) far from the file that held it. A rate above zero but below
  :data:`MIN_BANDWIDTH` (0.001 bytes per second) is refused for the same reason: ``1e-300B/s``
  made every download it timed last forever (``size / rate`` overflowed to infinity), so startup
  estimates and the horizons built on them were no longer numbers.

``format_bytes``/``format_bandwidth``/``format_duration`` render a value back to the shortest
spelling that parses to exactly the same value, so ``extender policy show`` output reads like a
hand-written file and round-trips.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, TypeVar

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

from extender.core.errors import UnitError
from extender.core.quoting import quote

_DECIMAL = {"k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}

#: size suffix -> bytes
SIZE_UNITS: dict[str, int] = {"B": 1}
SIZE_UNITS.update({f"{p}B": f for p, f in _DECIMAL.items()})
SIZE_UNITS.update({f"{p}B": f for p, f in _BINARY.items()})
SIZE_UNITS.update(_BINARY)  # Kubernetes quantity spelling: 64Gi

#: bandwidth suffix -> bytes per second (as an exact Decimal)
BANDWIDTH_UNITS: dict[str, Decimal] = {"B/s": Decimal(1), "bps": Decimal(1) / 8, "bit/s": Decimal(1) / 8}
for _p, _f in {**_DECIMAL, **_BINARY}.items():
    BANDWIDTH_UNITS[f"{_p}B/s"] = Decimal(_f)
    BANDWIDTH_UNITS[f"{_p}bps"] = Decimal(_f) / 8
    BANDWIDTH_UNITS[f"{_p}bit/s"] = Decimal(_f) / 8

#: duration suffix -> seconds
DURATION_UNITS: dict[str, Decimal] = {
    "ms": Decimal("0.001"),
    "s": Decimal(1),
    "m": Decimal(60),
    "min": Decimal(60),
    "h": Decimal(3600),
    "d": Decimal(86400),
}

#: Largest size (one exbibyte, as the inventory's): ten thousand times the largest node's NVMe.
MAX_BYTES = 2**60
#: Largest rate in bytes per second (1 PB/s, 8 Pbps): a thousand times the fastest NIC sold.
MAX_BANDWIDTH = 10**15
#: Smallest rate above zero in bytes per second: with it, :data:`MAX_BYTES` take about 10^21
#: seconds, a finite number, where a rate of 1e-300 B/s made a download last forever.
MIN_BANDWIDTH = Decimal("0.001")
#: Longest duration in seconds (about 3,000 years, the inventory's longest TTL); a policy allows less.
MAX_DURATION_S = 10**11

# A person types these in a policy: a space is any script's (a pasted no-break space reads as one, as
# str.strip() takes it), while digits stay ASCII.
_QUANTITY = re.compile(r"\s*(?P<num>(?:[0-9][0-9_]*(?:\.[0-9]+)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?)\s*"
                       r"(?P<unit>[A-Za-z/]*)\s*", re.UNICODE)
_DURATION_PART = re.compile(r"(?P<num>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>ms|min|[smhd])", re.UNICODE)


def _split(text: str, what: str) -> tuple[Decimal, str]:
    stripped = text.strip()
    if stripped.startswith("-"):
        raise UnitError(f"{what} cannot be negative: {text!r}")
    m = _QUANTITY.fullmatch(stripped)
    if not m:
        raise UnitError(f"not a {what}: {text!r}")
    try:
        number = Decimal(m["num"].replace("_", ""))
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only valid decimals
        raise UnitError(f"not a number: {text!r}") from exc
    return number, m["unit"]


N = TypeVar("N", int, float, Decimal)


def _at_most(number: N, limit: int, value: Any, what: str, limit_text: str) -> N:
    """``number`` (what ``value`` parsed to), or a :class:`UnitError` when it is above ``limit``."""
    if number > limit:
        shown = quote(value if isinstance(value, str) else repr(value), 40)
        raise UnitError(f"{what} {shown} is larger than {limit_text}, the most any field takes")
    return number


def _reject_plain_number(value: Any, what: str) -> None:
    if isinstance(value, bool):
        raise UnitError(f"expected a {what}, got a boolean ({value!r})")


def parse_bytes(value: Any) -> int:
    """Parse a size to a whole number of bytes: ``64GiB`` -> 68719476736, ``3.9GB`` -> 3900000000."""
    _reject_plain_number(value, "size")
    if isinstance(value, int):
        if value < 0:
            raise UnitError(f"size cannot be negative: {value}")
        return _at_most(value, MAX_BYTES, value, "size", "1024PiB")
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0 or not value.is_integer():
            raise UnitError(f"a size in bytes must be a whole, non-negative number: {value!r}")
        return _at_most(int(value), MAX_BYTES, value, "size", "1024PiB")
    if not isinstance(value, str):
        raise UnitError(f"expected a size such as '64GiB' or '3.9GB', got {type(value).__name__}")
    number, unit = _split(value, "size")
    if unit == "":
        factor = 1
    elif unit in SIZE_UNITS:
        factor = SIZE_UNITS[unit]
    elif unit in _DECIMAL:
        raise UnitError(
            f"ambiguous size {value!r}: write {number}{unit.upper()}B (powers of 1000) "
            f"or {number}{unit.upper()}iB (powers of 1024)"
        )
    elif unit.endswith("b") or unit.endswith("bps") or "/s" in unit:
        raise UnitError(f"{value!r} is not a size: sizes are in bytes (B, GB, GiB), not bits or rates")
    else:
        raise UnitError(f"unknown size unit {unit!r} in {value!r} (use B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    exact = _at_most(number * factor, MAX_BYTES, value, "size", "1024PiB")
    if exact != exact.to_integral_value():
        raise UnitError(f"{value!r} is not a whole number of bytes ({exact})")
    return int(exact)


def parse_bandwidth(value: Any) -> float:
    """Parse a rate to bytes per second: ``40Gbps`` -> 5e9, ``7GB/s`` -> 7e9, ``1GiB/s`` -> 2**30."""
    _reject_plain_number(value, "bandwidth")
    if isinstance(value, int | float):
        raise UnitError(
            f"bandwidth {value!r} needs a unit: bits per second (e.g. '{value}Gbps') "
            f"or bytes per second (e.g. '{value}GB/s')"
        )
    if not isinstance(value, str):
        raise UnitError(f"expected a bandwidth such as '40Gbps' or '7GB/s', got {type(value).__name__}")
    number, unit = _split(value, "bandwidth")
    if unit in BANDWIDTH_UNITS:
        rate = _at_most(number * BANDWIDTH_UNITS[unit], MAX_BANDWIDTH, value, "bandwidth", "1PB/s")
        if 0 < rate < MIN_BANDWIDTH:
            raise UnitError(f"bandwidth {quote(value, 40)} is above zero but below 0.001B/s, the least any field takes")
        return float(rate)
    if unit.endswith("Bps"):
        raise UnitError(
            f"ambiguous bandwidth {value!r}: write {number}{unit[:-3]}B/s for bytes "
            f"or {number}{unit[:-3]}bps for bits per second"
        )
    if unit == "":
        raise UnitError(f"bandwidth {value!r} needs a unit such as Gbps (bits/s) or GB/s (bytes/s)")
    if unit.lower() in {u.lower() for u in BANDWIDTH_UNITS}:
        raise UnitError(f"bandwidth unit {unit!r} in {value!r} has the wrong letter case (bits: Gbps, bytes: GB/s)")
    raise UnitError(f"unknown bandwidth unit {unit!r} in {value!r} (use Mbps, Gbps, MB/s, GB/s, GiB/s)")


def parse_duration(value: Any) -> float:
    """Parse a duration to seconds: ``53s`` -> 53.0, ``5m`` -> 300.0, ``1h30m`` -> 5400.0, ``250ms``."""
    _reject_plain_number(value, "duration")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise UnitError(f"a duration must be a finite number of seconds, got {value!r}")
        if value < 0:
            raise UnitError(f"duration cannot be negative: {value}")
        return float(_at_most(value, MAX_DURATION_S, value, "duration", "1e11 seconds (3,000 years)"))
    if not isinstance(value, str):
        raise UnitError(f"expected a duration such as '53s' or '5m', got {type(value).__name__}")
    text = value.strip()
    if text.startswith("-"):
        raise UnitError(f"duration cannot be negative: {value!r}")
    if re.fullmatch(r"[0-9]+(?:\.[0-9]+)?", text):
        return float(_at_most(Decimal(text), MAX_DURATION_S, value, "duration", "1e11 seconds (3,000 years)"))
    if "M" in text:
        raise UnitError(f"ambiguous duration {value!r}: 'M' could be minutes or months; write 'm' for minutes")
    pos, total, seen = 0, Decimal(0), False
    for m in _DURATION_PART.finditer(text):
        if m.start() != pos and text[pos : m.start()].strip():
            break
        total += Decimal(m["num"]) * DURATION_UNITS[m["unit"]]
        pos, seen = m.end(), True
    if not seen or text[pos:].strip():
        raise UnitError(f"not a duration: {value!r} (use ms, s, m, h, d, e.g. '53s', '5m', '1h30m')")
    return float(_at_most(total, MAX_DURATION_S, value, "duration", "1e11 seconds (3,000 years)"))


# ---- plain numbers from outside ----------------------------------------------------------------------

#: A whole number as every reader of text from outside takes it (a flag, a stored counter, a header):
#: ASCII digits after an optional sign, nothing around them. Python's ``int()`` also takes ``1_000``,
#: other scripts' digits (``١٢٣``, full-width ``１２``) and blanks around (`` 12 ``), none of which a
#: writer of ours, Redis's INCR or another program's number printer produces: they are typos or
#: another tool's text, and read as a number they are a wrong one that nobody sees.
_WHOLE = re.compile(r"[+-]?[0-9]+")
#: A real number, likewise: ASCII decimal digits, an optional fraction and exponent (``1e+16``, what
#: ``repr`` and ``%g`` print), or the spellings of infinity and NaN ``float()`` takes (callers that
#: refuse them say so in their own words).
_REAL = re.compile(r"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf(?:inity)?|nan)", re.IGNORECASE)


def _ascii(value: str | bytes) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("ascii")
        except UnicodeDecodeError:
            raise UnitError(f"not a number: {value!r}") from None
    return value


def read_int(value: str | bytes) -> int:
    """``value`` as a whole number (:data:`_WHOLE`: ``-12``, ``007``); :class:`UnitError`, a ``ValueError``,
    for anything else, ``1_000``, ``١٢٣``, ``１２`` and `` 12 `` included."""
    text = _ascii(value)
    if not _WHOLE.fullmatch(text):
        raise UnitError(f"not a whole number: {quote(text, 40)}")
    return int(text)


def read_float(value: str | bytes) -> float:
    """``value`` as a number (:data:`_REAL`: ``1.5``, ``-2e-3``, ``inf``, ``nan``); :class:`UnitError`, a
    ``ValueError``, for anything else, ``1_000``, ``١٢٣``, ``１２`` and `` 12 `` included."""
    text = _ascii(value)
    if not _REAL.fullmatch(text):
        raise UnitError(f"not a number: {quote(text, 40)}")
    return float(text)


def _shortest(value: Decimal, candidates: dict[str, Decimal], parse: Any, original: float | int, base: str) -> str:
    best: str | None = None
    for unit, factor in candidates.items():
        scaled = value / factor
        for digits in range(1, 18):
            text = f"{scaled:.{digits}g}"
            if "e" in text:
                continue
            spelled = f"{text}{unit}"
            try:
                exact = parse(spelled) == original
            except UnitError:
                exact = False
            if exact:
                if best is None or len(spelled) < len(best):
                    best = spelled
                break
    # no short spelling is exact: the plain value in the base unit, never in exponent notation
    return best if best is not None else f"{value:f}{base}"


def format_bytes(n: int) -> str:
    """Render bytes as the shortest exact spelling: 68719476736 -> ``64GiB``, 3900000000 -> ``3.9GB``."""
    if n == 0:
        return "0B"
    units = {u: Decimal(f) for u, f in SIZE_UNITS.items() if u.endswith("B")}
    return _shortest(Decimal(n), units, parse_bytes, n, "B")


def format_bandwidth(bps: float) -> str:
    """Render bytes/s as the shortest exact spelling: 5e9 -> ``40Gbps``, 7e9 -> ``7GB/s``."""
    if bps == 0:
        return "0B/s"
    units = {u: f for u, f in BANDWIDTH_UNITS.items() if "bit/s" not in u}
    return _shortest(Decimal(repr(bps)), units, parse_bandwidth, bps, "B/s")


def format_duration(seconds: float) -> str:
    """Render seconds as the shortest exact spelling: 300.0 -> ``5m``, 53.0 -> ``53s``."""
    if seconds == 0:
        return "0s"
    units = {u: f for u, f in DURATION_UNITS.items() if u != "min"}
    return _shortest(Decimal(repr(seconds)), units, parse_duration, seconds, "s")


#: A Kubernetes resource quantity (apimachinery ``resource.Quantity``), without a sign: a decimal
#: number, then a binary suffix (``Ki`` .. ``Ei``), a decimal one (``n``, ``u``, ``m``, ``k``, ``M`` ..
#: ``E``) or a decimal exponent (``e3``, ``E-2``).
_K8S_QUANTITY = re.compile(
    r"(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:(?P<suffix>[KMGTPE]i|[numkMGTPE])|[eE](?P<exp>[+-]?[0-9]{1,4}))?"
)
_K8S_SUFFIXES: dict[str, Decimal] = {"": Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3")}
_K8S_SUFFIXES.update({p: Decimal(f) for p, f in _DECIMAL.items() if p != "K"})
_K8S_SUFFIXES.update({p: Decimal(f) for p, f in _BINARY.items()})
_K8S_SUFFIXES.update({"E": Decimal(10**18), "Ei": Decimal(2**60)})
#: Largest quantity Kubernetes stores without losing it (an int64 of units).
MAX_QUANTITY = 2**63 - 1


def parse_quantity(value: Any) -> Decimal:
    """Parse a Kubernetes resource quantity to its exact value: ``100m`` -> 0.1, ``4Gi`` -> 4294967296, ``2`` -> 2.

    As the API server reads ``resources`` (a plain number is accepted, as Kubernetes accepts
    ``cpu: 2``); no sign, no NaN, nothing past :data:`MAX_QUANTITY`.
    """
    _reject_plain_number(value, "quantity")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise UnitError(f"a quantity must be a finite number, got {value!r}")
        value = str(value)
    if not isinstance(value, str):
        raise UnitError(f"expected a quantity such as '500m', '2' or '4Gi', got {type(value).__name__}")
    if value.startswith("-"):
        raise UnitError(f"quantity cannot be negative: {value!r}")
    m = _K8S_QUANTITY.fullmatch(value)
    if not m:
        hint = " (a size here is 4Gi or 4G, Kubernetes' spelling, not 4GB)" if value.endswith("B") else ""
        raise UnitError(f"not a Kubernetes quantity: {quote(value, 40)}; use e.g. '500m', '2', '4Gi'{hint}")
    number = Decimal(m["num"])
    exact = number.scaleb(int(m["exp"])) if m["exp"] else number * _K8S_SUFFIXES[m["suffix"] or ""]
    return _at_most(exact, MAX_QUANTITY, value, "quantity", "2**63 - 1")


def _validator(parse: Any) -> BeforeValidator:
    def run(value: Any) -> Any:
        # pydantic reports a ValueError at the field's location; UnitError is one.
        return parse(value)

    return BeforeValidator(run)


# What an editor is told about the unit types (JSON Schema, ``extender policy schema``). The
# patterns admit what the parsers admit, as text; the parsers stay the authority (a size must also
# be a whole number of bytes, for instance), and ``extender policy check`` applies them.
_NUMBER = r"([0-9][0-9_]*(\.[0-9]+)?|\.[0-9]+)([eE][+-]?[0-9]{1,3})?"
SIZE_PATTERN = rf"^\s*{_NUMBER}\s*(B|[kKMGTP]B|[KMGTP]iB?)?\s*$"
BANDWIDTH_PATTERN = rf"^\s*{_NUMBER}\s*([kKMGTP]|[KMGTP]i)?(B/s|bps|bit/s)\s*$"
QUANTITY_PATTERN = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]{1,4})?$"
DURATION_PATTERN = r"^\s*([0-9]+(\.[0-9]+)?\s*|([0-9]+(\.[0-9]+)?\s*(ms|min|[smhd])\s*)+)$"


def _unit_schema(unit: str, pattern: str, plain: str | None, examples: list[str]) -> WithJsonSchema:
    text: dict[str, Any] = {"type": "string", "pattern": pattern}
    schema: dict[str, Any] = {"anyOf": [{"type": plain, "minimum": 0}, text]} if plain else text
    return WithJsonSchema({**schema, "x-unit": unit, "examples": examples})


#: A size typed by a person; validated to whole bytes, serialised back to ``64GiB``-style text.
Bytes = Annotated[
    int, _validator(parse_bytes), PlainSerializer(format_bytes, return_type=str, when_used="json"),
    _unit_schema("size", SIZE_PATTERN, "integer", ["64GiB", "3.9GB", "512Mi"]),
]
#: A rate typed by a person; validated to bytes/s, serialised back to ``40Gbps``-style text.
Bandwidth = Annotated[
    float, _validator(parse_bandwidth), PlainSerializer(format_bandwidth, return_type=str, when_used="json"),
    _unit_schema("bandwidth", BANDWIDTH_PATTERN, None, ["40Gbps", "7GB/s", "1GiB/s"]),
]
#: A duration typed by a person; validated to seconds, serialised back to ``5m``-style text.
Duration = Annotated[
    float, _validator(parse_duration), PlainSerializer(format_duration, return_type=str, when_used="json"),
    _unit_schema("duration", DURATION_PATTERN, "number", ["53s", "5m", "1h30m", "250ms"]),
]
