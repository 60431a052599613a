"""`AutoCheckpoint`: the Lightning callback that checkpoints the right modules under a memory budget."""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lightning_ckpt.config import AutoCheckpointConfig, Granularity
from lightning_ckpt.core.candidates import find_candidates
from lightning_ckpt.core.memory.meter import track_peak_bytes
from lightning_ckpt.core.profile_types import Cost, StepProfile
from lightning_ckpt.core.wrapping import checkpointed_by_torch, remove_checkpointing
from lightning_ckpt.lightning.apply_plan import apply_plan
from lightning_ckpt.lightning.checks import (
    check_sharding,
    check_single,
    check_trainer,
    explain_recompute_error,
    take_over_model,
)
from lightning_ckpt.lightning.granularity import OptionBook, check_granularity
from lightning_ckpt.lightning.plan_book import (
    PlanBook,
    agreed_key,
    book_for_fit,
    model_signature,
    run_setting,
)
from lightning_ckpt.lightning.plan_round import PlanRound, shapes_text
from lightning_ckpt.lightning.profile import FamilyProfileError, profile_in_fit
from lightning_ckpt.lightning.ranks import any_rank, log_metrics, max_over_ranks
from lightning_ckpt.lightning.replan import replan_over_budget
from lightning_ckpt.lightning.shapes import BatchShapes, batch_shapes
from lightning_ckpt.planning.plan import CheckpointPlan
from lightning_ckpt.solver.validate import Method
from lightning_ckpt.units import BYTES_PER_GB

log = logging.getLogger(__name__)


