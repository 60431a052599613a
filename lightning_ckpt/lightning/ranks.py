"""Planning across ranks: one rank plans and broadcasts, so every rank applies the identical plan, and
the small collectives every rank takes its decisions with (any rank, the heaviest rank, the maximum),
and fails with (:func:`run_together`: an error on one rank is raised on every rank, so that no rank
is left waiting in the next collective).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

import lightning.pytorch as pl
import torch

from lightning_ckpt.config import AutoCheckpointConfig
from lightning_ckpt.core.profile_types import StepProfile
from lightning_ckpt.lightning.shapes import BatchShapes
from lightning_ckpt.planning import BudgetTooSmallError, make_plan
from lightning_ckpt.planning.peak import PeakModel
from lightning_ckpt.planning.plan import CheckpointPlan

__all__ = [
    "RankFailedError",
    "any_rank",
    "broadcast_plan",
    "decide_plan",
    "heaviest_rank",
    "log_metrics",
    "max_each",
    "max_over_ranks",
    "run_on_rank",
    "run_together",
    "same_on_every_rank",
]

T = TypeVar("T")


class RankFailedError(RuntimeError):
    """Raised on every rank where a step that all ranks take together did not fail, when it failed on
    another rank (:func:`run_together`): the failing rank raises its own error."""


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
    peak = PeakModel(profile)
    src = heaviest_rank(trainer, peak.peak_bytes([]))
    plan = _broadcast_plan(trainer, peak, profile, config, shapes, budget, src, must=())
    for _ in range(trainer.world_size):
        excess = peak.peak_bytes(plan.checkpointed) - budget
        (over,) = any_rank(trainer, excess > 0)
        if not over:
            return plan
        src = heaviest_rank(trainer, excess)
        plan = _broadcast_plan(trainer, peak, profile, config, shapes, budget, src, must=plan.checkpointed)
    every = tuple(m.name for m in profile.modules)
    plan = _with_checkpointed(peak, profile, plan, every)
    (over,) = any_rank(trainer, peak.peak_bytes(plan.checkpointed) > budget)
    if not over:
        return plan
    minimum = max_over_ranks(trainer, peak.peak_bytes(every))
    raise BudgetTooSmallError(budget, minimum, len(profile.modules), shapes=[shape for shape, _ in shapes])


def _broadcast_plan(
    trainer: pl.Trainer,
    peak: PeakModel,
    profile: StepProfile,
    config: AutoCheckpointConfig,
    shapes: BatchShapes,
    budget_bytes: int,
    src: int,
    must: tuple[str, ...],
) -> CheckpointPlan:
    """Plan on rank ``src`` (checkpointing at least ``must``) and broadcast the plan."""

    def plan() -> CheckpointPlan:
        return _with_checkpointed(peak, profile, make_plan(profile, budget_bytes, config, peak=peak), must)

    return broadcast_plan(trainer, plan, src, shapes)


def broadcast_plan(
    trainer: pl.Trainer, plan_fn: Callable[[], CheckpointPlan], src: int, shapes: BatchShapes
) -> CheckpointPlan:
    """``plan_fn()`` run on rank ``src``, its plan broadcast: every rank returns the same plan, or raises
    (:func:`run_on_rank`).

    Raises:
        BudgetTooSmallError: on every rank when ``plan_fn`` raised it on ``src`` (naming the batch ``shapes``).
        RankFailedError: on the other ranks when ``plan_fn`` raised anything else on ``src``.
    """

    def planned() -> dict:
        try:
            return {"plan": plan_fn().to_dict()}
        except BudgetTooSmallError as error:
            return {"too_small": (error.budget_bytes, error.minimum_bytes, error.num_candidates)}

    payload = run_on_rank(trainer, src, "planning", planned)
    if "too_small" in payload:
        raise BudgetTooSmallError(*payload["too_small"], shapes=[shape for shape, _ in shapes])
    return CheckpointPlan.from_dict(payload["plan"])


def heaviest_rank(trainer: pl.Trainer, peak_bytes: int) -> int:
    """The rank whose ``peak_bytes`` is the largest (the lowest such rank); 0 on one process."""
    peaks = _gathered(trainer, peak_bytes)
    return max(range(len(peaks)), key=lambda rank: (peaks[rank], -rank))


def run_together(trainer: pl.Trainer, what: str, fn: Callable[[], T]) -> T:
    """``fn()`` on this rank, then one small all-gather: when it raised on any rank, every rank raises,
    the failing ranks their own error and the others a :class:`RankFailedError` naming the first failing
    rank and its error. Without it a rank whose ``fn`` raised leaves the others waiting in their next
    collective (NCCL: until the process group's timeout). Every rank must call it at the same point; a
    failure inside a collective of ``fn`` itself still leaves the others waiting there.

    Raises:
        RankFailedError: on the ranks where ``fn`` returned, when it raised on another.
    """
    try:
        result, error = fn(), None
    except Exception as caught:
        result, error = None, caught
    failed = [rank for rank, flag in enumerate(_gathered(trainer, error is not None)) if flag]
    if not failed:
        return result
    if error is not None:
        _tell_others(trainer, failed[0], error)
        raise error
    raise _failed_elsewhere(trainer, what, failed[0])


def run_on_rank(trainer: pl.Trainer, src: int, what: str, fn: Callable[[], T]) -> T:
    """``fn()`` on rank ``src`` only, its result (plain, picklable data) broadcast to every rank; when it
    raised there, ``src`` raises its own error and the others a :class:`RankFailedError` naming it (they
    would otherwise wait in the broadcast until the failing process ends or the timeout).

    Raises:
        RankFailedError: on the other ranks, when ``fn`` raised on ``src``.
    """
    if trainer.world_size == 1:
        return fn()
    payload: dict = {}
    if trainer.global_rank == src:
        try:
            payload = {"result": fn()}
        except Exception as error:
            trainer.strategy.broadcast({"failed": True}, src=src)
            _tell_others(trainer, src, error)
            raise
    payload = trainer.strategy.broadcast(payload, src=src)
    if payload.get("failed"):
        raise _failed_elsewhere(trainer, what, src)
    return payload["result"]


def _tell_others(trainer: pl.Trainer, src: int, error: Exception) -> None:
    """The failing rank ``src``'s side of :func:`_failed_elsewhere`: its error's text to every rank."""
    if trainer.world_size > 1:
        trainer.strategy.broadcast(f"{type(error).__name__}: {error}", src=src)


def _failed_elsewhere(trainer: pl.Trainer, what: str, src: int) -> RankFailedError:
    """The error of a rank whose step went well, for ``what`` failing on rank ``src`` (its text broadcast
    by :func:`_tell_others`)."""
    text = trainer.strategy.broadcast(None, src=src)
    return RankFailedError(
        f"AutoCheckpoint: {what} failed on rank {src} of {trainer.world_size} ({text}), so every rank"
        " stops here; that rank's own traceback has the details"
    )


def any_rank(trainer: pl.Trainer, *flags: bool) -> tuple[bool, ...]:
    """Each flag, true if it is true on any rank (one small all-reduce when there are several processes)."""
    return tuple(bool(value) for value in max_each(trainer, *(bool(flag) for flag in flags)))


def max_each(trainer: pl.Trainer, *values: int) -> tuple[int, ...]:
    """Each integer's largest value over the ranks (one small all-reduce when there are several processes):
    what every rank may decide on alike."""
    if trainer.world_size == 1:
        return tuple(int(value) for value in values)
    tensor = torch.tensor(
        [int(value) for value in values], dtype=torch.int64, device=trainer.strategy.root_device
    )
    return tuple(int(value) for value in trainer.strategy.reduce(tensor, reduce_op="max").tolist())


def same_on_every_rank(trainer: pl.Trainer, value: object) -> bool:
    """Whether ``value`` (plain, picklable data) equals rank 0's on every rank; every rank gets the same
    answer (a broadcast and an all-reduce when there are several processes)."""
    if trainer.world_size == 1:
        return True
    first = trainer.strategy.broadcast(value, src=0)
    (differs,) = any_rank(trainer, first != value)
    return not differs


def _gathered(trainer: pl.Trainer, value: int) -> list[int]:
    """``value`` of every rank, by rank (one all-gather when there are several processes)."""
    if trainer.world_size == 1:
        return [int(value)]
    tensor = torch.tensor([int(value)], dtype=torch.int64, device=trainer.strategy.root_device)
    return [int(v) for v in trainer.strategy.all_gather(tensor).flatten().tolist()]


def _with_checkpointed(
    peak: PeakModel, profile: StepProfile, plan: CheckpointPlan, must: tuple[str, ...]
) -> CheckpointPlan:
    """``plan`` with the candidates ``must`` checkpointed too (another rank needed them)."""
    if set(must) <= set(plan.checkpointed):
        return plan
    chosen = set(plan.checkpointed) | set(must)
    names = [m.name for m in profile.modules]
    return dataclasses.replace(
        plan,
        checkpointed=tuple(n for n in names if n in chosen),
        kept=tuple(n for n in names if n not in chosen),
        predicted_peak_bytes=peak.peak_bytes(chosen),
        recompute_seconds=sum(m.recompute_seconds for m in profile.modules if m.name in chosen),
    )


def max_over_ranks(trainer: pl.Trainer, value: int) -> int:
    """The largest value over all ranks: every rank must take the same re-plan decision."""
    (largest,) = max_each(trainer, value)
    return largest


def log_metrics(trainer: pl.Trainer, plan: CheckpointPlan) -> None:
    """The plan's figures to every logger of the trainer (rank 0)."""
    if trainer.is_global_zero:
        for logger in trainer.loggers:
            logger.log_metrics(plan.metrics(), step=trainer.global_step)
