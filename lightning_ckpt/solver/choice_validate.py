"""Input validation for ``solve_choices``: one function, messages that name the argument and the index.

The rules are ``solve_knapsack``'s (``validate.py``), entry by entry: a ``bool`` is never a number, an
integral argument must be an exact integer (``4.0`` is taken, ``4.5`` is not), weights, caps and the
capacity lie in ``[0, 2**48]``, all weights together at most ``2**62`` and all values at most
``1e300``. Groups must be non-empty and the three nested sequences of one shape.

Example:
    >>> groups, capacity = validate_choices([[0, 3], [0, 2.0]], [[0.0, 1], [0, 2]], 5, None, "auto", 1)
    >>> groups.weights.tolist(), groups.caps.tolist(), groups.starts.tolist(), capacity
    ([0, 3, 0, 2], [5, 5, 5, 5], [0, 2, 4], 5)
    >>> validate_choices([[0, 3], []], [[0.0, 1.0], []], 5, None, "auto", 1)
    Traceback (most recent call last):
    ...
    ValueError: `weights[1]` must be a non-empty sequence of options, got 0 options
"""

from __future__ import annotations

import numpy as np

from lightning_ckpt.solver.capped.groups import Groups, from_options
from lightning_ckpt.solver.scalars import VALUE_KIND, WEIGHT_KIND, as_integral, as_real
from lightning_ckpt.solver.validate import (
    CAPPED_METHODS,
    MAX_INTEGER,
    MAX_VALUE_SUM,
    MAX_WEIGHT_SUM,
    MAX_WORKERS,
    integral_scalar,
    refuse_masked,
)

__all__ = ["validate_choices"]


def _sequence(name: str, seq: object, what: str) -> list:
    """``seq`` as a list, refusing strings, masked arrays and non-sequences."""
    refuse_masked(name, seq, what)
    if isinstance(seq, (str, bytes)) or not hasattr(seq, "__len__") or not hasattr(seq, "__getitem__"):
        raise ValueError(f"`{name}` must be a sequence of {what}, got {type(seq).__name__}")
    if isinstance(seq, np.ndarray) and seq.ndim == 0:
        raise ValueError(f"`{name}` must be a sequence of {what}, got a 0-d array")
    return list(seq)


def _nested(name: str, seq: object, shape: list[int] | None, kind: str, convert) -> list[list]:
    """Check a sequence of groups of entries (of ``shape``, when given) and convert every entry."""
    groups = _sequence(name, seq, f"groups of options ({kind})")
    if shape is not None and len(groups) != len(shape):
        raise ValueError(
            f"`{name}` must have one group per group of `weights` ({len(shape)}), got {len(groups)}"
        )
    out = []
    for g, group in enumerate(groups):
        entries = _sequence(f"{name}[{g}]", group, f"options ({kind})")
        if shape is None and not entries:
            raise ValueError(f"`{name}[{g}]` must be a non-empty sequence of options, got 0 options")
        if shape is not None and len(entries) != shape[g]:
            raise ValueError(
                f"`{name}[{g}]` must have one entry per option of `weights[{g}]` ({shape[g]}), got {len(entries)}"
            )
        converted = []
        for j, entry in enumerate(entries):
            value = convert(entry)
            if value is None:
                raise ValueError(f"`{name}` must contain only {kind}, got {entry!r} at [{g}][{j}]")
            converted.append(value)
        out.append(converted)
    return out


def _method_and_workers(method: object, workers: object) -> None:
    if method not in CAPPED_METHODS:
        raise ValueError(f"`method` must be one of {', '.join(map(repr, CAPPED_METHODS))}, got {method!r}")
    integral_scalar("workers", workers, 1, MAX_WORKERS, str(MAX_WORKERS))


def validate_choices(
    weights: object,
    values: object,
    capacity: object,
    prefix_capacities: object,
    method: object,
    workers: object,
) -> tuple[Groups, int]:
    """Check every argument of ``solve_choices``; return the groups (caps default to the capacity)
    and the capacity.

    Raises:
        ValueError: naming the argument, what is allowed and what was given (and its index).
    """
    _method_and_workers(method, workers)
    weight_lists = _nested("weights", weights, None, WEIGHT_KIND, lambda x: as_integral(x, MAX_INTEGER))
    shape = [len(group) for group in weight_lists]
    value_lists = _nested("values", values, shape, VALUE_KIND, as_real)
    capacity = integral_scalar("capacity", capacity, 0, MAX_INTEGER, "2**48")
    if prefix_capacities is None:
        cap_lists = [[capacity] * size for size in shape]
    else:
        cap_lists = _nested(
            "prefix_capacities", prefix_capacities, shape, WEIGHT_KIND, lambda x: as_integral(x, MAX_INTEGER)
        )
    flat_w = [w for group in weight_lists for w in group]
    if sum(flat_w) > MAX_WEIGHT_SUM:
        raise ValueError(f"`weights` must sum to at most 2**62, got {sum(flat_w)}")
    flat_v = np.array([v for group in value_lists for v in group], dtype=np.float64)
    with np.errstate(over="ignore"):
        total = float(np.sum(flat_v))
    if not total <= MAX_VALUE_SUM:
        raise ValueError(
            f"`values` must sum to at most {MAX_VALUE_SUM:g} (so that totals stay finite), got {total:g}"
        )
    starts = np.concatenate(([0], np.cumsum(shape))).astype(np.int64)
    flat_caps = np.array([c for group in cap_lists for c in group], dtype=np.int64)
    return from_options(np.array(flat_w, dtype=np.int64), flat_v, flat_caps, starts), capacity
