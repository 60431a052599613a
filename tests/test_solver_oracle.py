"""Exact methods against a brute-force oracle, against each other, and across workers."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.bench.generators import FAMILIES, make_instance
from lightning_ckpt.solver import SolverOptions, solve_knapsack
from lightning_ckpt.solver.dense import hirschberg
from lightning_ckpt.solver.dense.profile import cell_updates

EXACT = ("auto", "hirschberg", "dp")


def brute_force_value(weights: np.ndarray, values: np.ndarray, capacity: int) -> float:
    n = len(weights)
    masks = ((np.arange(2**n)[:, None] >> np.arange(n)) & 1).astype(bool)
    feasible = masks @ weights <= capacity
    return float((masks @ values)[feasible].max())


def random_small_instances(family: str, count: int, seed: int):
    rng = np.random.default_rng(seed)
    for i in range(count):
        n = int(rng.integers(0, 11))
        capacity = int(rng.integers(0, 80))
        weights, values, _ = make_instance(family, n, capacity, seed=seed * 10_000 + i, noise=0.01 * (i % 2))
        if i % 5 == 0 and n:  # sprinkle zero weights and zero values
            weights[rng.integers(0, n)] = 0
            values[rng.integers(0, n)] = 0.0
        yield weights, values, capacity


def assert_optimal(result, weights, values, capacity, optimum):
    assert result.weight <= capacity
    assert result.weight == int(weights[list(result.chosen)].sum())
    assert sorted(result.chosen + result.rejected) == list(range(len(weights)))
    assert result.value == pytest.approx(optimum, rel=1e-9, abs=1e-12)


@pytest.fixture(params=["leaves", "forced splits"])
def split_mode(request) -> SolverOptions:
    """Options to run once with the default leaf rule and once with one-item leaves (deep Hirschberg)."""
    return SolverOptions(leaf_max_cells=0) if request.param == "forced splits" else SolverOptions()


@pytest.mark.parametrize("family", FAMILIES)
def test_exact_methods_match_brute_force(family, split_mode):
    for weights, values, capacity in random_small_instances(family, 400, seed=FAMILIES.index(family)):
        optimum = brute_force_value(weights, values, capacity)
        for method in EXACT:
            result = solve_knapsack(weights, values, capacity, method=method, options=split_mode)
            assert_optimal(result, weights, values, capacity, optimum)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("n_items, capacity", [(40, 3_000), (120, 20_000)])
def test_exact_methods_agree_on_medium_instances(family, n_items, capacity, split_mode):
    weights, values, capacity = make_instance(family, n_items, capacity, seed=n_items)
    results = {
        m: solve_knapsack(weights, values, capacity, method=m, options=split_mode) for m in (*EXACT, "ilp")
    }
    reference = results["dp"].value
    for method, result in results.items():
        assert result.weight <= capacity, method
        assert result.value == pytest.approx(reference, rel=1e-9), method
    greedy = solve_knapsack(weights, values, capacity, method="greedy")
    assert greedy.weight <= capacity and greedy.value <= reference * (1 + 1e-12)


def test_workers_two_equals_workers_one():
    options = SolverOptions(
        parallel_min_solve_cells=0, parallel_min_task_cells=0, leaf_max_cells=20_000, sparse_max_states=0
    )
    for family in FAMILIES:
        weights, values, capacity = make_instance(family, 60, 5_000, seed=7)
        for method in ("auto", "hirschberg"):
            single = solve_knapsack(weights, values, capacity, method=method, workers=1, options=options)
            double = solve_knapsack(weights, values, capacity, method=method, workers=2, options=options)
            assert double.stats.workers_used == 2 or double.stats.core_items == 0
            assert single.stats.workers_used == 1
            assert double == single
            assert double.stats.cell_updates == single.stats.cell_updates  # the same splits


@pytest.mark.parametrize("family", FAMILIES)
def test_checkpoints_change_the_work_not_the_answer(family):
    """Warm segments (left half copied from a checkpoint) give the same set with fewer updates,
    also when the checkpoint room is too small for all of them."""
    weights, values, capacity = make_instance(family, 80, 4_000, seed=3)
    runs = {}
    for share in (1.0, 0.3, 0.0):
        options = SolverOptions(leaf_max_cells=2_000, checkpoint_share=share)
        runs[share] = solve_knapsack(weights, values, capacity, method="hirschberg", options=options)
    assert runs[1.0] == runs[0.3] == runs[0.0]
    cells = [runs[share].stats.cell_updates for share in (1.0, 0.3, 0.0)]
    assert cells[0] < cells[1] < cells[2]


def test_split_point_balances_the_two_passes():
    rng = np.random.default_rng(5)
    for _ in range(200):
        n, capacity = int(rng.integers(2, 30)), int(rng.integers(1, 500))
        weights = np.sort(rng.integers(1, 60, n))
        lo, hi = sorted(int(x) for x in rng.choice(n + 1, 2, replace=False))
        if hi - lo < 2:
            continue
        mid = hirschberg.split_point(weights, lo, hi, capacity)
        worst = {
            m: max(cell_updates(weights[lo:m], capacity), cell_updates(weights[m:hi], capacity))
            for m in range(lo + 1, hi)
        }
        assert lo < mid < hi
        assert worst[mid] == min(worst.values())
