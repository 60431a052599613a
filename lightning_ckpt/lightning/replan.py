"""The one re-plan after a measured step over the budget: the plan in force made again, with the
overshoot subtracted from the budget, and applied; on several devices every rank takes part."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from lightning_ckpt.core.profile_types import StepProfile
from lightning_ckpt.lightning.apply_plan import apply_plan
from lightning_ckpt.lightning.granularity import OptionBook
from lightning_ckpt.lightning.plan_book import PlanBook, replanned
from lightning_ckpt.lightning.ranks import any_rank, run_together
from lightning_ckpt.lightning.shapes import BatchShapes
from lightning_ckpt.planning import BudgetTooSmallError
from lightning_ckpt.units import BYTES_PER_GB

__all__ = ["replan_over_budget"]


def replan_over_budget(
    trainer: pl.Trainer,
    pl_module: pl.LightningModule,
    step: tuple[Any, int],
    book: PlanBook,
    options: OptionBook,
    budget_bytes: int,
    overshoot_bytes: int,
    profile_at: Callable[[BatchShapes], StepProfile | None],
    candidates: list[str],
) -> None:
    """Plan ``book.current`` again within ``budget_bytes`` less ``overshoot_bytes`` and apply that plan,
    marked ``replanned`` (and reporting ``budget_bytes``). The plan in force stays (marked, its measured peak kept) where the step no longer runs
    on fake tensors at those shapes on some rank, or where nothing fits the reduced budget.

    ``step`` is the batch and its index (for a profile or the op-level options, where they are missing);
    ``profile_at`` profiles at given shapes (``None``: the step does not run on fake tensors there).
    """
    shapes, current = book.current, book.plans[book.current]
    rank_zero_warn(
        f"AutoCheckpoint: measured peak is {overshoot_bytes / BYTES_PER_GB:.4f} GB over the budget;"
        " re-planning once with the overshoot subtracted"
    )
    (missing,) = any_rank(trainer, shapes not in book.profiles)  # profiled in another fit
    profile = run_together(
        trainer, "profiling", lambda: profile_at(shapes) if missing else book.profiles[shapes]
    )
    if any_rank(trainer, profile is None)[0]:  # the top no longer runs on fake tensors (on a rank)
        rank_zero_warn("AutoCheckpoint: cannot profile again at the plan's shapes; keeping the current plan")
        return
    options.ensure(trainer, pl_module, *step, candidates, shapes)
    try:
        plan = options.decide(trainer, profile, shapes, max(budget_bytes - overshoot_bytes, 0))
    except BudgetTooSmallError as error:
        rank_zero_warn(
            f"AutoCheckpoint: cannot re-plan within the budget ({error}); keeping the current plan"
        )
        book.plans[shapes] = replanned(current, budget_bytes, current.measured_peak_bytes)
        return
    book.file(shapes, plan := replanned(plan, budget_bytes, None))  # a planning round on every rank
    apply_plan(pl_module, plan)
    rank_zero_info(f"AutoCheckpoint re-plan:\n{plan}")
