"""Argument checks shared by the workload builders; failures are `InputError` (user input)."""

from __future__ import annotations

import math
import numbers

from dualpath.errors import InputError


def require_int(value: object, minimum: int, name: str) -> int:
    """`value` as an int >= minimum; bool is rejected although Python counts it as an int."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise InputError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise InputError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def require_positive_float(value: object, name: str) -> float:
    """`value` as a finite float > 0."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise InputError(f"{name} must be a finite number > 0, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)
