"""What ``granularity`` changes in a fit: op level measures each candidate's options
(:mod:`lightning_ckpt.lightning.op_options`) and plans them
(:func:`~lightning_ckpt.planning.op_plan.make_op_plan`); block level plans with
:func:`~lightning_ckpt.lightning.ranks.decide_plan`. Both give every rank the same plan: the heaviest rank
plans and broadcasts, and each rank checks the plan on its own batch."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import lightning.pytorch as pl

from lightning_ckpt.config import AutoCheckpointConfig
from lightning_ckpt.core.profile_types import StepProfile
from lightning_ckpt.lightning.op_options import options_in_fit, saved_options_in_fit
from lightning_ckpt.lightning.profile import profiles_collectively
from lightning_ckpt.lightning.ranks import (
    any_rank,
    broadcast_plan,
    decide_plan,
    heaviest_rank,
    max_over_ranks,
)
from lightning_ckpt.lightning.shapes import BatchShapes, batch_shapes, pad_batch
from lightning_ckpt.planning import BudgetTooSmallError
from lightning_ckpt.planning.op_plan import make_op_plan, op_plan_peak_bytes
from lightning_ckpt.planning.peak import PeakModel
from lightning_ckpt.planning.plan import CheckpointPlan
from lightning_ckpt.units import BYTES_PER_GB

__all__ = [
    "OptionBook",
    "check_granularity",
    "decide_at_granularity",
    "decide_op_plan",
    "options_at_shapes",
]


def check_granularity(trainer: pl.Trainer, config: AutoCheckpointConfig) -> None:
    """Refuse op level where it is not verified: more than one device under any strategy but DDP and
    FSDP2 (``ModelParallelStrategy``, whose blocks are measured as plain copies:
    :mod:`~lightning_ckpt.lightning.plain_blocks`). FSDP and DeepSpeed shard the model into flat
    parameters that no plain copy of a block can be filled from.

    Raises:
        ValueError: naming ``granularity``, what is allowed and what was given.
    """
    strategy = type(trainer.strategy).__name__
    if config.granularity == "op" and trainer.world_size > 1 and strategy not in _OP_STRATEGIES:
        raise ValueError(
            "`granularity` must be 'block' with a sharding strategy other than FSDP2 (op level runs on one"
            f" device, with DDP or with ModelParallelStrategy), got 'op' with {strategy} on"
            f" {trainer.world_size} devices"
        )


_OP_STRATEGIES = frozenset({"DDPStrategy", "ModelParallelStrategy", "SingleDeviceStrategy"})
"""Strategies op level runs under with several devices (the model whole on every rank, or sharded by
``fully_shard``)."""


def options_at_shapes(
    trainer: pl.Trainer,
    pl_module: pl.LightningModule,
    batch: Any,
    batch_idx: int,
    candidates: Sequence[str],
    shapes: BatchShapes,
) -> dict[str, Any]:
    """Each candidate's measured options on ``batch`` grown to ``shapes`` (a family's top)."""
    grown = pad_batch(batch, shapes) if shapes != batch_shapes(batch) else batch
    return options_in_fit(trainer, pl_module, grown, batch_idx, candidates)


def decide_at_granularity(
    trainer: pl.Trainer,
    profile: StepProfile,
    config: AutoCheckpointConfig,
    shapes: BatchShapes,
    options: Mapping[str, Any],
    budget_bytes: int | None = None,
) -> CheckpointPlan:
    """The plan for ``profile``: across ranks at block level, from the measured ``options`` at op level.

    Raises:
        BudgetTooSmallError: naming the batch ``shapes`` and the smallest budget that works.
    """
    if config.granularity == "block":
        return decide_plan(trainer, profile, config, shapes, budget_bytes)
    budget = config.budget_bytes if budget_bytes is None else budget_bytes
    if trainer.world_size > 1:
        return decide_op_plan(trainer, profile, config, shapes, options, budget)
    try:
        return make_op_plan(profile, options, budget, config)
    except BudgetTooSmallError as error:
        raise BudgetTooSmallError(
            error.budget_bytes, error.minimum_bytes, error.num_candidates, [s for s, _ in shapes]
        ) from None


def decide_op_plan(
    trainer: pl.Trainer,
    profile: StepProfile,
    config: AutoCheckpointConfig,
    shapes: BatchShapes,
    options: Mapping[str, Any],
    budget_bytes: int,
) -> CheckpointPlan:
    """One op-level plan for every rank, checked against every rank's own batch (a collective).

    The options are the same policies at the same seconds on every rank (rank 0's times, each rank's
    own bytes: :func:`~lightning_ckpt.lightning.op_options.options_in_fit`). The rank with the heaviest
    step (nothing checkpointed) plans and broadcasts; each rank predicts the plan on its own batch. While
    one is over, the planning rank plans again with the largest excess taken off its room (at most one
    round per rank); then the block-level plan across ranks, with a note.

    Raises:
        BudgetTooSmallError: naming the batch ``shapes`` and the smallest budget that works for them.
    """
    src = heaviest_rank(trainer, PeakModel(profile).peak_bytes([]))
    room = budget_bytes
    for _ in range(trainer.world_size):
        try:
            plan = broadcast_plan(
                trainer, lambda room=room: make_op_plan(profile, options, room, config), src, shapes
            )
        except BudgetTooSmallError:  # the same on every rank: the broadcast carries it
            break
        excess = op_plan_peak_bytes(profile, options, plan, config.cost) - budget_bytes
        worst = max_over_ranks(trainer, excess)
        if worst <= 0:
            return dataclasses.replace(plan, budget_bytes=budget_bytes)
        room -= worst
    plan = decide_plan(trainer, profile, config, shapes, budget_bytes)
    note = "op level: no op-level plan fitted every rank's batch; planned by block"
    return dataclasses.replace(plan, notes=(*plan.notes, note))


class OptionBook:
    """The measured options of each planned batch shape (op level; empty at block level)."""

    def __init__(self, config: AutoCheckpointConfig) -> None:
        self.config = config
        self.options: dict[BatchShapes, dict[str, Any]] = {}

    def measure(self, trainer, pl_module, batch, batch_idx: int, candidates, shapes: BatchShapes) -> None:
        """Op level: each candidate's options at ``shapes``, measured once on one device (block level:
        nothing). On several devices it is a collective, run whenever it is called: another rank may
        need new options where this one has them."""
        if self.config.granularity == "op" and (trainer.world_size > 1 or shapes not in self.options):
            self.options[shapes] = options_at_shapes(trainer, pl_module, batch, batch_idx, candidates, shapes)

    def ensure(self, trainer, pl_module, batch, batch_idx: int, candidates, shapes: BatchShapes) -> None:
        """:meth:`measure` where some rank has no options at ``shapes`` (a re-plan after a resume: the saved
        plan's options were sized, not measured). On several devices a collective."""
        if self.config.granularity == "op" and any_rank(trainer, shapes not in self.options)[0]:
            self.measure(trainer, pl_module, batch, batch_idx, candidates, shapes)

    def decide(
        self, trainer: pl.Trainer, profile: StepProfile, shapes: BatchShapes, budget_bytes: int | None = None
    ) -> CheckpointPlan:
        """:func:`decide_at_granularity` with the options measured at ``shapes``."""
        options = self.options.get(shapes, {})
        return decide_at_granularity(trainer, profile, self.config, shapes, options, budget_bytes)

    def check_saved(
        self,
        trainer,
        pl_module,
        batch,
        batch_idx: int,
        plan: CheckpointPlan | None,
        profile: StepProfile,
        problem: str | None,
    ) -> tuple[str | None, CheckpointPlan | None]:
        """A saved selective ``plan`` (a resume) that passed the block-level check (``problem`` None)
        against a fresh ``profile`` of the batch: why it must not be applied (its saved op calls no longer
        match the model, or its predicted peak is over the budget), or ``None`` and the plan with its
        fresh prediction, its peak not measured yet. Anything else comes back as it is. Called on every
        rank: under FSDP2 and FSDP the check runs the live model (collectives), so it runs on every rank
        or on none, and where some rank cannot check its plan the others plan anew too."""
        checkable = plan is not None and plan.selective and problem is None
        (elsewhere,) = any_rank(trainer, profiles_collectively(trainer) and not checkable)
        if not checkable:
            return problem, plan
        if elsewhere:
            return "another rank plans anew (under FSDP2 and FSDP every rank checks together)", plan
        measured, problem = saved_options_in_fit(trainer, pl_module, batch, batch_idx, plan)
        if problem:
            return problem, plan
        peak_bytes = op_plan_peak_bytes(profile, measured, plan, self.config.cost)
        if peak_bytes > self.config.budget_bytes:
            return (
                f"a fresh profile predicts {peak_bytes / BYTES_PER_GB:.4f} GB for it, over the budget of"
                f" {self.config.budget_bytes / BYTES_PER_GB:.4f} GB"
            ), plan
        return None, dataclasses.replace(plan, predicted_peak_bytes=peak_bytes, measured_peak_bytes=None)
