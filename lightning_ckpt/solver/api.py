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

import dataclasses
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from lightning_ckpt.solver import baselines
from lightning_ckpt.solver.capped.solve import cap_violation, solve_capped
from lightning_ckpt.solver.options import SolverOptions, resolve_options
from lightning_ckpt.solver.runtime import cpus, interrupt
from lightning_ckpt.solver.runtime.backend import KERNEL
from lightning_ckpt.solver.validate import validate_caps, validate_inputs

__all__ = ["KnapsackResult", "SolveStats", "solve_knapsack"]


@dataclass(frozen=True)
class SolveStats:
    """Figures of one ``solve_knapsack`` call (for benchmarks and logs), carried on its result.

    The defaults are those of a method without reductions or O(W) dynamic programming
    (``"dp"``, ``"greedy"``, ``"ilp"``): no cell updates counted, one process.

    Attributes:
        method: The method asked for.
        kernel: The DP back end of this process, ``"numba"`` or ``"numpy"``.
        items: Items in the instance.
        capacity: The instance's capacity.
        core_items: Items left after the exact reductions (``"auto"``, ``"hirschberg"``); the
            other methods work on the whole instance and report ``items``.
        core_capacity: The capacity left after the reductions, in the core's weight units
            (divided by the weights' common divisor); ``capacity`` for the other methods.
        cell_updates: DP cells the O(W) method updated (0 for the other methods, and when the
            reductions settled every item).
        workers_used: Processes that computed, this one included.
        path: What answered, for ``"auto"`` and ``"hirschberg"``: without caps, or with caps that
            bind nowhere, ``"reductions"`` (they settled every item), ``"sparse"`` (the expanding
            core's sparse states; ``cell_updates`` then counts states) or ``"hirschberg"``; with
            binding caps ``"frontier"`` (``cell_updates`` counts its entries) or ``"dense"``. Empty
            for the other methods.
    """

    method: str = ""
    kernel: str = KERNEL
    items: int = 0
    capacity: int = 0
    core_items: int = 0
    core_capacity: int = 0
    cell_updates: int = 0
    workers_used: int = 1
    path: str = ""


@dataclass(frozen=True)
class KnapsackResult:
    """The answer of ``solve_knapsack``.

    Attributes:
        value: Sum of the chosen items' values.
        weight: Sum of the chosen items' weights (never above the capacity).
        chosen: Sorted indices of the items kept.
        rejected: Sorted indices of the other items.
        method: The method that produced it.
        stats: How it was computed; not part of equality (equal answers compare equal).
    """

    value: float
    weight: int
    chosen: tuple[int, ...]
    rejected: tuple[int, ...]
    method: str
    stats: SolveStats = field(default=SolveStats(), compare=False)


