"""``python -m benchmarks.bench.first_plan``: what the first plan adds to a fit's first step, in fresh
processes.

The main job's model (configs/gpt-cpu.yaml: the example GPT, 8 blocks, width 128, 16 x 128 tokens,
budget 0.12 GB) is fitted for ``--steps`` steps in a new Python process, with AutoCheckpoint and without,
alternated ``--rounds`` times. Each child reports the CPU seconds from just before ``trainer.fit`` to
the end of step 0 (setup, the first plan, the first real step) and its median step after that. The cost
of the first plan is the difference between the two first steps, in median steps of the fit without the
callback: a fresh fit's step 0 pays its warm-up (the first real forward, the allocator) either way, so
this is what the user waits for beyond it. The fits with the callback also report its own
``on_train_batch_start`` of step 0 (the profile, the solve, the wrapping: clocks called just before and
after it), in median steps of the fit without it: less noisy than a difference of two processes' first
steps, and a plain step is shorter than a step with blocks checkpointed (the auto median, shown too).
``benchmarks.bench.shapes``' first-plan figure compares the planning with a warm step too. A command, not a
test: no time is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import lightning as L
import torch
from torch.utils.data import DataLoader


class _StepClock(L.Callback):
    """CPU seconds from ``start`` (set just before ``trainer.fit``) to the end of step 0, then of each
    later step."""

    def __init__(self) -> None:
        self.start, self.steps = 0.0, []

    def on_train_batch_start(self, *args) -> None:
        if self.steps:
            self.start = time.process_time()

    def on_train_batch_end(self, *args) -> None:
        self.steps.append(time.process_time() - self.start)


class _PlanClock(L.Callback):
    """CPU seconds between two of these placed around AutoCheckpoint, at step 0's batch start."""

    def __init__(self, start: _PlanClock | None = None) -> None:
        self.start, self.at, self.seconds = start, None, 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == 0:
            self.at = time.process_time()
            if self.start is not None:
                self.seconds = self.at - self.start.at


def child(with_callback: bool, steps: int) -> dict:
    """One fit in this process; its first step's and its median later step's CPU seconds."""
    from benchmarks.bench.shapes import _trainer, main_job_gpt, padded_batches
    from lightning_ckpt import AutoCheckpoint

    torch.set_num_threads(1)
    torch.manual_seed(0)
    batches = padded_batches("gpt", steps, 16, (128, 128), 0)
    model = main_job_gpt()
    clock, before = _StepClock(), _PlanClock()
    after = _PlanClock(before)
    callbacks = [before, AutoCheckpoint(budget_gb=0.12), after, clock] if with_callback else [clock]
    trainer = _trainer(callbacks, steps)
    clock.start = time.process_time()
    trainer.fit(model, train_dataloaders=DataLoader(batches, batch_size=None))
    median_s = statistics.median(clock.steps[1:])
    return {"first_s": clock.steps[0], "median_s": median_s, "plan_s": after.seconds}


def _run_child(with_callback: bool, steps: int) -> dict:
    command = [
        sys.executable,
        "-m",
        "benchmarks.bench.first_plan",
        "--child",
        "auto" if with_callback else "plain",
    ]
    done = subprocess.run([*command, "--steps", str(steps)], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench.first_plan", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--rounds", type=int, default=3, help="pairs of fresh processes (3)")
    parser.add_argument("--steps", type=int, default=8, help="steps per fit (8)")
    parser.add_argument("--child", choices=("auto", "plain"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child == "auto", args.steps)))
        return
    print("example GPT (8 blocks, 16 x 128, budget 0.12 GB), fresh processes, CPU s")
    print(
        "round  plain step 0  auto step 0  plain median  first plan adds (steps)"
        "  auto median  planning alone (steps)"
    )
    for round_index in range(args.rounds):
        plain, auto = _run_child(False, args.steps), _run_child(True, args.steps)
        extra_s = auto["first_s"] - plain["first_s"]
        print(
            f"{round_index:>5}  {plain['first_s']:>12.3f}  {auto['first_s']:>11.3f}  {plain['median_s']:>12.3f}"
            f"  {extra_s:>6.3f} s ({extra_s / plain['median_s']:.2f})       {auto['median_s']:>11.3f}"
            f"  {auto['plan_s']:.3f} s ({auto['plan_s'] / plain['median_s']:.2f})"
        )


if __name__ == "__main__":
    main()
