"""``lightning-ckpt plan``: the command line of :func:`lightning_ckpt.offline.plan_offline`.

The parser needs neither torch nor lightning (``--help`` and a bad flag answer at once); the planner is
imported once the arguments parse.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from lightning_ckpt.cli import check_output_file, one_line, positive_float, positive_int

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightning-ckpt plan",
        description="Plan a run's activation checkpointing from its LightningCLI YAML on fake tensors"
        " (no GPU, no weight memory): the plan table and the predicted peak per device.",
    )
    parser.add_argument("--config", required=True, help="the training YAML (as for `fit --config`)")
    parser.add_argument(
        "--budget-gb", type=positive_float, help="per-device budget in GB (default: the config's)"
    )
    parser.add_argument("--devices", type=positive_int, help="devices per node (replaces trainer.devices)")
    parser.add_argument("--num-nodes", type=positive_int, help="nodes (replaces trainer.num_nodes)")
    parser.add_argument("--tflops", type=positive_float, help="device TFLOP/s, to show recompute time")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        type=_override,
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set data.init_args.batch_size=16 (repeatable)",
    )
    parser.add_argument("--json", help="also write the plan and its context to this JSON file")
    return parser


def _override(text: str) -> list[str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"must be KEY=VALUE, got {text!r}")
    return [f"--{key.strip().removeprefix('--')}", value]


def main(argv: list[str] | None = None) -> int:
    """``lightning-ckpt plan``: print the offline plan (and write JSON); exit status 1 if it cannot plan."""
    args = _parser().parse_args(argv)
    quiet = [logging.getLogger(name) for name in _QUIET_LOGGERS]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.WARNING)
    try:
        return _plan(args)
    finally:  # called in-process (a notebook, a test): the loggers as they were
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)


_QUIET_LOGGERS = (
    "lightning.fabric.utilities.seed",  # "Seed set to ..."
    # "AutoCheckpoint candidates: ...", which the callback tells in training: here the table lists them
    "lightning.pytorch.utilities.rank_zero",
)


def _plan(args: argparse.Namespace) -> int:
    from lightning_ckpt.offline.plan import plan_offline  # torch and lightning: after the arguments parse
    from lightning_ckpt.offline.stack import call_with_deep_stack

    try:
        check_output_file("--json", args.json)
        result = call_with_deep_stack(  # a deep model's graph teardown recurses (offline/stack.py)
            plan_offline,
            args.config,
            overrides=[part for pair in args.set for part in pair],
            budget_gb=args.budget_gb,
            devices=args.devices,
            num_nodes=args.num_nodes,
            tflops=args.tflops,
        )
    except ValueError as error:  # BudgetTooSmallError included: its message names the smallest budget
        sys.stderr.write(f"lightning-ckpt plan: {one_line(error)}\n")
        return 1
    sys.stdout.write(f"{result}\n")
    if args.json is not None:
        try:
            Path(args.json).write_text(json.dumps(result.to_dict(), indent=2) + "\n")
        except OSError as error:
            sys.stderr.write(f"lightning-ckpt plan: cannot write --json: {one_line(error)}\n")
            return 1
        sys.stdout.write(f"wrote {args.json}\n")
    return 0
