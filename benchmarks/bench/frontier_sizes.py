"""``python -m benchmarks.bench.frontier_sizes``: how large the capped engine's sparse frontier grows on plans.

A capped solve (``solve_knapsack(..., prefix_capacities=...)``, ``method="auto"``) runs the sparse
frontier DP first and hands over to the dense capped Hirschberg past
``lightning_ckpt.solver.capped.solve.SPARSE_MAX_ENTRIES`` frontier entries (all passes together).
This command records every capped solve of

- the offline planner (``plan_offline``, what ``python -m lightning_ckpt.cli plan --config C
  --budget-gb B`` runs) on each config, at budgets between the minimum it reports and the unchecked
  peak (fractions of that span);
- the instances of ``benchmarks.bench.fresh`` (GPT-like blocks, family P, and the planner's own
  instance of a profiled stack of mixed widths at three budgets) at the given sizes,

and prints, per solve, the items, the capacity (after the weights' common divisor), the path that
answered, its frontier entries (DP cells where the dense path ran) against the handover, and the
time; then the largest frontier seen and how often the dense path ran. Where the dense path ran, the
frontier is also counted up to 16 times the handover (not timed).

Example::

    python -m benchmarks.bench.frontier_sizes --configs configs/gpt-cpu.yaml --kinds P --n 200
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from unittest import mock

__all__ = ["Solve", "format_row", "main", "recorded"]

FRACTIONS = (0.05, 0.25, 0.5, 0.75, 0.95)
"""Default budgets: these fractions of the way from the minimum budget to the unchecked peak."""


@dataclass(frozen=True)
class Solve:
    """One capped solve: where it came from, its size, the path that answered and its work."""

    source: str
    items: int
    capacity: int
    path: str
    entries: int
    """Frontier entries (``path == "frontier"``), DP cells (``"dense"``, ``"hirschberg"``) or states
    (``"sparse"``: caps that bind nowhere, solved as one run without caps)."""
    seconds: float
    frontier_entries: int | None = None
    """Where the dense path ran: the frontier's entries counted further (None past 16x the handover)."""


def format_row(solve: Solve, handover: int) -> str:
    """One line of the table.

    Example:
        >>> print(format_row(Solve("P n=200", 200, 140_000_000, "frontier", 41_000, 0.0021), 1 << 22))
        P n=200                              200    140000000  frontier      41000  0.978%     2.10
    """
    share = f"{solve.entries / handover:.3%}" if solve.path == "frontier" else solve.path[:7]
    return (
        f"{solve.source:<34} {solve.items:>6} {solve.capacity:>12}  {solve.path:<9} {solve.entries:>9}"
        f" {share:>7} {solve.seconds * 1e3:>8.2f}"
    )


@contextlib.contextmanager
def recorded(source: list[str], show=None) -> Iterator[list[Solve]]:
    """Record every capped solve made inside (``source[0]`` names where it came from); ``show`` is
    called with each as it is recorded."""
    from lightning_ckpt.solver import api
    from lightning_ckpt.solver.capped import solve as capped

    real, solves = capped.solve_capped, []

    def solve_capped(weights, values, capacity, take=None, skip=None, **kwargs):
        start = time.perf_counter()
        answer = real(weights, values, capacity, take, skip, **kwargs)
        seconds = time.perf_counter() - start
        if take is None:  # a solve without caps (the one engine runs those too): not a capped solve
            return answer
        further = None
        if answer.path == "dense" and kwargs.get("sparse_first"):
            from lightning_ckpt.solver.capped.frontier import solve_sparse

            sparse = solve_sparse(
                *_divided(weights, values, capacity, take, skip), 16 * capped.SPARSE_MAX_ENTRIES
            )
            further = None if sparse is None else sparse[1]
        solves.append(
            Solve(source[0], len(weights), answer.core_capacity, answer.path, answer.cells, seconds, further)
        )
        if show is not None:
            show(solves[-1])
        return answer

    with mock.patch.object(api, "solve_capped", solve_capped):
        yield solves


def _divided(weights, values, capacity, take, skip):
    from lightning_ckpt.solver.capped.groups import divided, from_items

    return divided(from_items(weights, values, take, skip), capacity)


def _config_solves(path: str, fractions: list[float], source: list[str], solves: list[Solve]) -> None:
    """Plan the config offline at each budget (its capped solves are recorded into ``solves``)."""
    from lightning_ckpt.offline.plan import plan_offline
    from lightning_ckpt.planning import BudgetTooSmallError

    source[0] = f"{path} (bounds)"
    try:
        plan_offline(path, budget_gb=1e-9)
        raise AssertionError("a budget of one byte was enough")
    except BudgetTooSmallError as error:
        minimum = error.minimum_bytes
    unchecked = plan_offline(path, budget_gb=1e9).plan.predicted_peak_bytes  # all kept
    print(f"# {path}: minimum {minimum / 1e9:.4f} GB, unchecked peak {unchecked / 1e9:.4f} GB", flush=True)
    for fraction in fractions:
        budget_gb = (minimum + fraction * (unchecked - minimum)) / 1e9
        source[0] = f"{path} @{budget_gb:.4g} GB"
        before = len(solves)
        solver = plan_offline(path, budget_gb=budget_gb).plan.solver_method
        print(f"#   fraction {fraction:g}: {solver}, {len(solves) - before} capped solve(s)", flush=True)


def _instance_solves(kind: str, n: int, source: list[str]) -> None:
    from benchmarks.bench.fresh import instance
    from lightning_ckpt.solver import solve_knapsack

    weights, values, capacity, take, skip = instance(kind, n)
    source[0] = f"{kind} n={n}"
    solve_knapsack(weights, values, capacity, prefix_capacities=take, skip_capacities=skip)


def main(argv: list[str] | None = None) -> int:
    from benchmarks.bench.fresh import KINDS

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench.frontier_sizes", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--configs", nargs="*", default=sorted(glob.glob("configs/*.yaml")), help="YAML configs"
    )
    parser.add_argument(
        "--fractions", nargs="+", type=float, default=list(FRACTIONS), help="budget fractions"
    )
    parser.add_argument("--kinds", nargs="*", default=list(KINDS), help=f"among {' '.join(KINDS)}")
    parser.add_argument("--n", nargs="+", type=int, default=[200, 500, 1000, 2000], help="item counts")
    args = parser.parse_args(argv)

    from lightning_ckpt.solver.capped.solve import SPARSE_MAX_ENTRIES

    source = [""]
    print(f"# handover to the dense capped path past {SPARSE_MAX_ENTRIES} frontier entries")
    print(f"{'source':<34} {'items':>6} {'capacity':>12}  {'path':<9} {'entries':>9} {'share':>7} {'ms':>8}")
    with recorded(
        source, show=lambda solve: print(format_row(solve, SPARSE_MAX_ENTRIES), flush=True)
    ) as solves:
        for path in args.configs:
            _config_solves(path, args.fractions, source, solves)
        for kind in args.kinds:
            for n in args.n:
                _instance_solves(kind, n, source)
    frontier = [s.entries for s in solves if s.path == "frontier"]
    dense = [s for s in solves if s.path == "dense"]
    largest = max(frontier, default=0)
    print(
        f"# {len(solves)} capped solves: largest frontier {largest} entries "
        f"({largest / SPARSE_MAX_ENTRIES:.2%} of the handover); the dense path ran {len(dense)} times"
    )
    for solve in dense:
        print(
            f"#   dense: {solve.source}, frontier entries {solve.frontier_entries or 'over 16x the handover'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
