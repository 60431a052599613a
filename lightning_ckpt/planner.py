"""From a step profile and a budget to a `CheckpointPlan`: the knapsack formulation.

Keep (store activations) or checkpoint (store only inputs, recompute in backward) each candidate. The
predicted peak (`lightning_ckpt.core.memory.model.predict_peak_bytes`) is a maximum over the points of
the step, each an affine function of the kept set (`lightning_ckpt.core.memory.points`). With the exact
solvers (``solver="auto"`` or ``"hirschberg"``) the plan keeps the most recompute time (or flops) whose
predicted peak fits the budget (`lightning_ckpt.core.memory.choose`): when the backward frees blocks in
reverse forward order the points are prefix capacities of a knapsack, solved in O(W) memory; otherwise
the small module-level instance is solved exactly. Sizes are rounded to ``quantum_bytes``, so the plan
is optimal up to one quantum per candidate.

The baseline solvers (``"dp"``, ``"greedy"``, ``"ilp"``) solve the additive bound

    predict_peak_bytes(profile, S) <= fixed_peak_bytes(profile) + sum(keep_cost_bytes[m] for m kept),

with capacity ``budget - fixed`` (weights rounded up and capacity rounded down to ``quantum_bytes``).
Either way a last pass keeps, most valuable first, any checkpointed module whose activations still fit
under the exact prediction (room the rounding left). Nothing ever goes over the budget.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence

import numpy as np

from lightning_ckpt.config import AutoCheckpointConfig
from lightning_ckpt.core.memory.choose import choose_kept, keep_more_that_fits
from lightning_ckpt.core.memory.model import fixed_peak_bytes, keep_cost_bytes, predict_peak_bytes
from lightning_ckpt.core.profile_types import Cost, StepProfile
from lightning_ckpt.plan import CheckpointPlan, PlanItem
from lightning_ckpt.solver import quantize, solve_knapsack
from lightning_ckpt.units import BYTES_PER_GB

log = logging.getLogger(__name__)

EXACT_SOLVERS = ("auto", "hirschberg")
"""Solvers planned exactly under the peak model; the others solve the additive bound (baselines)."""
_DEFAULT_CONFIG = AutoCheckpointConfig(budget_gb=1.0)  # only its cost, solver, quantum and workers are read


class BudgetTooSmallError(ValueError):
    """The budget is below what the model needs even with every candidate checkpointed.

    Example:
        >>> print(BudgetTooSmallError(10**9, 2_345_600_000, 12, shapes=[(8, 1024), (8, 1024)]))
        `budget_gb`=1 is too small for batch shapes (8, 1024), (8, 1024): even with all 12 candidate modules checkpointed this step needs 2.3456 GB per device. The smallest budget that works is budget_gb=2.346; raise the budget or shrink the batch or sequence length.
    """

    def __init__(
        self,
        budget_bytes: int,
        minimum_bytes: int,
        num_candidates: int,
        shapes: Sequence[Sequence[int]] | None = None,
    ) -> None:
        self.budget_bytes = int(budget_bytes)
        self.minimum_bytes = int(minimum_bytes)
        self.num_candidates = int(num_candidates)
        self.shapes = None if shapes is None else tuple(tuple(int(n) for n in shape) for shape in shapes)
        minimum_gb = math.ceil(minimum_bytes / BYTES_PER_GB * 1000) / 1000
        where = "" if not self.shapes else " for batch shapes " + ", ".join(map(str, self.shapes))
        super().__init__(
            f"`budget_gb`={budget_bytes / BYTES_PER_GB:g} is too small{where}: even with all {num_candidates}"
            f" candidate modules checkpointed this step needs {minimum_bytes / BYTES_PER_GB:.4f} GB per device."
            f" The smallest budget that works is budget_gb={minimum_gb:g}; raise the budget or shrink the batch"
            " or sequence length."
        )


def item_values(profile: StepProfile, cost: Cost) -> list[float]:
    """What keeping each candidate saves per step: recompute seconds, or forward flops."""
    if cost == "time":
        return [max(float(m.recompute_seconds), 0.0) for m in profile.modules]
    return [float(max(m.flops, 0)) for m in profile.modules]


def make_plan(
    profile: StepProfile,
    budget_bytes: int,
    config: AutoCheckpointConfig | None = None,
    *,
    notes: Sequence[str] = (),
) -> CheckpointPlan:
    """Choose the modules to checkpoint so the predicted peak fits ``budget_bytes`` at least recompute cost.

    Args:
        profile: the step's profile.
        budget_bytes: the budget to plan for (the callback's ``config.budget_bytes``, or less on a re-plan).
        config: cost, solver, quantum and workers (``budget_gb`` is not read); default settings if None.
        notes: lines added to the plan's report.

    Raises:
        BudgetTooSmallError: if even checkpointing every candidate does not fit.
    """
    config = config or _DEFAULT_CONFIG
    names = [m.name for m in profile.modules]
    fixed_bytes = fixed_peak_bytes(profile)
    capacity_bytes = int(budget_bytes) - fixed_bytes
    if capacity_bytes < 0:
        raise BudgetTooSmallError(budget_bytes, fixed_bytes, len(names))
    values = item_values(profile, config.cost)
    start = time.perf_counter()
    if config.solver in EXACT_SOLVERS:
        mask, method = choose_kept(
            profile,
            int(budget_bytes),
            values,
            quantum_bytes=config.quantum_bytes,
            method=config.solver,
            workers=config.workers,
        )
        kept = {name for name, keep in zip(names, mask.tolist(), strict=True) if keep}
    elif predict_peak_bytes(profile, []) <= budget_bytes:
        kept, method = set(names), "all-fit"
    else:
        kept, method = _solve_additive(profile, capacity_bytes, values, config)
        mask = keep_more_that_fits(profile, np.array([n in kept for n in names]), values, int(budget_bytes))
        kept = {name for name, keep in zip(names, mask.tolist(), strict=True) if keep}
    solver_seconds = time.perf_counter() - start
    checkpointed = tuple(n for n in names if n not in kept)
    predicted_bytes = int(predict_peak_bytes(profile, checkpointed))
    if predicted_bytes > budget_bytes:  # cannot happen by the memory model's contract; never hand it out
        raise AssertionError(f"plan predicted at {predicted_bytes} bytes is over the budget {budget_bytes}")
    return CheckpointPlan(
        checkpointed=checkpointed,
        kept=tuple(n for n in names if n in kept),
        items=tuple(_plan_item(m) for m in profile.modules),
        static_bytes=int(profile.static_bytes),
        budget_bytes=int(budget_bytes),
        predicted_peak_bytes=predicted_bytes,
        recompute_seconds=sum(m.recompute_seconds for m in profile.modules if m.name not in kept),
        solver_method=method,
        solver_seconds=solver_seconds,
        notes=tuple(notes),
    )


def _solve_additive(
    profile: StepProfile, capacity_bytes: int, values: list[float], config: AutoCheckpointConfig
) -> tuple[set[str], str]:
    """The baseline solvers on the additive bound: kept candidates and the method."""
    names = [m.name for m in profile.modules]
    costs = keep_cost_bytes(profile)
    weights, capacity = quantize([max(int(costs[n]), 0) for n in names], capacity_bytes, config.quantum_bytes)
    result = solve_knapsack(weights, values, capacity, method=config.solver, workers=config.workers)
    return {names[i] for i in result.chosen}, f"{result.method} (additive bound)"


def _plan_item(module_profile) -> PlanItem:
    return PlanItem(
        name=module_profile.name,
        activation_bytes=int(module_profile.activation_bytes),
        input_bytes=int(module_profile.input_bytes),
        recompute_seconds=float(module_profile.recompute_seconds),
        flops=int(module_profile.flops),
    )
