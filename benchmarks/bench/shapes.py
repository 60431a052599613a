"""``python -m benchmarks.bench.shapes``: dynamic padding, side by side in one run.

Each batch is padded to its own longest sequence (``DataCollatorWithPadding`` style): a new length
almost every step. On the same batches it trains, from the same weights:

- ``none``: no checkpointing (what the budget is too small for, when it is);
- ``all``: every block checkpointed by hand;
- ``hand``: the fastest hand policy that fits every shape: the first k blocks checkpointed, k the
  smallest whose predicted peak at the longest batch is within the budget;
- ``auto``: AutoCheckpoint with the budget, one plan per family of shapes.

It prints each run's CPU and wall time, the ratios against ``none`` and ``hand``, and for ``auto`` the
profiles and plans it made and where its CPU time beyond ``hand`` went: each part of its profiles (the
fake step, its no-grad forward for working sets, the optimizer step, the timing forward), solving,
wrapping and unwrapping at plan switches, the per-step lookup (``batch_shapes``, the plan book), the
measured steps (a live-storage count on CPU), and the training steps themselves (recompute). Models: transformers Llama and GPT-2 from tiny
configs (random weights, nothing downloaded) and the example GPT. A command, not a test: no time is
asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import lightning as L
import torch
from torch.utils.data import DataLoader

import lightning_ckpt.callback as callback_module
import lightning_ckpt.core.profiler as profiler_module
import lightning_ckpt.lightning.granularity as granularity_module
import lightning_ckpt.lightning.profile as profile_module
from lightning_ckpt import AutoCheckpoint
from lightning_ckpt.core.candidates import find_candidates
from lightning_ckpt.core.wrapping import apply_checkpointing, remove_checkpointing
from lightning_ckpt.planning.peak import PeakModel
from lightning_ckpt.testing import memory_cap
from lightning_ckpt.units import BYTES_PER_MB

MODELS = ("llama", "gpt2", "gpt")


@dataclass
class RunResult:
    name: str
    cpu_s: float
    wall_s: float
    profiles: int = 0
    profile_s: float = 0.0
    plans: list[str] = field(default_factory=list)
    parts: dict[str, list[float]] = field(default_factory=dict)
    """CPU seconds of each call, by part of the callback's work (see :func:`timed_calls`)."""
    steps: StepSeconds | None = None


_PARTS = {  # part: (module, attribute) whose calls are timed; nested parts are within "profile"
    "profile": (callback_module, "profile_in_fit"),
    "  fake step (forward+backward)": (profile_module, "profile_step"),
    "    no-grad forward (working sets)": (profiler_module, "forward_working_sets"),
    "  optimizer step": (profile_module, "optimizer_step_extra_bytes"),
    "  timing forward (real)": (profile_module, "time_forwards"),
    "solve": (granularity_module.OptionBook, "decide"),
    "apply plan (wrap/unwrap)": (callback_module, "apply_plan"),
}


@contextlib.contextmanager
def timed_calls(parts: dict[str, tuple[object, str]]) -> Iterator[dict[str, list[float]]]:
    """The CPU seconds of each call of each ``(owner, attribute)`` inside the block, by part name."""
    spent: dict[str, list[float]] = {name: [] for name in parts}
    originals = {name: getattr(owner, attribute) for name, (owner, attribute) in parts.items()}

    def timed(name: str, real: Callable) -> Callable:
        def call(*args, **kwargs):
            start = time.process_time()
            try:
                return real(*args, **kwargs)
            finally:
                spent[name].append(time.process_time() - start)

        return call

    for name, (owner, attribute) in parts.items():
        setattr(owner, attribute, timed(name, originals[name]))
    try:
        yield spent
    finally:
        for name, (owner, attribute) in parts.items():
            setattr(owner, attribute, originals[name])


