"""Planning across ranks: one rank plans and broadcasts, so every rank applies the identical plan; the
plans of a fit are kept per batch shape.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_ckpt.config import AutoCheckpointConfig
from lightning_ckpt.core.memory.model import fixed_peak_bytes, predict_peak_bytes
from lightning_ckpt.core.profile_types import StepProfile
from lightning_ckpt.lightning.profile import BatchShapes
from lightning_ckpt.plan import CheckpointPlan
from lightning_ckpt.planner import BudgetTooSmallError, make_plan

__all__ = [
    "run_setting",
    "PlanBook",
    "any_rank",
    "decide_plan",
    "heaviest_rank",
    "log_metrics",
    "max_over_ranks",
    "model_signature",
    "non_candidates",
    "replanned",
]


def decide_plan(
    trainer: pl.Trainer,
    profile: StepProfile,
    config: AutoCheckpointConfig,
    shapes: BatchShapes,
    budget_bytes: int | None = None,
) -> CheckpointPlan:
    """One plan for every rank, checked against every rank's own batch; every rank fails the same way.

    Every rank passes the profile of its own batch: ranks can see batches of different shapes at the same
    step (padding to each batch's longest sequence, batching by token count). The rank with the heaviest
    step (the largest peak with nothing checkpointed) plans and broadcasts. Each rank then predicts the
    plan on its own batch; while one is over the budget, the rank most over plans again, checkpointing at
    least what is checkpointed already (at most one round per rank, then every candidate).

    Raises:
        BudgetTooSmallError: naming the batch ``shapes`` and the smallest budget that works for them
            (the largest over the ranks).
    """
    budget = config.budget_bytes if budget_bytes is None else budget_bytes
    src = heaviest_rank(trainer, predict_peak_bytes(profile, []))
    plan = _broadcast_plan(trainer, profile, config, shapes, budget, src, must=())
    for _ in range(trainer.world_size):
        excess = predict_peak_bytes(profile, plan.checkpointed) - budget
        (over,) = any_rank(trainer, excess > 0)
        if not over:
            return plan
        src = heaviest_rank(trainer, excess)
        plan = _broadcast_plan(trainer, profile, config, shapes, budget, src, must=plan.checkpointed)
    plan = _with_checkpointed(profile, plan, tuple(m.name for m in profile.modules))
    (over,) = any_rank(trainer, predict_peak_bytes(profile, plan.checkpointed) > budget)
    if not over:
        return plan
    minimum = max_over_ranks(trainer, fixed_peak_bytes(profile))
    raise BudgetTooSmallError(budget, minimum, len(profile.modules), shapes=[shape for shape, _ in shapes])


def _broadcast_plan(
    trainer: pl.Trainer,
    profile: StepProfile,
    config: AutoCheckpointConfig,
    shapes: BatchShapes,
    budget_bytes: int,
    src: int,
    must: tuple[str, ...],
) -> CheckpointPlan:
    """Plan on rank ``src`` (checkpointing at least ``must``) and broadcast the plan."""
    payload, failure = ({}, None)
    if trainer.global_rank == src:
        payload, failure = _plan_locally(profile, budget_bytes, config, must)
    payload = trainer.strategy.broadcast(payload, src=src)
    if "too_small" in payload:
        raise BudgetTooSmallError(*payload["too_small"], shapes=[shape for shape, _ in shapes])
    if "failure" in payload:
        raise failure or RuntimeError(f"AutoCheckpoint: planning failed on rank {src}: {payload['failure']}")
    return CheckpointPlan.from_dict(payload["plan"])


def heaviest_rank(trainer: pl.Trainer, peak_bytes: int) -> int:
    """The rank whose ``peak_bytes`` is the largest (the lowest such rank); 0 on one process."""
    if trainer.world_size == 1:
        return 0
    tensor = torch.tensor([int(peak_bytes)], dtype=torch.int64, device=trainer.strategy.root_device)
    peaks = trainer.strategy.all_gather(tensor).flatten().tolist()
    return max(range(len(peaks)), key=lambda rank: (peaks[rank], -rank))


def any_rank(trainer: pl.Trainer, *flags: bool) -> tuple[bool, ...]:
    """Each flag, true if it is true on any rank (one small all-reduce when there are several processes)."""
    if trainer.world_size == 1:
        return tuple(bool(flag) for flag in flags)
    tensor = torch.tensor([int(bool(flag)) for flag in flags], device=trainer.strategy.root_device)
    return tuple(bool(value) for value in trainer.strategy.reduce(tensor, reduce_op="max").tolist())


def _plan_locally(
    profile: StepProfile, budget_bytes: int, config: AutoCheckpointConfig, must: tuple[str, ...] = ()
) -> tuple[dict, Exception | None]:
    """The plan as plain data for the broadcast, or what made planning fail."""
    try:
        plan = _with_checkpointed(profile, make_plan(profile, budget_bytes, config), must)
    except BudgetTooSmallError as error:
        return {"too_small": (error.budget_bytes, error.minimum_bytes, error.num_candidates)}, error
    except Exception as error:
        return {"failure": repr(error)}, error
    return {"plan": plan.to_dict()}, None


def _with_checkpointed(profile: StepProfile, plan: CheckpointPlan, must: tuple[str, ...]) -> CheckpointPlan:
    """``plan`` with the candidates ``must`` checkpointed too (another rank needed them)."""
    if set(must) <= set(plan.checkpointed):
        return plan
    chosen = set(plan.checkpointed) | set(must)
    names = [m.name for m in profile.modules]
    return dataclasses.replace(
        plan,
        checkpointed=tuple(n for n in names if n in chosen),
        kept=tuple(n for n in names if n not in chosen),
        predicted_peak_bytes=predict_peak_bytes(profile, chosen),
        recompute_seconds=sum(m.recompute_seconds for m in profile.modules if m.name in chosen),
    )


def run_setting(trainer: pl.Trainer, config: AutoCheckpointConfig) -> dict[str, Any]:
    """What a saved plan depends on besides the batch shapes: a resumed run with another one plans anew."""
    return {
        "config": {key: value for key, value in dataclasses.asdict(config).items() if key != "measure"},
        "precision": str(trainer.precision),
        "strategy": type(trainer.strategy).__name__,
        "world_size": int(trainer.world_size),
        "accumulate_grad_batches": int(trainer.accumulate_grad_batches),
    }


def model_signature(pl_module: torch.nn.Module, candidates: list[str]) -> dict[str, Any]:
    """What identifies the model a plan was made for: its class, its candidates, its parameter count
    (lazy parameters, still without a shape, count as none)."""
    parameters = (p for p in pl_module.parameters() if not torch.nn.parameter.is_lazy(p))
    return {
        "class": type(pl_module).__qualname__,
        "candidates": list(candidates),
        "parameters": sum(p.numel() for p in parameters),
    }


def non_candidates(book: PlanBook, candidates: list[str]) -> list[str]:
    """Names in the book's plans that are not among ``candidates`` (a damaged or foreign plan)."""
    named = {name for plan in book.plans.values() for name in (*plan.checkpointed, *plan.kept)}
    return sorted(named - set(candidates))


def replanned(plan: CheckpointPlan, budget_bytes: int, measured_peak_bytes: int | None) -> CheckpointPlan:
    """Mark a plan as the result of the one re-plan, reporting the user's budget (not the reduced one)."""
    data = plan.to_dict() | {
        "replanned": True,
        "budget_bytes": budget_bytes,
        "measured_peak_bytes": measured_peak_bytes,
    }
    return CheckpointPlan.from_dict(data)


def max_over_ranks(trainer: pl.Trainer, value: int) -> int:
    """The largest value over all ranks: every rank must take the same re-plan decision."""
    tensor = torch.tensor(int(value), dtype=torch.int64, device=trainer.strategy.root_device)
    return int(trainer.strategy.reduce(tensor, reduce_op="max").item())


def log_metrics(trainer: pl.Trainer, plan: CheckpointPlan) -> None:
    """The plan's figures to every logger of the trainer (rank 0)."""
    if trainer.is_global_zero:
        for logger in trainer.loggers:
            logger.log_metrics(plan.metrics(), step=trainer.global_step)


@dataclass
class PlanBook:
    """The plans of a fit, one per batch shape, with the profiles they were made from.

    Example:
        >>> book = PlanBook()
        >>> book.from_state(book.to_state(None)) == (book, None)
        True
    """

    plans: dict[BatchShapes, CheckpointPlan] = field(default_factory=dict)
    profiles: dict[BatchShapes, StepProfile] = field(default_factory=dict)

    def to_state(self, current: BatchShapes | None) -> dict[str, Any]:
        """Plain data for a checkpoint: the plans by shapes and the shapes in force (not the profiles)."""
        plans = [[_shapes_to_lists(shapes), plan.to_dict()] for shapes, plan in self.plans.items()]
        return {"plans": plans, "current_shapes": None if current is None else _shapes_to_lists(current)}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> tuple[PlanBook, BatchShapes | None]:
        """Inverse of :meth:`to_state`: the book and the shapes in force.

        Raises:
            ValueError: for state that :meth:`to_state` cannot have written (a damaged checkpoint).
        """
        try:
            plans = {
                _shapes_from_lists(shapes): CheckpointPlan.from_dict(plan)
                for shapes, plan in state.get("plans", [])
            }
            current = state.get("current_shapes")
            current = None if current is None else _shapes_from_lists(current)
        except (TypeError, AttributeError, KeyError) as error:  # a wrong type somewhere in the nesting
            raise ValueError(f"the saved plans are not what AutoCheckpoint writes ({error})") from None
        if current is not None and current not in plans:
            raise ValueError("the saved `current_shapes` have no saved plan")
        return cls(plans), current


def _shapes_to_lists(shapes: BatchShapes) -> list[list[Any]]:
    return [[list(shape), dtype] for shape, dtype in shapes]


def _shapes_from_lists(data: list[list[Any]]) -> BatchShapes:
    if not all(isinstance(n, int) and n >= 0 for shape, _ in data for n in shape):
        raise TypeError(f"batch shapes must be lists of sizes, got {data!r:.80}")
    return tuple((tuple(shape), str(dtype)) for shape, dtype in data)
