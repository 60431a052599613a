"""The baseline route: the solvers ``"dp"``, ``"greedy"`` and ``"ilp"`` on the additive bound.

They are baselines, not exact planners: ``"dp"`` and ``"ilp"`` solve the bound below exactly (and agree on
its optimum), but the bound is looser than the step's peak, so their plans may recompute more than
``"auto"``'s (never less; ``tests/test_baselines_named.py``). Their plans say so: ``solver dp (baseline:
additive bound)``.

For every set ``S`` of checkpointed candidates the predicted peak is at most

    fixed_peak_bytes(profile) + sum(keep_cost_bytes(profile)[m] for m not in S),

with equality when ``S`` holds every candidate. The baselines solve that bound as a plain knapsack
(capacity ``budget - fixed``, weights rounded up and capacity down to ``quantum_bytes``); the plan
then keeps, most valuable first, whatever still fits under the exact prediction. The exact routes
(:mod:`~lightning_ckpt.planning.exact`) plan on the peak itself and never keep less.

Example:
    >>> from lightning_ckpt.core.profile_types import ModuleProfile, StaticMemory, StepProfile
    >>> modules = (ModuleProfile("a", 30, 10, 0.1, 0), ModuleProfile("b", 50, 10, 0.1, 0))
    >>> keep_cost_bytes(StepProfile(modules, StaticMemory("cpu", 100, 0, 0, 0), 5, 2))
    {'a': 20, 'b': 40}
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lightning_ckpt.core.profile_types import SavedStorage, StepProfile
from lightning_ckpt.planning.exact import keep_more_that_fits
from lightning_ckpt.planning.peak import PeakModel
from lightning_ckpt.solver import KnapsackResult, quantize, solve_knapsack

__all__ = ["BASELINE_NOTE", "additive_knapsack", "keep_cost_bytes", "solve_additive"]

BASELINE_NOTE = "baseline: additive bound"
"""How a baseline's plan names its route (``solver_method`` and the report's solver line)."""


def solve_additive(
    peak: PeakModel,
    keep_costs: Sequence[int],
    capacity_bytes: int,
    values: Sequence[float],
    *,
    method: str,
    quantum_bytes: int,
    workers: int,
    budget_bytes: int,
) -> tuple[np.ndarray, str]:
    """The kept mask (profile order) of the baseline ``method`` on the additive bound (``keep_costs``: the
    :func:`keep_cost_bytes`, profile order), then the exact last pass; and how it was solved."""
    result = additive_knapsack(
        keep_costs, capacity_bytes, values, method=method, quantum_bytes=quantum_bytes, workers=workers
    )
    kept = np.zeros(len(keep_costs), dtype=np.bool_)
    kept[list(result.chosen)] = True
    kept = keep_more_that_fits(peak, kept, values, budget_bytes)
    return kept, f"{result.method} ({BASELINE_NOTE})"


def additive_knapsack(
    keep_costs: Sequence[int],
    capacity_bytes: int,
    values: Sequence[float],
    *,
    method: str,
    quantum_bytes: int,
    workers: int = 1,
) -> KnapsackResult:
    """The baselines' knapsack: weights ``keep_costs`` rounded up and ``capacity_bytes`` (the budget less
    :func:`~lightning_ckpt.planning.peak.fixed_peak_bytes`) down to ``quantum_bytes``, solved by ``method``.

    ``"dp"`` and ``"ilp"`` solve it exactly (the same ``value``), ``"greedy"`` by ratio.

    Example:
        >>> additive_knapsack([20, 40], 50, [0.1, 0.3], method="dp", quantum_bytes=1).chosen
        (1,)
    """
    weights, capacity = quantize([max(int(c), 0) for c in keep_costs], capacity_bytes, quantum_bytes)
    return solve_knapsack(weights, values, capacity, method=method, workers=workers)


def keep_cost_bytes(profile: StepProfile) -> dict[str, int]:
    """Per candidate, the bytes that keeping its activations adds over checkpointing it (>= 0).

    That is the storages it saves that nothing else holds from the same point on (not an input the
    candidate's own checkpoint would keep, not saved earlier outside the candidates).
    """
    names = [module.name for module in profile.modules]
    if not profile.storages:
        return {m.name: max(m.activation_bytes - m.input_bytes, 0) for m in profile.modules}
    costs = dict.fromkeys(names, 0)
    for storage in profile.storages:
        for owner in {
            owner for owner, seq in storage.saves if owner is not None and not _covered(storage, owner, seq)
        }:
            if owner in costs:
                costs[owner] += storage.nbytes
    return costs


def _covered(storage: SavedStorage, owner: str, seq: int) -> bool:
    """Whether the storage is held from ``seq`` on even when ``owner`` is checkpointed: saved before
    outside the candidates, or an input of an earlier call of ``owner`` (kept by its checkpoint)."""
    by_other = any(o is None and s <= seq for o, s in storage.saves)
    return by_other or any(name == owner and s <= seq for name, s in storage.inputs)