def build_model(kind: str, layers: int, max_length: int) -> L.LightningModule:
    """A tiny ``kind`` model (seeded): transformers Llama or GPT-2 (``examples.hf_lm``) or the example GPT."""
    torch.manual_seed(0)
    if kind == "gpt":
        from examples.gpt import GPT

        return GPT(block_size=max_length, n_layer=layers, n_head=4, n_embd=64, dropout=0.0)
    from examples.hf_lm import HFCausalLM

    sizes = {"vocab_size": 256, "num_attention_heads": 4, "use_cache": False}
    if kind == "llama":
        sizes |= {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": layers}
        return HFCausalLM("llama", sizes | {"num_key_value_heads": 2})
    sizes |= {"n_embd": 64, "n_layer": layers, "n_positions": max_length}
    return HFCausalLM("gpt2", sizes)


def padded_batches(kind: str, steps: int, batch_size: int, lengths: tuple[int, int], seed: int) -> list:
    """``steps`` batches, each padded to its own longest row: that length uniform in ``lengths``, the
    other rows between the shortest length and it (padding masked, and left out of the loss)."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        longest = int(torch.randint(lengths[0], lengths[1] + 1, (), generator=generator))
        rows = torch.randint(lengths[0], longest + 1, (batch_size, 1), generator=generator)
        rows[0] = longest
        ids = torch.randint(1, 256, (batch_size, longest + 1), generator=generator)
        mask = (torch.arange(longest + 1) < rows + 1).long()
        ids = ids * mask
        if kind == "gpt":
            batches.append((ids[:, :-1].contiguous(), ids[:, 1:].contiguous()))
        else:
            ids, mask = ids[:, :-1].contiguous(), mask[:, :-1].contiguous()
            labels = ids.masked_fill(mask == 0, -100)
            batches.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return batches


def _trainer(callbacks: list, steps: int) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=callbacks,
    )


def timed_fit(
    make: Callable[[], L.LightningModule], batches: list, checkpointed: list[str] | None, callbacks: list
) -> RunResult:
    """One fit over ``batches`` with ``checkpointed`` wrapped by hand (or ``callbacks``): its CPU and wall
    time (and each step's, when ``callbacks`` holds a :class:`StepSeconds`)."""
    model = make()
    if checkpointed:
        apply_checkpointing(model, checkpointed)
    L.seed_everything(0, verbose=False)
    trainer = _trainer(callbacks, len(batches))
    cpu, wall = time.process_time(), time.perf_counter()
    trainer.fit(model, train_dataloaders=DataLoader(batches, batch_size=None))
    result = RunResult("", time.process_time() - cpu, time.perf_counter() - wall)
    result.steps = next((c for c in callbacks if isinstance(c, StepSeconds)), None)
    remove_checkpointing(model)
    return result


def auto_fit(make: Callable[[], L.LightningModule], batches: list, budget_gb: float) -> RunResult:
    """The callback's fit, with its profiles counted and each part of its work timed."""
    callback = AutoCheckpoint(budget_gb=budget_gb)
    steps = StepSeconds(planning=callback, measured=callback)
    with timed_calls(_PARTS) as parts:
        result = timed_fit(make, batches, None, [callback, steps])
    result.parts, result.steps = parts, steps
    result.profiles, result.profile_s = len(parts["profile"]), sum(parts["profile"])
    result.plans = [
        f"{shapes[0][0]}: {len(plan.checkpointed)} of {len(plan.items)} checkpointed,"
        f" predicted {plan.predicted_peak_bytes / BYTES_PER_MB:.1f} MB"
        + (
            ""
            if plan.measured_peak_bytes is None
            else f", measured {plan.measured_peak_bytes / BYTES_PER_MB:.1f} MB"
        )
        for shapes, plan in callback.plans.items()
    ]
    return result


def capped_fit(make: Callable[[], L.LightningModule], batches: list, budget_bytes: int) -> str:
    """The callback's fit again inside ``memory_cap(budget_bytes)``: did every step stay within it?"""
    model = make()
    trainer = _trainer([AutoCheckpoint(budget_gb=budget_bytes / 1e9)], len(batches))
    try:
        with memory_cap(budget_bytes, model=model) as cap:
            trainer.fit(model, train_dataloaders=DataLoader(batches, batch_size=None))
    except torch.OutOfMemoryError as error:
        return f"out of memory at step {trainer.global_step} ({error})"
    return f"all {trainer.global_step} steps within it (peak {cap.peak_bytes / BYTES_PER_MB:.1f} MB)"


def longest_profile(make: Callable[[], L.LightningModule], batches: list):
    """The callback's profile of the longest batch (an uncapped one-step probe)."""
    longest = max(batches, key=lambda b: next(iter(b.values() if isinstance(b, dict) else b)).shape[1])
    probe = AutoCheckpoint(budget_gb=1000, measure=False)
    _trainer([probe], 1).fit(make(), train_dataloaders=DataLoader([longest], batch_size=None))
    return probe.profile


def hand_policy(profile, budget_bytes: int) -> list[str]:
    """The first k blocks, k the smallest whose predicted peak fits ``budget_bytes``."""
    names = [m.name for m in profile.modules]
    peak = PeakModel(profile)
    return next(
        (names[:k] for k in range(len(names) + 1) if peak.peak_bytes(names[:k]) <= budget_bytes), names
    )


def bench_model(kind: str, layers: int, args: argparse.Namespace) -> str:
    make = lambda: build_model(kind, layers, args.max_length)  # noqa: E731
    batches = padded_batches(kind, args.steps, args.batch_size, (args.min_length, args.max_length), args.seed)
    profile = longest_profile(make, batches)
    peak = PeakModel(profile)
    names = [m.name for m in profile.modules]
    lowest, highest = peak.peak_bytes(names), peak.peak_bytes([])
    budget_bytes = int(lowest + args.where * (highest - lowest))
    hand = hand_policy(profile, budget_bytes)
    names = find_candidates(make(), None)
    runs = {
        "none": timed_fit(make, batches, None, []),
        "all": timed_fit(make, batches, names, []),
        f"hand ({len(hand)} of {len(names)})": timed_fit(make, batches, hand, [StepSeconds()]),
        "auto": auto_fit(make, batches, budget_bytes / 1e9),
    }
    none_cpu, hand_cpu = runs["none"].cpu_s, list(runs.values())[2].cpu_s
    lengths = sorted({next(iter(b.values() if isinstance(b, dict) else b)).shape[1] for b in batches})
    lines = [
        f"{kind}, {layers} layers: {args.steps} steps of {args.batch_size} rows, {len(lengths)} lengths"
        f" {lengths[0]}-{lengths[-1]}; budget {budget_bytes / BYTES_PER_MB:.1f} MB (all checkpointed"
        f" {lowest / BYTES_PER_MB:.1f}, none {highest / BYTES_PER_MB:.1f} at the longest batch)",
        f"  {'run':<16} {'cpu s':>7} {'wall s':>7} {'/ none':>7} {'/ hand':>7}",
    ]
    for name, run in runs.items():
        lines.append(
            f"  {name:<16} {run.cpu_s:7.2f} {run.wall_s:7.2f} {run.cpu_s / none_cpu:7.2f} {run.cpu_s / hand_cpu:7.2f}"
        )
    auto = runs["auto"]
    if args.cap:
        lines.append(f"  auto under memory_cap(budget): {capped_fit(make, batches, budget_bytes)}")
    lines.append(
        f"  auto: {auto.profiles} profiles, {auto.profile_s:.2f} CPU s profiling ({auto.profile_s / auto.cpu_s:.0%}"
        f" of its CPU time), {len(auto.plans)} plans:"
    )
    lines += [f"    {plan}" for plan in auto.plans]
    lines += excess_lines(auto, list(runs.values())[2], len(hand))
    return "\n".join(lines)


def excess_lines(auto: RunResult, hand: RunResult, hand_checkpointed: int) -> list[str]:
    """Where ``auto``'s CPU time beyond ``hand``'s went: the parts of its planning, the per-step lookup,
    its measured steps, and its training steps (their recompute) against ``hand``'s."""
    total = lambda name: sum(auto.parts.get(name, ()))  # noqa: E731
    steps, hand_steps = auto.steps, hand.steps
    planning_s = sum(steps.planning)
    lookup = [s for s, planned in zip(steps.planning, steps.planned, strict=True) if not planned]
    measured = [s for s, m in zip(steps.steps, steps.measured, strict=True) if m]
    plain = [s for s, m in zip(steps.steps, steps.measured, strict=True) if not m]
    measured_extra_s = sum(measured) - len(measured) * statistics.median(plain)
    checkpointed = statistics.mean(steps.checkpointed)
    lines = [f"  auto - hand = {auto.cpu_s - hand.cpu_s:+.2f} CPU s:"]
    for name in _PARTS:
        calls = auto.parts.get(name, [])
        lines.append(
            f"    {name.strip() if not name.startswith('  ') else name:<36} {len(calls):3d} calls {total(name):6.2f} s"
        )
    lines += [
        f"    per-step lookup (batch_shapes, plan book) {len(lookup):3d} steps {sum(lookup):6.3f} s",
        f"    on_train_batch_start in all             {planning_s:6.2f} s",
        f"    measured steps (live-storage count)  {len(measured):3d} steps {measured_extra_s:+6.2f} s over the median step",
        f"    training steps: auto {sum(steps.steps):.2f} s, hand {sum(hand_steps.steps):.2f} s"
        f" ({sum(steps.steps) - sum(hand_steps.steps):+.2f} s); blocks checkpointed per step {checkpointed:.2f}"
        f" (hand {hand_checkpointed})",
        f"    the rest (Lightning's loop and setup): auto {auto.cpu_s - planning_s - sum(steps.steps):.2f} s,"
        f" hand {hand.cpu_s - sum(hand_steps.steps):.2f} s",
    ]
    return lines


class StepSeconds(L.Callback):
    """The CPU seconds of each training step, from batch start to batch end (placed after AutoCheckpoint,
    its planning is left out); with ``planning=callback``, also the CPU seconds of that callback's
    ``on_train_batch_start`` (its planning) on each step and whether it planned; with
    ``measured=callback``, whether each step was measured and how many blocks it checkpointed."""

    def __init__(self, planning: L.Callback | None = None, measured: AutoCheckpoint | None = None) -> None:
        self.steps: list[float] = []
        self.planning: list[float] = []
        self.planned: list[bool] = []
        self.measured: list[bool] = []
        self.checkpointed: list[int] = []
        self._callback = measured
        if planning is not None:
            real = planning.on_train_batch_start

            def timed(*args, **kwargs):
                start, plans = time.process_time(), len(planning._book.profiles)
                try:
                    return real(*args, **kwargs)
                finally:
                    self.planning.append(time.process_time() - start)
                    self.planned.append(len(planning._book.profiles) != plans)

            planning.on_train_batch_start = timed

    def on_train_batch_start(self, *args) -> None:
        if self._callback is not None:
            self.measured.append(self._callback._meter is not None)
            self.checkpointed.append(len(self._callback.plan.checkpointed))
        self._start = time.process_time()

    def on_train_batch_end(self, *args) -> None:
        self.steps.append(time.process_time() - self._start)


def main_job_gpt() -> L.LightningModule:
    """The example GPT of configs/gpt-cpu.yaml (8 blocks, width 128, 128 tokens), dropout off."""
    from examples.gpt import GPT

    return GPT(block_size=128, n_layer=8, n_head=4, n_embd=128, dropout=0.0)


def first_plan_cost(args: argparse.Namespace) -> str:
    """The example GPT of configs/gpt-cpu.yaml (8 blocks, width 128, 16 x 128 tokens, budget 0.12 GB): the
    first plan (the callback's ``on_train_batch_start`` on step 0: profile, solve, wrap) against the median
    step of a fit without the callback run right after it (CPU time)."""
    torch.manual_seed(0)
    batches = padded_batches("gpt", 10, 16, (128, 128), args.seed)
    make = main_job_gpt
    callback = AutoCheckpoint(budget_gb=0.12)
    auto_steps = StepSeconds(planning=callback)
    with timed_calls(_PARTS) as parts:
        auto = timed_fit(make, batches, None, [callback, auto_steps])
    plain_steps = StepSeconds()
    plain = timed_fit(make, batches, None, [plain_steps])
    step_s, planning_s = statistics.median(plain_steps.steps), auto_steps.planning[0]
    first = ", ".join(f"{name.strip()} {calls[0]:.3f}" for name, calls in parts.items() if calls)
    return (
        f"example GPT (8 blocks, 16 x 128, budget 0.12 GB), CPU time: first plan {planning_s:.3f} s"
        f" ({first}), median training step {step_s:.3f} s without the callback: {planning_s / step_s:.2f}"
        f" steps; median step with the plan ({len(callback.plan.checkpointed)} of 8 checkpointed)"
        f" {statistics.median(auto_steps.steps):.3f} s; the fit with the callback {auto.cpu_s:.2f} s, without"
        f" {plain.cpu_s:.2f} s"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench.shapes", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--layers", nargs="+", type=int, default=[4, 16], help="blocks per model (4 16)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--min-length", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument(
        "--where", type=float, default=0.5, help="budget between all (0) and none (1) checkpointed"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1)")
    parser.add_argument("--cap", action="store_true", help="also run the callback under memory_cap(budget)")
    parser.add_argument("--no-first-plan", action="store_true", help="skip the example GPT's first-plan cost")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    for kind in args.models:
        for layers in args.layers:
            sys.stdout.write(bench_model(kind, layers, args) + "\n\n")
            sys.stdout.flush()
    if not args.no_first_plan:
        sys.stdout.write(first_plan_cost(args) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
