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
    item by item gives the same numbers. Each item's shifted copy goes to one scratch row, not a
    new array per item (no fresh pages to fault in: C n=100 W=1e7 1.44-1.64 s, now 1.18-1.28 s).
    """
    scratch = np.empty(capacity + 1)
    for w, v in zip(weights.tolist(), values.tolist(), strict=True):
        if stop[0]:
            break
        if w > capacity:
            continue
        new_reach = min(capacity, reach + w)
        out[reach + 1 : new_reach + 1] = out[reach]
        dst = out[w : new_reach + 1]
        size = new_reach + 1 - w
        np.maximum(dst, np.add(out[:size], v, out=scratch[:size]), out=dst)  # a copy: reads before the item
        reach = new_reach
    return reach


_DECISION_BYTES = 1 << 20
"""Bytes of unpacked decisions ``fill_leaf`` holds before packing them (a block of rows)."""


def fill_leaf(
    weights: np.ndarray,
    values: np.ndarray,
    capacity: int,
    out: np.ndarray,
    keep_bits: np.ndarray,
    stop: np.ndarray,
) -> None:
    """Like ``profile``, also setting bit ``c`` of ``keep_bits[i]`` where item ``i`` improved
    ``c`` (stops early, unfinished, once ``stop[0]`` is set). Decisions are written as bools, one
    row per item, and packed once per block of rows of at most ``_DECISION_BYTES`` (two numpy calls
    an item fewer than packing each row); each item's shifted copy goes to one scratch row (B n=54,
    W=5,000: 183-185 us, now 173-174)."""
    out[0] = 0.0
    reach, n, width = 0, len(weights), keep_bits.shape[1] * 8
    block = np.zeros((min(n, max(1, _DECISION_BYTES // width)), width), dtype=np.bool_)
    scratch = np.empty(capacity + 1)  # each item's shifted copy, not a new array per item
    start = 0
    for i, (w, v) in enumerate(zip(weights.tolist(), values.tolist(), strict=True)):
        if stop[0]:
            return
        if i - start == len(block):
            keep_bits[start:i] = np.packbits(block, axis=1, bitorder="little")
            block[:] = False
            start = i
        if w > capacity:
            continue
        new_reach = reach + w if reach + w < capacity else capacity
        if new_reach > reach:
            out[reach + 1 : new_reach + 1] = out[reach]
        dst = out[w : new_reach + 1]
        size = new_reach + 1 - w
        candidate = np.add(out[:size], v, out=scratch[:size])  # a copy: the profile before this item
        np.greater(candidate, dst, out=block[i - start, w : new_reach + 1])
        np.maximum(dst, candidate, out=dst)
        reach = new_reach
    keep_bits[start:n] = np.packbits(block[: n - start], axis=1, bitorder="little")
    out[reach + 1 : capacity + 1] = out[reach]


ROWS_MAX_CELLS = 1 << 20
"""Largest leaf (items + 1) x (capacity + 1) that ``solve_leaf_rows`` solves: its float64 table of
rows is then at most 8 MiB (``fill_leaf``'s bits take 1/64 of that)."""


def solve_leaf_rows(
    weights: np.ndarray, values: np.ndarray, capacity: int, stop: np.ndarray
) -> np.ndarray | None:
    """``fill_leaf`` and ``backtrack`` in two numpy calls an item (``fill_leaf`` makes four): each
    item's profile goes to its own row of a table, item ``i`` improved ``c`` where its row differs
    from the one before, and each item's pass covers only the capacities ``windows`` says a backtrack
    from ``capacity`` can read. Same float operations per cell, so the same mask (B n=54, W=5,000:
    about 20% less time). None when ``stop[0]`` was set before the leaf was done.

    Example:
        >>> stop = np.zeros(1, dtype=np.bool_)
        >>> solve_leaf_rows(np.array([2, 3, 4]), np.array([3.0, 4.0, 5.5]), 5, stop).tolist()
        [True, True, False]
    """
    sizes, reach_after, low = windows(weights, capacity)
    rows = _fill_rows(sizes, values.tolist(), capacity, reach_after, low, stop)
    if rows is None:
        return None
    picked, c = [], capacity
    for i in range(len(sizes) - 1, -1, -1):
        if sizes[i] > capacity:
            continue
        c = min(c, reach_after[i])  # beyond its reach, item i's profile is flat
        if rows[i + 1].item(c) != rows[i].item(c):  # .item: a Python float, no numpy scalar
            picked.append(i)
            c -= sizes[i]
    chosen = np.zeros(len(sizes), dtype=np.bool_)
    chosen[picked] = True
    return chosen


LIST_ITEMS = 64
"""Up to this many items ``windows`` runs on plain ints: 10-14 us less on a 54-item leaf within a
whole solve, where numpy's calls cost more than the loop; above it numpy's (a Hirschberg of 240
items, C n = 300 W = 1e4, was 2-3% slower on lists)."""


def windows(weights: np.ndarray, capacity: int) -> tuple[list[int], list[int], list[int]]:
    """``(sizes, reach_after, low)``: the weights as ints; the most weight the items up to ``i``
    reach (at most ``capacity``); for an item that fits, the least capacity a backtrack from
    ``capacity`` can read at item ``i``: ``max(0, min over j >= i of reach_after[j] less the
    weights of items i+1..j)`` (``capacity`` less the chosen weights after ``i``, and never above
    the reach). Items heavier than ``capacity`` weigh 0 in these sums (they are never chosen).

    Example:
        >>> windows(np.array([2, 3, 4]), 5)
        ([2, 3, 4], [2, 5, 5], [0, 1, 5])
    """
    if len(weights) <= LIST_ITEMS:
        return _windows_on_lists(weights.tolist(), capacity)
    fits = np.where(weights <= capacity, weights, 0)
    total = np.cumsum(fits)  # int64: validated weights sum to at most 2**62
    reach = np.minimum(total, capacity)
    least = np.minimum.accumulate((reach - total)[::-1])[::-1]
    return weights.tolist(), reach.tolist(), np.maximum(total + least, 0).tolist()


def _windows_on_lists(sizes: list[int], capacity: int) -> tuple[list[int], list[int], list[int]]:
    """``windows`` on plain ints (the same lists)."""
    totals, reach_after, total = [], [], 0
    for w in sizes:
        if w <= capacity:
            total += w
        totals.append(total)
        reach_after.append(total if total < capacity else capacity)
    low, least = [0] * len(sizes), 0
    for i in range(len(sizes) - 1, -1, -1):  # least: min over j >= i of reach_after[j] - totals[j]
        gap = reach_after[i] - totals[i]
        if gap < least:
            least = gap
        if totals[i] + least > 0:
            low[i] = totals[i] + least
    return sizes, reach_after, low


def _fill_rows(sizes, gains, capacity, reach_after, low, stop) -> list[np.ndarray] | None:
    """Row ``i + 1`` of the table: item ``i``'s profile on ``low[i]..reach_after[i]`` (an item
    heavier than ``capacity`` shares the row before it). The loop zips plain lists (B n=42: 78 us,
    now 69)."""
    table = np.empty((len(sizes) + 1, capacity + 1))
    prev, prev_reach = table[0], 0
    prev[0] = 0.0
    rows = [prev]
    for w, v, lo, hi, cur in zip(sizes, gains, low, reach_after, table[1:], strict=True):
        if stop[0]:
            return None
        if w > capacity:
            rows.append(prev)
            continue
        if hi > prev_reach:  # the previous profile is flat past its reach
            prev[prev_reach + 1 : hi + 1] = prev[prev_reach]
        if lo < w:  # capacities below w: the row before, unchanged (hi >= w: this item fits)
            cur[lo:w] = prev[lo:w]
            lo = w
        dst = cur[lo : hi + 1]
        np.add(prev[lo - w : hi + 1 - w], v, dst)  # positional out: 0.15 us less
        np.maximum(dst, prev[lo : hi + 1], out=dst)
        rows.append(cur)
        prev, prev_reach = cur, hi
    return rows


def backtrack(weights: np.ndarray, capacity: int, keep_bits: np.ndarray, chosen: np.ndarray) -> None:
    """Read the chosen items back from a decision-bit table: ``backtrack_loops`` on Python ints
    (numpy scalar reads cost about 0.1 us each: B n=54, W=5,000 took 37 us, now 19)."""
    sizes = weights.tolist()
    reach_after, reach = [], 0
    for w in sizes:
        if w <= capacity:
            reach = min(capacity, reach + w)
        reach_after.append(reach)
    c = capacity
    for i in range(len(sizes) - 1, -1, -1):
        w = sizes[i]
        if w > capacity:
            continue
        c = min(c, reach_after[i])  # beyond its reach, item i's profile is flat
        if (int(keep_bits[i, c >> 3]) >> (c & 7)) & 1:
            chosen[i] = True
            c -= w


def backtrack_loops(weights: np.ndarray, capacity: int, keep_bits: np.ndarray, chosen: np.ndarray) -> None:
    """``backtrack`` as plain loops over arrays, the code numba compiles (``_kernels_numba``)."""
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
