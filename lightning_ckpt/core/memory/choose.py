"""Choose the kept candidates of least recompute whose predicted peak fits a budget, exactly.

The peak is a maximum over points (``points``). Nested points become a knapsack with prefix
capacities (``prefix_form``), solved by ``solve_knapsack(..., prefix_capacities=...)`` in O(W) memory;
other points are solved on the small module-level instance (``fallback``). Either way, weights are
rounded up and rooms down to whole quanta, so the kept set's ``predict_peak_bytes`` is within the
budget, and no kept set that fits ``budget - len(candidates) * quantum_bytes`` keeps less value.

Example:
    >>> from lightning_ckpt.core.profile_types import ModuleProfile, StaticMemory, StepProfile
    >>> sizes = {"a": (30, 0.1), "b": (60, 0.3), "c": (20, 0.2)}  # activation bytes, recompute s
    >>> modules = tuple(ModuleProfile(name, size, 10, s, 0) for name, (size, s) in sizes.items())
    >>> profile = StepProfile(modules, StaticMemory("cpu", 100, 0, 0, 0), 5, 2)
    >>> choose_kept(profile, 200, [0.1, 0.3, 0.2], quantum_bytes=1)  # no timeline: not nested
    (array([False, False,  True]), 'exact (enumeration)')
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lightning_ckpt.core.memory.fallback import solve_points
from lightning_ckpt.core.memory.points import PointMatrix, peak_points
from lightning_ckpt.core.memory.prefix_form import PrefixForm, prefix_form
from lightning_ckpt.core.profile_types import StepProfile
from lightning_ckpt.solver import solve_knapsack

__all__ = ["choose_kept", "keep_more_that_fits", "nested_instance"]


def choose_kept(
    profile: StepProfile,
    budget_bytes: int,
    values: Sequence[float],
    *,
    quantum_bytes: int,
    method: str = "auto",
    workers: int = 1,
) -> tuple[np.ndarray, str]:
    """The kept mask (profile order) and how it was solved; ``method`` is the O(W) solver's.

    ``"all-fit"`` when keeping everything fits. A last pass keeps, most valuable first, whatever
    still fits in bytes (room left by the rounding to quanta).

    Raises:
        ValueError: when nothing fits, not even checkpointing every candidate.
    """
    points = peak_points(profile)
    matrix = PointMatrix(points)
    if matrix.peak(np.ones(len(values), dtype=np.bool_)) <= budget_bytes:
        return np.ones(len(values), dtype=np.bool_), "all-fit"
    form = prefix_form(points, matrix)
    if form is None:
        kept, how = solve_points(points, values, budget_bytes, quantum_bytes)
        how = f"exact ({how})"
    else:
        kept, how = _solve_nested(form, values, budget_bytes, quantum_bytes, method, workers)
    return _keep_more(matrix, kept, values, budget_bytes), how


def _solve_nested(form: PrefixForm, values, budget_bytes: int, quantum_bytes: int, method: str, workers: int):
    instance = nested_instance(form, values, budget_bytes, quantum_bytes)
    kept = np.zeros(len(values), dtype=np.bool_)
    if instance is not None:
        items, weights, item_values, capacity, take, skip = instance
        result = solve_knapsack(
            weights,
            item_values,
            capacity,
            method=method,
            workers=workers,
            prefix_capacities=take,
            skip_capacities=skip,
        )
        kept[[items[j] for j in result.chosen]] = True
    return kept, f"{method} (prefix capacities)"


def keep_more_that_fits(
    profile: StepProfile, kept: np.ndarray, values: Sequence[float], budget_bytes: int
) -> np.ndarray:
    """``kept`` (a mask, profile order) and, most valuable first, every other candidate whose keeping
    still fits ``budget_bytes`` by ``predict_peak_bytes`` (as its points compute it)."""
    return _keep_more(PointMatrix(peak_points(profile)), kept, values, budget_bytes)


def _keep_more(
    matrix: PointMatrix, kept: np.ndarray, values: Sequence[float], budget_bytes: int
) -> np.ndarray:
    """Also keep, most valuable first, what still fits in bytes (the room the rounding to quanta left)."""
    kept = kept.copy()
    for i in sorted(np.flatnonzero(~kept).tolist(), key=lambda i: (-values[i], i)):
        kept[i] = True
        kept[i] = matrix.peak(kept) <= budget_bytes
    return kept


def _quanta(budget_bytes: int, base_bytes: float, quantum_bytes: int) -> float:
    """Whole quanta of room under the budget above a base (``inf`` for no base)."""
    return (
        float("inf")
        if base_bytes == float("-inf")
        else (int(budget_bytes) - int(base_bytes)) // quantum_bytes
    )


def nested_instance(form: PrefixForm, values: Sequence[float], budget_bytes: int, quantum_bytes: int):
    """The capped knapsack at the budget, in quanta: ``(candidate per item, weights, values, capacity,
    take caps, skip caps)``, or None when nothing can be kept. Candidates that cannot be kept are left
    out, their skip cap moved to the next item (the same kept items lie before it)."""
    weights = [-(-w // quantum_bytes) for w in form.weight_bytes]
    capacity = _quanta(budget_bytes, form.total_base_bytes, quantum_bytes)
    if capacity == float("inf"):
        capacity = sum(weights)
    if capacity < 0:
        raise ValueError("no set of kept candidates fits the budget, not even checkpointing every one")
    items, kept_weights, kept_values, take, skip = [], [], [], [], []
    carried = float("inf")  # the skip caps of left-out items, binding the next item
    for j, candidate in enumerate(form.order):
        take_j = min(_quanta(budget_bytes, form.take_base_bytes[j], quantum_bytes), carried, capacity)
        skip_j = min(_quanta(budget_bytes, form.skip_base_bytes[j], quantum_bytes), carried, capacity)
        if skip_j < 0:
            raise ValueError("no set of kept candidates fits the budget, not even checkpointing every one")
        if take_j < 0 or weights[j] > capacity:
            carried = skip_j
            continue
        carried = float("inf")
        items.append(candidate)
        kept_weights.append(weights[j])
        kept_values.append(float(values[candidate]))
        take.append(int(take_j))
        skip.append(int(skip_j))
    capacity = int(min(capacity, carried))
    return (items, kept_weights, kept_values, capacity, take, skip) if items else None
