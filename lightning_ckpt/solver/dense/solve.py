"""The uncapped exact engine: exact reductions, then Hirschberg on the core, in O(W) memory.

``solve_knapsack`` runs it for ``method="auto"`` and ``"hirschberg"`` without prefix capacities
(the planner's additive baselines call it so). ``"auto"`` applies every exact reduction
(``reduce.py``: LP fixing, bundles of identical items, the weights' common divisor), which on
plan-like instances settles almost every item, then tries the sparse states of ``sparse/minknap.py``
(an expanding core around the break item), which answer uncorrelated and weakly correlated
instances in milliseconds whatever W is; past ``max_sparse_states`` states (at most one per
capacity unit, and ``SolverOptions.sparse_max_states``, 4M) it gives up. ``"hirschberg"`` keeps only the trivial reductions and the
common divisor, and no sparse try. What is left, the *core*, goes to Hirschberg's divide and conquer
(``hirschberg.py``) over value profiles (``profile.py``), in a helper thread that Ctrl-C stops
(below ``CALLING_THREAD_MAX_CELLS`` = 1M core cells, in this thread, and a core that is one leaf
straight into its bit table):
on worker processes sharing one arena when ``runtime.cpus.processes_for`` says so (``workers > 1``,
the core has at least ``SolverOptions.parallel_min_solve_cells`` cells and the CPUs are idle for
them), else in this process.

Example:
    >>> answer = solve_uncapped(np.array([2, 3, 4]), np.array([3.0, 4.0, 5.5]), 5, use_lp=False)
    >>> answer.chosen.tolist(), answer.core_items, answer.workers_used, answer.path
    ([True, True, False], 3, 1, 'hirschberg')
    >>> solve_uncapped(np.array([2, 3, 4]), np.array([3.0, 4.0, 5.5]), 5, use_lp=True).path
    'reductions'

"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from lightning_ckpt.solver.dense import hirschberg
from lightning_ckpt.solver.dense.profile import cell_updates, solve_leaf
from lightning_ckpt.solver.dense.reduce import Core, reduce_instance
from lightning_ckpt.solver.fits import check_fits
from lightning_ckpt.solver.options import DEFAULT_OPTIONS, SolverOptions
from lightning_ckpt.solver.runtime import cpus, interrupt, pool
from lightning_ckpt.solver.sparse.minknap import STRONG_AFTER_STATES, solve_minknap

__all__ = [
    "CALLING_THREAD_MAX_CELLS",
    "CELLS_PER_STATE",
    "SPARSE_MIN_CELLS",
    "STREAMING_CELLS_PER_STATE",
    "DenseAnswer",
    "max_sparse_states",
    "solve_uncapped",
]


SPARSE_MIN_CELLS = 1 << 22
"""Below this many dense cells (core items x (core capacity + 1)) Hirschberg runs at once: a few
milliseconds at most, less than the sparse states' per-item steps cost on such cores."""

CALLING_THREAD_MAX_CELLS = 1 << 20
"""Hirschberg cores under this many cells (about a millisecond) run in the calling thread: the helper
thread's start and join cost 0.1-0.4 ms. Above it the helper thread is also faster in numpy
(measured 2026-12-01, family B n=300 W=1e4, 2.3M cells: 1.75-1.76 ms in the helper thread, 1.95-2.15
ms in the calling thread, likely the allocator's per-thread arena for the kernels' temporaries)."""

CELLS_PER_STATE = 4096
"""A sparse state costs about as much as this many dense cells where the dense kernel's groups of
items stay in cache (measured 2026-12-01: 29 ns a state, family B n=1000 W=4e6, where Hirschberg's
283 ms make 0.07 ns per core cell; 2026-12-02: 0.17 CPU ns per cell); the sparse try may make one
state per this many cells, so that giving up wastes at most about a tenth of the dense time."""

STREAMING_CELLS_PER_STATE = 512
"""The same where the dense kernel streams the profile through memory for each item (a group of
``SolverOptions.group_items`` items of the core's mean weight spans more than ``group_window``
cells): measured 2026-12-02, family B n=100 W=1.4e8 seed 1, Hirschberg 16.8 CPU s for 1.4e10 core
cells (1.2 ns a cell, 7x the cached rate), and the sparse states 81 ns each (3.5M states in 285 ms,
answering where the 4096 rule had given up after 3.4M)."""


