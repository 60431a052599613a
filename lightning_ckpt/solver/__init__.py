"""Exact 0/1 and multiple-choice knapsack solver in O(W) memory (imports neither torch nor lightning).

Two entry points: ``solve_knapsack`` (0/1 items) and ``solve_choices`` (one option per group under
prefix capacities: op-level plans). Both run one engine (``capped/``), whose case of no caps is the
plain knapsack: 0/1 items without caps, or whose caps bind nowhere (``"auto"``), are one run solved
core-first. For ``solve_knapsack``, what runs depends on the method and on whether caps are given:

=============  ===========================================  ==========================================
``method``     without ``prefix_capacities``                with ``prefix_capacities`` (or skip caps)
=============  ===========================================  ==========================================
``"auto"``     one run: all exact reductions, minknap's     the sparse frontier DP (caps that bind
               expanding core, Hirschberg on the core       nowhere: as without); past 4M frontier
               past its state budget                        entries, the dense capped Hirschberg
``hirschberg`` one run: trivial reductions and common       the dense capped Hirschberg only (caps
               divisor only, then Hirschberg                that bind nowhere: as without)
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
``fits.py`` (memory checks) and ``baselines.py``; ``capped/`` (the one engine), ``dense/`` (its dense
pass without caps), ``sparse/`` (the exact layer both stand on: reductions, minknap, Pareto steps)
and ``runtime/`` (numba-or-numpy back end, stop flag and interrupts, worker processes).
Maintainers: ``docs/solver.md``.

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
    >>> solve_choices([[0, 3, 5], [0, 4]], [[0.0, 4.0, 6.0], [0.0, 5.0]], 8).choice  # one option per group
    (1, 1)
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
