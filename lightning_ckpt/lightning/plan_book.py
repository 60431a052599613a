"""The saved-plans book: the plans of a fit by batch shape (or by the top shapes of a family, see
:mod:`lightning_ckpt.lightning.shapes`), what they were made for, and whether a resumed fit may use them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from lightning_ckpt.config import AutoCheckpointConfig
from lightning_ckpt.core.profile_types import StepProfile
from lightning_ckpt.lightning.ranks import any_rank, max_each
from lightning_ckpt.lightning.shapes import BatchShapes, covers
from lightning_ckpt.planning.peak import PeakModel
from lightning_ckpt.planning.plan import CheckpointPlan
from lightning_ckpt.units import BYTES_PER_GB, BYTES_PER_MB

__all__ = [
    "PlanBook",
    "agreed_key",
    "book_for_fit",
    "checked_plan",
    "model_signature",
    "plan_decision",
    "replanned",
    "run_setting",
    "saved_plan_problem",
]


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


def replanned(plan: CheckpointPlan, budget_bytes: int, measured_peak_bytes: int | None) -> CheckpointPlan:
    """Mark a plan as the result of the one re-plan, reporting the user's budget (not the reduced one)."""
    data = plan.to_dict() | {
        "replanned": True,
        "budget_bytes": budget_bytes,
        "measured_peak_bytes": measured_peak_bytes,
    }
    return CheckpointPlan.from_dict(data)


