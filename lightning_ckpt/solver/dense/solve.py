"""The uncapped exact engine: exact reductions, then Hirschberg on the core, in O(W) memory.

``solve_knapsack`` runs it for ``method="auto"`` and ``"hirschberg"`` without prefix capacities
(the planner's additive baselines call it so). ``"auto"`` applies every exact reduction
(``reduce.py``: LP fixing, bundles of identical items, the weights' common divisor), which on
plan-like instances settles almost every item; ``"hirschberg"`` keeps only the trivial ones and
the common divisor. What is left, the *core*, goes to Hirschberg's divide and conquer
(``hirschberg.py``) over value profiles (``profile.py``), in a helper thread that Ctrl-C stops:
on worker processes sharing one arena when ``workers > 1`` and the core has at least
``SolverOptions.parallel_min_solve_cells`` cells, else in this process.

Example:
    >>> answer = solve_uncapped(np.array([2, 3, 4]), np.array([3.0, 4.0, 5.5]), 5, use_lp=False)
    >>> answer.chosen.tolist(), answer.core_items, answer.workers_used
    ([True, True, False], 3, 1)
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from lightning_ckpt.solver.dense import hirschberg
from lightning_ckpt.solver.dense.reduce import Core, reduce_instance
from lightning_ckpt.solver.fits import check_fits
from lightning_ckpt.solver.options import DEFAULT_OPTIONS, SolverOptions
from lightning_ckpt.solver.runtime import interrupt, pool

__all__ = ["DenseAnswer", "solve_uncapped"]


class DenseAnswer(NamedTuple):
    """What the uncapped engine found, and how."""

    chosen: np.ndarray
    """Mask over the instance's items."""
    core_items: int
    """Items left after the reductions."""
    core_capacity: int
    """The capacity left, in the core's weight units (divided by the common divisor)."""
    cells: int
    """DP cells updated (0 when the reductions settled every item)."""
    workers_used: int
    """Processes that computed, this one included."""


def solve_uncapped(
    weights: np.ndarray,
    values: np.ndarray,
    capacity: int,
    *,
    use_lp: bool,
    workers: int = 1,
    options: SolverOptions = DEFAULT_OPTIONS,
) -> DenseAnswer:
    """The optimal set of validated items (int64 weights, float64 values): reductions (``use_lp``:
    all of them, as for ``"auto"``), then Hirschberg on what is left."""
    core = reduce_instance(weights, values, capacity, use_lp=use_lp)
    n, cap = len(core.weights), core.capacity
    mask, cells, used = np.zeros(n, dtype=np.bool_), 0, 1
    if n and cap:
        mask, cells, used = _solve_core(core, workers, options)
    chosen = np.zeros(len(weights), dtype=np.bool_)
    chosen[core.expand(mask)] = True
    return DenseAnswer(chosen, n, cap, cells, used)


def _solve_core(core: Core, workers: int, options: SolverOptions) -> tuple[np.ndarray, int, int]:
    """Hirschberg on the reduced instance: ``(chosen mask, cell updates, processes used)``.

    It runs in a helper thread, so that Ctrl-C stops it (and its workers) at once.
    """
    n, cap = len(core.weights), core.capacity
    floats = hirschberg.arena_size(cap, n, options)
    advice = "lower the capacity (a coarser weight unit, such as a larger `quantum_bytes`) or free memory"
    check_fits(8 * floats, None, f"the O(W) solver's profiles (capacity {cap})", advice)
    stop = interrupt.new_stop_flag()
    if workers > 1 and n * (cap + 1) >= options.parallel_min_solve_cells:
        shared = interrupt.run_interruptibly(
            lambda: pool.solve_on_workers(
                core.weights,
                core.values,
                floats,
                workers,
                options,
                stop,
                lambda executor: hirschberg.solve_segments(core.weights, core.values, cap, executor, options),
            ),
            stop,
            uses_workers=True,
        )
        if shared is not None:
            return *shared, workers
    executor = pool.LocalExecutor(core.weights, core.values, np.empty(floats), options, stop)
    solve = lambda: hirschberg.solve_segments(core.weights, core.values, cap, executor, options)  # noqa: E731
    return *interrupt.run_interruptibly(solve, stop), 1
