"""``lightning-ckpt bench`` arguments and ``main``: run the grid (or the targets), print, plot, write JSON."""

from __future__ import annotations

import argparse
import json
import sys

from benchmarks.bench.harness import BenchOptions, run_grid, run_jobs
from benchmarks.bench.instances import DEFAULT_N, DEFAULT_W, FAMILIES, KNOWN_FAMILIES
from benchmarks.bench.methods import METHODS
from benchmarks.bench.prefix import PREFIX_METHODS, format_prefix, run_prefix
from benchmarks.bench.report import _footer, _header, format_table, write_json, write_plot
from benchmarks.bench.targets import _format_verdicts, _target_jobs, _targets, _verdict
from lightning_ckpt.cli import check_output_file, positive_int


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightning-ckpt bench",
        description="Benchmark the knapsack solvers against PyTorch's, side by side on the same instances.",
    )
    parser.add_argument(
        "--families",
        nargs="+",
        default=None,
        help=f"instance families (A B C; U W B C with --paper; among {' '.join(KNOWN_FAMILIES)})",
    )
    parser.add_argument("--n", nargs="+", type=positive_int, default=list(DEFAULT_N), help="item counts")
    parser.add_argument(
        "--W", nargs="+", type=positive_int, default=list(DEFAULT_W), help="capacities (1e6 ok)"
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=None,
        help=f"among {' '.join(METHODS)} (default: all but auto-dense, auto without the sparse states;"
        f" with --paper: {' '.join(PAPER_METHODS)})",
    )
    parser.add_argument("--seed", type=int, default=0, help="instance seed (default 0)")
    parser.add_argument(
        "--paper",
        action="store_true",
        help="the paper's instances only: n=2000 at W=1.4e8 and 3.8e8, families U W B C, this solver against"
        " PyTorch's two and HiGHS (with --targets: add the paper-scale targets)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="with --paper: only auto and HiGHS (methods: auto ilp), runs estimated over 60 s skipped"
        " (a few minutes in all; the full --paper run takes hours)",
    )
    parser.add_argument("--targets", action="store_true", help="run the issue targets, print PASS/MISS")
    parser.add_argument(
        "--prefix",
        action="store_true",
        help="the prefix-capacity family (exact peak planning) against the additive solve and brute force,"
        " over --n and --W (methods: prefix prefix-w2 additive brute)",
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="skip runs estimated longer than this (3; 600 with --paper or --targets; 60 with --quick)",
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=None,
        help="kill a call running longer than this and report a timeout (default: 3x --max-seconds, at least 10)",
    )
    parser.add_argument(
        "--max-memory-gb",
        type=float,
        default=None,
        help="refuse full DP tables above this (default: 1/4 of the available memory)",
    )
    parser.add_argument("--plot", default=None, help="write a time-vs-n*W plot (png)")
    parser.add_argument("--json", default=None, help="write every row as JSON")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads (1; 0: default)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


PAPER_FAMILIES = ("U", "W", "B", "C")
"""``--paper``: uncorrelated, weakly and strongly correlated, transformer-like."""
PAPER_METHODS = ("auto", "auto-dense", "hirschberg", "ilp", "torch-sliding", "torch-dp")
QUICK_METHODS = ("auto", "ilp")
"""``--paper --quick``: this solver and HiGHS only."""


def _check_names(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    paper = args.paper and not args.targets
    families = args.families or list(PAPER_FAMILIES if paper else FAMILIES)
    paper_methods = QUICK_METHODS if args.quick else PAPER_METHODS
    methods = args.methods or (list(paper_methods) if paper else [m for m in METHODS if m != "auto-dense"])
    args.families = [f for item in families for f in item.split(",") if f]
    args.methods = [m for item in methods for m in item.split(",") if m]
    for flag, names, allowed in (
        ("--families", args.families, KNOWN_FAMILIES),
        ("--methods", args.methods, METHODS),
    ):
        unknown = [name for name in names if name not in allowed]
        if unknown:
            parser.error(f"{flag} must be among {', '.join(allowed)}, got {', '.join(unknown)}")


def main(argv: list[str] | None = None) -> int:
    """``lightning-ckpt bench``: print the table (and the target verdicts) on stdout.

    Args:
        argv: the command's arguments (``--help`` lists them).

    Returns:
        0; 1 if a ``--targets`` target was missed; 2 for bad arguments.

    Raises:
        ValueError: for a ``--plot`` or ``--json`` path it cannot write (``lightning-ckpt`` prints
            it as one line, before the run).
    """
    parser = _parser()
    try:
        args = parser.parse_args(argv)
        _check_names(parser, args)
    except SystemExit as exit_request:
        return int(exit_request.code or 0)
    check_output_file("--plot", args.plot)  # before the run, not after it
    check_output_file("--json", args.json)
    if args.prefix:
        return _prefix_main(args)
    default_seconds = 60.0 if args.quick else 600.0 if args.targets or args.paper else 3.0
    options = BenchOptions(
        max_seconds=args.max_seconds or default_seconds,
        timeout_s=args.timeout_s,
        max_memory_gb=args.max_memory_gb,
        torch_threads=args.torch_threads,
        progress=not args.no_progress,
        repeat_budget_s=3.0 if args.targets else 0.25,  # targets: best of several calls, also for long ones
    )
    targets = _targets(args.paper) if args.targets else []
    if targets:
        report = run_jobs(_target_jobs(targets, args.seed), options)
    else:
        ns, capacities = ([], []) if args.paper else (args.n, args.W)  # --paper: its instances only
        report = run_grid(
            args.families, ns, capacities, args.methods, seed=args.seed, options=options, paper=args.paper
        )
    verdicts = [_verdict(t, report.rows) for t in targets]
    sys.stdout.write("\n".join([_header(report), "", format_table(report.rows), "", _footer(report)]) + "\n")
    if verdicts:
        sys.stdout.write("\n" + _format_verdicts(verdicts) + "\n")
    if args.plot:
        write_plot(report.rows, args.plot)
    if args.json:
        write_json(report, args.json, vars(args), verdicts)
    return 0 if all(v["passed"] for v in verdicts) else 1


def _prefix_main(args: argparse.Namespace) -> int:
    """``--prefix``: the family-P table (each call in a fresh process, killed past ``--max-seconds``)."""
    rows = run_prefix(args.n, args.W, PREFIX_METHODS, args.seed, args.max_seconds or 60.0)
    sys.stdout.write(format_prefix(rows) + "\n")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"arguments": vars(args), "rows": rows}, handle, indent=1)
    return 0 if all(r.get("fits", True) for r in rows) else 1