def solve_knapsack(
    weights: Sequence[int],
    values: Sequence[float],
    capacity: int,
    *,
    method: str = "auto",
    workers: int = 1,
    options: SolverOptions | None = None,
    prefix_capacities: Sequence[int] | None = None,
    skip_capacities: Sequence[int] | None = None,
) -> KnapsackResult:
    """Choose items maximizing total value with total weight at most ``capacity``.

    Which engine runs:

    - ``"auto"`` and ``"hirschberg"`` run the one engine (``capped/``). Without caps the instance is
      one run (``capped/run.py``): exact reductions (all of them for ``"auto"``, only the trivial
      ones and the common divisor for ``"hirschberg"``); for ``"auto"`` then sparse states around
      the break item (``sparse/``, minknap-style, with combo's cardinality bound and pairing on hard
      instances), and past a state bound (one state per capacity unit, at most 4M), as for
      ``"hirschberg"``, Hirschberg over value profiles on the core (``dense/``), on ``workers``
      processes when it is large; ``"dp"``, ``"greedy"`` and ``"ilp"`` run ``baselines.py`` (the
      planner's additive baselines come here, without caps);
    - with ``prefix_capacities`` or ``skip_capacities`` (how the callback's planner calls it, with
      ``method=config.solver``, ``"auto"`` by default): for ``"auto"`` the sparse frontier DP (caps
      that no feasible set can reach: the run above), and the dense capped Hirschberg only past 4M
      frontier entries; for ``"hirschberg"`` the dense capped Hirschberg alone (or, for caps that
      bind nowhere, the run's Hirschberg). Other methods are refused.

    Args:
        weights: Integral item weights >= 0 (ints, numpy ints, or integral floats).
        values: Finite item values >= 0.
        capacity: Integral capacity >= 0.
        method: ``"auto"`` (exact: reductions, or the sparse frontier with caps, then the dense
            O(W) path), ``"hirschberg"`` (exact, the dense O(W)-memory DP alone), ``"dp"`` (exact,
            full table, refuses large ones), ``"greedy"`` (ratio heuristic) or ``"ilp"`` (exact via
            scipy's MILP); with caps only ``"auto"`` and ``"hirschberg"``.
        workers: Processes for the exact O(W) paths, capped (with a warning) at the CPUs this
            process may use; the answer does not depend on it.
        options: Tunables (``SolverOptions``; None: the defaults); the answer does not depend
            on them either.
        prefix_capacities: Per item ``i``, the most the chosen items before ``i`` (in the given
            order) may weigh (integral, >= 0); only ``"auto"`` and ``"hirschberg"`` take it. With
            ``skip_capacities`` it binds only when item ``i`` is chosen.
        skip_capacities: Per item ``i``, the most the chosen items before ``i`` may weigh when
            ``i`` is not chosen (default: ``prefix_capacities``).

    Returns:
        A ``KnapsackResult``, its ``stats`` filled. Exact methods return an optimal,
        deterministic set.

    Raises:
        ValueError: for invalid arguments (the message names the argument).
        MemoryError: when the needed memory exceeds what is available (or, for ``"dp"``,
            ``options.dp_table_limit_bytes``).
        ImportError: for ``"ilp"`` without scipy.
        TimeoutError: for ``"ilp"`` when it proves no optimum within ``options.ilp_time_limit_s``.
        KeyboardInterrupt: at once on Ctrl-C, also during a long solve (its worker processes
            are then stopped; later solves start fresh ones).
        RuntimeError: when a worker process dies during the solve (the next solve starts fresh).

    Example:
        >>> result = solve_knapsack([2, 3, 4], [3.0, 4.0, 5.5], 5, method="hirschberg")
        >>> result.chosen, result.stats.core_items, result.stats.workers_used
        ((0, 1), 3, 1)
        >>> deep = SolverOptions(leaf_max_cells=0)  # split down to one-item leaves: same answer
        >>> split = solve_knapsack([2, 3, 4], [3.0, 4.0, 5.5], 5, method="hirschberg", options=deep)
        >>> split == result, split.stats == result.stats  # equal answers, different work
        (True, False)
        >>> caps = {"prefix_capacities": [5, 5, 0], "skip_capacities": [5, 5, 5]}
        >>> solve_knapsack([2, 3, 4], [3.0, 4.0, 5.5], 5, **caps).chosen  # item 2 only if first
        (0, 1)
        >>> solve_knapsack([2, 3, 4], [3.0, 4.0, 7.5], 5, **caps).chosen
        (2,)
        >>> dense = solve_knapsack([2, 3, 4], [3.0, 4.0, 7.5], 5, method="hirschberg", **caps)
        >>> dense.chosen, dense.stats.cell_updates  # the same set from the dense capped path's profiles
        ((2,), 18)
    """
    weight_array, value_array, capacity = validate_inputs(weights, values, capacity, method, workers)
    caps = validate_caps(prefix_capacities, skip_capacities, len(weight_array), capacity, method)
    workers = _usable_workers(int(workers))
    options = resolve_options(options)
    n = len(weight_array)
    if caps is not None:
        stats = SolveStats(method, KERNEL, n, capacity, core_items=n, core_capacity=capacity)
        chosen, stats = _solve_with_caps(weight_array, value_array, capacity, caps, stats, workers, options)
    elif method in ("auto", "hirschberg"):
        run = solve_capped(
            weight_array,
            value_array,
            capacity,
            sparse_first=method == "auto",
            workers=workers,
            options=options,
        )
        chosen = run.chosen
        stats = SolveStats(  # not dataclasses.replace: 6 us, a tenth of a small solve
            method,
            KERNEL,
            n,
            capacity,
            run.core_items,
            run.core_capacity,
            run.cells,
            run.workers_used,
            run.path,
        )
    else:
        stats = SolveStats(method, KERNEL, n, capacity, core_items=n, core_capacity=capacity)
        if method == "dp":
            chosen = baselines.dp_table(weight_array, value_array, capacity, options.dp_table_limit_bytes)
        elif method == "ilp":
            ilp = lambda: baselines.ilp(weight_array, value_array, capacity, options.ilp_time_limit_s)  # noqa: E731
            chosen = interrupt.run_interruptibly(ilp, None)
        else:
            chosen = baselines.greedy(weight_array, value_array, capacity)
    result = _result(weight_array, value_array, chosen, stats)
    if result.weight > capacity:  # a last guard: no method may ever answer over the capacity
        raise AssertionError(f"solver {method!r} chose weight {result.weight} over capacity {capacity}")
    return result


