"""The uncapped dense DP: value profiles of a 0/1 knapsack, the routine under Hirschberg.

``profile(weights, values, capacity, out)`` fills ``out[c]`` (c = 0..capacity) with the best
total value of a subset of the items whose total weight is at most ``c``. The uncapped exact
engine is built on it: Hirschberg's halves, and the small bit-table leaves that also record
each item's decisions so the chosen set can be read back.

Two interchangeable kernel modules compute bit-identical results: ``_kernels_numba`` (a fused
in-place kernel, ``dp[j] = max(dp[j], dp[j - w] + v)`` in one pass, several items per sweep over
memory, compiled once and cached on disk, releasing the GIL) and ``_kernels_numpy`` (the pure
numpy fallback). Which one runs is ``runtime.backend``'s choice, per call (numpy for small calls
until numba is loaded, or when numba is off). Each item's update is clipped to the capacities it
can reach (the prefix sum of the weights so far); the unreachable tail is filled once at the end.

Example:
    >>> import numpy as np
    >>> out = np.empty(6)
    >>> profile(np.array([2, 3]), np.array([1.0, 2.0]), 5, out)
    >>> out.tolist()
    [0.0, 0.0, 1.0, 2.0, 2.0, 3.0]
"""

from __future__ import annotations

import numpy as np

from lightning_ckpt.solver.dense import _kernels_numpy
from lightning_ckpt.solver.options import DEFAULT_OPTIONS
from lightning_ckpt.solver.runtime import backend
from lightning_ckpt.solver.runtime.interrupt import new_stop_flag, raise_if_stopped

__all__ = ["best_split", "cell_updates", "profile", "solve_leaf"]


NUMPY_CELLS_PER_ITEM = 2048
"""What one item's pass costs the numpy kernels beyond its cells, in cells at
``backend.NUMPY_S_PER_CELL`` (about 3 us: its 4-6 numpy calls; measured 2026-12-01 on rows of 10
cells, the 2-core VM under load: 6-12 us an item in a leaf, 2.5-4.5 us in a profile pass). Counted
in the ski-rental rule, so that a process making many small solves loads numba too, once their
numpy time would pass its load cost."""


def _kernels(cells: int, items: int = 0):
    """The kernel module for a call of ``cells`` DP cells over ``items`` items (``runtime.backend``
    decides)."""
    return backend.compiled(cells + items * NUMPY_CELLS_PER_ITEM, backend.DENSE_NUMBA) or _kernels_numpy


