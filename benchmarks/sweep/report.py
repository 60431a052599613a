"""The sweep's report: per-budget verdicts, the two tables, the Pareto plot and the JSON file."""

from __future__ import annotations

import json
import math
import platform
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from benchmarks.sweep.run import PolicyResult, SweepSetup
from lightning_ckpt.units import BYTES_PER_GB, BYTES_PER_MB

NOISE = 0.05  # "no slower than the best fitting hand policy" allows this relative noise


@dataclass(frozen=True)
class BudgetVerdict:
    """At one budget: AutoCheckpoint against the fastest hand policy that fits."""

    budget_gb: float
    auto_fits: bool
    best_hand: str | None
    time_ratio: float  # AutoCheckpoint's median step time / the best fitting hand policy's (nan: none fits)
    old_plan_ratio: float = math.nan  # its median step time / the old plan's at this budget (nan: not run)

    @property
    def passed(self) -> bool:
        """Within budget, and no slower than the best fitting hand policy (within :data:`NOISE`)."""
        return self.auto_fits and (self.best_hand is None or self.time_ratio <= 1.0 + NOISE)


def verdicts(results: Sequence[PolicyResult]) -> list[BudgetVerdict]:
    """Per AutoCheckpoint budget: does it fit, and how fast is it against the best fitting hand policy."""
    hands = [r for r in results if r.budget_gb is None]
    olds = {r.budget_gb: r for r in results if r.budget_gb is not None and r.solver is not None}
    out = []
    for auto in (r for r in results if r.budget_gb is not None and r.solver is None):
        fitting = [r for r in hands if r.fits(auto.budget_gb)]
        best = min(fitting, key=lambda r: r.median_step_seconds, default=None)
        ratio = auto.median_step_seconds / best.median_step_seconds if best else math.nan
        old = olds.get(auto.budget_gb)
        old_ratio = (
            auto.median_step_seconds / old.median_step_seconds if old and old.error is None else math.nan
        )
        fits = auto.fits(auto.budget_gb)
        out.append(BudgetVerdict(auto.budget_gb, fits, best and best.policy, ratio, old_ratio))
    return out


def format_results(results: Sequence[PolicyResult], total_blocks: int) -> str:
    """The per-policy table: blocks checkpointed, peaks, median step time, final loss."""
    lines = [
        f"{'policy':<18} {'ckpt':>6} {'budget_MB':>10} {'pred_MB':>9} {'peak_MB':>9} {'step_ms':>9} {'min_ms':>8} {'loss':>8}"
    ]
    for r in results:
        budget = f"{r.budget_gb * BYTES_PER_GB / BYTES_PER_MB:.2f}" if r.budget_gb is not None else "-"
        predicted = (
            f"{r.predicted_peak_bytes / BYTES_PER_MB:.2f}" if r.predicted_peak_bytes is not None else "-"
        )
        if r.error:
            lines.append(
                f"{r.policy:<18} {'-':>6} {budget:>10} {'-':>9} {'-':>9} {'-':>9} {'-':>8} {'-':>8}  {r.error}"
            )
            continue
        lines.append(
            f"{r.policy:<18} {len(r.checkpointed):>3}/{total_blocks:<2} {budget:>10} {predicted:>9} "
            f"{r.measured_peak_bytes / BYTES_PER_MB:>9.2f} {r.median_step_seconds * 1e3:>9.1f} "
            f"{min(r.step_seconds, default=math.nan) * 1e3:>8.1f} {r.final_loss:>8.4f}"
        )
    return "\n".join(lines)


def format_verdicts(rows: Sequence[BudgetVerdict]) -> str:
    """Per budget: the best fitting hand policy and AutoCheckpoint's time ratio against it."""
    lines = [
        f"{'budget_MB':>10} {'auto_fits':>9} {'best_hand':>12} {'time_ratio':>10} {'vs_old':>7}  verdict"
    ]
    for v in rows:
        ratio = f"{v.time_ratio:.3f}" if not math.isnan(v.time_ratio) else "-"
        old = f"{v.old_plan_ratio:.3f}" if not math.isnan(v.old_plan_ratio) else "-"
        verdict = "ok" if v.passed else ("OVER BUDGET" if not v.auto_fits else f"SLOWER (>{1 + NOISE:.2f})")
        lines.append(
            f"{v.budget_gb * BYTES_PER_GB / BYTES_PER_MB:>10.2f} {v.auto_fits!s:>9} {v.best_hand or '-':>12} {ratio:>10} {old:>7}  {verdict}"
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
                r.measured_peak_bytes / BYTES_PER_MB, r.median_step_seconds * 1e3, marker=marker, s=45
            )
            axes.annotate(
                r.policy,
                (r.measured_peak_bytes / BYTES_PER_MB, r.median_step_seconds * 1e3),
                fontsize=8,
                xytext=(4, 4),
                textcoords="offset points",
            )
            if r.budget_gb is not None:
                axes.axvline(
                    r.budget_gb * BYTES_PER_GB / BYTES_PER_MB,
                    linestyle="--",
                    linewidth=1,
                    color=point.get_facecolor()[0],
                )
    axes.set(xlabel="measured peak memory of a training step (MB)", ylabel="median step time (ms)")
    axes.set_title("AutoCheckpoint (circles, budget = dashed line) vs hand policies (squares)")
    axes.grid(True, alpha=0.3)
    figure.savefig(path, dpi=120, bbox_inches="tight")


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


def format_header(setup: SweepSetup, rounds: int) -> str:
    """The comment lines above the tables: the machine, how the sweep measured, and each column."""
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
