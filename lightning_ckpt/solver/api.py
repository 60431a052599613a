"""``solve_knapsack``: the public entry point of the 0/1 knapsack solver.

Values are float64 throughout. Sums of a few thousand float64 values carry a relative rounding
error of about n * 1.1e-16 (< 1e-12 for n < 10^4), far below the required 1e-9 relative error
against the true optimum; float32 (as PyTorch uses) would give ~1e-7 per operation, which
accumulates past 1e-5 on large instances and can mis-order near-ties.

Example:
    >>> result = solve_knapsack([1, 1, 1], [1.0, 1.0, 1.0], 1)
    >>> result.value, result.weight, result.chosen, result.rejected
    (1.0, 1, (0,), (1, 2))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lightning_ckpt.solver import baselines, hirschberg, parallel
from lightning_ckpt.solver.fits import check_fits
from lightning_ckpt.solver.reduce import reduce_instance
from lightning_ckpt.solver.validate import validate_inputs
from lightning_ckpt.solver.value_profile import KERNEL

__all__ = ["KnapsackResult", "solve_knapsack", "last_solve_stats"]

# Below this many cells (items x capacity) a solve never starts worker processes.
PARALLEL_MIN_TOTAL_CELLS = 1 << 27

_LAST_STATS: dict[str, object] = {}


@dataclass(frozen=True)
class KnapsackResult:
    """The answer of ``solve_knapsack``.

    Attributes:
        value: Sum of the chosen items' values.
        weight: Sum of the chosen items' weights (never above the capacity).
        chosen: Sorted indices of the items kept.
        rejected: Sorted indices of the other items.
        method: The method that produced it.
    """

    value: float
    weight: int
    chosen: tuple[int, ...]
    rejected: tuple[int, ...]
    method: str


def solve_knapsack(
    weights: Sequence[int],
    values: Sequence[float],
    capacity: int,
    *,
    method: str = "auto",
    workers: int = 1,
) -> KnapsackResult:
    """Choose items maximizing total value with total weight at most ``capacity``.

    Args:
        weights: Integral item weights >= 0 (ints, numpy ints, or integral floats).
        values: Finite item values >= 0.
        capacity: Integral capacity >= 0.
        method: ``"auto"`` (exact, reductions then the fastest exact path), ``"hirschberg"``
            (exact, dense O(W)-memory DP), ``"dp"`` (exact, full table, refuses large ones),
            ``"greedy"`` (ratio heuristic) or ``"ilp"`` (exact via scipy's MILP).
        workers: Processes for the exact O(W) paths; the answer does not depend on it.

    Returns:
        A ``KnapsackResult``. Exact methods return an optimal, deterministic set.

    Raises:
        ValueError: for invalid arguments (the message names the argument).
        MemoryError: when the needed memory exceeds what is available (or, for ``"dp"``,
            ``baselines.DP_TABLE_LIMIT_BYTES``).
        ImportError: for ``"ilp"`` without scipy.

    Example:
        >>> solve_knapsack([2, 3, 4], [3.0, 4.0, 5.5], 5, method="hirschberg").chosen
        (0, 1)
    """
    weight_array, value_array, capacity = validate_inputs(weights, values, capacity, method, workers)
    _LAST_STATS.clear()
    _LAST_STATS.update(
        method=method, kernel=KERNEL, items=len(weight_array), capacity=capacity, cell_updates=0
    )
    if method in ("auto", "hirschberg"):
        chosen = _solve_exact(weight_array, value_array, capacity, method == "auto", workers)
    else:
        solver = {"dp": baselines.dp_table, "greedy": baselines.greedy, "ilp": baselines.ilp}[method]
        chosen = solver(weight_array, value_array, capacity)
    result = _result(weight_array, value_array, chosen, method)
    if result.weight > capacity:  # a last guard: no method may ever answer over the capacity
        raise AssertionError(f"solver {method!r} chose weight {result.weight} over capacity {capacity}")
    return result


def last_solve_stats() -> dict[str, object]:
    """Figures of the last ``solve_knapsack`` call in this process (for benchmarks).

    Keys: ``method``, ``kernel`` ("numba" or "numpy"), ``items``, ``capacity``,
    ``core_items`` and ``core_capacity`` (after reductions), ``cell_updates`` (DP cells
    updated), ``workers_used`` (processes that computed, this one included).

    Example:
        >>> _ = solve_knapsack([2, 3], [1.0, 1.0], 4, method="hirschberg")
        >>> last_solve_stats()["core_items"]
        2
    """
    return dict(_LAST_STATS)


def _solve_exact(weights: np.ndarray, values: np.ndarray, capacity: int, use_lp: bool, workers: int):
    core = reduce_instance(weights, values, capacity, use_lp=use_lp)
    n, cap = len(core.weights), core.capacity
    _LAST_STATS.update(core_items=n, core_capacity=cap, workers_used=1)
    mask = np.zeros(n, dtype=np.bool_)
    if n and cap:
        floats = hirschberg.arena_size(cap, n)
        check_fits(8 * floats, None, f"the O(W) solver's profiles (capacity {cap})")
        if workers > 1 and n * (cap + 1) >= PARALLEL_MIN_TOTAL_CELLS:
            _LAST_STATS["workers_used"] = workers
            with parallel.PoolExecutor(core.weights, core.values, floats, workers) as executor:
                mask, cells = hirschberg.solve_segments(core.weights, core.values, cap, executor)
        else:
            executor = hirschberg.LocalExecutor(core.weights, core.values, np.empty(floats))
            mask, cells = hirschberg.solve_segments(core.weights, core.values, cap, executor)
        _LAST_STATS["cell_updates"] = cells
    chosen = np.zeros(len(weights), dtype=np.bool_)
    chosen[core.expand(mask)] = True
    return chosen


def _result(weights: np.ndarray, values: np.ndarray, chosen: np.ndarray, method: str) -> KnapsackResult:
    index = np.arange(len(weights))
    return KnapsackResult(
        value=math.fsum(values[chosen].tolist()),
        weight=sum(weights[chosen].tolist()),
        chosen=tuple(index[chosen].tolist()),
        rejected=tuple(index[~chosen].tolist()),
        method=method,
    )