def max_sparse_states(
    items: int, capacity: int, options: SolverOptions, weights: np.ndarray | None = None
) -> int:
    """States the sparse try may make on a core (0: no try): one per ``CELLS_PER_STATE`` dense cells
    (``STREAMING_CELLS_PER_STATE`` where the core's ``weights``, if given, are heavy enough that the
    dense kernel streams), and one per capacity unit and item (8 bytes of history each, a
    third of the dense path's 24 bytes per unit), at most ``options.sparse_max_states``; none below
    ``SPARSE_MIN_CELLS``.

    Example:
        >>> max_sparse_states(100, 10_000, DEFAULT_OPTIONS), max_sparse_states(94, 6_478_072, DEFAULT_OPTIONS)
        (0, 148666)
        >>> max_sparse_states(100, 140_000_000, DEFAULT_OPTIONS, np.full(100, 2_800_000))  # streams
        4194304
    """
    cells = items * (capacity + 1)
    if cells < SPARSE_MIN_CELLS:
        return 0
    weight_sum = 0 if weights is None else int(weights.sum())  # summed only for a core this large
    streams = weight_sum * options.group_items > options.group_window * items
    per_state = STREAMING_CELLS_PER_STATE if streams else CELLS_PER_STATE
    return min(options.sparse_max_states, capacity + items, cells // per_state)


class DenseAnswer(NamedTuple):
    """What the uncapped engine found, and how."""

    chosen: np.ndarray
    """Mask over the instance's items."""
    core_items: int
    """Items left after the reductions."""
    core_capacity: int
    """The capacity left, in the core's weight units (divided by the common divisor)."""
    cells: int
    """DP cells updated, or states made on the sparse path (0 when the reductions settled every item)."""
    workers_used: int
    """Processes that computed, this one included."""
    path: str
    """``"reductions"`` (they settled every item), ``"sparse"`` (the sparse states answered) or
    ``"hirschberg"``."""


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
    mask, cells, used, path = np.zeros(n, dtype=np.bool_), 0, 1, "reductions"
    sparse, most = None, max_sparse_states(n, cap, options, core.weights)
    if use_lp and most:
        early = max_sparse_states(n, cap, options) // 4  # the strong bounds start where they did
        strong_after = min(STRONG_AFTER_STATES, early)  # before the streaming rule: the same sets
        sparse = solve_minknap(core.weights, core.values, cap, most, strong_after, counts=core.copies)
    if sparse is not None:
        (mask, cells), path = sparse, "sparse"
    elif n and cap:
        (mask, cells, used), path = _solve_core(core, workers, options), "hirschberg"
    chosen = np.zeros(len(weights), dtype=np.bool_)
    chosen[core.expand(mask)] = True
    return DenseAnswer(chosen, n, cap, cells, used, path)


def _solve_core(core: Core, workers: int, options: SolverOptions) -> tuple[np.ndarray, int, int]:
    """Hirschberg on the reduced instance: ``(chosen mask, cell updates, processes used)``.

    It runs in a helper thread, so that Ctrl-C stops it (and its workers) at once; a core of fewer
    than ``CALLING_THREAD_MAX_CELLS`` cells, done in about a millisecond, runs in this thread
    (starting and joining the helper cost 0.1-0.4 ms, more than the whole solve of 50 items), and
    when it is one leaf (``hirschberg.is_leaf``) straight into ``profile.solve_leaf``, with no arena.
    """
    n, cap = len(core.weights), core.capacity
    cells = n * (cap + 1)
    workers = cpus.processes_for(workers, cells, options.parallel_min_solve_cells)
    parallel = workers > 1
    if (
        not parallel
        and cells < CALLING_THREAD_MAX_CELLS
        and hirschberg.is_leaf(n, cap, options.leaf_max_cells)
    ):
        return _solve_one_leaf(core)
    floats = hirschberg.arena_size(cap, n, options)
    check_fits(8 * floats, None, f"the O(W) solver's profiles (capacity {cap})", _ADVICE)
    stop = interrupt.new_stop_flag()
    if parallel:
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
    if cells < CALLING_THREAD_MAX_CELLS:
        return *solve(), 1
    return *interrupt.run_interruptibly(solve, stop), 1


_ADVICE = "lower the capacity (a coarser weight unit, such as a larger `quantum_bytes`) or free memory"


def _solve_one_leaf(core: Core) -> tuple[np.ndarray, int, int]:
    """A core that is one leaf: what ``hirschberg.solve_segments`` would run, without its planning
    and arena (one profile of ``capacity + 1`` floats and the leaf's bit table)."""
    cap = core.capacity
    check_fits(8 * (cap + 1), None, f"the O(W) solver's profiles (capacity {cap})", _ADVICE)
    return solve_leaf(core.weights, core.values, cap, np.empty(cap + 1)), cell_updates(core.weights, cap), 1
