"""Run by tests/test_solver_faults.py: a long solve for the test to interrupt or kill.

Usage: python tests/solver_fault_script.py WORKERS, or ``ilp`` for a long ``method="ilp"`` solve, or
``capped`` for a long dense solve with prefix capacities (one kernel call of several seconds), or
``small-shm`` for a parallel solve under a tiny /dev/shm (prints ``exact`` and the size of /dev/shm). Prints ``ready PID...`` (the worker
processes' ids) just before a solve of several seconds, then, if that solve is interrupted,
``interrupted`` (or ``died`` and the error, where a worker was killed or stopped), and ``exact`` once three later solves on ``WORKERS`` processes have matched
the one-process answer (and ``stale PID...`` if a worker from before the interrupt survived).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]
from lightning_ckpt.solver import SolverOptions, solve_knapsack  # noqa: E402
from lightning_ckpt.solver.runtime import backend  # noqa: E402
from lightning_ckpt.solver.runtime import workers as solver_workers  # noqa: E402

# workers on small solves too, and no sparse try (it would answer them in this process)
EAGER = SolverOptions(parallel_min_solve_cells=0, parallel_min_task_cells=0, sparse_max_states=0)
# the long solve: Hirschberg (the sparse states would finish it at once), on the workers even when
# the machine's CPUs are busy
DENSE = SolverOptions(sparse_max_states=0, parallel_min_solve_cells=0)


def instance(n_items: int, capacity: int, seed: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Weights of 0.5-5% of the capacity, values within 10% of them: few items settle early."""
    rng = np.random.default_rng(seed)
    weights = rng.integers(capacity // 200, capacity // 20, n_items)
    return weights, weights * rng.uniform(0.9, 1.1, n_items), capacity


def main() -> None:
    if sys.argv[1] == "ilp":
        return ilp()
    if sys.argv[1] == "small-shm":
        return small_shm()
    if sys.argv[1] == "capped":
        return capped()
    workers = int(sys.argv[1])
    small = instance(300, 30_000, seed=1)
    reference = solve_knapsack(*small)
    solve_knapsack(*small, workers=workers, options=EAGER)  # workers started
    backend.load_numba()  # kernel loaded: a Ctrl-C waits for no import (small solves stay on numpy)
    before = solver_workers.live_worker_pids()
    print("ready", *before, flush=True)
    try:
        solve_knapsack(*instance(4000, 8_000_000, seed=2), workers=workers, options=DENSE)
        print("finished", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    except solver_workers.WorkerDied as exc:
        print("died", exc, flush=True)
    for _ in range(3):
        result = solve_knapsack(*small, workers=workers, options=EAGER)
        if result != reference or result.stats.workers_used != workers:
            print("inexact", result.value, reference.value, flush=True)
            return
    stale = set(before) & set(solver_workers.live_worker_pids())
    print("exact" if not stale else f"stale {sorted(stale)}", flush=True)


def small_shm() -> None:
    """A ``workers=2`` solve whose 48 MB arena is far above the size of this process's /dev/shm."""
    weights, values, capacity = instance(200, 2_000_000, seed=5)
    alone = solve_knapsack(weights, values, capacity)
    shared = solve_knapsack(weights, values, capacity, workers=2, options=EAGER)
    exact = shared == alone and shared.stats.workers_used == 2
    print("exact" if exact else "inexact", shutil.disk_usage("/dev/shm").total, flush=True)


def capped() -> None:
    """The dense capped Hirschberg: its first two profiles are single kernel calls of 1e10 cells."""
    weights, values, capacity = instance(2000, 8_000_000, seed=6)
    caps = {"prefix_capacities": capacity - weights, "skip_capacities": capacity - 2 * weights}
    small = instance(40, 3_000, seed=7)
    small_caps = {"prefix_capacities": small[2] - small[0], "method": "hirschberg"}
    reference = solve_knapsack(*small, prefix_capacities=small_caps["prefix_capacities"])
    solve_knapsack(*small, **small_caps)
    backend.load_numba()  # the kernels loaded
    print("ready", flush=True)
    try:
        solve_knapsack(weights, values, capacity, method="hirschberg", **caps)
        print("finished", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    print("exact" if solve_knapsack(*small, **small_caps).value == reference.value else "inexact", flush=True)


def ilp() -> None:
    """A MILP that takes far longer than the test waits (scipy's HiGHS, stopped only by its limit)."""
    weights, values, capacity = instance(300, 10_000_000, seed=3)
    weights = weights + 100_000
    values = weights + np.random.default_rng(4).uniform(0, 1000, 300)  # near-equal ratios: hard
    print("ready", flush=True)
    try:
        solve_knapsack(weights, values, capacity, method="ilp", options=SolverOptions(ilp_time_limit_s=30))
        print("finished", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    except TimeoutError:
        print("timed out", flush=True)
    print(
        "exact" if solve_knapsack([2, 3], [3.0, 4.0], 4, method="ilp").chosen == (1,) else "inexact",
        flush=True,
    )


if __name__ == "__main__":
    main()
