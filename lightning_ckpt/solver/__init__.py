"""Exact 0/1 knapsack solver in O(W) memory (imports neither torch nor lightning).

One entry point, ``solve_knapsack``; which engine runs depends on the method and on whether prefix
capacities are given:

=============  ===========================================  ==========================================
``method``     without ``prefix_capacities``                with ``prefix_capacities`` (or skip caps)
=============  ===========================================  ==========================================
``"auto"``     ``dense``: all exact reductions, then        ``capped``: the sparse frontier DP; past
               Hirschberg on the core                       4M frontier entries, the dense capped
                                                            Hirschberg
``hirschberg`` ``dense``: trivial reductions and common     ``capped``: the dense capped Hirschberg
               divisor only, then Hirschberg                only
``dp``         ``baselines.dp_table``: the full table       refused (``ValueError``)
``greedy``     ``baselines.greedy``: ratio heuristic        refused
``ilp``        ``baselines.ilp``: scipy's MILP              refused
=============  ===========================================  ==========================================

What the callback runs: its planner (``lightning_ckpt.planning.exact``) calls ``solve_knapsack(...,
method=config.solver, prefix_capacities=..., skip_capacities=...)`` when the peak points are nested, so
with the default ``solver="auto"`` a plan is solved by the sparse frontier (``capped/frontier.py``), in
numpy, in milliseconds; the dense capped path is its O(W)-memory fallback. With ``solver`` one of
``"dp"``, ``"greedy"`` or ``"ilp"``, the planner (``lightning_ckpt.planning.additive``) calls ``solve_knapsack``
without caps on the additive bound: the baselines. (Peak points that are not nested never reach this
package: the planner solves that small module-level instance itself, ``planning/non_nested.py``.)

The rooms: ``api.py`` (the entry and its results), ``validate.py``, ``options.py``, ``quantize.py``,
``fits.py`` (memory checks) and ``baselines.py``; ``dense/`` (the uncapped engine), ``capped/`` (the
capped engine) and ``runtime/`` (numba-or-numpy back end, stop flag and interrupts, worker
processes), on which both engines stand. Maintainers: ``docs/solver.md``.

Example:
    >>> from lightning_ckpt.solver import solve_knapsack
    >>> solve_knapsack([3, 4, 5], [4.0, 5.0, 6.0], 8).chosen
    (0, 2)
    >>> caps = {"prefix_capacities": [8, 8, 2], "skip_capacities": [8, 8, 8]}  # item 2: at most 2 before
    >>> solve_knapsack([3, 4, 5], [4.0, 5.0, 6.0], 8, **caps).chosen  # the capped engine's frontier
    (0, 1)
    >>> solve_knapsack([3, 4, 5], [4.0, 5.0, 6.0], 8, method="greedy", **caps)
    Traceback (most recent call last):
    ...
    ValueError: `method` must be one of 'auto', 'hirschberg' with prefix capacities, got 'greedy'
"""

from lightning_ckpt.solver.api import KnapsackResult, SolveStats, solve_knapsack
from lightning_ckpt.solver.choices import ChoiceResult, solve_choices
from lightning_ckpt.solver.options import SolverOptions
from lightning_ckpt.solver.quantize import quantize
from lightning_ckpt.solver.runtime.backend import KERNEL

__all__ = [
    "KERNEL",
    "ChoiceResult",
    "KnapsackResult",
    "SolveStats",
    "SolverOptions",
    "quantize",
    "solve_choices",
    "solve_knapsack",
]
