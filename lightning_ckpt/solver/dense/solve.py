"""The dense pass without caps: Hirschberg on a reduced instance, in O(W) memory.

The one engine (``capped/``) runs it on a run of groups where no cap binds (``capped/run.py``: every
instance of ``solve_knapsack`` without caps is one such run) when the run's sparse states give up,
or at once for ``method="hirschberg"``: the core that the exact reductions (``sparse/reduce.py``)
leave goes to Hirschberg's divide and conquer (``hirschberg.py``) over value profiles
(``profile.py``), in a helper thread that Ctrl-C stops (below ``CALLING_THREAD_MAX_CELLS`` = 1M core
cells, in this thread, and a core that is one leaf straight into its bit table): on worker
processes sharing one arena when ``runtime.cpus.processes_for`` says so (``workers > 1``, the core
has at least ``SolverOptions.parallel_min_solve_cells`` cells and the CPUs are idle for them), else
in this process. It is the no-caps specialisation of the dense capped Hirschberg
(``capped/hirschberg.py``): weight-sorted clipping, balanced halves and checkpoints, which the
capped profiles cannot use (their caps fix the item order).

Example:
    >>> from lightning_ckpt.solver.sparse.reduce import reduce_instance
    >>> core = reduce_instance(np.array([2, 3, 4]), np.array([3.0, 4.0, 5.5]), 5, use_lp=False)
    >>> mask, cells, used = solve_core(core)
    >>> core.expand(mask).tolist(), used
    ([0, 1], 1)
"""

from __future__ import annotations

import numpy as np

from lightning_ckpt.solver.dense import hirschberg
from lightning_ckpt.solver.dense.profile import cell_updates, solve_leaf
from lightning_ckpt.solver.fits import check_fits
from lightning_ckpt.solver.options import DEFAULT_OPTIONS, SolverOptions
from lightning_ckpt.solver.runtime import cpus, interrupt, pool
from lightning_ckpt.solver.sparse.reduce import Core

__all__ = ["CALLING_THREAD_MAX_CELLS", "solve_core"]

CALLING_THREAD_MAX_CELLS = 1 << 20
"""Hirschberg cores under this many cells (about a millisecond) run in the calling thread: the helper
thread's start and join cost 0.1-0.4 ms. Above it the helper thread is also faster in numpy
(measured 2026-12-01, family B n=300 W=1e4, 2.3M cells: 1.75-1.76 ms in the helper thread, 1.95-2.15
ms in the calling thread, likely the allocator's per-thread arena for the kernels' temporaries)."""


def solve_core(
    core: Core, workers: int = 1, options: SolverOptions = DEFAULT_OPTIONS
) -> tuple[np.ndarray, int, int]:
    """Hirschberg on a reduced instance (items and capacity > 0): ``(chosen mask over the core,
    cell updates, processes used)``.

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
