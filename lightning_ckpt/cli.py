"""The ``lightning-ckpt`` command: ``bench``, ``sweep`` and ``plan`` subcommands."""

from __future__ import annotations

import importlib
import os
import sys

_SUBCOMMANDS = {
    "bench": ("lightning_ckpt.bench", "Benchmark the knapsack solvers against PyTorch's."),
    "sweep": ("lightning_ckpt.sweep", "Budget sweep of the GPT example against hand-picked policies."),
    "plan": (
        "lightning_ckpt.offline",
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
    module = importlib.import_module(_SUBCOMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
