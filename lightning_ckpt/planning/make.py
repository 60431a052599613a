"""From a step profile and a budget to a `CheckpointPlan`.

Keep (store activations) or checkpoint (store only inputs, recompute in backward) each candidate. The
predicted peak (:mod:`~lightning_ckpt.planning.peak`) is a maximum over the points of the step, each an
affine function of the kept set. With the exact solvers (``solver="auto"`` or ``"hirschberg"``) the plan
keeps the most recompute time (or flops) whose predicted peak fits the budget
(:mod:`~lightning_ckpt.planning.exact`); the baselines (``"dp"``, ``"greedy"``, ``"ilp"``) solve a looser
additive bound (:mod:`~lightning_ckpt.planning.additive`) and may recompute more: their plans say
``(baseline: additive bound)``. Sizes are rounded to ``quantum_bytes``, then a
last pass keeps whatever still fits in bytes. Nothing ever goes over the budget.

Example:
    >>> from lightning_ckpt.core.profile_types import ModuleProfile, StaticMemory, StepProfile
    >>> sizes = {"a": (30, 0.1), "b": (60, 0.3), "c": (20, 0.2)}  # activation bytes, recompute s
    >>> modules = tuple(ModuleProfile(name, size, 10, s, 0) for name, (size, s) in sizes.items())
    >>> plan = make_plan(StepProfile(modules, StaticMemory("cpu", 100, 0, 0, 0), 5, 2), 200)
    >>> plan.checkpointed, plan.predicted_peak_bytes, plan.solver_method
    (('a', 'b'), 197, 'exact (enumeration)')
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from lightning_ckpt.config import AutoCheckpointConfig
from lightning_ckpt.core.profile_types import Cost, ModuleProfile, StepProfile
from lightning_ckpt.planning.additive import keep_cost_bytes, solve_additive
from lightning_ckpt.planning.errors import BudgetTooSmallError
from lightning_ckpt.planning.exact import choose_kept
from lightning_ckpt.planning.peak import PeakModel
from lightning_ckpt.planning.plan import CheckpointPlan, PlanItem

__all__ = ["EXACT_SOLVERS", "item_values", "make_plan"]

EXACT_SOLVERS = ("auto", "hirschberg")
"""Solvers planned exactly under the peak model; the others solve the additive bound (baselines)."""
_DEFAULT_CONFIG = AutoCheckpointConfig(budget_gb=1.0)  # only its cost, solver, quantum and workers are read


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
    peak: PeakModel | None = None,
) -> CheckpointPlan:
    """Choose the modules to checkpoint so the predicted peak fits ``budget_bytes`` at least recompute cost.

    Args:
        profile: the step's profile.
        budget_bytes: the budget to plan for (the callback's ``config.budget_bytes``, or less on a re-plan).
        config: cost, solver, quantum and workers (``budget_gb`` is not read); default settings if None.
        notes: lines added to the plan's report.
        peak: the profile's :class:`PeakModel`, if the caller has it already.

    Raises:
        BudgetTooSmallError: if even checkpointing every candidate does not fit.
    """
    config = config or _DEFAULT_CONFIG
    peak = peak or PeakModel(profile)
    names = [m.name for m in profile.modules]
    fixed_bytes = peak.peak_bytes(names)
    if fixed_bytes > budget_bytes:
        raise BudgetTooSmallError(budget_bytes, fixed_bytes, len(names))
    values = item_values(profile, config.cost)
    start = time.perf_counter()
    kept, method, weighed = _solve(peak, profile, int(budget_bytes), fixed_bytes, values, config)
    solver_seconds = time.perf_counter() - start
    predicted_bytes = peak.matrix.peak(kept)
    if predicted_bytes > budget_bytes:  # cannot happen by the memory model's contract; never hand it out
        raise AssertionError(f"plan predicted at {predicted_bytes} bytes is over the budget {budget_bytes}")
    return CheckpointPlan(
        checkpointed=tuple(n for n, keep in zip(names, kept.tolist(), strict=True) if not keep),
        kept=tuple(n for n, keep in zip(names, kept.tolist(), strict=True) if keep),
        items=tuple(_plan_item(m, w) for m, w in zip(profile.modules, weighed, strict=True)),
        static_bytes=int(profile.static_bytes),
        budget_bytes=int(budget_bytes),
        predicted_peak_bytes=predicted_bytes,
        recompute_seconds=float(
            sum(m.recompute_seconds for m, keep in zip(profile.modules, kept, strict=True) if not keep)
        ),
        solver_method=str(method),
        solver_seconds=solver_seconds,
        notes=tuple(str(note) for note in notes),
    )


def _solve(
    peak: PeakModel,
    profile: StepProfile,
    budget_bytes: int,
    fixed_bytes: int,
    values: list[float],
    config: AutoCheckpointConfig,
) -> tuple[np.ndarray, str, list[int]]:
    """The kept mask, how it was found, and what the knapsack weighed per candidate (bytes)."""
    if config.solver in EXACT_SOLVERS:
        weighed = np.clip(peak.matrix.keep.max(axis=0, initial=0), 0, None).tolist()
        kept, method = choose_kept(
            peak,
            budget_bytes,
            values,
            quantum_bytes=config.quantum_bytes,
            method=config.solver,
            workers=config.workers,
        )
        return kept, method, weighed
    weighed = list(keep_cost_bytes(profile).values())
    everything = np.ones(len(values), dtype=np.bool_)
    if peak.matrix.peak(everything) <= budget_bytes:
        return everything, "all-fit", weighed
    kept, method = solve_additive(
        peak,
        weighed,
        budget_bytes - fixed_bytes,
        values,
        method=config.solver,
        quantum_bytes=config.quantum_bytes,
        workers=config.workers,
        budget_bytes=budget_bytes,
    )
    return kept, method, weighed


def _plan_item(module: ModuleProfile, weighed_bytes: int) -> PlanItem:
    return PlanItem(
        name=module.name,
        activation_bytes=int(module.activation_bytes),
        input_bytes=int(module.input_bytes),
        recompute_seconds=float(module.recompute_seconds),
        flops=int(module.flops),
        keep_bytes=int(weighed_bytes),
    )