@dataclass
class PlanBook:
    """The plans of a fit, one per batch shape, with the profiles they were made from, the shapes whose
    plan is in force, and the setting (run and model) they were made for.

    Example:
        >>> book = PlanBook(setting={"precision": "32-true"})
        >>> PlanBook.from_state(book.to_state()) == book
        True
    """

    plans: dict[BatchShapes, CheckpointPlan] = field(default_factory=dict)
    profiles: dict[BatchShapes, StepProfile] = field(default_factory=dict)
    current: BatchShapes | None = None
    """The batch shapes whose plan was applied last (kept after the fit, for ``AutoCheckpoint.plan``)."""
    setting: dict[str, Any] | None = None
    unchecked: set[BatchShapes] = field(default_factory=set)
    """Shapes whose plan came from a checkpoint and has not been checked against a fresh profile yet."""
    refused: set[BatchShapes] = field(default_factory=set)
    """Family top shapes that did not fit the budget or did not run on fake tensors: the batches they
    would cover are planned at their own shapes (not saved)."""
    rounds: dict[BatchShapes, int] = field(default_factory=dict)
    """The planning round each plan was made in. Rounds are collective (every rank plans in each), so a
    round's plan is the same on every rank, filed there under that rank's own family."""
    round_count: int = 0

    def file(self, shapes: BatchShapes, plan: CheckpointPlan) -> None:
        """File ``plan``, made in a new planning round, under ``shapes``."""
        self.plans[shapes], self.rounds[shapes] = plan, self.round_count
        self.round_count += 1

    def covering_rounds(self, shapes: BatchShapes) -> dict[int, BatchShapes]:
        """Per planning round whose plan covers a batch of ``shapes`` here, the shapes it is filed under.

        Example:
            >>> from lightning_ckpt.planning.plan import CheckpointPlan
            >>> book, plan = PlanBook(), CheckpointPlan((), (), (), 0, 10, 5, 0.0, "all-fit", 0.0)
            >>> book.file((((8, 256), "torch.int64"),), plan)
            >>> book.file((((8, 64), "torch.int64"),), plan)
            >>> book.covering_rounds((((8, 100), "torch.int64"),))
            {0: (((8, 256), 'torch.int64'),)}
        """
        return {self.rounds[top]: top for top in self.plans if covers(top, shapes)}

    def key_for(self, shapes: BatchShapes) -> BatchShapes | None:
        """The shapes of the plan for a batch of ``shapes``: its own, else the covering plan made for the
        fewest elements (the closest family: the least checkpointed); ``None`` when no plan covers them.

        Example:
            >>> from lightning_ckpt.planning.plan import CheckpointPlan
            >>> plan = CheckpointPlan((), (), (), 0, 10, 5, 0.0, "all-fit", 0.0)
            >>> book = PlanBook(plans={(((8, 256), "torch.int64"),): plan})
            >>> book.key_for((((8, 100), "torch.int64"),)), book.key_for((((8, 300), "torch.int64"),))
            ((((8, 256), 'torch.int64'),), None)
        """
        if shapes in self.plans:
            return shapes
        covering = [top for top in self.plans if covers(top, shapes)]
        return min(covering, key=lambda top: sum(math.prod(shape) for shape, _ in top), default=None)

    def to_state(self) -> dict[str, Any]:
        """Plain data for a checkpoint: the plans by shapes, the shapes in force, the setting (not the
        profiles)."""
        plans = [[_shapes_to_lists(shapes), plan.to_dict()] for shapes, plan in self.plans.items()]
        current = None if self.current is None else _shapes_to_lists(self.current)
        return {"plans": plans, "current_shapes": current, "setting": self.setting}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> PlanBook:
        """Inverse of :meth:`to_state`.

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
            setting = state.get("setting")
        except (TypeError, AttributeError, KeyError) as error:  # a wrong type somewhere in the nesting
            raise ValueError(f"the saved plans are not what AutoCheckpoint writes ({error})") from None
        if current is not None and current not in plans:
            raise ValueError("the saved `current_shapes` have no saved plan")
        if setting is not None and not isinstance(setting, dict):
            raise ValueError(f"the saved `setting` must be a dict, got {type(setting).__name__}")
        # Each plan's fields were checked by `CheckpointPlan.from_dict` (planning/plan_checks.py); whether
        # it still holds for this model is the fresh-profile check before its first step.
        rounds = {shapes: index for index, shapes in enumerate(plans)}  # every rank loads the same
        return cls(
            plans,
            current=current,
            setting=setting,
            unchecked=set(plans),
            rounds=rounds,
            round_count=len(plans),
        )

    def non_candidates(self, candidates: list[str]) -> list[str]:
        """Names in the plans that are not among ``candidates`` (a damaged or foreign plan)."""
        named = {name for plan in self.plans.values() for name in (*plan.checkpointed, *plan.kept)}
        return sorted(named - set(candidates))


def saved_plan_problem(plan: CheckpointPlan, profile: StepProfile, budget_bytes: int) -> str | None:
    """Why a saved ``plan`` must not be applied to a step of ``profile`` (a fresh profile at the plan's
    shapes), or ``None`` when it holds: the same candidates with the same activations, and a predicted
    peak within ``budget_bytes``."""
    modules = {m.name: m for m in profile.modules}
    items = {item.name: item for item in plan.items}
    if modules.keys() != items.keys():
        return "its candidates are not the model's"
    for name, item in items.items():
        fresh = modules[name]
        if (item.activation_bytes, item.input_bytes) != (fresh.activation_bytes, fresh.input_bytes):
            return (
                f"the activations differ from what it was made for ({name}: {item.activation_bytes / BYTES_PER_MB:.2f}"
                f" MB saved, {fresh.activation_bytes / BYTES_PER_MB:.2f} MB now)"
            )
    peak_bytes = PeakModel(profile).peak_bytes(plan.checkpointed)
    if peak_bytes > budget_bytes:
        return (
            f"a fresh profile predicts {peak_bytes / BYTES_PER_GB:.4f} GB for it, over the budget of"
            f" {budget_bytes / BYTES_PER_GB:.4f} GB"
        )
    return None


def checked_plan(plan: CheckpointPlan, profile: StepProfile) -> CheckpointPlan:
    """A saved plan that held against ``profile``: its predicted peak from that profile, and its peak
    not measured yet in this fit (the first measured step measures it, with the re-plan rule)."""
    peak_bytes = PeakModel(profile).peak_bytes(plan.checkpointed)
    return dataclasses.replace(plan, predicted_peak_bytes=int(peak_bytes), measured_peak_bytes=None)


def book_for_fit(
    trainer: pl.Trainer, book: PlanBook, setting: dict[str, Any], candidates: list[str]
) -> PlanBook:
    """The book a fit starts with: ``book`` (restored from a checkpoint, or the last fit's) when its
    plans were made for this ``setting`` and name only ``candidates``; else an empty one, saying why.
    Every rank decides the same."""
    outside = book.non_candidates(candidates)
    other_setting, foreign = any_rank(trainer, setting != book.setting, bool(outside))
    if book.plans and other_setting:  # another model, precision, strategy, ...: plan anew
        rank_zero_info(
            "AutoCheckpoint: the saved plans were made for another model or setting; planning anew"
        )
    elif book.plans and foreign:
        rank_zero_warn(
            f"AutoCheckpoint: the saved plans name modules that are not candidates of this model"
            f" ({', '.join(outside[:5])}); profiling anew"
        )
    if book.plans and (other_setting or foreign):
        return PlanBook(setting=setting)
    return dataclasses.replace(book, setting=setting)


def _shapes_to_lists(shapes: BatchShapes) -> list[list[Any]]:
    return [[list(shape), dtype] for shape, dtype in shapes]


def _shapes_from_lists(data: list[list[Any]]) -> BatchShapes:
    if not all(isinstance(n, int) and n >= 0 for shape, _ in data for n in shape):
        raise TypeError(f"batch shapes must be lists of sizes, got {data!r:.80}")
    return tuple((tuple(shape), str(dtype)) for shape, dtype in data)


def agreed_key(
    trainer: pl.Trainer, book: PlanBook, shapes: BatchShapes, key: BatchShapes | None, plan_now: bool
) -> tuple[bool, BatchShapes | None, bool]:
    """Whether to plan now (on any rank), the shapes of the plan to apply, and whether that plan is
    unmeasured (on any rank): one small all-reduce on several processes.

    On one process: ``plan_now``, ``key`` (:meth:`PlanBook.key_for`) and ``key``'s plan unmeasured. On
    several, each rank's batch can be covered by a plan of another round than the other ranks' (dynamic
    padding: each rank files a round's plan under its own family), so the ranks agree on one round whose
    plan covers every rank's batch and has been checked on every rank (a plan restored from a checkpoint
    counts once a fresh profile has checked it), the one that keeps the most candidates, then the latest,
    and plan anew together where none does: every rank runs the same plan at every step. The choice is
    taken on the reduced values alone, so every rank takes the same.
    """
    if trainer.world_size == 1:
        return plan_now, key, _unmeasured(book, key)
    mine = {index: top for index, top in book.covering_rounds(shapes).items() if top not in book.unchecked}
    values = [plan_now, _unmeasured(book, key)]
    for index in range(book.round_count):  # the same count on every rank: rounds are collective
        top = mine.get(index)
        kept = 0 if top is None else len(book.plans[top].kept)
        values += [top is None, top is not None and _unmeasured(book, top), kept]
    reduced = max_each(trainer, *values)
    common = [index for index in range(book.round_count) if not reduced[2 + 3 * index]]
    if reduced[0] or not common:
        return True, key, bool(reduced[1])
    chosen = max(common, key=lambda index: (reduced[4 + 3 * index], index))
    return False, mine[chosen], bool(reduced[3 + 3 * chosen])


def plan_decision(plan: CheckpointPlan | None) -> tuple | None:
    """What applying ``plan`` does to the model (which candidates are checkpointed, each one's option and
    saved op calls), without its figures: equal on two ranks when they would run the same plan.

    Example:
        >>> from lightning_ckpt.planning.plan import CheckpointPlan
        >>> plan = CheckpointPlan(("h.1",), ("h.0",), (), 0, 10, 5, 0.0, "all-fit", 0.0)
        >>> plan_decision(plan) == plan_decision(plan.with_measured_peak(7))
        True
    """
    if plan is None:
        return None
    return plan.checkpointed, tuple((item.name, item.option, item.saved_ops) for item in plan.items)


def _unmeasured(book: PlanBook, shapes: BatchShapes | None) -> bool:
    plan = None if shapes is None else book.plans.get(shapes)
    return plan is None or plan.measured_peak_bytes is None
