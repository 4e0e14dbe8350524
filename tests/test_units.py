"""Human units: exact parsing, clear errors for ambiguous input, and exact round trips."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.core.errors import UnitError
from extender.core.units import (
    MAX_BYTES,
    format_bandwidth,
    format_bytes,
    format_duration,
    parse_bandwidth,
    parse_bytes,
    parse_duration,
    parse_quantity,
    read_float,
    read_int,
)

SIZES = [
    # (id, input, bytes)
    ("binary-gib", "64GiB", 64 * 2**30),
    ("kubernetes-gi", "64Gi", 64 * 2**30),
    ("decimal-gb-fraction", "3.9GB", 3_900_000_000),  # 3.9 x 10^9, exact, no float rounding
    ("decimal-tb", "30TB", 30 * 10**12),
    ("mib", "15MiB", 15 * 2**20),
    ("half-kib", "0.5KiB", 512),
    ("kb-lowercase-k", "1kB", 1000),
    ("kb-uppercase-k", "1KB", 1000),
    ("plain-int-is-bytes", 1024, 1024),
    ("plain-string-is-bytes", "1024", 1024),
    ("underscores", "1_000_000B", 10**6),
    ("space-before-unit", "64 GiB", 64 * 2**30),
    # a policy is typed (and pasted) by a person: any script's space reads as one (re.UNICODE on purpose)
    ("no-break-space-before-unit", "64\u00a0GiB", 64 * 2**30),
    ("zero", "0B", 0),
    ("integral-float", 2048.0, 2048),
    ("exponent", "1e12", 10**12),
    ("exponent-fraction-signed", "1.5E+3", 1500),
    ("exponent-with-unit", "2e3GiB", 2000 * 2**30),
]


@pytest.mark.parametrize(("text", "expected"), [(r[1], r[2]) for r in SIZES], ids=[r[0] for r in SIZES])
def test_parse_bytes(text: Any, expected: int) -> None:
    assert parse_bytes(text) == expected


BANDWIDTHS = [
    ("gbps-is-bits", "40Gbps", 5e9),  # 40e9 bits / 8
    ("gbit-per-s", "40Gbit/s", 5e9),
    ("gb-per-s-is-bytes", "7GB/s", 7e9),
    ("gib-per-s", "1GiB/s", 2.0**30),
    ("mbps", "100Mbps", 12.5e6),
    ("fractional-gbps", "5.96Gbps", 745e6),  # the EKS model-loading report's serial-stream figure
    ("p5-nic", "3200Gbps", 400e9),
    ("exponent", "3.2e3Gbps", 400e9),
    ("the-least-rate-above-zero", "0.001B/s", 0.001),
    ("one-bit-per-second", "1bps", 0.125),
    ("zero-stays-allowed", "0B/s", 0.0),  # a schema that needs more says > 0 itself
]


@pytest.mark.parametrize(("text", "expected"), [(r[1], r[2]) for r in BANDWIDTHS], ids=[r[0] for r in BANDWIDTHS])
def test_parse_bandwidth(text: str, expected: float) -> None:
    assert parse_bandwidth(text) == pytest.approx(expected, rel=1e-15)


DURATIONS = [
    ("seconds", "53s", 53.0),
    ("minutes", "5m", 300.0),
    ("min-spelling", "5min", 300.0),
    ("hours", "2h", 7200.0),
    ("days", "1d", 86400.0),
    ("millis", "250ms", 0.25),
    ("compound", "1h30m", 5400.0),
    ("compound-spaced", "2m 30s", 150.0),
    ("compound-no-break-spaced", "2m\u00a030s", 150.0),
    ("fraction", "1.5s", 1.5),
    ("plain-number-is-seconds", 17, 17.0),
    ("plain-string-is-seconds", "17", 17.0),
]


@pytest.mark.parametrize(("text", "expected"), [(r[1], r[2]) for r in DURATIONS], ids=[r[0] for r in DURATIONS])
def test_parse_duration(text: Any, expected: float) -> None:
    seconds = parse_duration(text)
    assert seconds == expected


ERRORS = [
    # (id, parser, input, words the message must contain)
    ("bare-decimal-prefix", parse_bytes, "64G", "ambiguous"),
    ("bits-for-size", parse_bytes, "64Gb", "bits"),
    ("rate-for-size", parse_bytes, "7GB/s", "not a size"),
    ("fractional-bytes", parse_bytes, "1.5B", "whole number"),
    ("negative-exponent-bytes", parse_bytes, "1e-3", "whole number"),
    ("huge-exponent", parse_bytes, "1e999", "larger than 1024PiB"),
    ("negative-size", parse_bytes, "-1GiB", "negative"),
    ("negative-int-size", parse_bytes, -5, "negative"),
    ("bool-size", parse_bytes, True, "boolean"),
    ("unknown-size-unit", parse_bytes, "3 parsecs", "unknown size unit"),
    ("list-size", parse_bytes, [1], "expected a size"),
    ("Bps-ambiguous", parse_bandwidth, "7GBps", "ambiguous"),
    ("bandwidth-without-unit", parse_bandwidth, "40", "needs a unit"),
    ("bandwidth-number", parse_bandwidth, 40, "needs a unit"),
    ("bandwidth-wrong-case", parse_bandwidth, "40gbps", "letter case"),
    ("bandwidth-unknown", parse_bandwidth, "40furlongs", "unknown bandwidth unit"),
    # a download at such a rate lasts forever: size / rate overflowed to infinity in the estimator
    ("bandwidth-near-zero", parse_bandwidth, "1e-300B/s", "below 0.001B/s"),
    ("bandwidth-just-below-the-least", parse_bandwidth, "0.0009B/s", "below 0.001B/s"),
    ("bandwidth-underflowing-a-float", parse_bandwidth, "1e-999Gbps", "below 0.001B/s"),
    ("months-or-minutes", parse_duration, "5M", "ambiguous"),
    ("negative-duration", parse_duration, "-3s", "negative"),
    ("word-duration", parse_duration, "5 mins", "not a duration"),
    ("unit-only", parse_duration, "s", "not a duration"),
    ("trailing-junk", parse_duration, "5s later", "not a duration"),
    ("empty", parse_duration, "", "not a duration"),
]


@pytest.mark.parametrize(("parse", "text", "words"), [r[1:] for r in ERRORS], ids=[r[0] for r in ERRORS])
def test_errors_name_the_problem(parse: Any, text: Any, words: str) -> None:
    with pytest.raises(UnitError, match=words):
        parse(text)


def test_unit_error_is_a_value_error() -> None:
    # pydantic turns ValueError raised in validators into located field errors
    assert issubclass(UnitError, ValueError)


FORMATS = [
    ("gib", format_bytes, 64 * 2**30, "64GiB"),
    ("gb", format_bytes, 3_900_000_000, "3.9GB"),
    ("odd-bytes", format_bytes, 1234567, "1234567B"),
    ("zero-bytes", format_bytes, 0, "0B"),
    ("gbps", format_bandwidth, 337.5e6, "2.7Gbps"),
    ("gb-per-s", format_bandwidth, 7e9, "7GB/s"),
    ("minutes", format_duration, 300.0, "5m"),
    ("seconds", format_duration, 53.0, "53s"),
    ("zero-duration", format_duration, 0.0, "0s"),
]


@pytest.mark.parametrize(("fmt", "value", "text"), [r[1:] for r in FORMATS], ids=[r[0] for r in FORMATS])
def test_format_shortest_spelling(fmt: Any, value: Any, text: str) -> None:
    assert fmt(value) == text


@given(st.integers(min_value=0, max_value=MAX_BYTES))  # the largest size a field takes
def test_bytes_round_trip(n: int) -> None:
    assert parse_bytes(format_bytes(n)) == n


@given(st.floats(min_value=1e-3, max_value=1e13, allow_nan=False, allow_infinity=False))
def test_bandwidth_round_trip(bps: float) -> None:
    assert parse_bandwidth(format_bandwidth(bps)) == bps


@given(st.floats(min_value=0, max_value=1e7, allow_nan=False, allow_infinity=False))
def test_duration_round_trip(seconds: float) -> None:
    back = parse_duration(format_duration(seconds))
    assert back == seconds


# Kubernetes quantities (warm Job resources): our parser against the official client's, the reference.
# core may not import the kubernetes package (tests/test_layering.py), so the parser is our own; where
# the two differ, ours refuses what the API server refuses and the client lets through.
AGREED = ["100m", "4Gi", "2", "0.5", "1e3", "1E3", "1.5e3", "1e+3", "1e-3", ".5", "5.", "1Ki", "1k", "1M",
          "1Mi", "1n", "1u", "1.5Gi", "1Ei", "0", "64Pi"]


@pytest.mark.parametrize("text", AGREED)
def test_quantities_parse_as_the_kubernetes_client_parses_them(text: str) -> None:
    from kubernetes.utils import parse_quantity as reference
    assert parse_quantity(text) == reference(text)  # type: ignore[no-untyped-call]


REFUSED = [
    # (id, input, words): the client's parse_quantity refuses these too
    ("a byte size", "4GB", "not a Kubernetes quantity"),
    ("lowercase binary suffix", "1ki", "not a Kubernetes quantity"),
    ("hex", "0x10", "not a Kubernetes quantity"),
    ("empty", "", "not a Kubernetes quantity"),
    # the client accepts these; the API server does not (apimachinery's suffixes are k, not K; a
    # request is never negative; a quantity is an int64 of units; no spaces inside the string)
    ("uppercase K", "1K", "not a Kubernetes quantity"),
    ("negative", "-1", "cannot be negative"),
    ("past int64", "9Ei", "larger than"),
    ("a huge exponent", "1e999", "larger than"),
    ("a leading space", " 1", "not a Kubernetes quantity"),
    ("a trailing line feed", "4Gi\n", "not a Kubernetes quantity"),
    ("a no-break space inside", "4\u00a0Gi", "not a Kubernetes quantity"),
    ("a boolean", True, "boolean"),
]


@pytest.mark.parametrize(("text", "words"), [(r[1], r[2]) for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_quantities_the_api_server_refuses_are_refused(text: Any, words: str) -> None:
    with pytest.raises(UnitError, match=words):
        parse_quantity(text)


#: (id, text, read_int's value, read_float's value); ``None``: refused (a UnitError, a ValueError).
PLAIN_NUMBERS = [
    ("digits", "12", 12, 12.0),
    ("signed", "-3", -3, -3.0),
    ("plus-sign", "+4", 4, 4.0),
    ("leading-zeros", "007", 7, 7.0),
    ("bytes", b"12", 12, 12.0),
    ("fraction", "1.5", None, 1.5),
    ("exponent", "1e+16", None, 1e16),
    ("trailing-point", "1.", None, 1.0),
    ("leading-point", ".5", None, 0.5),
    ("infinity", "-inf", None, float("-inf")),
    # Python's int() and float() take every one of these
    ("underscore", "1_000", None, None),
    ("arabic-indic-digits", "\u0661\u0662\u0663", None, None),
    ("full-width-digits", "\uff11\uff12", None, None),
    ("devanagari-digits", "\u0967\u0968", None, None),
    ("blanks-around", " 12 ", None, None),
    ("line-feed-after", "12\n", None, None),
    ("not-ascii-bytes", "\uff11".encode(), None, None),
    ("empty", "", None, None),
    ("hexadecimal", "0x10", None, None),
    ("exponent-without-digits", "1e", None, None),
]


@pytest.mark.parametrize(("text", "whole", "real"), [r[1:] for r in PLAIN_NUMBERS], ids=[r[0] for r in PLAIN_NUMBERS])
def test_plain_numbers_from_outside_are_ascii_digits(text: str | bytes, whole: int | None, real: float | None) -> None:
    for read, expected in ((read_int, whole), (read_float, real)):
        if expected is None:
            with pytest.raises(UnitError, match="not a"):
                read(text)
        else:
            assert read(text) == expected
