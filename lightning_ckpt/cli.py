"""The ``lightning-ckpt`` command: ``plan``, and ``bench`` and ``sweep`` from a repository checkout.

``bench`` and ``sweep`` live in the repository's ``benchmarks/`` (they need its configs and examples),
not in the installed package. The argument types below are shared by every subcommand.

Example:
    >>> positive_int("1e6"), positive_float("0.5")
    (1000000, 0.5)
    >>> positive_int("0")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: must be a positive integer, got '0'
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys

_SUBCOMMANDS = {
    "bench": ("benchmarks.bench", "Benchmark the knapsack solvers against PyTorch's."),
    "sweep": ("benchmarks.sweep.cli", "Budget sweep of the GPT example against hand-picked policies."),
    "plan": (
        "lightning_ckpt.offline.cli",
        "Plan a run from its YAML config on fake tensors, without the hardware.",
    ),
}


def _usage() -> str:
    lines = ["usage: lightning-ckpt {" + ",".join(_SUBCOMMANDS) + "} [options]", ""]
    lines += [f"  {name:<6} {text}" for name, (_, text) in _SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Dispatch to a subcommand's ``main(argv)``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(_usage() + "\n")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in _SUBCOMMANDS:
        sys.stderr.write(f"lightning-ckpt: unknown command {name!r}\n\n{_usage()}\n")
        return 2
    # Like `python -m`, let configs refer to modules in the working directory (`examples.gpt.GPT`).
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(_SUBCOMMANDS[name][0])
    except ModuleNotFoundError as error:
        if error.name not in ("benchmarks", "examples"):
            raise
        sys.stderr.write(
            f"lightning-ckpt {name}: run it from the repository checkout (it needs `{error.name}/`)\n"
        )
        return 2
    return int(module.main(rest) or 0)


def positive_int(text: str) -> int:
    """A whole number >= 1; ``"1e6"`` is accepted for large counts and capacities."""
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number.is_integer() and number >= 1):
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return int(number)


def positive_float(text: str) -> float:
    """A finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text!r}")
    return value


if __name__ == "__main__":
    raise SystemExit(main())
