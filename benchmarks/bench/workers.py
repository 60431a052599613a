"""``python -m benchmarks.bench.workers``: where a second solver process pays, idle and busy.

For each size, one instance that the exact O(W) path (Hirschberg) solves, timed with ``workers=1``
and ``workers=2`` forced (``parallel_min_solve_cells=0``: every size runs on two processes), and with
``workers=2`` as the library decides (``runtime.cpus``: the instance's cells and the idle CPUs it
measures). Calls alternate between the settings, ``--repeats`` times each, in this process with a
warm worker pool and loaded kernels; the median is printed with the ratio ``workers=1 / setting``
(above 1: faster than one process). Every answer is checked against the one-process answer.

``--busy K`` starts ``K`` spinning processes (pure Python loops) for the run: a shared machine.

Example:
    >>> weights, values, capacity = make_instance(10, 1_000, seed=0)
    >>> len(weights), capacity, bool(weights.max() < capacity // 20)
    (10, 1000, True)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np

from lightning_ckpt.solver import SolverOptions, solve_knapsack
from lightning_ckpt.solver.runtime import backend, cpus

__all__ = ["SIZES", "make_instance", "main"]

SIZES = (
    (200, 100_000),
    (400, 500_000),
    (500, 800_000),
    (700, 800_000),
    (1_000, 1_000_000),
    (2_000, 2_500_000),
)
"""``(items, capacity)`` per row: about 2e7, 2e8, 4e8, 5.6e8, 1e9 and 5e9 DP cells before the
reductions (4e8 and 5.6e8 lie either side of ``SolverOptions.parallel_min_solve_cells``)."""

FORCED = SolverOptions(parallel_min_solve_cells=0)  # workers on every size: where do they pay?
SETTINGS = (("workers=1", 1, FORCED), ("workers=2 forced", 2, FORCED), ("workers=2 decided", 2, None))


def make_instance(n_items: int, capacity: int, seed: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Weights of 0.5-5% of the capacity, values within 10% of them: few items settle early."""
    rng = np.random.default_rng(seed)
    weights = rng.integers(capacity // 200, capacity // 20, n_items)
    return weights, weights * rng.uniform(0.9, 1.1, n_items), capacity


@contextlib.contextmanager
def spinning(count: int) -> Iterator[None]:
    """``count`` processes that spin on a CPU until the block ends."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def _time_row(n_items: int, capacity: int, repeats: int) -> dict[str, list[float]]:
    weights, values, capacity = make_instance(n_items, capacity, seed=n_items)
    reference = solve_knapsack(weights, values, capacity, method="hirschberg", options=FORCED)
    times: dict[str, list[float]] = {name: [] for name, _, _ in SETTINGS}
    times["cells"] = [reference.stats.core_items * (reference.stats.core_capacity + 1)]
    times["used"] = []
    for _ in range(repeats):
        for name, workers, options in SETTINGS:
            started = time.perf_counter()
            result = solve_knapsack(
                weights, values, capacity, method="hirschberg", workers=workers, options=options
            )
            times[name].append(time.perf_counter() - started)
            if result != reference:
                raise AssertionError(f"{name} gave another answer at n={n_items}, W={capacity}")
            if name == "workers=2 decided":
                times["used"].append(result.stats.workers_used)
    return times


def _format(rows: list[tuple[int, int, dict[str, list[float]]]]) -> str:
    header = "| items | W | core cells | workers=1 s | workers=2 forced s | ratio | decided s | ratio | decided used |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for n_items, capacity, t in rows:
        one, forced, decided = (statistics.median(t[name]) for name, _, _ in SETTINGS)
        used = "/".join(str(u) for u in t["used"])
        lines.append(
            f"| {n_items} | {capacity:.2g} | {t['cells'][0]:.2e} | {one:.3f} | {forced:.3f} | {one / forced:.2f} "
            f"| {decided:.3f} | {one / decided:.2f} | {used} |"
        )
    return "\n".join(lines)


def _machine() -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",) * 3
    return (
        f"{cpus.usable_cpus()} usable CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
        f"{cpus.idle_cpus():.2f} idle CPUs measured now, kernel {backend.KERNEL}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="calls per setting and size (median)")
    parser.add_argument("--busy", type=int, default=0, help="spinning processes beside the run")
    parser.add_argument("--max-items", type=int, default=2_000, help="skip larger sizes")
    args = parser.parse_args(argv)
    backend.load_numba()
    solve_knapsack(*make_instance(50, 10_000, seed=1), method="hirschberg", workers=2, options=FORCED)
    with spinning(args.busy):
        time.sleep(0.5 if args.busy else 0)  # let the spinners show in the load
        print(f"machine: {_machine()}; --busy {args.busy}", flush=True)
        rows = [(n, w, _time_row(n, w, args.repeats)) for n, w in SIZES if n <= args.max_items]
    print(_format(rows))


if __name__ == "__main__":
    main()
