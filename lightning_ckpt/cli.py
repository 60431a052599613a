"""The ``lightning-ckpt`` command: ``plan``, and ``bench`` and ``sweep`` from a repository checkout.

``bench`` and ``sweep`` live in the repository's ``benchmarks/`` (they need its configs and examples),
not in the installed package. The argument types below are shared by every subcommand. A user error
(a file it cannot read or write, an input it cannot use) is one line on stderr and exit status 1, never
a traceback; a bad flag is argparse's usage line and status 2.

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
from pathlib import Path

from lightning_ckpt import __version__

_SUBCOMMANDS = {
    "bench": ("benchmarks.bench", "Benchmark the knapsack solvers against PyTorch's."),
    "sweep": ("benchmarks.sweep.cli", "Budget sweep of the GPT example against hand-picked policies."),
    "plan": (
        "lightning_ckpt.offline.cli",
        "Plan a run from its YAML config on fake tensors, without the hardware.",
    ),
}


def _usage() -> str:
    lines = ["usage: lightning-ckpt {" + ",".join(_SUBCOMMANDS) + "} [options] | --version", ""]
    lines += [f"  {name:<10} {text}" for name, (_, text) in _SUBCOMMANDS.items()]
    lines += [
        f"  {'--version':<10} Print the version and exit.",
        "",
        "`lightning-ckpt <command> --help` lists a command's options.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Dispatch to a subcommand's ``main(argv)``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(_usage() + "\n")
        return 0
    if argv[0] in ("-V", "--version"):
        sys.stdout.write(f"lightning-ckpt {__version__}\n")
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
    try:
        return int(module.main(rest) or 0)
    except (OSError, ValueError) as error:  # a file it cannot read or write, an input it cannot use
        sys.stderr.write(f"lightning-ckpt {name}: {one_line(error)}\n")
        return 1
    except KeyboardInterrupt:
        sys.stderr.write(f"lightning-ckpt {name}: interrupted\n")
        return 130


def one_line(error: BaseException) -> str:
    """An error as one line: its type where the message alone would not say, whitespace collapsed.

    Example:
        >>> one_line(PermissionError(13, "Permission denied", "/root/x.json"))
        "PermissionError: [Errno 13] Permission denied: '/root/x.json'"
    """
    text = " ".join(str(error).split())
    return text if isinstance(error, ValueError) else f"{type(error).__name__}: {text}"


def raised_by_lightning_ckpt(error: BaseException) -> bool:
    """Whether lightning_ckpt's own code raised ``error`` (its message is then meant for the user as it is).

    Example:
        >>> from lightning_ckpt import AutoCheckpointConfig
        >>> try:
        ...     AutoCheckpointConfig(budget_gb=-1)
        ... except ValueError as error:
        ...     raised_by_lightning_ckpt(error), raised_by_lightning_ckpt(ValueError("a model's own"))
        (True, False)
    """
    traceback = error.__traceback__
    while traceback is not None and traceback.tb_next is not None:
        traceback = traceback.tb_next
    module = traceback.tb_frame.f_globals.get("__name__", "") if traceback is not None else ""
    return module.split(".")[0] == "lightning_ckpt"


def check_output_file(flag: str, text: str | None) -> None:
    """Refuse at once a file a command would write only at the end: its folder missing or not
    writable, or itself a folder (writing can still fail later; the commands catch that too).

    Raises:
        ValueError: naming the flag, the path and the reason.

    Example:
        >>> check_output_file("--json", "/nonexistent-folder/plan.json")
        Traceback (most recent call last):
        ...
        ValueError: cannot write --json '/nonexistent-folder/plan.json': its folder does not exist
    """
    if text is None:
        return
    path = Path(text)
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        reason = "it is a folder"
    elif not folder.is_dir():
        reason = "its folder does not exist"
    elif not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        reason = "permission denied"
    else:
        return
    raise ValueError(f"cannot write {flag} {text!r}: {reason}")


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
