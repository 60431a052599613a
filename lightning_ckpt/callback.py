"""`AutoCheckpoint`: the Lightning callback that checkpoints the right modules under a memory budget."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lightning_ckpt.config import AutoCheckpointConfig
from lightning_ckpt.core.candidates import find_candidates
from lightning_ckpt.core.memory.meter import track_peak_bytes
from lightning_ckpt.core.profile_types import Cost, StepProfile
from lightning_ckpt.core.wrapping import (
    apply_checkpointing,
    checkpointed_by_torch,
    checkpointed_names,
    remove_checkpointing,
)
from lightning_ckpt.lightning.checks import (
    check_sharding,
    check_single,
    check_trainer,
    explain_recompute_error,
    take_over_model,
)
from lightning_ckpt.lightning.plan_book import PlanBook, book_for_fit, model_signature, replanned, run_setting
from lightning_ckpt.lightning.profile import BatchShapes, batch_shapes, profile_in_fit
from lightning_ckpt.lightning.ranks import any_rank, decide_plan, log_metrics, max_over_ranks
from lightning_ckpt.planning import BudgetTooSmallError
from lightning_ckpt.planning.plan import CheckpointPlan
from lightning_ckpt.solver.validate import Method
from lightning_ckpt.units import BYTES_PER_GB

log = logging.getLogger(__name__)


class AutoCheckpoint(Callback):
    """Checkpoint the modules that let training fit ``budget_gb`` per device at the least recompute cost.

    Before the first training batch, and before every batch whose tensor shapes it has not planned for
    (a longer sequence, a larger batch, the first batch after a resume), it profiles every candidate module
    (activation memory kept for backward on fake tensors, recompute time from forwards that keep nothing),
    solves the keep-or-checkpoint choice exactly as a 0/1 knapsack, wraps the chosen modules with
    non-reentrant checkpointing, and trains on; nothing of that goes over the budget (except a step that
    cannot run on fake tensors, or an FSDP module that cannot be rebuilt from its saved hyperparameters: then
    that one profiling step runs unchecked, with a warning). Plans are
    kept per batch shape, so a shape seen before costs nothing. After the first step with a new plan it
    measures the real peak and, if it is over the budget, re-plans once with the overshoot subtracted.

    Args:
        budget_gb: peak memory (GB = 1e9 bytes) one device may use for training: parameters, gradients,
            optimizer state, activations and the transient peak of backward.
        targets: candidate modules, as class names (``"Block"``) or qualified-name globs
            (``"model.h.*.mlp"``); default: the blocks of the model's largest ``nn.ModuleList``.
        cost: what keeping a module saves: measured recompute ``"time"`` or forward ``"flops"``.
        solver: ``"auto"`` (exact, the fastest exact path) or ``"hirschberg"`` (exact); ``"dp"``, ``"ilp"``
            and ``"greedy"`` are baselines on a looser additive bound (see ``AutoCheckpointConfig.solver``).
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
        ValueError: `budget_gb` must be a positive finite number of GB up to 1e+09, got -1
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
        self._book = PlanBook()
        self._shapes: BatchShapes | None = None  # the batch shapes whose plan is applied now
        self._meter: track_peak_bytes | None = None
        self._setting: dict[str, Any] | None = None  # what the plans depend on besides the batch shapes
        self._steps_this_fit = 0  # the first step is lighter (no gradients, no optimizer state): not measured
        self._model_settings = contextlib.ExitStack()  # undoes what `take_over_model` changed

    @property
    def budget_gb(self) -> float:
        return self.config.budget_gb

    @property
    def budget_bytes(self) -> int:
        return self.config.budget_bytes

    @property
    def plan(self) -> CheckpointPlan | None:
        """The plan in force (``None`` before the first training step)."""
        return self._book.plans.get(self._book.current)

    @property
    def profile(self) -> StepProfile | None:
        """The profile the plan in force was made from (``None`` for a plan restored from a checkpoint)."""
        return self._book.profiles.get(self._book.current)

    @property
    def plans(self) -> dict[BatchShapes, CheckpointPlan]:
        """Every plan of this fit, by the batch shapes (shape and dtype of each tensor) it was made for."""
        return dict(self._book.plans)

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(budget_gb=self.budget_gb)

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._setting = run_setting(trainer, self.config)
            check_trainer(trainer, pl_module)
            check_single(trainer, self)
            if any(True for _ in pl_module.children()):  # models built in `configure_model` are checked later
                find_candidates(pl_module, self.config.targets)  # no candidates: fail now, not at step 1

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        shapes = batch_shapes(batch)
        # Planning and measuring are collective: every rank does them at the same step, or none does.
        new_shapes, measure = any_rank(
            trainer, shapes not in self._book.plans, self._wants_measure(trainer, shapes)
        )
        if new_shapes:
            self._book.plans[shapes] = self._new_plan(trainer, pl_module, batch, batch_idx, shapes)
            rank_zero_info(
                f"AutoCheckpoint plan for batch shapes {_shapes_text(shapes)}:\n{self.plans[shapes]}"
            )
            self._shapes = None  # (re-)apply it below
        if shapes != self._shapes:
            self._switch_plan(trainer, pl_module, shapes)
        if measure:
            self._start_measuring(trainer)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._steps_this_fit += 1
        if self._meter is None:
            return
        peak_bytes = max_over_ranks(trainer, self._stop_measuring())
        plan = self._book.plans[self._shapes] = self.plan.with_measured_peak(peak_bytes)
        rank_zero_info(
            f"AutoCheckpoint: measured peak {peak_bytes / BYTES_PER_GB:.4f} GB, predicted"
            f" {plan.predicted_peak_bytes / BYTES_PER_GB:.4f} GB, budget {self.budget_gb:g} GB"
        )
        log_metrics(trainer, plan)
        if peak_bytes > self.budget_bytes and plan.replanned:
            rank_zero_warn(
                f"AutoCheckpoint: the measured peak is still {(peak_bytes - self.budget_bytes) / BYTES_PER_GB:.4f}"
                " GB over the budget after the one re-plan; lower the batch size or raise `budget_gb`"
            )
        elif peak_bytes > self.budget_bytes:
            self._replan(trainer, pl_module, batch, batch_idx, overshoot_bytes=peak_bytes - self.budget_bytes)

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        explain_recompute_error(exception)
        self.teardown(trainer, pl_module, "fit")  # Lightning runs no teardown after an exception

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._meter is not None:
            self._stop_measuring()
        if stage == "fit" and self._shapes is not None:
            remove_checkpointing(pl_module)
            self._shapes = None
        if stage == "fit":
            self._model_settings.close()  # the model's own checkpointing and KV cache as they were
        self._steps_this_fit = 0

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"budget_gb": self.budget_gb, **self._book.to_state()}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        try:
            self._book = PlanBook.from_state(state_dict)
        except ValueError as error:
            rank_zero_warn(
                f"AutoCheckpoint: the checkpoint's saved plans are unusable ({error}); profiling anew"
            )
            self._book = PlanBook()

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        check_sharding(pl_module)
        self._model_settings = take_over_model(pl_module)
        candidates = self._candidates(pl_module)
        setting = {**(self._setting or {}), "model": model_signature(pl_module, candidates)}
        self._book = book_for_fit(trainer, self._book, setting, candidates)

    # -- the work, handed to plain functions -------------------------------------------------------------

    def _switch_plan(self, trainer: pl.Trainer, pl_module: pl.LightningModule, shapes: BatchShapes) -> None:
        """Apply the plan made for ``shapes``."""
        plan = self._book.plans[shapes]
        if self._shapes is not None:
            rank_zero_info(
                f"AutoCheckpoint: batch shapes {_shapes_text(shapes)}: their plan ({len(plan.checkpointed)} checkpointed)"
            )
        self._apply(pl_module, plan)
        self._shapes = self._book.current = shapes
        log_metrics(trainer, plan)

    def _wants_measure(self, trainer: pl.Trainer, shapes: BatchShapes) -> bool:
        """Measure a plan's first step, except the first step of a fit (no gradients or optimizer state yet)."""
        plan = self._book.plans.get(shapes)
        unmeasured = plan is None or plan.measured_peak_bytes is None
        return self.config.measure and unmeasured and self._steps_this_fit > 0 and trainer.global_step > 0

    def _new_plan(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        batch: Any,
        batch_idx: int,
        shapes: BatchShapes,
    ) -> CheckpointPlan:
        profile = self._profile(trainer, pl_module, batch, batch_idx, shapes)
        plan = decide_plan(trainer, profile, self.config, shapes)
        if not plan.checkpointed:
            headroom_gb = (plan.budget_bytes - plan.predicted_peak_bytes) / BYTES_PER_GB
            rank_zero_info(
                f"AutoCheckpoint: everything fits in {self.budget_gb:g} GB without checkpointing"
                f" ({headroom_gb:.4f} GB headroom predicted)"
            )
        return plan

    def _profile(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        batch: Any,
        batch_idx: int,
        shapes: BatchShapes,
    ) -> StepProfile:
        candidates = self._candidates(pl_module)
        profile = profile_in_fit(trainer, pl_module, batch, batch_idx, candidates, self.config.cost)
        self._book.profiles[shapes] = profile
        return profile

    def _candidates(self, pl_module: pl.LightningModule) -> list[str]:
        """The modules this callback may checkpoint (not those torch's checkpointing covers already)."""
        names = find_candidates(pl_module, self.config.targets)
        by_torch = checkpointed_by_torch(pl_module, names)
        return [name for name in names if name not in by_torch]

    def _apply(self, pl_module: pl.LightningModule, plan: CheckpointPlan) -> None:
        """Checkpoint exactly ``plan.checkpointed`` (only what changes is unwrapped or wrapped)."""
        wanted = set(plan.checkpointed)
        current = set(checkpointed_names(pl_module))
        if current - wanted:
            remove_checkpointing(pl_module)
            current = set()
        if wanted - current:
            apply_checkpointing(pl_module, [name for name in plan.checkpointed if name not in current])

    def _replan(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        batch: Any,
        batch_idx: int,
        overshoot_bytes: int,
    ) -> None:
        rank_zero_warn(
            f"AutoCheckpoint: measured peak is {overshoot_bytes / BYTES_PER_GB:.4f} GB over the budget;"
            " re-planning once with the overshoot subtracted"
        )
        shapes, current = self._shapes, self.plan
        (missing,) = any_rank(trainer, shapes not in self._book.profiles)  # e.g. after a resume
        profile = (
            self._profile(trainer, pl_module, batch, batch_idx, shapes)
            if missing
            else self._book.profiles[shapes]
        )
        try:
            plan = decide_plan(
                trainer, profile, self.config, shapes, max(self.budget_bytes - overshoot_bytes, 0)
            )
        except BudgetTooSmallError as error:
            rank_zero_warn(
                f"AutoCheckpoint: cannot re-plan within the budget ({error}); keeping the current plan"
            )
            self._book.plans[shapes] = replanned(current, self.budget_bytes, current.measured_peak_bytes)
            return
        self._book.plans[shapes] = plan = replanned(plan, self.budget_bytes, None)
        self._apply(pl_module, plan)
        rank_zero_info(f"AutoCheckpoint re-plan:\n{plan}")

    def _start_measuring(self, trainer: pl.Trainer) -> None:
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        self._meter = track_peak_bytes(
            trainer.strategy.root_device, model=trainer.lightning_module, optimizer=optimizer
        )
        self._meter.start()

    def _stop_measuring(self) -> int:
        meter, self._meter = self._meter, None
        return meter.stop()


def _shapes_text(shapes: BatchShapes) -> str:
    return ", ".join(str(shape) for shape, _ in shapes)
