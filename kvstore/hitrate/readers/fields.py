"""Field validation shared by the readers: each check raises ``BadField`` with a message the
reader prefixes with the file and line/row/path."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


class BadField(Exception):
    """A field is missing or of the wrong type; the reader adds where."""


def get(obj: Mapping[str, Any], name: str) -> Any:
    try:
        return obj[name]
    except KeyError:
        raise BadField(f"missing field {name!r}") from None


def count(value: Any, name: str) -> int:
    """A non-negative integer (JSON ``7`` or ``7.0``, never ``true``)."""
    if type(value) is int:
        if value < 0:
            raise BadField(f"{name} must not be negative, got {value}")
        return value
    if type(value) is float and value.is_integer() and value >= 0:
        return int(value)
    raise BadField(f"{name} must be a non-negative integer, got {value!r}")


def time_value(value: Any, name: str) -> float:
    """A finite, non-negative number."""
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        raise BadField(f"{name} must be a finite non-negative number, got {value!r}")
    return float(value)


def id_list(value: Any, name: str) -> list[int]:
    """A list of integer block ids."""
    if type(value) is not list:
        raise BadField(f"{name} must be a list of integers, got {type(value).__name__}")
    for x in value:
        if type(x) is not int:
            raise BadField(f"{name} must be a list of integers, found {x!r}")
    return value
