"""Pure-numpy DP kernels: the fallback when numba is unavailable (see ``profile.py``).

Every function here computes exactly what its twin in ``_kernels_numba.py`` computes, bit for
bit (same float operations in the same order per cell).
"""

from __future__ import annotations

import numpy as np


def extend(
    weights: np.ndarray,
    values: np.ndarray,
    capacity: int,
    out: np.ndarray,
    reach: int,
    _window: int,
    _k_max: int,
    _tile: int,
    stop: np.ndarray,
) -> int:
    """Apply the items to ``out``, whose entries ``0..reach`` hold a profile; return the new
    reach (see ``profile.profile``; entries above it are left unfilled). Returns early,
    the profile unfinished, once ``stop[0]`` is set (checked before each item).

    The grouping (window, items, tile of the numba kernel's grouped sweep) is ignored here:
    item by item gives the same numbers.
    """
    for w, v in zip(weights.tolist(), values.tolist(), strict=True):
        if stop[0]:
            break
        if w > capacity:
            continue
        new_reach = min(capacity, reach + w)
        out[reach + 1 : new_reach + 1] = out[reach]
        dst = out[w : new_reach + 1]
        np.maximum(dst, out[: new_reach + 1 - w] + v, out=dst)  # a copy: reads before the item
        reach = new_reach
    return reach


def _improved(out: np.ndarray, w: int, v: float, hi: int) -> np.ndarray:
    """Apply one item to ``out[w:hi + 1]`` in place; return where it strictly improved."""
    dst = out[w : hi + 1]
    candidate = out[: hi + 1 - w] + v  # a copy: reads the profile before this item
    improved = candidate > dst
    np.maximum(dst, candidate, out=dst)
    return improved


def fill_leaf(
    weights: np.ndarray,
    values: np.ndarray,
    capacity: int,
    out: np.ndarray,
    keep_bits: np.ndarray,
    stop: np.ndarray,
) -> None:
    """Like ``profile``, also setting bit ``c`` of ``keep_bits[i]`` where item ``i`` improved ``c``
    (stops early, unfinished, once ``stop[0]`` is set)."""
    out[0] = 0.0
    reach = 0
    row = np.zeros(keep_bits.shape[1] * 8, dtype=np.bool_)
    for i, (w, v) in enumerate(zip(weights.tolist(), values.tolist(), strict=True)):
        if stop[0]:
            return
        if w > capacity:
            continue
        new_reach = min(capacity, reach + w)
        out[reach + 1 : new_reach + 1] = out[reach]
        row[:] = False
        row[w : new_reach + 1] = _improved(out, w, v, new_reach)
        keep_bits[i] = np.packbits(row, bitorder="little")
        reach = new_reach
    out[reach + 1 : capacity + 1] = out[reach]


def backtrack(weights: np.ndarray, capacity: int, keep_bits: np.ndarray, chosen: np.ndarray) -> None:
    """Read the chosen items back from a decision-bit table (numba compiles this same code)."""
    n = len(weights)
    reach_after = np.zeros(n, dtype=np.int64)
    reach = 0
    for i in range(n):
        if weights[i] <= capacity:
            reach = min(capacity, reach + weights[i])
        reach_after[i] = reach
    c = capacity
    for i in range(n - 1, -1, -1):
        w = weights[i]
        if w > capacity:
            continue
        c = min(c, reach_after[i])  # beyond its reach, item i's profile is flat
        if (keep_bits[i, c >> 3] >> (c & 7)) & 1:
            chosen[i] = True
            c -= w


def best_split(left: np.ndarray, right: np.ndarray, capacity: int) -> int:
    """First ``c`` maximizing ``left[c] + right[capacity - c]``."""
    return int(np.argmax(left[: capacity + 1] + right[capacity::-1]))
