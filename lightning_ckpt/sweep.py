"""``lightning-ckpt sweep``: AutoCheckpoint at several budgets against the policies users pick by hand.

Builds the model and data from a LightningCLI YAML config (the same one ``python -m examples.train fit``
reads) and compares, from the same seeded weights on the same batches:

- ``none``: no checkpointing;
- ``all``: every candidate block checkpointed (what Lightning's FSDP policy and HF's gradient
  checkpointing do);
- ``every-other``: blocks 0, 2, 4, ... checkpointed;
- ``auto@<budget>``: :class:`~lightning_ckpt.AutoCheckpoint` at each budget (default: spread between the
  measured peaks of ``all`` and ``none``).

Memory: one short training run per policy (AutoCheckpoint's through the real callback, which profiles,
plans and wraps on the first step); the peak of its last whole training step (forward, backward,
optimizer step) is measured by :class:`~lightning_ckpt.memory.track_peak_bytes`, and its loss is kept
(the same for every policy: checkpointing does not change the arithmetic).

Time: one more training run that switches the checkpointed blocks before every step, cycling through
the policies (AutoCheckpoint's as its plan chose them, wrapped the same way the callback wraps them),
the order rotating each round; the step time is the median over a policy's steps. Interleaving step by
step makes slow drifts of a busy machine hit every policy alike.

Per budget: the fastest hand policy whose measured peak fits, and AutoCheckpoint's time ratio against it.

Example (a tiny model, from the command line)::

    lightning-ckpt sweep --config configs/gpt-cpu.yaml --steps 3 --plot sweep.png \\
        --model.init_args.n_layer=2
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import logging
import math
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader

from lightning_ckpt.callback import AutoCheckpoint
from lightning_ckpt.candidates import find_candidates
from lightning_ckpt.memory import track_peak_bytes
from lightning_ckpt.planner import BudgetTooSmallError
from lightning_ckpt.run_config import RunConfig, load_run_config
from lightning_ckpt.wrapping import apply_checkpointing, remove_checkpointing

log = logging.getLogger(__name__)

_GB = 1e9
_MB = 1e6
NOISE = 0.05  # "no slower than the best fitting hand policy" allows this relative noise
HAND_POLICIES = ("none", "all", "every-other")
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


@dataclass
class PolicyResult:
    """What one policy measured.

    Attributes:
        policy: ``"none"``, ``"all"``, ``"every-other"`` or ``"auto@<budget_gb>"``.
        budget_gb: AutoCheckpoint's budget (``None`` for hand policies).
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
        return self.error is None and self.measured_peak_bytes <= budget_gb * _GB


@dataclass(frozen=True)
class BudgetVerdict:
    """At one budget: AutoCheckpoint against the fastest hand policy that fits."""

    budget_gb: float
    auto_fits: bool
    best_hand: str | None
    time_ratio: float  # AutoCheckpoint's median step time / the best fitting hand policy's (nan: none fits)

    @property
    def passed(self) -> bool:
        """Within budget, and no slower than the best fitting hand policy (within :data:`NOISE`)."""
        return self.auto_fits and (self.best_hand is None or self.time_ratio <= 1.0 + NOISE)


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


def run_policy(setup: SweepSetup, policy: str, budget_gb: float | None = None) -> PolicyResult:
    """Train ``warmup_steps + 1`` steps from the seeded weights with one policy; measure the last step.

    A hand policy wraps its blocks before training; ``budget_gb`` runs the real AutoCheckpoint callback
    (it profiles, plans and wraps on the first step).
    """
    L.seed_everything(setup.seed, verbose=False)
    model = setup.run.model.instantiate()
    recorder = _PeakRecorder(measure_step=setup.warmup_steps)
    callbacks: list[Callback] = [recorder]
    result = PolicyResult(policy, budget_gb)
    if budget_gb is None:
        result.checkpointed = tuple(apply_checkpointing(model, hand_policy_blocks(policy, setup.candidates)))
    else:
        callbacks.insert(0, AutoCheckpoint(**{**(setup.run.autocheckpoint or {}), "budget_gb": budget_gb}))
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
    return [round((all_peak_bytes + span_bytes * (i + 1) / (count + 1)) / _GB, 6) for i in range(count)]


def run_sweep(
    setup: SweepSetup, budgets_gb: Sequence[float] | None, num_budgets: int, rounds: int
) -> list[PolicyResult]:
    """Memory runs (hand policies, then AutoCheckpoint at each budget), then one interleaved timing run.

    Without ``budgets_gb``, the budgets are spread between the measured peaks of ``all`` and ``none``.
    """
    results = {policy: run_policy(setup, policy) for policy in HAND_POLICIES}
    if budgets_gb is None:
        peaks = [results[policy].measured_peak_bytes for policy in ("all", "none")]
        budgets_gb = default_budgets_gb(*peaks, num_budgets)
    for budget_gb in budgets_gb:
        results[_auto_name(budget_gb)] = run_policy(setup, _auto_name(budget_gb), budget_gb)
        log.info("sweep: %s planned and measured", _auto_name(budget_gb))
    order = interleaved_order(list(HAND_POLICIES), [_auto_name(b) for b in budgets_gb])
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