class AutoCheckpoint(Callback):
    """Checkpoint the modules that let training fit ``budget_gb`` per device at the least recompute cost.

    Before the first training batch, and before every batch no plan covers (a longer sequence, a larger
    batch), it profiles every candidate module (activation memory kept for backward on fake tensors,
    recompute time from forwards that keep nothing), solves the keep-or-checkpoint choice exactly as a 0/1
    knapsack, wraps the chosen modules with non-reentrant checkpointing, and trains on; nothing of that goes
    over the budget (except a step that cannot run on fake tensors, or an FSDP module that cannot be rebuilt
    from its saved hyperparameters: then that one profiling step runs unchecked, with a warning). A plan
    covers every batch of the same tensors with no size larger, and a batch nothing covers is planned at its
    family's top shapes (the sizes that vary rounded up to a power of two, see
    :mod:`lightning_ckpt.lightning.shapes`), so dynamic padding costs a few plans, not one per length. A plan
    restored from a checkpoint is checked on a fresh profile before its first step and made anew if it no
    longer holds. After the first step with a new plan it measures the real peak and, if it is over the
    budget, re-plans once with the overshoot subtracted.

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
        granularity: ``"block"`` (whole candidates) or ``"op"`` (also selective policies; one device or DDP).

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
        granularity: Granularity = "block",
    ) -> None:
        self.config = AutoCheckpointConfig(
            budget_gb, targets, cost, solver, quantum_bytes, workers, measure, granularity
        )
        self._book = PlanBook()
        self._shapes: BatchShapes | None = None  # the batch shapes whose plan is applied now
        self._meter: track_peak_bytes | None = None
        self._setting: dict[str, Any] | None = None  # what the plans depend on besides the batch shapes
        self._steps_this_fit = 0  # the first step is lighter (no gradients, no optimizer state): not measured
        self._rounded_first: BatchShapes | None = None  # the first batch's shapes, when planned at a rung
        self._model_settings = contextlib.ExitStack()  # undoes what `take_over_model` changed
        self._options = OptionBook(self.config)  # op level: each plan's measured options

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
        """Every plan of this fit, by the batch shapes (shape and dtype of each tensor) it was made for:
        a batch's own, or the top shapes of a family, covering every smaller batch of the same tensors."""
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
            check_granularity(trainer, self.config)
            if any(True for _ in pl_module.children()):  # models built in `configure_model` are checked later
                find_candidates(pl_module, self.config.targets)  # no candidates: fail now, not at step 1

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        shapes = batch_shapes(batch)
        key = covering = self._book.key_for(shapes)  # its own shapes, or a family's top that covers them
        exact = self._steps_this_fit == 1 and shapes == self._rounded_first  # a fixed length: plan it
        # Planning and measuring are collective: every rank does them at the same step, or none does, and
        # every rank runs the same plan.
        need = key is None or key in self._book.unchecked or exact
        plan_now, key, unmeasured = agreed_key(trainer, self._book, shapes, key, need)
        measure = unmeasured and self._measures_now(trainer)
        if plan_now:
            key = self._round(trainer, pl_module, batch, batch_idx).plan_for(
                shapes, None if exact else key, exact
            )
            self._shapes = None  # (re-)apply it below
        if self._steps_this_fit == 0:  # planned anew at the length's rung, not at `shapes`
            self._rounded_first = shapes if covering is None and key != shapes else None
        if key != self._shapes:
            self._switch_plan(trainer, pl_module, key)
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
        if peak_bytes > self.budget_bytes and any_rank(trainer, plan.replanned)[0]:  # ranks' own plans
            rank_zero_warn(
                f"AutoCheckpoint: the measured peak is still {(peak_bytes - self.budget_bytes) / BYTES_PER_GB:.4f}"
                " GB over the budget after the one re-plan; lower the batch size or raise `budget_gb`"
            )
        elif peak_bytes > self.budget_bytes:
            profile_at = functools.partial(self._profile, trainer, pl_module, batch, batch_idx)
            overshoot_bytes, candidates = peak_bytes - self.budget_bytes, self._candidates(pl_module)
            book_and_budget = (self._book, self._options, self.budget_bytes, overshoot_bytes)
            replan_over_budget(
                trainer, pl_module, (batch, batch_idx), *book_and_budget, profile_at, candidates
            )

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
        if self._shapes is not None:  # every few steps under dynamic padding: debug, not info
            log.debug(
                "AutoCheckpoint: plan for %s (%d checkpointed)", shapes_text(shapes), len(plan.checkpointed)
            )
        apply_plan(pl_module, plan)
        self._shapes = self._book.current = shapes
        log_metrics(trainer, plan)

    def _measures_now(self, trainer: pl.Trainer) -> bool:
        """Measure a plan's first step, except the first step of a fit (no gradients or optimizer state yet)."""
        return self.config.measure and self._steps_this_fit > 0 and trainer.global_step > 0

    def _round(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> PlanRound:
        """A planning round before the step of ``batch``, on this callback's books."""
        profile_at = functools.partial(self._profile, trainer, pl_module, batch, batch_idx)
        candidates = functools.partial(self._candidates, pl_module)
        return PlanRound(
            trainer, pl_module, batch, batch_idx, self._book, self._options, profile_at, candidates
        )

    def _profile(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        batch: Any,
        batch_idx: int,
        shapes: BatchShapes,
    ) -> StepProfile | None:
        """The step's profile at ``shapes`` (the batch grown to them); ``None`` when it does not run on
        fake tensors at shapes other than the batch's own."""
        candidates, cost = self._candidates(pl_module), self.config.cost
        try:
            return profile_in_fit(trainer, pl_module, batch, batch_idx, candidates, cost, pad_to=shapes)
        except FamilyProfileError as error:
            log.info("AutoCheckpoint: %s; planning the batch's own shapes", error)
            return None

    def _candidates(self, pl_module: pl.LightningModule) -> list[str]:
        """The modules this callback may checkpoint (not those torch's checkpointing covers already)."""
        names = find_candidates(pl_module, self.config.targets)
        by_torch = checkpointed_by_torch(pl_module, names)
        return [name for name in names if name not in by_torch]

    def _start_measuring(self, trainer: pl.Trainer) -> None:
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        self._meter = track_peak_bytes(
            trainer.strategy.root_device, model=trainer.lightning_module, optimizer=optimizer
        )
        self._meter.start()

    def _stop_measuring(self) -> int:
        meter, self._meter = self._meter, None
        return meter.stop()
