"""Input validation for ``solve_knapsack``: one function, messages that say what to fix.

Numbers are taken only when their value is exactly what is asked for: a ``bool`` is never a
number here, an integral argument must be an exact integer (``np.float32(5.5)`` and
``Fraction(11, 2)`` are refused, ``4.0`` is taken), a masked array is refused (its mask would
be lost), and sums that could overflow are refused up front.

Example:
    >>> w, v, cap = validate_inputs([3, 4.0], [1, 2.5], 7, "auto", 1)
    >>> w.dtype.name, v.dtype.name, cap
    ('int64', 'float64', 7)
    >>> validate_inputs([3, 4], [1.0, None], 7, "auto", 1)
    Traceback (most recent call last):
    ...
    ValueError: `values` must contain only finite real numbers >= 0, got None at index 1
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Literal, get_args

import numpy as np

from lightning_ckpt.solver.scalars import VALUE_KIND, WEIGHT_KIND, as_integral, as_real

__all__ = [
    "CAPPED_METHODS",
    "MAX_INTEGER",
    "MAX_VALUE_SUM",
    "MAX_WEIGHT_SUM",
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
MAX_WEIGHT_SUM = 2**62  # all weights together: int64 sums never overflow
MAX_VALUE_SUM = 1e300  # all values together: float64 sums stay finite, far from overflow


def refuse_masked(name: str, seq: object, kind: str) -> None:
    """A masked array is refused: its masked entries would be solved with whatever values they hold."""
    masked = sys.modules.get("numpy.ma")  # unimported, nothing is masked (importing it costs ~10 ms)
    if masked is not None and isinstance(seq, masked.MaskedArray):
        raise ValueError(
            f"`{name}` must be a plain sequence of {kind}, got a masked array (fill or compress it)"
        )


def _to_array(name: str, seq: object, kind: str) -> np.ndarray:
    refuse_masked(name, seq, kind)
    if isinstance(seq, (str, bytes)) or not isinstance(
        seq, (np.ndarray, Sequence)
    ):  # ndarray first: no ABC check
        raise ValueError(f"`{name}` must be a sequence of {kind}, got {type(seq).__name__}")
    try:
        array = np.asarray(seq)
    except (ValueError, TypeError):
        raise ValueError(f"`{name}` must be a flat sequence of {kind}, got {seq!r:.80}") from None
    if array.ndim != 1:
        raise ValueError(f"`{name}` must be a flat sequence of {kind}, got an array of shape {array.shape}")
    return array


def _entries(name: str, seq: object, kind: str, convert, dtype) -> np.ndarray:
    """Convert entry by entry, naming the first one refused and its index."""
    out = []
    for index, entry in enumerate(seq):  # type: ignore[arg-type]
        converted = convert(entry)
        if converted is None:
            raise ValueError(f"`{name}` must contain only {kind}, got {entry!r} at index {index}")
        out.append(converted)
    return np.array(out, dtype=dtype)


def _integral_array(name: str, seq: object) -> np.ndarray:
    array = _to_array(name, seq, WEIGHT_KIND)
    if array.dtype.kind in "iu" and len(array) and not _holds_bools(seq):  # two reductions, no temporaries
        if array.min() >= 0 and array.max() <= MAX_INTEGER:
            return array.astype(np.int64)
    elif array.dtype.kind in "iuf" and not _holds_bools(seq):
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(array) | (array < 0) | (array > MAX_INTEGER) | (np.floor(array) != array)
        if not bad.any():
            return array.astype(np.int64)
    return _entries(name, array if isinstance(seq, np.ndarray) else seq, WEIGHT_KIND, _weight, np.int64)


def _weight(x: object) -> int | None:
    return as_integral(x, MAX_INTEGER)


def _value_array(name: str, seq: object) -> np.ndarray:
    array = _to_array(name, seq, VALUE_KIND)
    if array.dtype.kind in "iuf" and not _holds_bools(seq):
        floats = array.astype(np.float64)
        if not len(floats) or (floats.min() >= 0 and floats.max() < math.inf):  # NaN fails min() >= 0
            return floats
    return _entries(name, array if isinstance(seq, np.ndarray) else seq, VALUE_KIND, as_real, np.float64)


def _holds_bools(seq: object) -> bool:
    """A list such as ``[1, True]`` becomes an int array: look at its entries themselves."""
    return not isinstance(seq, np.ndarray) and any(isinstance(x, (bool, np.bool_)) for x in seq)  # type: ignore[union-attr]


def integral_scalar(name: str, x: object, low: int, high: int, high_text: str) -> int:
    value = as_integral(x, high)
    if value is None or value < low:
        raise ValueError(f"`{name}` must be an integral number in [{low}, {high_text}], got {x!r}")
    return value


def _check_sums(weights: np.ndarray, values: np.ndarray) -> None:
    if len(weights) * MAX_INTEGER > MAX_WEIGHT_SUM and sum(weights.tolist()) > MAX_WEIGHT_SUM:
        raise ValueError(f"`weights` must sum to at most 2**62, got {sum(weights.tolist())}")
    with np.errstate(over="ignore"):
        total = float(np.sum(values))
    if not total <= MAX_VALUE_SUM:
        raise ValueError(
            f"`values` must sum to at most {MAX_VALUE_SUM:g} (so that totals stay finite), got {total:g}"
        )


def validate_inputs(
    weights: object, values: object, capacity: object, method: object, workers: object
) -> tuple[np.ndarray, np.ndarray, int]:
    """Check every argument of ``solve_knapsack``; return int64 weights, float64 values, int capacity.

    Raises:
        ValueError: naming the argument, what is allowed and what was given (and its index).
    """
    if method not in METHODS:
        raise ValueError(f"`method` must be one of {', '.join(map(repr, METHODS))}, got {method!r}")
    integral_scalar("workers", workers, 1, MAX_WORKERS, str(MAX_WORKERS))
    weight_array = _integral_array("weights", weights)
    value_array = _value_array("values", values)
    if len(weight_array) != len(value_array):
        raise ValueError(
            f"`weights` and `values` must have the same length, got {len(weight_array)} and {len(value_array)}"
        )
    _check_sums(weight_array, value_array)
    return weight_array, value_array, integral_scalar("capacity", capacity, 0, MAX_INTEGER, "2**48")


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
