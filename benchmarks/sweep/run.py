"""The sweep's runner: model and data from the config, the policies, the memory runs and the timing run.

Memory: one short training run per policy (AutoCheckpoint's through the real callback, which profiles,
plans and wraps on the first step); the peak of its last whole training step (forward, backward,
optimizer step) is measured by :class:`~lightning_ckpt.core.memory.meter.track_peak_bytes`, and its loss is kept
(the same for every policy: checkpointing does not change the arithmetic).

Time: one more training run that switches the checkpointed blocks before every step, cycling through
the policies (AutoCheckpoint's as its plan chose them, wrapped the same way the callback wraps them),
the order rotating each round; the step time is the median over a policy's steps. Interleaving step by
step makes slow drifts of a busy machine hit every policy alike.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import statistics
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader

from benchmarks.sweep.options import CLOCKS
from lightning_ckpt.callback import AutoCheckpoint
from lightning_ckpt.config import AutoCheckpointConfig
from lightning_ckpt.core.candidates import find_candidates
from lightning_ckpt.core.memory.meter import track_peak_bytes
from lightning_ckpt.core.wrapping import apply_checkpointing, remove_checkpointing
from lightning_ckpt.lightning.run_spec import RunConfig
from lightning_ckpt.offline.run_config import load_run_config
from lightning_ckpt.planning import BudgetTooSmallError
from lightning_ckpt.units import BYTES_PER_GB

log = logging.getLogger(__name__)

HAND_POLICIES = ("none", "all", "every-other")
OLD_PLAN_SOLVER = "ilp"
"""The plan before exact peak planning: the additive bound solved exactly, then the greedy pass
(what ``solver="auto"`` planned then; the baseline solvers still plan that way)."""


@dataclass
class PolicyResult:
    """What one policy measured.

    Attributes:
        policy: ``"none"``, ``"all"``, ``"every-other"``, ``"auto@<budget_gb>"`` or, for the old plan,
            ``"additive@<budget_gb>"``.
        budget_gb: AutoCheckpoint's budget (``None`` for hand policies).
        solver: the solver AutoCheckpoint was given when not the config's (the old plan's).
        checkpointed: the modules checkpointed (for AutoCheckpoint, its plan).
        measured_peak_bytes: the measured peak of one whole training step.
        predicted_peak_bytes: AutoCheckpoint's prediction (``None`` for hand policies).
        step_seconds: every timed step of the interleaved timing run.
        final_loss: training loss of the memory run's last step.
        error: why the policy could not run (e.g. a budget below what checkpointing everything needs).
    """

    policy: str
    budget_gb: float | None
    checkpointed: tuple[str, ...] = ()
    solver: str | None = None
    measured_peak_bytes: int = 0
    predicted_peak_bytes: int | None = None
    step_seconds: list[float] = field(default_factory=list)
    final_loss: float = math.nan
    error: str | None = None

    @property
    def median_step_seconds(self) -> float:
        """Median of the timed steps (``nan`` if none ran).

        Example:
            >>> PolicyResult("none", None, step_seconds=[0.3, 0.1, 0.2]).median_step_seconds
            0.2
        """
        return statistics.median(self.step_seconds) if self.step_seconds else math.nan

    def fits(self, budget_gb: float) -> bool:
        """Whether the measured peak is within ``budget_gb`` (and the policy ran)."""
        return self.error is None and self.measured_peak_bytes <= budget_gb * BYTES_PER_GB


@dataclass(frozen=True)
class SweepSetup:
    """What every run shares: the parsed config, candidate blocks, batches and step counts."""

    run: RunConfig
    candidates: tuple[str, ...]
    batches: tuple[Any, ...]
    warmup_steps: int  # steps before the measured one (AutoCheckpoint plans, measures, may re-plan)
    timed_steps: int  # timed steps per policy per round
    seed: int
    clock: str = "wall"  # "wall" (perf_counter) or "cpu" (this process's CPU time: steadier on a busy CPU)


class _PeakRecorder(Callback):
    """Measures the peak of one whole training step (the last) and keeps the last loss.

    Measured as AutoCheckpoint measures it: the previous step's gradients are alive on entry (Lightning
    zeroes them after the forward), so they count, as they do in the real peak at the end of the forward.
    """

    def __init__(self, measure_step: int) -> None:
        self.measure_step = measure_step
        self.peak_bytes = 0
        self.loss = math.nan
        self._meter: track_peak_bytes | None = None

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ):
        if batch_idx == self.measure_step:
            optimizer = trainer.optimizers[0] if trainer.optimizers else None
            self._meter = track_peak_bytes(trainer.strategy.root_device, model=pl_module, optimizer=optimizer)
            self._meter.__enter__()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ):
        if self._meter is not None:
            self._meter.__exit__(None, None, None)
            self.peak_bytes, self._meter = int(self._meter.peak_bytes), None
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.loss = float(loss) if loss is not None else math.nan


class _Interleaver(Callback):
    """Switches the checkpointed blocks before every step as ``schedule`` says, and times each step."""

    def __init__(
        self, blocks: dict[str, tuple[str, ...]], schedule: Sequence[str | None], clock: str
    ) -> None:
        self.blocks = blocks
        self.schedule = list(schedule)  # a policy name per step; None: an untimed warm-up step
        self.clock = CLOCKS[clock]
        self.step_seconds: dict[str, list[float]] = {name: [] for name in blocks}
        self._current: str | None = None
        self._start = 0.0

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ):
        name = self.schedule[batch_idx]
        if name != self._current:
            remove_checkpointing(pl_module)
            apply_checkpointing(pl_module, self.blocks.get(name, ()))
            self._current = name
        _synchronize(trainer.strategy.root_device)
        self._start = self.clock()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ):
        _synchronize(trainer.strategy.root_device)
        if self.schedule[batch_idx] is not None:
            self.step_seconds[self.schedule[batch_idx]].append(self.clock() - self._start)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        remove_checkpointing(pl_module)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_setup(
    config: str,
    overrides: Sequence[str] = (),
    *,
    warmup_steps: int = 3,
    timed_steps: int = 5,
    seed: int = 1337,
    clock: str = "wall",
) -> SweepSetup:
    """Parse the config, find the candidate blocks, and draw the batches every run will train on."""
    with warnings.catch_warnings():  # LightningCLI warns that sys.argv is not what it parses: intended
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        run = load_run_config(config, list(overrides))
    if run.data is None:
        raise ValueError(f"the config {config!r} must name a `data` module for the sweep to train on")
    L.seed_everything(seed, verbose=False)
    model = run.model.instantiate()
    targets = (run.autocheckpoint or {}).get("targets")
    data = run.data.instantiate()
    data.setup("fit")
    batches = _first_batches(data, warmup_steps + 1)
    candidates = tuple(find_candidates(model, targets))
    return SweepSetup(run, candidates, tuple(batches), warmup_steps, timed_steps, seed, clock)


def _first_batches(data: L.LightningDataModule, count: int) -> list[Any]:
    """The first ``count`` training batches, going round the data again if one epoch is shorter."""
    batches: list[Any] = []
    while len(batches) < count:
        epoch = list(itertools.islice(data.train_dataloader(), count - len(batches)))
        if not epoch:
            raise ValueError("the config's data module gives no training batches")
        batches += epoch
    return batches


def hand_policy_blocks(policy: str, candidates: Sequence[str]) -> list[str]:
    """The blocks a hand policy checkpoints.

    Example:
        >>> hand_policy_blocks("every-other", ["h.0", "h.1", "h.2"])
        ['h.0', 'h.2']
    """
    choices = {"none": [], "all": list(candidates), "every-other": list(candidates[::2])}
    if policy not in choices:
        raise ValueError(f"`policy` must be one of {sorted(choices)}, got {policy!r}")
    return choices[policy]


def run_policy(
    setup: SweepSetup, policy: str, budget_gb: float | None = None, solver: str | None = None
) -> PolicyResult:
    """Train ``warmup_steps + 1`` steps from the seeded weights with one policy; measure the last step.

    A hand policy wraps its blocks before training; ``budget_gb`` runs the real AutoCheckpoint callback
    (it profiles, plans and wraps on the first step), with ``solver`` instead of the config's if given.
    """
    L.seed_everything(setup.seed, verbose=False)
    model = setup.run.model.instantiate()
    recorder = _PeakRecorder(measure_step=setup.warmup_steps)
    callbacks: list[Callback] = [recorder]
    result = PolicyResult(policy, budget_gb, solver=solver)
    if budget_gb is None:
        result.checkpointed = tuple(apply_checkpointing(model, hand_policy_blocks(policy, setup.candidates)))
    else:
        overrides = {"budget_gb": budget_gb} | ({"solver": solver} if solver else {})
        settings = AutoCheckpointConfig(**{**(setup.run.autocheckpoint or {}), **overrides})
        callbacks.insert(0, AutoCheckpoint(**dataclasses.asdict(settings)))
    try:
        _fit(setup, model, callbacks, setup.batches)
    except BudgetTooSmallError as error:
        result.error = str(error)
        return result
    finally:
        remove_checkpointing(model)
    if budget_gb is not None:
        plan = callbacks[0].plan
        result.checkpointed, result.predicted_peak_bytes = tuple(plan.checkpointed), plan.predicted_peak_bytes
    result.measured_peak_bytes, result.final_loss = recorder.peak_bytes, recorder.loss
    return result


def time_policies(
    setup: SweepSetup, blocks: dict[str, tuple[str, ...]], rounds: int
) -> dict[str, list[float]]:
    """Step times of every policy in one training run, switching policy every step.

    Each round takes ``timed_steps`` turns through the policies, starting one policy later than the round
    before, after ``warmup_steps`` untimed steps; so slow drifts of a busy machine hit all policies alike.
    """
    order = list(blocks)
    schedule: list[str | None] = [None] * setup.warmup_steps
    for round_index in range(rounds):
        shift = round_index % len(order)
        schedule += (order[shift:] + order[:shift]) * setup.timed_steps
    interleaver = _Interleaver(blocks, schedule, setup.clock)
    L.seed_everything(setup.seed, verbose=False)
    batches = [setup.batches[i % len(setup.batches)] for i in range(len(schedule))]
    _fit(setup, setup.run.model.instantiate(), [interleaver], batches)
    return interleaver.step_seconds


def _fit(
    setup: SweepSetup, model: L.LightningModule, callbacks: list[Callback], batches: Sequence[Any]
) -> None:
    settings = setup.run.trainer
    trainer = L.Trainer(
        accelerator=settings.get("accelerator") or "auto",
        devices=1,
        precision=settings.get("precision"),
        max_steps=len(batches),
        max_epochs=-1,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    trainer.fit(model, train_dataloaders=DataLoader(list(batches), batch_size=None))


def default_budgets_gb(all_peak_bytes: int, none_peak_bytes: int, count: int) -> list[float]:
    """``count`` budgets evenly inside (peak with every block checkpointed, peak with none).

    Example:
        >>> default_budgets_gb(1_000_000_000, 2_000_000_000, 3)
        [1.25, 1.5, 1.75]
    """
    if count < 1:
        raise ValueError(f"`count` must be a positive integer, got {count!r}")
    span_bytes = none_peak_bytes - all_peak_bytes
    return [
        round((all_peak_bytes + span_bytes * (i + 1) / (count + 1)) / BYTES_PER_GB, 6) for i in range(count)
    ]


def run_sweep(
    setup: SweepSetup,
    budgets_gb: Sequence[float] | None,
    num_budgets: int,
    rounds: int,
    old_plan: bool = False,
) -> list[PolicyResult]:
    """Memory runs (hand policies, then AutoCheckpoint at each budget, and the old plan there too if
    ``old_plan``), then one interleaved timing run.

    Without ``budgets_gb``, the budgets are spread between the measured peaks of ``all`` and ``none``.
    """
    results = {policy: run_policy(setup, policy) for policy in HAND_POLICIES}
    if budgets_gb is None:
        peaks = [results[policy].measured_peak_bytes for policy in ("all", "none")]
        budgets_gb = default_budgets_gb(*peaks, num_budgets)
    autos = []
    for budget_gb in budgets_gb:
        results[_auto_name(budget_gb)] = run_policy(setup, _auto_name(budget_gb), budget_gb)
        autos.append(_auto_name(budget_gb))
        if old_plan:
            name = f"additive@{budget_gb:.4g}GB"
            results[name] = run_policy(setup, name, budget_gb, solver=OLD_PLAN_SOLVER)
            autos.append(name)
        log.info("sweep: %s planned and measured", _auto_name(budget_gb))
    order = interleaved_order(list(HAND_POLICIES), autos)
    blocks = {name: results[name].checkpointed for name in order if results[name].error is None}
    for name, step_seconds in time_policies(setup, blocks, rounds).items():
        results[name].step_seconds = step_seconds
    return list(results.values())


def interleaved_order(hands: list[str], autos: list[str]) -> list[str]:
    """Alternate hand and AutoCheckpoint policies.

    Example:
        >>> interleaved_order(["none", "all", "every-other"], ["a1", "a2", "a3", "a4"])
        ['none', 'a1', 'all', 'a2', 'every-other', 'a3', 'a4']
    """
    pairs = itertools.zip_longest(hands, autos)
    return [name for pair in pairs for name in pair if name is not None]


def _auto_name(budget_gb: float) -> str:
    return f"auto@{budget_gb:.4g}GB"


@contextlib.contextmanager
def quiet_lightning() -> Iterator[None]:
    """Silence Lightning's per-Trainer info lines (and the plan tables) during the many short runs."""
    loggers = [logging.getLogger(name) for name in ("lightning.pytorch", "lightning.fabric")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*no `val_dataloader`")  # the sweep only trains
            warnings.filterwarnings(
                "ignore", message=".*isinstance\\(treespec, LeafSpec\\)"
            )  # lightning on torch 2.13
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
