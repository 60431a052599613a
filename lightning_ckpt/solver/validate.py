"""Input validation for ``solve_knapsack``: one function, messages that say what to fix.

Example:
    >>> w, v, cap = validate_inputs([3, 4.0], [1, 2.5], 7, "auto", 1)
    >>> w.dtype.name, v.dtype.name, cap
    ('int64', 'float64', 7)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Literal, get_args

import numpy as np

__all__ = [
    "CAPPED_METHODS",
    "MAX_INTEGER",
    "MAX_WORKERS",
    "METHODS",
    "Method",
    "validate_caps",
    "validate_inputs",
]

Method = Literal["auto", "hirschberg", "dp", "greedy", "ilp"]
METHODS: tuple[str, ...] = get_args(Method)
MAX_WORKERS = 1024
MAX_INTEGER = 2**48  # weights and capacity: sums of thousands stay exact in int64
CAPPED_METHODS = ("auto", "hirschberg")  # the methods that take prefix capacities


def _to_array(name: str, seq: object, kind: str) -> np.ndarray:
    if isinstance(seq, (str, bytes)) or not isinstance(seq, (Sequence, np.ndarray)):
        raise ValueError(f"`{name}` must be a sequence of {kind}, got {type(seq).__name__}")
    try:
        array = np.asarray(seq)
    except (ValueError, TypeError):
        raise ValueError(f"`{name}` must be a flat sequence of {kind}, got {seq!r:.80}") from None
    if array.ndim != 1:
        raise ValueError(f"`{name}` must be a flat sequence of {kind}, got an array of shape {array.shape}")
    return array


def _bad_entry(name: str, seq: object, bad: np.ndarray, kind: str) -> ValueError:
    index = int(np.flatnonzero(bad)[0])
    entry = seq[index]  # type: ignore[index]
    return ValueError(f"`{name}` must contain only {kind}, got {entry!r} at index {index}")


def _integral_array(name: str, seq: object) -> np.ndarray:
    kind = "integral numbers in [0, 2**48]"
    array = _to_array(name, seq, kind)
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if array.dtype.kind == "O" and all(isinstance(x, numbers.Integral) for x in array):
        array = np.array([int(x) if 0 <= x <= MAX_INTEGER else -1 for x in array], dtype=np.int64)
    if array.dtype.kind not in "iuf" or array.dtype.kind == "b":
        raise _bad_entry(name, seq, np.ones(array.shape, dtype=bool), kind)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(array) | (array < 0) | (array > MAX_INTEGER) | (np.floor(array) != array)
    if bad.any():
        raise _bad_entry(name, seq, bad, kind)
    return array.astype(np.int64)


def _value_array(name: str, seq: object) -> np.ndarray:
    kind = "finite real numbers >= 0"
    array = _to_array(name, seq, kind)
    if array.size and (array.dtype.kind not in "iuf"):
        raise _bad_entry(name, seq, np.ones(array.shape, dtype=bool), kind)
    array = array.astype(np.float64)
    bad = ~np.isfinite(array) | (array < 0)
    if bad.any():
        raise _bad_entry(name, seq, bad, kind)
    return array


def _integral_scalar(name: str, x: object, low: int, high: int, high_text: str) -> int:
    ok = isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_))
    if ok and isinstance(x, float):
        ok = math.isfinite(x) and x.is_integer()
    if not ok or not low <= x <= high:
        raise ValueError(f"`{name}` must be an integral number in [{low}, {high_text}], got {x!r}")
    return int(x)


def validate_inputs(
    weights: object, values: object, capacity: object, method: object, workers: object
) -> tuple[np.ndarray, np.ndarray, int]:
    """Check every argument of ``solve_knapsack``; return int64 weights, float64 values, int capacity.

    Raises:
        ValueError: naming the argument, what is allowed and what was given.
    """
    if method not in METHODS:
        raise ValueError(f"`method` must be one of {', '.join(map(repr, METHODS))}, got {method!r}")
    _integral_scalar("workers", workers, 1, MAX_WORKERS, str(MAX_WORKERS))
    weight_array = _integral_array("weights", weights)
    value_array = _value_array("values", values)
    if len(weight_array) != len(value_array):
        raise ValueError(
            f"`weights` and `values` must have the same length, got {len(weight_array)} and {len(value_array)}"
        )
    return weight_array, value_array, _integral_scalar("capacity", capacity, 0, MAX_INTEGER, "2**48")


def validate_caps(
    prefix_capacities: object, skip_capacities: object, n_items: int, capacity: int, method: str
) -> tuple[np.ndarray, np.ndarray] | None:
    """Check the prefix capacities of ``solve_knapsack``; return ``(take, skip)`` int64 caps, or None
    when neither is given. ``skip`` defaults to ``prefix_capacities``, which defaults to ``capacity``.

    Raises:
        ValueError: naming the argument, what is allowed and what was given.

    Example:
        >>> take, skip = validate_caps([5, 2], None, 2, 9, "auto")
        >>> take.tolist(), skip.tolist()
        ([5, 2], [5, 2])
    """
    if prefix_capacities is None and skip_capacities is None:
        return None
    if method not in CAPPED_METHODS:
        raise ValueError(
            f"`method` must be one of {', '.join(map(repr, CAPPED_METHODS))} with prefix capacities,"
            f" got {method!r}"
        )
    caps = []
    for name, seq in (("prefix_capacities", prefix_capacities), ("skip_capacities", skip_capacities)):
        array = None if seq is None else _integral_array(name, seq)
        if array is not None and len(array) != n_items:
            raise ValueError(f"`{name}` must have one entry per item ({n_items}), got {len(array)}")
        caps.append(array)
    take = np.full(n_items, capacity, dtype=np.int64) if caps[0] is None else caps[0]
    return take, take.copy() if caps[1] is None else caps[1]