def verdicts(results: Sequence[PolicyResult]) -> list[BudgetVerdict]:
    """Per AutoCheckpoint budget: does it fit, and how fast is it against the best fitting hand policy."""
    hands = [r for r in results if r.budget_gb is None]
    out = []
    for auto in (r for r in results if r.budget_gb is not None):
        fitting = [r for r in hands if r.fits(auto.budget_gb)]
        best = min(fitting, key=lambda r: r.median_step_seconds, default=None)
        ratio = auto.median_step_seconds / best.median_step_seconds if best else math.nan
        out.append(BudgetVerdict(auto.budget_gb, auto.fits(auto.budget_gb), best and best.policy, ratio))
    return out


def format_results(results: Sequence[PolicyResult], total_blocks: int) -> str:
    """The per-policy table: blocks checkpointed, peaks, median step time, final loss."""
    lines = [
        f"{'policy':<18} {'ckpt':>6} {'budget_MB':>10} {'pred_MB':>9} {'peak_MB':>9} {'step_ms':>9} {'min_ms':>8} {'loss':>8}"
    ]
    for r in results:
        budget = f"{r.budget_gb * _GB / _MB:.2f}" if r.budget_gb is not None else "-"
        predicted = f"{r.predicted_peak_bytes / _MB:.2f}" if r.predicted_peak_bytes is not None else "-"
        if r.error:
            lines.append(
                f"{r.policy:<18} {'-':>6} {budget:>10} {'-':>9} {'-':>9} {'-':>9} {'-':>8} {'-':>8}  {r.error}"
            )
            continue
        lines.append(
            f"{r.policy:<18} {len(r.checkpointed):>3}/{total_blocks:<2} {budget:>10} {predicted:>9} "
            f"{r.measured_peak_bytes / _MB:>9.2f} {r.median_step_seconds * 1e3:>9.1f} "
            f"{min(r.step_seconds, default=math.nan) * 1e3:>8.1f} {r.final_loss:>8.4f}"
        )
    return "\n".join(lines)


def format_verdicts(rows: Sequence[BudgetVerdict]) -> str:
    """Per budget: the best fitting hand policy and AutoCheckpoint's time ratio against it."""
    lines = [f"{'budget_MB':>10} {'auto_fits':>9} {'best_hand':>12} {'time_ratio':>10}  verdict"]
    for v in rows:
        ratio = f"{v.time_ratio:.3f}" if not math.isnan(v.time_ratio) else "-"
        verdict = "ok" if v.passed else ("OVER BUDGET" if not v.auto_fits else f"SLOWER (>{1 + NOISE:.2f})")
        lines.append(
            f"{v.budget_gb * _GB / _MB:>10.2f} {v.auto_fits!s:>9} {v.best_hand or '-':>12} {ratio:>10}  {verdict}"
        )
    return "\n".join(lines)


def write_plot(results: Sequence[PolicyResult], path: str) -> None:
    """Step time against measured peak memory (the Pareto view), budgets as dashed vertical lines."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 5.5))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    ran = [r for r in results if r.error is None]
    for group, marker in (
        ([r for r in ran if r.budget_gb is None], "s"),
        ([r for r in ran if r.budget_gb], "o"),
    ):
        for r in group:
            point = axes.scatter(
                r.measured_peak_bytes / _MB, r.median_step_seconds * 1e3, marker=marker, s=45
            )
            axes.annotate(
                r.policy,
                (r.measured_peak_bytes / _MB, r.median_step_seconds * 1e3),
                fontsize=8,
                xytext=(4, 4),
                textcoords="offset points",
            )
            if r.budget_gb is not None:
                axes.axvline(
                    r.budget_gb * _GB / _MB, linestyle="--", linewidth=1, color=point.get_facecolor()[0]
                )
    axes.set(xlabel="measured peak memory of a training step (MB)", ylabel="median step time (ms)")
    axes.set_title("AutoCheckpoint (circles, budget = dashed line) vs hand policies (squares)")
    axes.grid(True, alpha=0.3)
    figure.savefig(path, dpi=120, bbox_inches="tight")


@contextlib.contextmanager
def _quiet_lightning() -> Iterator[None]:
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


def _machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def write_json(results: Sequence[PolicyResult], path: str, arguments: dict[str, Any]) -> None:
    """Every policy's figures (with all timed steps), the verdicts, the machine and the arguments."""
    rows = [asdict(r) | {"median_step_seconds": r.median_step_seconds} for r in results]
    payload = {
        "machine": _machine(),
        "arguments": arguments,
        "results": rows,
        "verdicts": [asdict(v) | {"passed": v.passed} for v in verdicts(results)],
    }
    with open(path, "w") as handle:
        json.dump(_without_nan(payload), handle, indent=1)