def _solve_with_caps(
    weights: np.ndarray,
    values: np.ndarray,
    capacity: int,
    caps: tuple[np.ndarray, np.ndarray],
    stats: SolveStats,
    workers: int,
    options: SolverOptions,
) -> tuple[np.ndarray, SolveStats]:
    """The capped engine (``capped/``; ``"auto"``: the frontier first), then a last guard that no cap
    is broken: the chosen mask and the completed stats."""
    if not len(weights):
        return np.zeros(0, dtype=np.bool_), dataclasses.replace(stats, core_capacity=0)
    sparse_first = stats.method == "auto"  # "hirschberg": the dense path only
    answer = solve_capped(
        weights, values, capacity, *caps, sparse_first=sparse_first, workers=workers, options=options
    )
    broken = cap_violation(weights, answer.chosen, capacity, *caps)
    if broken is not None:
        raise AssertionError(f"solver {stats.method!r} with prefix capacities: {broken}")
    core_items = stats.core_items if answer.core_items < 0 else answer.core_items  # a run's reductions
    return answer.chosen, dataclasses.replace(
        stats,
        core_items=core_items,
        core_capacity=answer.core_capacity,
        cell_updates=answer.cells,
        workers_used=answer.workers_used,
        path=answer.path,
    )


def _usable_workers(workers: int) -> int:
    """``workers``, capped (with a warning) at the CPUs this process may run on: its affinity set
    and cgroup CPU quota (``runtime.cpus.usable_cpus``, the rule the busy-CPU check uses too)."""
    if workers <= 1:  # one process always fits (and small solves skip reading the cgroup file)
        return workers
    usable = cpus.usable_cpus()
    if workers <= usable:
        return workers
    warnings.warn(
        f"`workers={workers}` is more than the {usable} CPUs this process may use; using {usable}",
        RuntimeWarning,
        stacklevel=3,
    )
    return usable


def _result(weights: np.ndarray, values: np.ndarray, chosen: np.ndarray, stats: SolveStats) -> KnapsackResult:
    index = np.arange(len(weights))
    return KnapsackResult(
        value=math.fsum(values[chosen].tolist()),
        weight=sum(weights[chosen].tolist()),
        chosen=tuple(index[chosen].tolist()),
        rejected=tuple(index[~chosen].tolist()),
        method=stats.method,
        stats=stats,
    )
