"""Base class for every hand-written schema (policy, inventory, scenario).

Field names are snake_case in Python and camelCase on the wire and in YAML, like Kubernetes
objects. Unknown fields are errors (a typo must never be silently ignored) and models are frozen
(a loaded policy is a value, shared between threads without copying).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class Schema(BaseModel):
    """Strict, frozen, camelCase-aliased pydantic model."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        alias_generator=to_camel,
        populate_by_name=False,
        validate_default=False,  # defaults are ours, already in SI units; only input is parsed
    )