def _without_nan(value: Any) -> Any:
    """``nan`` (no figure) as ``null``, so that strict JSON readers accept the file.

    Example:
        >>> _without_nan({"ratio": math.nan, "steps": [0.1, math.nan]})
        {'ratio': None, 'steps': [0.1, None]}
    """
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: _without_nan(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_without_nan(item) for item in value]
    return value


def _header(setup: SweepSetup, rounds: int) -> str:
    machine = _machine()
    device = machine["cuda"] or f"{machine['processor']} CPU, {machine['torch_threads']} torch threads"
    return (
        f"# {device}; torch {machine['torch']}; {len(setup.candidates)} candidate blocks\n"
        f"# memory: 1 run per policy, peak of step {setup.warmup_steps + 1}; time: 1 run switching policy "
        f"every step, {rounds} round(s) x {setup.timed_steps} steps per policy, order rotating\n"
        "# peak_MB: measured peak of one whole training step (parameters, gradients, optimizer state, "
        "activations); pred_MB: AutoCheckpoint's prediction; "
        f"step_ms / min_ms: median / fastest timed step ({setup.clock} clock); loss: last step's training loss"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightning-ckpt sweep",
        description="AutoCheckpoint at several budgets against no / every-block / every-other-block "
        "checkpointing. Unknown --key=value options override the config (e.g. --model.init_args.n_layer=2).",
    )
    parser.add_argument("--config", required=True, help="LightningCLI YAML config (model and data)")
    budgets = parser.add_mutually_exclusive_group()
    budgets.add_argument(
        "--budgets-gb", type=_float_list, help="comma-separated budgets in GB, e.g. 0.05,0.08"
    )
    budgets.add_argument(
        "--num-budgets",
        type=_positive_int,
        default=4,
        help="budgets spread between the all-checkpointed and no-checkpointing peaks (default 4)",
    )
    parser.add_argument(
        "--steps", type=_positive_int, default=5, help="timed steps per policy per round (default 5)"
    )
    parser.add_argument(
        "--warmup",
        type=_warmup_steps,
        default=3,
        help="steps before the measured one (and untimed steps before timing), at least 3: "
        "AutoCheckpoint plans on the first and measures (and may re-plan) on the next two (default 3)",
    )
    parser.add_argument(
        "--rounds", type=_positive_int, default=3, help="turns through all policies (default 3)"
    )
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="step time as wall-clock time (default) or this process's CPU time (steadier when other jobs "
        "share the CPU; use with --threads 1)",
    )
    parser.add_argument("--threads", type=_positive_int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=1337, help="seed for weights and data (default 1337)")
    parser.add_argument("--plot", help="write the step time vs peak memory plot (PNG) here")
    parser.add_argument("--json", help="write every figure as JSON here")
    return parser


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _warmup_steps(text: str) -> int:
    value = int(text)
    if value < 3:
        raise argparse.ArgumentTypeError(f"must be at least 3, got {text}")
    return value


def _float_list(text: str) -> list[float]:
    values = [float(part) for part in text.split(",") if part.strip()]
    if not values or any(not math.isfinite(v) or v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"must be comma-separated positive numbers of GB, got {text!r}")
    return values


def _check_overrides(parser: argparse.ArgumentParser, overrides: list[str]) -> None:
    """Unknown options pass through as config overrides only if they name a config key (`--a.b=1`)."""
    for token in overrides:
        if token.startswith("--") and "." not in token.split("=", 1)[0]:
            parser.error(f"unrecognized option {token!r}: config overrides look like --trainer.max_steps=5")


def main(argv: list[str] | None = None) -> int:
    """Run the sweep, print both tables; returns 1 if AutoCheckpoint missed a target at some budget."""
    parser = _parser()
    try:
        args, overrides = parser.parse_known_args(argv)
        _check_overrides(parser, overrides)
    except SystemExit as exit_request:
        return int(exit_request.code or 0)
    if args.threads:
        torch.set_num_threads(args.threads)
    setup = make_setup(
        args.config,
        overrides,
        warmup_steps=args.warmup,
        timed_steps=args.steps,
        seed=args.seed,
        clock=args.clock,
    )
    with _quiet_lightning():
        results = run_sweep(setup, args.budgets_gb, args.num_budgets, args.rounds)
    rows = verdicts(results)
    tables = [
        _header(setup, args.rounds),
        format_results(results, len(setup.candidates)),
        format_verdicts(rows),
    ]
    sys.stdout.write("\n\n".join(tables) + "\n")
    if args.plot:
        write_plot(results, args.plot)
    if args.json:
        write_json(results, args.json, vars(args) | {"overrides": overrides})
    return 0 if all(v.passed for v in rows) else 1