def _as_items(weights: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.ascontiguousarray(weights, dtype=np.int64), np.ascontiguousarray(values, dtype=np.float64)


def profile(
    weights: np.ndarray,
    values: np.ndarray,
    capacity: int,
    out: np.ndarray,
    *,
    save_at: int | None = None,
    saved: np.ndarray | None = None,
    grouping: tuple[int, int, int] = DEFAULT_OPTIONS.grouping,
    stop: np.ndarray | None = None,
) -> None:
    """Fill ``out[:capacity + 1]`` with the knapsack value profile of the items.

    Args:
        weights: Item weights (integers >= 0).
        values: Item values (floats >= 0), same length.
        capacity: Largest capacity of the profile.
        out: A float64 array with at least ``capacity + 1`` entries, overwritten.
        save_at: Also write the profile of the first ``save_at`` items (a checkpoint, for
            free on the way) into ``saved``.
        saved: Array of ``min(capacity, weights[:save_at].sum()) + 1`` floats or more; the
            checkpoint fills all of it (the profile is flat beyond its items' total weight).
        grouping: ``SolverOptions.grouping`` (window, items, tile) of the numba kernel's grouped
            sweep; the numbers never depend on it.
        stop: A flag from ``interrupt.new_stop_flag``, polled between items (None: never stopped).

    Raises:
        SolveStopped: when ``stop`` was set before the profile was finished.

    Example:
        >>> out, saved = np.empty(4), np.empty(2)
        >>> profile(np.array([1, 1, 1]), np.array([1.0, 1.0, 1.0]), 3, out, save_at=1, saved=saved)
        >>> out.tolist(), saved.tolist()
        ([0.0, 1.0, 2.0, 3.0], [0.0, 1.0])
    """
    weights, values = _as_items(weights, values)
    capacity, stop = int(capacity), new_stop_flag() if stop is None else stop
    kernels = _kernels(len(weights) * (capacity + 1), len(weights))
    out[0] = 0.0
    reach = 0
    if save_at is not None:
        reach = int(kernels.extend(weights[:save_at], values[:save_at], capacity, out, 0, *grouping, stop))
        raise_if_stopped(stop)
        saved[: reach + 1] = out[: reach + 1]
        saved[reach + 1 :] = out[reach]
        weights, values = weights[save_at:], values[save_at:]
    reach = kernels.extend(weights, values, capacity, out, reach, *grouping, stop)
    raise_if_stopped(stop)
    out[reach + 1 : capacity + 1] = out[reach]


def solve_leaf(
    weights: np.ndarray, values: np.ndarray, capacity: int, out: np.ndarray, stop: np.ndarray | None = None
) -> np.ndarray:
    """Solve a small segment exactly, keeping one decision bit per item and capacity.

    Uses ``out[:capacity + 1]`` as the profile and ``len(weights) * (capacity + 1)`` bits of
    decision table, then backtracks from ``capacity``; on numpy a leaf of at most
    ``_kernels_numpy.ROWS_MAX_CELLS`` cells instead keeps one float64 row per item (two numpy calls
    an item, not four; the same mask).

    Args:
        weights: Item weights (integers >= 0).
        values: Item values (floats >= 0).
        capacity: The segment's capacity.
        out: Scratch float64 array with at least ``capacity + 1`` entries.
        stop: As for ``profile``.

    Returns:
        A boolean mask of the chosen items (total weight <= ``capacity``).

    Raises:
        SolveStopped: when ``stop`` was set before the leaf was solved.

    Example:
        >>> solve_leaf(np.array([2, 3, 4]), np.array([3.0, 4.0, 5.5]), 5, np.empty(6)).tolist()
        [True, True, False]
    """
    weights, values = _as_items(weights, values)
    stop, n, capacity = new_stop_flag() if stop is None else stop, len(weights), int(capacity)
    kernels = _kernels(n * (capacity + 1), n)
    if kernels is _kernels_numpy and (n + 1) * (capacity + 1) <= _kernels_numpy.ROWS_MAX_CELLS:
        chosen = _kernels_numpy.solve_leaf_rows(weights, values, capacity, stop)
        raise_if_stopped(stop)
        return chosen
    keep_bits = np.zeros((n, (capacity >> 3) + 1), dtype=np.uint8)
    kernels.fill_leaf(weights, values, capacity, out, keep_bits, stop)
    raise_if_stopped(stop)
    chosen = np.zeros(n, dtype=np.bool_)
    kernels.backtrack(weights, capacity, keep_bits, chosen)
    return chosen


def best_split(left: np.ndarray, right: np.ndarray, capacity: int) -> int:
    """Return the first ``c`` maximizing ``left[c] + right[capacity - c]``.

    Example:
        >>> best_split(np.array([0.0, 5.0, 5.0]), np.array([0.0, 1.0, 4.0]), 2)
        1
    """
    return int(_kernels(int(capacity)).best_split(left, right, int(capacity)))


def cell_updates(weights: np.ndarray, capacity: int) -> int:
    """Number of DP cells one profile pass updates, with the prefix-sum clipping.

    Example:
        >>> cell_updates(np.array([2, 3]), 10)  # item 1: c = 2..2, item 2: c = 3..5
        4
    """
    if len(weights) <= _kernels_numpy.LIST_ITEMS:  # a leaf's few dozen items: plain ints, under numpy's calls
        total = cells = 0
        for w in np.asarray(weights).tolist():
            total += w
            cells += max((total if total < capacity else capacity) - w + 1, 0)
        return int(cells)
    weights = np.asarray(weights, dtype=np.float64)
    reach = np.minimum(np.cumsum(weights), capacity)
    return int(np.maximum(reach - weights + 1, 0).sum())
