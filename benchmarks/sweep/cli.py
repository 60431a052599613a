"""``lightning-ckpt sweep``: AutoCheckpoint at several budgets against the policies users pick by hand.

Builds the model and data from a LightningCLI YAML config (the same one ``python -m examples.train fit``
reads) and compares, from the same seeded weights on the same batches:

- ``none``: no checkpointing;
- ``all``: every candidate block checkpointed (what Lightning's FSDP policy and HF's gradient
  checkpointing do);
- ``every-other``: blocks 0, 2, 4, ... checkpointed;
- ``auto@<budget>``: :class:`~lightning_ckpt.AutoCheckpoint` at each budget (default: spread between the
  measured peaks of ``all`` and ``none``);
- ``additive@<budget>`` (with ``--old-plan``): the plan of the additive bound at each budget, what
  AutoCheckpoint planned before it planned exactly under the peak model.

How memory and time are measured: :mod:`benchmarks.sweep.run`; the tables, verdicts, plot and
JSON: :mod:`benchmarks.sweep.report`.

Per budget: the fastest hand policy whose measured peak fits, and AutoCheckpoint's time ratio against it.

Example (a tiny model, from the command line)::

    lightning-ckpt sweep --config configs/gpt-cpu.yaml --steps 3 --plot sweep.png \\
        --model.init_args.n_layer=2
"""

from __future__ import annotations

import argparse
import sys

import torch

from benchmarks.sweep.report import (
    NOISE,
    BudgetVerdict,
    format_header,
    format_results,
    format_verdicts,
    verdicts,
    write_json,
    write_plot,
)
from benchmarks.sweep.run import (
    CLOCKS,
    HAND_POLICIES,
    PolicyResult,
    SweepSetup,
    default_budgets_gb,
    hand_policy_blocks,
    interleaved_order,
    make_setup,
    quiet_lightning,
    run_policy,
    run_sweep,
    time_policies,
)
from lightning_ckpt.cli import check_output_file, positive_int
from lightning_ckpt.config import AutoCheckpointConfig

__all__ = [
    "CLOCKS",
    "HAND_POLICIES",
    "NOISE",
    "BudgetVerdict",
    "PolicyResult",
    "SweepSetup",
    "default_budgets_gb",
    "format_results",
    "format_verdicts",
    "hand_policy_blocks",
    "interleaved_order",
    "main",
    "make_setup",
    "run_policy",
    "run_sweep",
    "time_policies",
    "verdicts",
    "write_json",
    "write_plot",
]


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
        type=positive_int,
        default=4,
        help="budgets spread between the all-checkpointed and no-checkpointing peaks (default 4)",
    )
    _add_timing_options(parser)
    parser.add_argument("--seed", type=int, default=1337, help="seed for weights and data (default 1337)")
    parser.add_argument(
        "--old-plan",
        action="store_true",
        help="also run the plan of the additive bound (solver ilp: the plan before exact peak planning) "
        "at each budget; vs_old is AutoCheckpoint's step time over the old plan's",
    )
    parser.add_argument("--plot", help="write the step time vs peak memory plot (PNG) here")
    parser.add_argument("--json", help="write every figure as JSON here")
    return parser


def _add_timing_options(parser: argparse.ArgumentParser) -> None:
    """``--steps``, ``--warmup``, ``--rounds``, ``--clock`` and ``--threads``."""
    parser.add_argument(
        "--steps", type=positive_int, default=5, help="timed steps per policy per round (default 5)"
    )
    parser.add_argument(
        "--warmup",
        type=_warmup_steps,
        default=3,
        help="steps before the measured one (and untimed steps before timing), at least 3: "
        "AutoCheckpoint plans on the first and measures (and may re-plan) on the next two (default 3)",
    )
    parser.add_argument(
        "--rounds", type=positive_int, default=3, help="turns through all policies (default 3)"
    )
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="step time as wall-clock time (default) or this process's CPU time (steadier when other jobs "
        "share the CPU; use with --threads 1)",
    )
    parser.add_argument("--threads", type=positive_int, help="torch intra-op threads (default: torch's)")


def _warmup_steps(text: str) -> int:
    value = int(text)
    if value < 3:
        raise argparse.ArgumentTypeError(f"must be at least 3, got {text}")
    return value


def _float_list(text: str) -> list[float]:
    """Budgets in GB, each checked as AutoCheckpoint checks ``budget_gb``."""
    try:
        values = [
            AutoCheckpointConfig(budget_gb=float(part)).budget_gb for part in text.split(",") if part.strip()
        ]
    except ValueError:
        values = []
    if not values:
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
    check_output_file("--plot", args.plot)  # before the sweep, not after it
    check_output_file("--json", args.json)
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
    with quiet_lightning():
        results = run_sweep(setup, args.budgets_gb, args.num_budgets, args.rounds, args.old_plan)
    rows = verdicts(results)
    tables = [
        format_header(setup, args.rounds),
        format_results(results, len(setup.candidates)),
        format_verdicts(rows),
    ]
    sys.stdout.write("\n\n".join(tables) + "\n")
    if args.plot:
        write_plot(results, args.plot)
    if args.json:
        write_json(results, args.json, vars(args) | {"overrides": overrides})
    return 0 if all(v.passed for v in rows) else 1
