"""``lightning-ckpt sweep``'s options: the parser and where its files go, without torch or lightning.

``--help`` and a mistyped flag answer at once; :mod:`benchmarks.sweep.cli` imports the sweep itself only
after the arguments parse. Files go under ``--out-dir`` (default ``runs/sweep``, git-ignored, created when
needed): the JSON always (default name: the config's, ``gpt-cpu.json``), the plot with ``--plot``.

Example:
    >>> args, overrides = parse(["--config", "configs/gpt-cpu.yaml", "--plot", "--model.init_args.n_layer=2"])
    >>> [str(path) for path in output_paths(args)], overrides
    (['runs/sweep/gpt-cpu.json', 'runs/sweep/gpt-cpu.png'], ['--model.init_args.n_layer=2'])
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from lightning_ckpt.cli import positive_int

__all__ = ["CLOCKS", "DEFAULT_OUT_DIR", "output_paths", "parse", "parser"]

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
DEFAULT_OUT_DIR = "runs/sweep"


def parser() -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(
        prog="lightning-ckpt sweep",
        description="AutoCheckpoint at several budgets against no / every-block / every-other-block "
        "checkpointing. Unknown --key=value options override the config (e.g. --model.init_args.n_layer=2).",
    )
    result.add_argument("--config", required=True, help="LightningCLI YAML config (model and data)")
    budgets = result.add_mutually_exclusive_group()
    budgets.add_argument(
        "--budgets-gb", type=_float_list, help="comma-separated budgets in GB, e.g. 0.05,0.08"
    )
    budgets.add_argument(
        "--num-budgets",
        type=positive_int,
        default=4,
        help="budgets spread between the all-checkpointed and no-checkpointing peaks (default 4)",
    )
    _add_timing_options(result)
    result.add_argument("--seed", type=int, default=1337, help="seed for weights and data (default 1337)")
    result.add_argument(
        "--old-plan",
        action="store_true",
        help="also run the plan of the additive bound (solver ilp: the plan before exact peak planning) "
        "at each budget; vs_old is AutoCheckpoint's step time over the old plan's",
    )
    result.add_argument(
        "--out-dir",
        default=DEFAULT_OUT_DIR,
        help=f"folder for the JSON and the plot, created if missing (default {DEFAULT_OUT_DIR})",
    )
    result.add_argument(
        "--plot",
        nargs="?",
        const="",
        help="also write the step time vs peak memory plot (PNG): this file name in --out-dir "
        "(default: the config's name, e.g. gpt-cpu.png; an absolute path is taken as is)",
    )
    result.add_argument(
        "--json",
        help="file name in --out-dir for every figure as JSON (default: the config's name, e.g. "
        "gpt-cpu.json; an absolute path is taken as is)",
    )
    return result


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
    from lightning_ckpt.config import AutoCheckpointConfig  # imports torch: only when the flag is given

    try:
        values = [
            AutoCheckpointConfig(budget_gb=float(part)).budget_gb for part in text.split(",") if part.strip()
        ]
    except ValueError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError(f"must be comma-separated positive numbers of GB, got {text!r}")
    return values


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The options and the config overrides; exits (status 2) on a bad flag, like argparse.

    Unknown options pass through as config overrides only if they name a config key (``--a.b=1``).
    """
    options = parser()
    args, overrides = options.parse_known_args(argv)
    for token in overrides:
        if token.startswith("--") and "." not in token.split("=", 1)[0]:
            options.error(f"unrecognized option {token!r}: config overrides look like --trainer.max_steps=5")
    return args, overrides


def output_paths(args: argparse.Namespace) -> list[Path]:
    """Where the JSON (always) and the plot (with ``--plot``) go: under ``--out-dir`` unless absolute."""
    stem = Path(args.config).stem
    names = [args.json or f"{stem}.json"] + ([args.plot or f"{stem}.png"] if args.plot is not None else [])
    return [Path(args.out_dir) / name for name in names]
