"""`AutoCheckpoint`: the Lightning callback that checkpoints the right modules under a memory budget."""

from __future__ import annotations

import logging
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lightning_ckpt.config import AutoCheckpointConfig
from lightning_ckpt.core.candidates import find_candidates
from lightning_ckpt.core.memory.meter import track_peak_bytes
from lightning_ckpt.core.profile_types import Cost, StepProfile
from lightning_ckpt.core.profiler import profile_step
from lightning_ckpt.core.wrapping import apply_checkpointing, checkpointing_removed, remove_checkpointing
from lightning_ckpt.lightning.checks import check_trainer, strategy_checkpointed
from lightning_ckpt.lightning.step import no_gradient_sync, training_loss_fn, untouched_training_state
from lightning_ckpt.plan import CheckpointPlan
from lightning_ckpt.planner import BudgetTooSmallError, make_plan
from lightning_ckpt.solver.validate import Method
from lightning_ckpt.units import BYTES_PER_GB

log = logging.getLogger(__name__)


class AutoCheckpoint(Callback):
    """Checkpoint the modules that let training fit ``budget_gb`` per device at the least recompute cost.

    On the first training batch it profiles every candidate module (activation memory kept for backward,
    recompute cost) in an extra forward/backward that leaves no trace, solves the keep-or-checkpoint
    choice exactly as a 0/1 knapsack, wraps the chosen modules with non-reentrant
    ``torch.utils.checkpoint``, and trains on. After the next step it measures the real peak and, if it
    is over the budget, re-plans once with the overshoot subtracted.

    Args:
        budget_gb: peak memory (GB = 1e9 bytes) one device may use for training: parameters, gradients,
            optimizer state, activations and the transient peak of backward.
        targets: candidate modules, as class names (``"Block"``) or qualified-name globs
            (``"model.h.*.mlp"``); default: the blocks of the model's largest ``nn.ModuleList``.
        cost: what keeping a module saves: measured recompute ``"time"`` or forward ``"flops"``.
        solver: knapsack method; ``"auto"`` is exact and picks the fastest exact path.
        quantum_bytes: memory unit of the knapsack (weights rounded up, capacity down).
        workers: processes for the knapsack solver on large problems.
        measure: measure the real peak on the step after planning and re-plan once if it is over budget.

    Raises:
        ValueError: for an argument outside what is allowed (the message names it and what was given).

    Example:
        >>> AutoCheckpoint(budget_gb=40).state_key
        "AutoCheckpoint{'budget_gb': 40.0}"
        >>> AutoCheckpoint(budget_gb=-1)
        Traceback (most recent call last):
        ...
        ValueError: `budget_gb` must be a positive finite number of GB, got -1
    """

    def __init__(
        self,
        budget_gb: float,
        targets: list[str] | None = None,
        cost: Cost = "time",
        solver: Method = "auto",
        quantum_bytes: int = 512,
        workers: int = 1,
        measure: bool = True,
    ) -> None:
        self.config = AutoCheckpointConfig(budget_gb, targets, cost, solver, quantum_bytes, workers, measure)
        self._plan: CheckpointPlan | None = None
        self._profile: StepProfile | None = None
        self._applied = False
        self._meter: track_peak_bytes | None = None
        self._measure_next = False

    @property
    def budget_gb(self) -> float:
        return self.config.budget_gb

    @property
    def budget_bytes(self) -> int:
        return self.config.budget_bytes

    @property
    def plan(self) -> CheckpointPlan | None:
        """The plan in force (``None`` before the first training step)."""
        return self._plan

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(budget_gb=self.budget_gb)

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            check_trainer(trainer, pl_module)
            if any(True for _ in pl_module.children()):  # models built in `configure_model` are checked later
                find_candidates(pl_module, self.config.targets)  # no candidates: fail now, not at step 1

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._applied:
            self._start_measuring(trainer)
            return
        if self._plan is None:
            self._plan = self._decide(trainer, self._profile_step(trainer, pl_module, batch, batch_idx))
            rank_zero_info(f"AutoCheckpoint plan:\n{self._plan}")
        else:
            rank_zero_info(
                f"AutoCheckpoint: re-applying the saved plan ({len(self._plan.checkpointed)} checkpointed)"
            )
        self._apply(pl_module, self._plan)
        self._measure_next = self.config.measure and self._plan.measured_peak_bytes is None
        _log_metrics(trainer, self._plan)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._meter is None:
            return
        peak_bytes = _max_over_ranks(trainer, self._stop_measuring())
        self._plan = self._plan.with_measured_peak(peak_bytes)
        rank_zero_info(
            f"AutoCheckpoint: measured peak {peak_bytes / BYTES_PER_GB:.4f} GB, predicted {self._plan.predicted_peak_bytes / BYTES_PER_GB:.4f} GB,"
            f" budget {self.budget_gb:g} GB"
        )
        _log_metrics(trainer, self._plan)
        if peak_bytes > self.budget_bytes and self._plan.replanned:
            rank_zero_warn(
                f"AutoCheckpoint: the measured peak is still {(peak_bytes - self.budget_bytes) / BYTES_PER_GB:.4f} GB over"
                " the budget after the one re-plan; lower the batch size or raise `budget_gb`"
            )
        elif peak_bytes > self.budget_bytes:
            if self._profile is None:  # a resumed run: profile this batch (the plan came from a checkpoint)
                self._profile_step(trainer, pl_module, batch, batch_idx)
            self._replan(trainer, pl_module, overshoot_bytes=peak_bytes - self.budget_bytes)

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self.teardown(trainer, pl_module, "fit")  # Lightning runs no teardown after an exception

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._meter is not None:
            self._stop_measuring()
        if stage == "fit" and self._applied:
            remove_checkpointing(pl_module)
            self._applied = False

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"budget_gb": self.budget_gb, "plan": None if self._plan is None else self._plan.to_dict()}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        plan = state_dict.get("plan")
        self._plan = None if plan is None else CheckpointPlan.from_dict(plan)

    # -- the work, handed to plain functions -------------------------------------------------------------

    def _profile_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> StepProfile:
        candidates = find_candidates(pl_module, self.config.targets)
        candidates = [name for name in candidates if name not in strategy_checkpointed(pl_module)]
        step_fn = training_loss_fn(trainer, pl_module, batch, batch_idx)
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        with untouched_training_state(pl_module), no_gradient_sync(trainer), checkpointing_removed(pl_module):
            self._profile = profile_step(
                pl_module, step_fn, candidates, cost=self.config.cost, optimizer=optimizer
            )
        return self._profile

    def _decide(
        self, trainer: pl.Trainer, profile: StepProfile, budget_bytes: int | None = None
    ) -> CheckpointPlan:
        """Plan on rank 0 and broadcast it, so every rank applies the identical plan."""
        budget = self.budget_bytes if budget_bytes is None else budget_bytes
        payload, failure = self._plan_on_rank_zero(profile, budget) if trainer.is_global_zero else ({}, None)
        payload = trainer.strategy.broadcast(payload, src=0)
        if "too_small" in payload:
            raise BudgetTooSmallError(*payload["too_small"])
        if "failure" in payload:  # every rank fails the same way instead of waiting for a plan
            raise failure or RuntimeError(f"AutoCheckpoint: planning failed on rank 0: {payload['failure']}")
        plan = CheckpointPlan.from_dict(payload["plan"])
        if not plan.checkpointed:
            headroom_gb = (plan.budget_bytes - plan.predicted_peak_bytes) / BYTES_PER_GB
            rank_zero_info(
                f"AutoCheckpoint: everything fits in {self.budget_gb:g} GB without checkpointing"
                f" ({headroom_gb:.4f} GB headroom predicted)"
            )
        return plan

    def _plan_on_rank_zero(self, profile: StepProfile, budget_bytes: int) -> tuple[dict, Exception | None]:
        """The plan as plain data for the broadcast, or what made planning fail."""
        try:
            plan = make_plan(profile, budget_bytes, self.config)
        except BudgetTooSmallError as error:
            return {"too_small": (error.budget_bytes, error.minimum_bytes, len(profile.modules))}, error
        except Exception as error:
            return {"failure": repr(error)}, error
        return {"plan": plan.to_dict()}, None

    def _apply(self, pl_module: pl.LightningModule, plan: CheckpointPlan) -> None:
        if plan.checkpointed:
            apply_checkpointing(pl_module, plan.checkpointed)
        self._applied = True

    def _replan(self, trainer: pl.Trainer, pl_module: pl.LightningModule, overshoot_bytes: int) -> None:
        rank_zero_warn(
            f"AutoCheckpoint: measured peak is {overshoot_bytes / BYTES_PER_GB:.4f} GB over the budget;"
            " re-planning once with the overshoot subtracted"
        )
        measured = self._plan.measured_peak_bytes
        try:
            plan = self._decide(trainer, self._profile, max(self.budget_bytes - overshoot_bytes, 0))
        except BudgetTooSmallError as error:
            rank_zero_warn(
                f"AutoCheckpoint: cannot re-plan within the budget ({error}); keeping the current plan"
            )
            self._plan = _replanned(self._plan, self.budget_bytes, measured)
            return
        remove_checkpointing(pl_module)
        self._plan = _replanned(plan, self.budget_bytes, None)
        self._apply(pl_module, self._plan)
        self._measure_next = self.config.measure
        rank_zero_info(f"AutoCheckpoint re-plan:\n{self._plan}")

    def _start_measuring(self, trainer: pl.Trainer) -> None:
        if not self._measure_next:
            return
        self._measure_next = False
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        self._meter = track_peak_bytes(
            trainer.strategy.root_device, model=trainer.lightning_module, optimizer=optimizer
        )
        self._meter.__enter__()

    def _stop_measuring(self) -> int:
        meter, self._meter = self._meter, None
        meter.__exit__(None, None, None)
        return int(meter.peak_bytes)


def _replanned(plan: CheckpointPlan, budget_bytes: int, measured_peak_bytes: int | None) -> CheckpointPlan:
    """Mark a plan as the result of the one re-plan, reporting the user's budget (not the reduced one)."""
    data = plan.to_dict() | {
        "replanned": True,
        "budget_bytes": budget_bytes,
        "measured_peak_bytes": measured_peak_bytes,
    }
    return CheckpointPlan.from_dict(data)


def _max_over_ranks(trainer: pl.Trainer, value: int) -> int:
    """The largest value over all ranks: every rank must take the same re-plan decision."""
    tensor = torch.tensor(int(value), dtype=torch.int64, device=trainer.strategy.root_device)
    return int(trainer.strategy.reduce(tensor, reduce_op="max").item())


def _log_metrics(trainer: pl.Trainer, plan: CheckpointPlan) -> None:
    if trainer.is_global_zero:
        for logger in trainer.loggers:
            logger.log_metrics(plan.metrics(), step=trainer.global_step)
