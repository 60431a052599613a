"""Exact number checks shared by the solver's validators (``validate.py``, ``choice_validate.py``).

A ``bool`` is never a number here; an integral entry must be exactly an integer (``4.0`` is taken,
``np.float32(5.5)`` and ``Fraction(11, 2)`` are not); a real entry must be finite and >= 0. Each
check returns the converted number, or None for the caller to name in its message.

Example:
    >>> as_integral(4.0, 10), as_integral(5.5, 10), as_integral(True, 10), as_integral(11, 10)
    (4, None, None, None)
    >>> as_real(2), as_real(float("inf")), as_real(-1.0)
    (2.0, None, None)
"""

from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = ["VALUE_KIND", "WEIGHT_KIND", "as_integral", "as_real"]

WEIGHT_KIND = "integral numbers in [0, 2**48]"
"""How messages describe an allowed weight, cap or capacity entry."""
VALUE_KIND = "finite real numbers >= 0"
"""How messages describe an allowed value entry."""


def as_integral(x: object, high: int) -> int | None:
    """``x`` as an int when it is exactly an integer in ``[0, high]`` (never a bool), else None."""
    if type(x) is int:  # the common case, without the ABC checks (a bool's type is bool)
        return x if 0 <= x <= high else None
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        return None
    if not isinstance(x, numbers.Integral):
        if not math.isfinite(float(x)) or x != math.floor(x):
            return None
    return int(x) if 0 <= x <= high else None


def as_real(x: object) -> float | None:
    """``x`` as a float when it is a finite real number >= 0 (never a bool), else None."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        return None
    value = float(x)
    return value if math.isfinite(value) and value >= 0 else None
