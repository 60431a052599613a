"""One planning round of :class:`~lightning_ckpt.AutoCheckpoint`: before a batch no checked plan covers,
profile it (at its family's top shapes, or its own), check a saved plan on that profile or make a new
one, and file it in the book. Every rank takes each step of a round together (see
:mod:`lightning_ckpt.lightning.ranks`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightning_ckpt.core.profile_types import StepProfile
from lightning_ckpt.lightning.granularity import OptionBook
from lightning_ckpt.lightning.plan_book import PlanBook, checked_plan, plan_decision, saved_plan_problem
from lightning_ckpt.lightning.profile import profiles_collectively
from lightning_ckpt.lightning.ranks import any_rank, run_together, same_on_every_rank
from lightning_ckpt.lightning.shapes import BatchShapes, family_top
from lightning_ckpt.planning import BudgetTooSmallError
from lightning_ckpt.planning.plan import CheckpointPlan
from lightning_ckpt.units import BYTES_PER_GB

__all__ = ["PlanRound", "shapes_text"]


@dataclass
class PlanRound:
    """What a round works with: the step's batch, the callback's books, and how to profile at shapes
    (``None``: the step does not run on fake tensors there)."""

    trainer: pl.Trainer
    pl_module: pl.LightningModule
    batch: Any
    batch_idx: int
    book: PlanBook
    options: OptionBook
    profile_at: Callable[[BatchShapes], StepProfile | None]
    candidates: Callable[[], list[str]]

    def plan_for(self, shapes: BatchShapes, key: BatchShapes | None, exact: bool = False) -> BatchShapes:
        """Plan a batch of ``shapes`` (or check the saved plan ``key`` covering them) before its step, and
        return the shapes the plan in force is filed under: a family's top when it fits, else the batch's
        (always the batch's when ``exact``)."""
        trainer, book = self.trainer, self.book
        target = shapes if exact else key if key is not None else family_top(shapes, book.plans)
        target = shapes if target in book.refused else target
        # a rank whose plan holds reuses its profile, unless profiles run collectives (FSDP, FSDP2)
        together = profiles_collectively(trainer)
        reuse = key is not None and key not in book.unchecked and target in book.profiles
        kept = book.profiles.get(target) if reuse and not together else None
        profile = run_together(
            trainer, "profiling", lambda: self.profile_at(target) if kept is None else kept
        )
        (failed,) = any_rank(trainer, profile is None)  # the step does not run at the top shapes
        if failed:
            target, profile = self._own_shapes(shapes, target, profile)
        budget_bytes = self.options.config.budget_bytes
        saved = book.plans.get(target) if target in book.unchecked else None
        problem = None if saved is None else saved_plan_problem(saved, profile, budget_bytes)
        step = (self.pl_module, self.batch, self.batch_idx)
        check = functools.partial(self.options.check_saved, trainer, *step, saved, profile, problem)
        problem, saved = run_together(trainer, "checking the saved plan", check)  # every rank
        # after a resume each rank checks the saved plan of its own batch's family: one plan for all or none
        agreed = same_on_every_rank(trainer, plan_decision(saved))
        (replan,) = any_rank(trainer, saved is None or problem is not None or not agreed)
        if replan:
            if problem is not None:
                rank_zero_info(
                    f"AutoCheckpoint: the saved plan for {shapes_text(target)} is not applied: {problem};"
                    " planning anew"
                )
            elif not agreed:
                rank_zero_info(
                    "AutoCheckpoint: the ranks' batches fall under different saved plans; planning anew on every rank"
                )
            target, profile, plan = self._new_plan(shapes, target, profile)
            family = f" (for {shapes_text(shapes)} and every batch it covers)" if target != shapes else ""
            rank_zero_info(f"AutoCheckpoint plan for batch shapes {shapes_text(target)}{family}:\n{plan}")
        else:
            plan = saved if saved.selective else checked_plan(saved, profile)
            rank_zero_info(
                f"AutoCheckpoint: the saved plan for {shapes_text(target)} holds on a fresh profile"
            )
        book.file(target, plan)
        book.profiles[target] = profile
        book.unchecked.discard(target)
        return target

    def _new_plan(
        self, shapes: BatchShapes, target: BatchShapes, profile: StepProfile
    ) -> tuple[BatchShapes, StepProfile, CheckpointPlan]:
        """The plan for ``target`` from its ``profile``; for the batch's own ``shapes`` when the budget is
        too small at a family's top (a batch that fits is never refused for its family)."""
        trainer = self.trainer
        step = (self.pl_module, self.batch, self.batch_idx)
        measure_options = functools.partial(self.options.measure, trainer, *step, self.candidates())
        try:
            measure_options(target)
            plan = self.options.decide(trainer, profile, target)
        except BudgetTooSmallError:
            (retry,) = any_rank(trainer, target != shapes)
            if not retry:
                raise
            rank_zero_info(
                f"AutoCheckpoint: {shapes_text(target)} does not fit; planning {shapes_text(shapes)} alone"
            )
            target, profile = self._own_shapes(shapes, target, profile)
            measure_options(target)  # on several devices a collective: every rank takes part
            plan = self.options.decide(trainer, profile, target)
        if not plan.checkpointed:
            headroom_gb = (plan.budget_bytes - plan.predicted_peak_bytes) / BYTES_PER_GB
            rank_zero_info(
                f"AutoCheckpoint: everything fits in {self.options.config.budget_gb:g} GB without"
                f" checkpointing ({headroom_gb:.4f} GB headroom predicted)"
            )
        return target, profile, plan

    def _own_shapes(
        self, shapes: BatchShapes, target: BatchShapes, profile: StepProfile | None
    ) -> tuple[BatchShapes, StepProfile | None]:
        """The batch's own ``shapes`` and their profile, in place of a family's top ``target`` that some
        rank cannot run or fit (profiled again on every rank when profiles run collectives)."""
        redo = target != shapes or profiles_collectively(self.trainer)
        if redo:
            self.book.refused |= {target} - {shapes}
        profile = run_together(
            self.trainer, "profiling", lambda: self.profile_at(shapes) if redo else profile
        )
        return (shapes if redo else target), profile


def shapes_text(shapes: BatchShapes) -> str:
    """``shapes`` as a log line names them.

    Example:
        >>> shapes_text((((8, 128), "torch.int64"), ((8, 128), "torch.int64")))
        '(8, 128), (8, 128)'
    """
    return ", ".join(str(shape) for shape, _ in shapes)
