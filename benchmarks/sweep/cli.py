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

    lightning-ckpt sweep --config configs/gpt-cpu.yaml --steps 3 --plot --model.init_args.n_layer=2

writes ``runs/sweep/gpt-cpu.json`` and ``runs/sweep/gpt-cpu.png`` (``--out-dir`` names another folder).
The options are parsed first (:mod:`benchmarks.sweep.options`, without torch), the sweep imported after.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.sweep.options import output_paths, parse
from lightning_ckpt.cli import check_output_file

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run the sweep, print both tables; returns 1 if AutoCheckpoint missed a target at some budget."""
    try:
        args, overrides = parse(argv)
    except SystemExit as exit_request:
        return int(exit_request.code or 0)
    json_path, *plot_path = _prepare_outputs(args)  # before the sweep, not after it

    import torch

    from benchmarks.sweep.report import format_header, format_results, format_verdicts, verdicts, write_json
    from benchmarks.sweep.run import make_setup, quiet_lightning, run_sweep

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
    write_json(results, str(json_path), vars(args) | {"overrides": overrides})
    if plot_path:
        from benchmarks.sweep.report import write_plot

        write_plot(results, str(plot_path[0]))
    sys.stdout.write(f"wrote {' and '.join(str(path) for path in [json_path, *plot_path])}\n")
    return 0 if all(v.passed for v in rows) else 1


def _prepare_outputs(args: argparse.Namespace) -> list[Path]:
    """The output files, their folders under ``--out-dir`` created, each checked writable.

    Raises:
        ValueError: for a file it cannot write (``lightning-ckpt`` prints it as one line).
    """
    paths = output_paths(args)
    for flag, path in zip(("--json", "--plot"), paths, strict=False):
        if path.is_relative_to(args.out_dir):
            path.parent.mkdir(parents=True, exist_ok=True)
        check_output_file(flag, str(path))
    return paths
