"""Turn byte sizes into integer knapsack weights without ever overshooting the budget.

Item sizes are rounded *up* to whole quanta and the budget *down*, so any set whose weights
fit the capacity in quanta also fits the budget in bytes:
``sum(b_i) <= q * sum(ceil(b_i / q)) <= q * floor(B / q) <= B``.

Example:
    >>> quantize([1000, 512, 0], budget_bytes=2000, quantum_bytes=512)
    ([2, 1, 0], 3)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from fractions import Fraction

__all__ = ["quantize"]


def _exact(name: str, x: object, allow_zero: bool) -> Fraction:
    ok = isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)
    if not ok or x < 0 or (x == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"`{name}` must be a finite number {bound}, got {x!r}")
    return Fraction(x) if isinstance(x, float) else Fraction(int(x))


def quantize(item_bytes: Sequence[float], budget_bytes: float, quantum_bytes: float) -> tuple[list[int], int]:
    """Round item sizes up and the budget down to integer quanta.

    Args:
        item_bytes: Size of each item in bytes (finite, >= 0).
        budget_bytes: Memory budget in bytes (finite, >= 0).
        quantum_bytes: Size of one quantum in bytes (finite, > 0), e.g. 512.

    Returns:
        ``(weights, capacity)``: ``ceil(item / quantum)`` per item and ``floor(budget / quantum)``.

    Raises:
        ValueError: naming the argument, what is allowed and what was given.
    """
    quantum = _exact("quantum_bytes", quantum_bytes, allow_zero=False)
    budget = _exact("budget_bytes", budget_bytes, allow_zero=True)
    if isinstance(item_bytes, (str, bytes)) or not hasattr(item_bytes, "__iter__"):
        raise ValueError(f"`item_bytes` must be a sequence of finite numbers >= 0, got {item_bytes!r:.80}")
    weights = [
        math.ceil(_exact(f"item_bytes[{i}]", b, allow_zero=True) / quantum) for i, b in enumerate(item_bytes)
    ]
    return weights, math.floor(budget / quantum)
