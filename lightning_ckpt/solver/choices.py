"""``solve_choices``: one option per group, exactly, under prefix capacities (a multiple-choice knapsack).

Op-level planning gives every block a few options (keep, full checkpoint, selective policies), each
with the bytes it adds and the recompute it saves; the plan takes one option per block. The engine is
the capped one (``capped/``), which also solves ``solve_knapsack`` with prefix capacities: a 0/1 item
is the two-option group (leave out, take).

Example:
    >>> result = solve_choices([[0, 4], [0, 2, 5]], [[0.0, 3.0], [0.0, 1.0, 2.5]], 6)
    >>> result.choice, result.value, result.weight
    ((1, 1), 4.0, 6)
    >>> weights, values = [[0, 4], [0, 2, 2]], [[0.0, 3.0], [0.0, 1.0, 2.5]]
    >>> solve_choices(weights, values, 6).choice
    (1, 2)
    >>> caps = [[6, 6], [6, 6, 0]]  # group 1's option 2 only with nothing chosen before it
    >>> solve_choices(weights, values, 6, prefix_capacities=caps).choice
    (1, 1)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from lightning_ckpt.solver.api import SolveStats, _usable_workers
from lightning_ckpt.solver.capped.groups import choice_violation, reach
from lightning_ckpt.solver.capped.solve import solve_groups
from lightning_ckpt.solver.choice_validate import validate_choices
from lightning_ckpt.solver.options import SolverOptions, resolve_options
from lightning_ckpt.solver.runtime.backend import KERNEL

__all__ = ["ChoiceResult", "solve_choices"]


@dataclass(frozen=True)
class ChoiceResult:
    """The answer of ``solve_choices``.

    Attributes:
        value: Sum of the chosen options' values.
        weight: Sum of the chosen options' weights (never above the capacity).
        choice: The option index chosen in each group.
        method: The method that produced it.
        stats: How it was computed (``items`` counts groups); not part of equality.
    """

    value: float
    weight: int
    choice: tuple[int, ...]
    method: str
    stats: SolveStats = field(default=SolveStats(), compare=False)


def solve_choices(
    weights: Sequence[Sequence[int]],
    values: Sequence[Sequence[float]],
    capacity: int,
    *,
    prefix_capacities: Sequence[Sequence[int]] | None = None,
    method: str = "auto",
    workers: int = 1,
    options: SolverOptions | None = None,
) -> ChoiceResult:
    """Choose one option per group maximizing total value under the capacity and prefix capacities.

    Group ``g`` has options ``j = 0..len(weights[g]) - 1``; the chosen weights sum to at most
    ``capacity``, and when group ``g`` takes option ``j`` the chosen weights of the groups before it
    (in the given order) sum to at most ``prefix_capacities[g][j]``. ``"auto"`` runs the sparse
    multiple-choice frontier (``capped/frontier.py``) and, past 4M entries, the dense capped
    Hirschberg (O(W) memory, profiles on ``workers`` processes); ``"hirschberg"`` the dense path alone.

    Args:
        weights: Per group, its options' integral weights >= 0 (at least one option per group).
        values: Per group, its options' finite values >= 0 (the same shape).
        capacity: Integral capacity >= 0.
        prefix_capacities: Per group and option, the most the groups before may weigh when it is
            chosen (integral, >= 0; default: ``capacity``).
        method: ``"auto"`` or ``"hirschberg"``, both exact.
        workers: Processes for the dense path, capped (with a warning) at the CPUs this process may
            use; the answer does not depend on it.
        options: Tunables (``SolverOptions``); the answer does not depend on them.

    Returns:
        A ``ChoiceResult``: an optimal choice, the same for any ``workers`` and ``options``.

    Raises:
        ValueError: for invalid arguments (the message names the argument and the index), and when
            no choice meets the caps (naming ``prefix_capacities``).
        MemoryError: when the dense path's profiles do not fit in the available memory.
        KeyboardInterrupt: at once on Ctrl-C, also during a long solve.
        RuntimeError: when a worker process dies during the solve.
    """
    groups, capacity = validate_choices(weights, values, capacity, prefix_capacities, method, workers)
    workers, options = _usable_workers(int(workers)), resolve_options(options)
    stats = SolveStats(method, KERNEL, groups.count, capacity, groups.count, capacity)
    if not groups.count:
        return ChoiceResult(0.0, 0, (), method, stats)
    room = reach(groups, capacity)[0]
    if room[0] < 0:
        last = int(np.flatnonzero(room < 0).max())
        raise ValueError(
            f"`prefix_capacities` admit no choice within them and `capacity` {capacity}: from group {last} on,"
            " no option fits after the lightest choice before it (give each group an option of weight 0)"
        )
    answer = solve_groups(groups, capacity, sparse_first=method == "auto", workers=workers, options=options)
    broken = choice_violation(groups, answer.chosen, capacity)
    if broken is not None:  # a last guard: no answer may break a cap
        raise AssertionError(f"solve_choices {method!r}: {broken}")
    picked = groups.starts[:-1] + answer.chosen
    stats = SolveStats(
        method,
        KERNEL,
        groups.count,
        capacity,
        groups.count,
        answer.core_capacity,
        answer.cells,
        answer.workers_used,
        answer.path,
    )
    return ChoiceResult(
        value=math.fsum(groups.values[picked].tolist()),
        weight=sum(groups.weights[picked].tolist()),
        choice=tuple(answer.chosen.tolist()),
        method=method,
        stats=stats,
    )
