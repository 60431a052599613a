"""The exact routes: the kept candidates of least recompute whose predicted peak fits a budget.

The peak is a maximum over points (:mod:`~lightning_ckpt.planning.points`). Nested points become a
knapsack with prefix capacities (:mod:`~lightning_ckpt.planning.nested`), solved by
``solve_knapsack(..., prefix_capacities=...)`` in O(W) memory; other points are solved on the small
module-level instance (:mod:`~lightning_ckpt.planning.non_nested`). Either way, weights are rounded up
and rooms down to whole quanta, so the kept set's predicted peak is within the budget, and no kept set
that fits ``budget - len(candidates) * quantum_bytes`` keeps less value.

Example:
    >>> from lightning_ckpt.core.profile_types import ModuleProfile, StaticMemory, StepProfile
    >>> sizes = {"a": (30, 0.1), "b": (60, 0.3), "c": (20, 0.2)}  # activation bytes, recompute s
    >>> modules = tuple(ModuleProfile(name, size, 10, s, 0) for name, (size, s) in sizes.items())
    >>> profile = StepProfile(modules, StaticMemory("cpu", 100, 0, 0, 0), 5, 2)
    >>> choose_kept(PeakModel(profile), 200, [0.1, 0.3, 0.2], quantum_bytes=1)  # no timeline: not nested
    (array([False, False,  True]), 'exact (enumeration)')
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lightning_ckpt.planning.nested import nested_instance, prefix_form
from lightning_ckpt.planning.non_nested import solve_points
from lightning_ckpt.planning.peak import PeakModel
from lightning_ckpt.solver import solve_knapsack

__all__ = ["choose_kept", "keep_more_that_fits"]


def choose_kept(
    peak: PeakModel,
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
    if peak.matrix.peak(np.ones(len(values), dtype=np.bool_)) <= budget_bytes:
        return np.ones(len(values), dtype=np.bool_), "all-fit"
    form = prefix_form(peak.points, peak.matrix)
    if form is None:
        kept, how = solve_points(peak.points, values, budget_bytes, quantum_bytes)
        how = f"exact ({how})"
    else:
        kept = np.zeros(len(values), dtype=np.bool_)
        instance = nested_instance(form, values, budget_bytes, quantum_bytes)
        if instance is not None:
            kept[list(_solve_nested(instance, method, workers))] = True
        how = f"{method} (prefix capacities)"
    return keep_more_that_fits(peak, kept, values, budget_bytes), how


def _solve_nested(instance, method: str, workers: int) -> list[int]:
    """The candidates (profile order) the capped knapsack keeps."""
    result = solve_knapsack(
        instance.weights,
        instance.values,
        instance.capacity,
        method=method,
        workers=workers,
        prefix_capacities=instance.take_capacities,
        skip_capacities=instance.skip_capacities,
    )
    return [instance.items[j] for j in result.chosen]


def keep_more_that_fits(
    peak: PeakModel, kept: np.ndarray, values: Sequence[float], budget_bytes: int
) -> np.ndarray:
    """``kept`` (a mask, profile order) and, most valuable first, every other candidate whose keeping
    still fits ``budget_bytes`` (the room the rounding to quanta left)."""
    kept, matrix = kept.copy(), peak.matrix
    totals = matrix.totals(kept)
    for i in sorted(np.flatnonzero(~kept).tolist(), key=lambda i: (-values[i], i)):
        kept[i] = True
        trial = matrix.totals(kept) if matrix.either else totals + matrix.keep[:, i]  # one column: O(points)
        kept[i] = bool(trial[matrix.applies(kept)].max() <= budget_bytes)
        totals = trial if kept[i] else totals
    return kept
