"""A run of 0/1 groups where no cap binds, solved core-first: the one engine's uncapped case.

Without caps (``solve_knapsack`` without ``prefix_capacities``), or with caps that no feasible set
can reach (``caps_bind`` says False), the items may be taken in any order, so the run is solved as
minknap solves a knapsack, not in the given order as the frontier does:

- the exact reductions (``sparse/reduce.py``: for ``"auto"`` LP fixing and bundles of identical
  items, always the trivial ones and the weights' common divisor; on Python lists up to
  ``LISTS_MAX_ITEMS`` items, ``sparse/reduce_lists.py``);
- for ``"auto"``, on a core of at least ``SPARSE_MIN_CELLS`` dense cells, the expanding core around
  the break item (``sparse/minknap.py``, efficiency order, with combo's strong bounds once past
  ``STRONG_AFTER_STATES``), at most ``max_sparse_states`` states;
- past that budget, or for ``"hirschberg"``, the dense pass without caps (``dense/solve.py``).

Example:
    >>> answer = solve_run(np.array([2, 3, 4]), np.array([3.0, 4.0, 5.5]), 5, use_lp=False)
    >>> answer.chosen.tolist(), answer.core_items, answer.workers_used, answer.path
    ([True, True, False], 3, 1, 'hirschberg')
    >>> solve_run(np.array([2, 3, 4]), np.array([3.0, 4.0, 5.5]), 5, use_lp=True).path
    'reductions'
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from lightning_ckpt.solver.dense.solve import solve_core
from lightning_ckpt.solver.options import DEFAULT_OPTIONS, SolverOptions
from lightning_ckpt.solver.sparse.minknap import STRONG_AFTER_STATES, solve_minknap
from lightning_ckpt.solver.sparse.reduce import reduce_instance
from lightning_ckpt.solver.sparse.reduce_lists import LISTS_MAX_ITEMS, reduce_lists

__all__ = [
    "CELLS_PER_STATE",
    "SPARSE_MIN_CELLS",
    "STREAMING_CELLS_PER_STATE",
    "RunAnswer",
    "caps_bind",
    "max_sparse_states",
    "solve_run",
]

SPARSE_MIN_CELLS = 1 << 22
"""Below this many dense cells (core items x (core capacity + 1)) Hirschberg runs at once: a few
milliseconds at most, less than the sparse states' per-item steps cost on such cores."""

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


def caps_bind(weights: np.ndarray, capacity: int, take: np.ndarray, skip: np.ndarray) -> bool:
    """Whether some set of weight at most ``capacity`` breaks a cap. No set does when every item's
    caps hold what may lie before it: at most the weight of all items before it, and at most
    ``capacity`` (less its own weight when it is taken). Then the caps change nothing.

    Example:
        >>> w = np.array([3, 4, 5])
        >>> caps_bind(w, 8, np.array([8, 3, 3]), np.array([8, 7, 8])), caps_bind(w, 8, w * 0 + 2, w * 0 + 8)
        (False, True)
    """
    if len(weights) < 16:  # Python ints, 0.25 us an item, under the 3 us of the numpy calls below
        before = 0
        for w, t, s in zip(weights.tolist(), take.tolist(), skip.tolist(), strict=True):
            if t < min(before, capacity - w) or s < min(before, capacity):
                return True
            before += w
        return False
    before = np.cumsum(weights) - weights
    if (skip < np.minimum(before, capacity)).any():
        return True
    return bool((take < np.minimum(before, capacity - weights)).any())


class RunAnswer(NamedTuple):
    """What a run without binding caps came to, and how."""

    chosen: np.ndarray
    """Mask over the run's items."""
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


def solve_run(
    weights: np.ndarray,
    values: np.ndarray,
    capacity: int,
    *,
    use_lp: bool,
    workers: int = 1,
    options: SolverOptions = DEFAULT_OPTIONS,
) -> RunAnswer:
    """The optimal set of validated items (int64 weights, float64 values) with no binding cap:
    reductions (``use_lp``: all of them, and the sparse states, as for ``"auto"``), then the dense
    pass on what is left."""
    if use_lp and len(weights) <= LISTS_MAX_ITEMS:  # the same core, without numpy's per-call cost
        core = reduce_lists(weights, values, capacity)
    else:
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
        (mask, cells, used), path = solve_core(core, workers, options), "hirschberg"
    chosen = np.zeros(len(weights), dtype=np.bool_)
    chosen[core.expand(mask)] = True
    return RunAnswer(chosen, n, cap, cells, used, path)
