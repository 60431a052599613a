"""What ``granularity`` changes in a fit: op level measures each candidate's options and plans them on
one device (:mod:`lightning_ckpt.lightning.op_options`, :func:`~lightning_ckpt.planning.op_plan.make_op_plan`);
block level plans across ranks (:func:`~lightning_ckpt.lightning.ranks.decide_plan`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import lightning.pytorch as pl

from lightning_ckpt.config import AutoCheckpointConfig
from lightning_ckpt.core.profile_types import StepProfile
from lightning_ckpt.lightning.op_options import options_in_fit
from lightning_ckpt.lightning.ranks import decide_plan
from lightning_ckpt.lightning.shapes import BatchShapes, batch_shapes, pad_batch
from lightning_ckpt.planning import BudgetTooSmallError
from lightning_ckpt.planning.op_plan import make_op_plan
from lightning_ckpt.planning.plan import CheckpointPlan

__all__ = ["OptionBook", "check_granularity", "decide_at_granularity", "options_at_shapes"]


def check_granularity(trainer: pl.Trainer, config: AutoCheckpointConfig) -> None:
    """Refuse op level on more than one device (its plans are not yet shared across ranks).

    Raises:
        ValueError: naming ``granularity``, what is allowed and what was given.
    """
    if config.granularity == "op" and trainer.world_size > 1:
        raise ValueError(
            "`granularity` must be 'block' on more than one device (op-level plans are not yet"
            f" shared across ranks), got 'op' with world size {trainer.world_size}"
        )


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
    try:
        return make_op_plan(profile, options, budget, config)
    except BudgetTooSmallError as error:
        raise BudgetTooSmallError(
            error.budget_bytes, error.minimum_bytes, error.num_candidates, [s for s, _ in shapes]
        ) from None


class OptionBook:
    """The measured options of each planned batch shape (op level; empty at block level)."""

    def __init__(self, config: AutoCheckpointConfig) -> None:
        self.config = config
        self.options: dict[BatchShapes, dict[str, Any]] = {}

    def measure(self, trainer, pl_module, batch, batch_idx: int, candidates, shapes: BatchShapes) -> None:
        """Op level: each candidate's options at ``shapes``, measured once (block level: nothing)."""
        if self.config.granularity == "op" and shapes not in self.options:
            self.options[shapes] = options_at_shapes(trainer, pl_module, batch, batch_idx, candidates, shapes)

    def decide(
        self, trainer: pl.Trainer, profile: StepProfile, shapes: BatchShapes, budget_bytes: int | None = None
    ) -> CheckpointPlan:
        """:func:`decide_at_granularity` with the options measured at ``shapes``."""
        options = self.options.get(shapes, {})
        return decide_at_granularity(trainer, profile, self.config, shapes, options, budget_bytes)
