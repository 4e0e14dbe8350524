"""Base class for every hand-written schema (policy, inventory, scenario), and its number types.

Field names are snake_case in Python and camelCase on the wire and in YAML, like Kubernetes
objects. Unknown fields are errors (a typo must never be silently ignored) and models are frozen
(a loaded policy is a value, shared between threads without copying).

:data:`Int` and :data:`Float` are the numbers a person types: YAML reads ``yes``, ``on`` and
``true`` as booleans, which pydantic would take as 1 (``gpu: {count: yes}`` was one GPU); NaN and
infinity (``.nan``, ``.inf``) compare false with every bound and broke arithmetic far from the
file; and nothing a person counts or rates is larger than :data:`MAX_NUMBER`.

Unknown fields are errors in what a person writes, not in what a release of ours stored for another
to read (:func:`read_stored`): during a rolling upgrade or a rollback an older and a newer release
read each other's records, and a field one of them added must not make the other drop the record.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.alias_generators import to_camel

from extender.core.errors import InvalidValueError

M = TypeVar("M", bound=BaseModel)

#: Largest magnitude of a plain number in a document (a count, a rate, a factor): 10**15.
MAX_NUMBER = 10**15


class Schema(BaseModel):
    """Strict, frozen, camelCase-aliased pydantic model."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=False,
        validate_default=False,  # defaults are ours, already in SI units; only input is parsed
    )


#: What ``float()`` reads as NaN or infinity.
_NOT_FINITE = frozenset({"nan", "inf", "infinity"})


def plain_number(value: Any) -> Any:
    """``value`` unless it is a boolean, NaN, infinity or larger than :data:`MAX_NUMBER` (pydantic then parses it)."""
    if isinstance(value, bool):
        raise InvalidValueError(f"expected a number, got a boolean ({str(value).lower()}; YAML also reads "
                                "yes, no, on and off as booleans)")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidValueError(f"expected a finite number, got {value!r}")
    if isinstance(value, str) and value.strip().lower().lstrip("+-") in _NOT_FINITE:  # a flag's text: pydantic
        raise InvalidValueError(f"expected a finite number, got {value.strip()!r}")    # would parse it to NaN
    if isinstance(value, int | float) and abs(value) > MAX_NUMBER:
        shown = f"{value:.3g}" if isinstance(value, float) else f"a number of {len(str(abs(value)))} digits"
        raise InvalidValueError(f"{shown} is out of range: a number here is at most 10^15 in size")
    return value


#: A whole number typed by a person: not a boolean, at most :data:`MAX_NUMBER` in size. (Inside
#: ``X | None``, give the bounds before the check: ``Annotated[int, Field(ge=0), BeforeValidator(plain_number)]``,
#: or the JSON Schema loses them.)
Int = Annotated[int, BeforeValidator(plain_number)]
#: A number typed by a person: not a boolean, finite, at most :data:`MAX_NUMBER` in size.
Float = Annotated[float, BeforeValidator(plain_number), Field(allow_inf_nan=False)]

#: Characters of one stored or shown text (an image reference with its digest is about 150).
MAX_TEXT = 1024
#: Printable text: no control character (NUL, a line feed, a terminal escape), bounded length; for
#: names and labels that are stored, shown in reports and logged.
Text = Annotated[str, Field(max_length=MAX_TEXT, pattern=r"^[^\x00-\x1f\x7f]*$")]


def read_stored(model: type[M], raw: str | bytes | Mapping[str, Any]) -> M:
    """``raw``, JSON that a release of ours stored (a Redis record, a Job annotation; as text or
    already parsed), read as ``model``.

    Fields ``model`` does not know are ignored, at every depth; everything else is checked as usual
    and raises pydantic's ``ValidationError`` (a ``ValueError``). Why: the components share their
    stored data, and a rolling upgrade or a rollback runs two releases side by side for minutes. A
    newer release may add a field; a reader that refused the whole record would make every node it
    wrote unknown (cold) to every older reader until the rollout ends. A field a newer release
    *removed* is the writer's duty: it keeps writing it, or the field has a default here. Files a
    person writes (policies, inventory files) stay strict: there an unknown field is a typo.
    """
    if isinstance(raw, str | bytes):
        return model.model_validate_json(raw, extra="ignore")
    return model.model_validate(raw, extra="ignore")
