"""The one engine: one option per group under prefix capacities; the uncapped knapsack is its case of no caps.

Group ``g`` takes one of its options; option ``o`` may be chosen only while the chosen options of the
groups before ``g`` weigh at most its cap; everything chosen at most the capacity W (``groups.py``).
A 0/1 knapsack with take caps (item chosen) and skip caps (item left out) is the two-option case:
a plan's peak constraints have that form when the backward frees modules in reverse forward order,
and op-level plans (several options per block) the general one.

``solve_knapsack`` runs it for ``"auto"`` and ``"hirschberg"``, with caps or without, ``solve_choices``
always. 0/1 items without caps, or whose caps no feasible set can reach (``run.caps_bind``), are one
run of groups where no cap binds: ``run.py`` solves it core-first (for ``"auto"`` the exact
reductions and minknap's expanding core; the dense pass without caps past its state budget, or at
once for ``"hirschberg"``: 9-12x faster there than the dense capped Hirschberg). Otherwise
caps are clipped to W, and weights, caps and W are divided (floor) by the weights' common divisor.
Then:

- ``method="auto"``: the sparse Pareto-frontier DP (``frontier.py``, numpy, in the calling thread),
  which solves plan-like instances in milliseconds whatever W is; past ``SPARSE_MAX_ENTRIES``
  frontier entries it gives up and the dense capped Hirschberg (``hirschberg.py``) takes over;
- ``method="hirschberg"``: the dense capped Hirschberg only.

The dense path runs in a helper thread (``runtime.interrupt``), so that Ctrl-C stops it at once.

Example:
    >>> w, v = np.array([3, 3, 3]), np.array([1.5, 2.0, 3.0])
    >>> answer = solve_capped(w, v, 6, np.array([6, 6, 0]), np.array([6, 6, 6]), sparse_first=True)
    >>> answer.chosen.tolist(), answer.path  # item 2 only with nothing before it: items 0 and 1 (3.5)
    ([True, True, False], 'frontier')
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from lightning_ckpt.solver.capped import hirschberg
from lightning_ckpt.solver.capped.frontier import solve_sparse
from lightning_ckpt.solver.capped.groups import Groups, divided, from_items
from lightning_ckpt.solver.capped.run import caps_bind, solve_run
from lightning_ckpt.solver.options import DEFAULT_OPTIONS, SolverOptions
from lightning_ckpt.solver.runtime import interrupt

__all__ = ["SPARSE_MAX_ENTRIES", "CappedAnswer", "cap_violation", "solve_capped", "solve_groups"]

SPARSE_MAX_ENTRIES = 1 << 22
"""The sparse path gives up past this many frontier entries (all passes together; its history holds
at most ~32 MB), and the dense capped Hirschberg takes over. With its bounds it stays far below on
plan-like instances: at most 234,042 entries (5.6%) over the configs' plans and the fresh-process
instances up to n = 2000 (``python -m benchmarks.bench.frontier_sizes``, 2026-12-01)."""


class CappedAnswer(NamedTuple):
    """What the capped engine found, and how."""

    chosen: np.ndarray
    """The option index per group (``solve_groups``), or a mask over the items (``solve_capped``)."""
    cells: int
    """Frontier entries made (``path == "frontier"``) or DP cells updated (``"dense"``)."""
    workers_used: int
    """Processes that computed, this one included."""
    core_capacity: int
    """The capacity after dividing by the weights' common divisor."""
    path: str
    """``"frontier"`` (the sparse DP answered) or ``"dense"`` (the dense capped Hirschberg did); for a
    run without binding caps (``run.py``), ``"reductions"``, ``"sparse"`` or ``"hirschberg"``."""
    core_items: int = -1
    """Items left after the reductions on a run without binding caps; -1 where none ran."""


def solve_groups(
    groups: Groups,
    capacity: int,
    *,
    sparse_first: bool,
    workers: int = 1,
    options: SolverOptions = DEFAULT_OPTIONS,
) -> CappedAnswer:
    """Solve a feasible instance exactly (``feasible`` says whether it is; a cap below 0 forbids its
    option). ``sparse_first`` (``"auto"``) tries the frontier DP before the dense one; ``workers``
    processes (this one included) compute the dense path's profiles."""
    groups, capacity = divided(groups, capacity)
    if sparse_first:
        sparse = solve_sparse(groups, capacity, SPARSE_MAX_ENTRIES)
        if sparse is not None:
            return CappedAnswer(*sparse, 1, capacity, "frontier")
    stop = interrupt.new_stop_flag()
    solve = lambda: hirschberg.solve_dense(groups, capacity, workers, options, stop)  # noqa: E731
    choice, cells, used = interrupt.run_interruptibly(solve, stop, uses_workers=workers > 1)
    return CappedAnswer(choice, cells, used, capacity, "dense")


def solve_capped(
    weights: np.ndarray,
    values: np.ndarray,
    capacity: int,
    take: np.ndarray | None = None,
    skip: np.ndarray | None = None,
    *,
    sparse_first: bool,
    workers: int = 1,
    options: SolverOptions = DEFAULT_OPTIONS,
) -> CappedAnswer:
    """The 0/1 knapsack with take and skip caps (>= 0; ``take`` None: no caps, ``skip`` None: as
    ``take``) as two-option groups, or as one run core-first (``run.py``) where no cap binds;
    ``chosen`` is a mask."""
    skip = take if skip is None else skip
    if take is None or not caps_bind(weights, capacity, take, skip):
        run = solve_run(weights, values, capacity, use_lp=sparse_first, workers=workers, options=options)
        return CappedAnswer(
            run.chosen, run.cells, run.workers_used, run.core_capacity, run.path, run.core_items
        )
    groups = from_items(weights, values, take, skip)
    answer = solve_groups(groups, capacity, sparse_first=sparse_first, workers=workers, options=options)
    return answer._replace(chosen=answer.chosen == 1)


def cap_violation(
    weights: np.ndarray, chosen: np.ndarray, capacity: int, take: np.ndarray, skip: np.ndarray
) -> str | None:
    """What the chosen mask breaks (a sentence), or None when it meets every cap.

    Example:
        >>> cap_violation(np.array([2, 2]), np.array([True, True]), 4, np.array([4, 1]), np.array([4, 4]))
        'item 1 chosen after 2 of chosen weight, over its cap 1'
    """
    before = 0
    for j, (w, keep) in enumerate(zip(weights.tolist(), chosen.tolist(), strict=True)):
        cap = int(take[j] if keep else skip[j])
        if before > cap:
            return f"item {j} {'chosen' if keep else 'left out'} after {before} of chosen weight, over its cap {cap}"
        before += w if keep else 0
    return None if before <= capacity else f"chosen weight {before} over the capacity {capacity}"
