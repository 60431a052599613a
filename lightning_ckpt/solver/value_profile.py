"""The one dynamic-programming routine: value profiles of a 0/1 knapsack.

``profile(weights, values, capacity, out)`` fills ``out[c]`` (c = 0..capacity) with the best
total value of a subset of the items whose total weight is at most ``c``. Every exact path of
the solver is built on it: Hirschberg's halves, and the small bit-table leaves that also record
each item's decisions so the chosen set can be read back.

Two interchangeable back ends compute bit-identical results:

- ``"numba"``: a fused in-place kernel (``dp[j] = max(dp[j], dp[j - w] + v)`` in one pass,
  several items per sweep over memory), compiled once and cached on disk, releasing the GIL;
- ``"numpy"``: a pure-numpy fallback, used when numba is missing or when the environment
  variable ``LIGHTNING_CKPT_NO_NUMBA=1`` is set.

``KERNEL`` names the back end of large problems; numba is imported (and its cached kernels loaded)
only when a problem of at least ``NUMPY_MAX_CELLS`` cells comes, so small solves in a fresh process
take milliseconds. Each item's update is clipped to the capacities it can reach (the prefix sum of
the weights so far); the unreachable tail is filled once at the end.

Example:
    >>> import numpy as np
    >>> out = np.empty(6)
    >>> profile(np.array([2, 3]), np.array([1.0, 2.0]), 5, out)
    >>> out.tolist()
    [0.0, 0.0, 1.0, 2.0, 2.0, 3.0]
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np

from lightning_ckpt.solver import _kernels_numpy
from lightning_ckpt.solver.options import DEFAULT_OPTIONS

__all__ = [
    "KERNEL",
    "SolveStopped",
    "new_stop_flag",
    "raise_if_stopped",
    "profile",
    "solve_leaf",
    "best_split",
    "cell_updates",
]


class SolveStopped(Exception):
    """A kernel returned early, its work unfinished, because its stop flag was set."""


def new_stop_flag() -> np.ndarray:
    """A one-entry array the kernels poll between items: set ``flag[0] = 1`` to stop them."""
    return np.zeros(1, dtype=np.uint8)


def raise_if_stopped(stop: np.ndarray) -> None:
    """Raise ``SolveStopped`` once ``stop[0]`` is set."""
    if stop[0]:
        raise SolveStopped("the solve was stopped")


def _numba_wanted() -> bool:
    if os.environ.get("LIGHTNING_CKPT_NO_NUMBA", "") not in ("", "0"):
        return False
    return importlib.util.find_spec("numba") is not None


KERNEL: str = "numba" if _numba_wanted() else "numpy"
NUMPY_MAX_CELLS = 1 << 22
"""Until numba is loaded, calls below this many DP cells (~20 ms in numpy) run the numpy kernels
(bit-identical) rather than pay numba's import and cache load (~0.5 s) in a fresh process."""
_LOADED: list = []


def _backend(cells: int):
    """The kernels for a call of ``cells`` DP cells: numpy when numba is off, or small and not loaded."""
    if KERNEL == "numpy" or (cells < NUMPY_MAX_CELLS and not _LOADED):
        return _kernels_numpy
    if not _LOADED:
        try:
            from lightning_ckpt.solver import _kernels_numba
        except ImportError:  # numba present but broken
            _kernels_numba = _kernels_numpy
        _LOADED.append(_kernels_numba)
    return _LOADED[0]


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
        stop: A flag from ``new_stop_flag``, polled between items (None: never stopped).

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
    backend = _backend(len(weights) * (capacity + 1))
    out[0] = 0.0
    reach = 0
    if save_at is not None:
        reach = int(backend.extend(weights[:save_at], values[:save_at], capacity, out, 0, *grouping, stop))
        raise_if_stopped(stop)
        saved[: reach + 1] = out[: reach + 1]
        saved[reach + 1 :] = out[reach]
        weights, values = weights[save_at:], values[save_at:]
    reach = backend.extend(weights, values, capacity, out, reach, *grouping, stop)
    raise_if_stopped(stop)
    out[reach + 1 : capacity + 1] = out[reach]


def solve_leaf(
    weights: np.ndarray, values: np.ndarray, capacity: int, out: np.ndarray, stop: np.ndarray | None = None
) -> np.ndarray:
    """Solve a small segment exactly, keeping one decision bit per item and capacity.

    Uses ``out[:capacity + 1]`` as the profile and ``len(weights) * (capacity + 1)`` bits of
    decision table, then backtracks from ``capacity``.

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
    keep_bits = np.zeros((len(weights), (int(capacity) >> 3) + 1), dtype=np.uint8)
    stop = new_stop_flag() if stop is None else stop
    backend = _backend(len(weights) * (int(capacity) + 1))
    backend.fill_leaf(weights, values, int(capacity), out, keep_bits, stop)
    raise_if_stopped(stop)
    chosen = np.zeros(len(weights), dtype=np.bool_)
    backend.backtrack(weights, int(capacity), keep_bits, chosen)
    return chosen


def best_split(left: np.ndarray, right: np.ndarray, capacity: int) -> int:
    """Return the first ``c`` maximizing ``left[c] + right[capacity - c]``.

    Example:
        >>> best_split(np.array([0.0, 5.0, 5.0]), np.array([0.0, 1.0, 4.0]), 2)
        1
    """
    return int(_backend(int(capacity)).best_split(left, right, int(capacity)))


def cell_updates(weights: np.ndarray, capacity: int) -> int:
    """Number of DP cells one profile pass updates, with the prefix-sum clipping.

    Example:
        >>> cell_updates(np.array([2, 3]), 10)  # item 1: c = 2..2, item 2: c = 3..5
        4
    """
    weights = np.asarray(weights, dtype=np.float64)
    reach = np.minimum(np.cumsum(weights), capacity)
    return int(np.maximum(reach - weights + 1, 0).sum())
