"""The knapsack with prefix capacities against a brute-force oracle, on every path and across workers."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_ckpt.solver import SolverOptions, solve_knapsack
from lightning_ckpt.solver.capped import frontier
from lightning_ckpt.solver.capped import profile as capped_profile
from lightning_ckpt.solver.capped import solve as capped
from lightning_ckpt.solver.capped.groups import from_items
from lightning_ckpt.solver.capped.hirschberg import CappedTask
from lightning_ckpt.solver.runtime import backend, interrupt
from tests.test_solver_api import _run_python


def brute_force_value(weights, values, capacity, take, skip) -> float:
    """The best value over every subset that meets every cap."""
    n = len(weights)
    masks = ((np.arange(2**n)[:, None] >> np.arange(n)) & 1).astype(bool)
    chosen_weights = masks * np.asarray(weights)
    before = np.cumsum(chosen_weights, axis=1) - chosen_weights
    meets = np.where(masks, before <= take, before <= skip).all(axis=1)
    feasible = meets & (chosen_weights.sum(axis=1) <= capacity)
    return float((masks @ values)[feasible].max())


def random_capped_instances(count: int, seed: int, max_items: int = 8):
    """Small instances with random caps: loose, tight and absent, taking and skipping apart."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        n = int(rng.integers(1, max_items + 1))
        capacity = int(rng.integers(0, 40))
        weights = rng.integers(0 if i % 7 == 0 else 1, 12, n) * (1 + (i % 3 == 0))  # some common divisors
        values = rng.uniform(0.0, 10.0, n).round(int(rng.integers(0, 3)))  # ties when rounded
        take = rng.integers(0, capacity + 3, n)
        skip = np.where(rng.random(n) < 0.5, take, rng.integers(0, capacity + 3, n))
        yield weights, values, capacity, take, skip


def assert_optimal(result, weights, values, capacity, take, skip):
    chosen = np.zeros(len(weights), dtype=bool)
    chosen[list(result.chosen)] = True
    assert capped.cap_violation(np.asarray(weights), chosen, capacity, take, skip) is None
    assert result.weight == int(np.asarray(weights)[chosen].sum()) <= capacity
    optimum = brute_force_value(weights, values, capacity, take, skip)
    assert result.value == pytest.approx(optimum, rel=1e-9, abs=1e-12)


@pytest.fixture(params=["sparse", "sparse pruned", "dense leaves", "dense splits", "dense compiled"])
def path(request, monkeypatch) -> SolverOptions:
    """Run on the sparse frontier (with falling targets, or one pass as at these sizes), on dense
    leaves, on dense one-item Hirschberg splits, and on dense splits with the numba kernels however
    small the call."""
    if request.param == "sparse pruned":  # falling targets, item fixing and pruning even when small
        monkeypatch.setattr(frontier, "FEW_ITEMS", 0)
    elif request.param != "sparse":
        monkeypatch.setattr(capped, "SPARSE_MAX_ENTRIES", 0)
    if request.param == "dense compiled":
        pytest.importorskip("numba")
        monkeypatch.setattr(backend, "NUMBA_LOAD_S", 0.0)
    splits = request.param in ("dense splits", "dense compiled")
    return SolverOptions(leaf_max_cells=0) if splits else SolverOptions()


def test_capped_matches_brute_force(path):
    for weights, values, capacity, take, skip in random_capped_instances(1000, seed=13):
        result = solve_knapsack(
            weights, values, capacity, prefix_capacities=take, skip_capacities=skip, options=path
        )
        assert_optimal(result, weights, values, capacity, take, skip)


def test_nested_caps_of_a_chain_match_brute_force(path):
    """Caps that grow along the items, as a plan's backward makes them (prefix caps only)."""
    rng = np.random.default_rng(5)
    for _ in range(300):
        n = int(rng.integers(1, 10))
        weights, values = rng.integers(1, 9, n), rng.uniform(0.1, 5.0, n)
        take = np.sort(rng.integers(0, 30, n))
        capacity = int(take[-1] + rng.integers(0, 8))
        result = solve_knapsack(weights, values, capacity, prefix_capacities=take, options=path)
        assert_optimal(result, weights, values, capacity, take, take)


def test_without_binding_caps_equals_plain_knapsack():
    rng = np.random.default_rng(3)
    for _ in range(50):
        weights, values = rng.integers(1, 30, 12), rng.uniform(0.0, 5.0, 12)
        plain = solve_knapsack(weights, values, 60)
        loose = solve_knapsack(weights, values, 60, prefix_capacities=[60] * 12)
        assert loose.value == pytest.approx(plain.value, rel=1e-12)


def test_workers_two_equals_workers_one_with_caps(monkeypatch):
    """Forces the worker processes: dense path, one-item splits, no size thresholds."""
    monkeypatch.setattr(capped, "SPARSE_MAX_ENTRIES", 0)
    options = SolverOptions(parallel_min_solve_cells=0, parallel_min_task_cells=0, leaf_max_cells=50)
    rng = np.random.default_rng(11)
    for _ in range(4):
        n, capacity = 40, 400
        weights, values = rng.integers(1, 40, n), rng.uniform(0.0, 10.0, n)
        take = np.sort(rng.integers(0, capacity, n))
        skip = np.minimum(take, rng.integers(0, capacity, n))
        args = (weights, values, capacity)
        caps = {"prefix_capacities": take, "skip_capacities": skip, "options": options}
        single = solve_knapsack(*args, workers=1, **caps)
        double = solve_knapsack(*args, workers=2, **caps)
        assert single.stats.workers_used == 1 and double.stats.workers_used == 2
        assert double == single
        dense_value = single.value
        monkeypatch.setattr(capped, "SPARSE_MAX_ENTRIES", 1 << 18)
        assert solve_knapsack(*args, prefix_capacities=take, skip_capacities=skip).value == pytest.approx(
            dense_value, rel=1e-12
        )
        monkeypatch.setattr(capped, "SPARSE_MAX_ENTRIES", 0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"prefix_capacities": [1, 2]}, r"`prefix_capacities` must have one entry per item \(3\), got 2"),
        ({"skip_capacities": [1, 2, 3, 4]}, r"`skip_capacities` must have one entry per item \(3\), got 4"),
        ({"prefix_capacities": [1, -1, 2]}, r"`prefix_capacities` must contain only integral numbers"),
        ({"skip_capacities": [1, 2.5, 2]}, r"`skip_capacities` must contain only integral numbers .* 2.5"),
        ({"prefix_capacities": "abc"}, r"`prefix_capacities` must be a sequence"),
        ({"prefix_capacities": [1, 1, 1], "method": "dp"}, r"`method` must be one of 'auto', 'hirschberg'"),
        ({"skip_capacities": [1, 1, 1], "method": "greedy"}, r"with prefix capacities, got 'greedy'"),
    ],
)
def test_bad_caps_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        solve_knapsack([1, 2, 3], [1.0, 1.0, 1.0], 5, **kwargs)


def test_stats_and_empty_instance():
    empty = solve_knapsack([], [], 5, prefix_capacities=[])
    assert empty.chosen == () and empty.value == 0.0
    result = solve_knapsack([4, 4, 4], [1.0, 2.0, 3.0], 8, prefix_capacities=[8, 8, 4])
    assert (
        result.chosen == (1, 2) and result.stats.items == 3
    )  # item 0 would leave 4 before item 2 and result.stats.workers_used == 1


def test_compiled_kernels_match_numpy():
    numba_kernels = pytest.importorskip("lightning_ckpt.solver.capped._kernels_numba")
    rng = np.random.default_rng(2)
    for i in range(300):
        wide = i % 3 == 0  # many blocks of a few cells, caps binding inside them
        n, size = int(rng.integers(1, 7)), int(rng.integers(1, 500 if wide else 30))
        weights, values = rng.integers(0, size if wide else 10, n), rng.uniform(0, 5, n).round(1)
        take, skip = rng.integers(-2, size + 2, n), rng.integers(-1, size + 2, n)
        arrays = capped_profile._as_arrays(weights, values, take, skip)
        for name in ("forward", "backward"):
            ours, twin = np.zeros(size), np.zeros(size)
            getattr(capped_profile, name)(*arrays, ours)  # small: the numpy version
            getattr(numba_kernels, name)(*arrays, twin, interrupt.new_stop_flag())
            np.testing.assert_array_equal(ours, twin)
        took = np.zeros((n, size), dtype=bool)
        numba_kernels.fill_leaf(*arrays, np.zeros(size), took, interrupt.new_stop_flag())
        mask = capped_profile.backtrack(weights, take, skip, took, size - 1)
        assert np.array_equal(mask, capped_profile.solve_leaf(*arrays, np.zeros(size)))


def test_small_solves_do_not_load_numba():
    """A plan-sized instance (200 items of a few sizes, W ~ 1e8) in a fresh process stays in numpy."""
    code = (
        "import sys, numpy as np; from lightning_ckpt.solver import solve_knapsack; "
        "w = np.tile([3_078_912, 1_000_448, 524_288, 2_000_000], 50); caps = np.cumsum(w)[::-1] // 3; "
        "r = solve_knapsack(w, np.linspace(1, 2, 200), 90_000_000, prefix_capacities=caps); "
        "print(r.weight <= 90_000_000, 'numba' in sys.modules)"
    )
    assert _run_python(code) == "True False"


def test_hirschberg_is_dense_auto_tries_the_frontier_first():
    weights, values = [6, 9, 12, 6], [1.0, 2.0, 2.5, 1.0]
    caps = {"prefix_capacities": [30, 30, 12, 30], "skip_capacities": [30, 6, 30, 30]}
    auto = solve_knapsack(weights, values, 30, **caps)
    dense = solve_knapsack(weights, values, 30, method="hirschberg", **caps)
    assert auto.value == dense.value == 5.5 and dense.method == "hirschberg"
    assert auto.stats.core_capacity == dense.stats.core_capacity == 10  # divided by the gcd 3
    assert dense.stats.cell_updates > 0


def test_pruned_frontier_equals_the_dense_solve_on_a_heterogeneous_stack():
    from benchmarks.bench.prefix import make_prefix_instance

    p = make_prefix_instance(120, 20_000, seed=2)
    caps = {"prefix_capacities": p.take, "skip_capacities": p.skip}
    sparse = solve_knapsack(p.weights, p.values, 20_000, **caps)
    dense = solve_knapsack(p.weights, p.values, 20_000, method="hirschberg", **caps)
    assert sparse.stats.cell_updates < dense.stats.cell_updates  # the frontier did it
    assert sparse.value == pytest.approx(dense.value, rel=1e-12)


@pytest.mark.parametrize("compiled", [False, True], ids=["numpy", "numba"])
def test_capped_kernels_stop_before_the_next_item_once_flagged(monkeypatch, compiled):
    """A raised stop flag leaves every profile untouched (the kernels check it before each item),
    and a task then raises ``SolveStopped``."""
    if compiled:
        pytest.importorskip("numba")
        monkeypatch.setattr(backend, "NUMBA_LOAD_S", 0.0)
    stop = interrupt.new_stop_flag()
    stop[0] = 1
    weights, values = np.array([2, 3, 1]), np.array([1.0, 2.0, 0.5])
    caps = (np.array([9, 9, 9]), np.array([9, 9, 9]))
    for kernel in (capped_profile.forward, capped_profile.backward):
        profile = np.full(10, 7.0)
        kernel(weights, values, *caps, profile, stop)
        assert (profile == 7.0).all()
        kernel(weights, values, *caps, profile)  # without the flag it runs
        assert not (profile == 7.0).all()
    groups = from_items(weights, values, *caps)
    task = CappedTask("leaf", 0, 3, 9, 0, groups.starts, groups.caps, True)
    with pytest.raises(interrupt.SolveStopped):
        task.run(groups.weights, groups.values, np.zeros(10), stop)


def test_caps_that_bind_nowhere_are_found_exactly_and_solved_as_one_run():
    """``run.caps_bind`` is False only when every set within the capacity meets every cap (brute force,
    at both of its sizes: the Python loop under 16 items, numpy from 16); such caps are then solved as
    the run without caps, for both methods, with the brute-force and the uncapped answers' value."""
    from lightning_ckpt.solver.capped.run import caps_bind

    rng, unbound = np.random.default_rng(23), 0
    for i in range(300):
        n = int(rng.integers(1, 9)) if i % 4 else 16
        weights, capacity = rng.integers(1, 8, n), int(rng.integers(1, 30))
        before = np.cumsum(weights) - weights
        slack = rng.integers(-1, 3, (2, n)) * (rng.random((2, n)) < 0.2)  # now and then a unit short
        take = np.maximum(np.minimum(before, capacity - weights) + slack[0], 0)
        skip = np.maximum(np.minimum(before, capacity) + slack[1], 0)
        masks = ((np.arange(2**n)[:, None] >> np.arange(n)) & 1).astype(bool)
        chosen = masks * weights
        prefix = np.cumsum(chosen, axis=1) - chosen
        fits = chosen.sum(axis=1) <= capacity
        broken = (fits & ~np.where(masks, prefix <= take, prefix <= skip).all(axis=1)).any()
        if caps_bind(weights, capacity, take, skip):
            continue
        unbound += 1
        assert not broken, (weights, capacity, take, skip)
        values = rng.uniform(0, 5, n)
        plain = solve_knapsack(weights, values, capacity)
        best = brute_force_value(weights, values, capacity, take, skip)
        for method in ("auto", "hirschberg"):
            caps = {"prefix_capacities": take, "skip_capacities": skip, "method": method}
            run = solve_knapsack(weights, values, capacity, **caps)
            assert run.stats.path in ("reductions", "sparse", "hirschberg")
            assert run.value == pytest.approx(plain.value, rel=1e-12)
            assert run.value == pytest.approx(best, rel=1e-12)
    assert 30 < unbound < 270  # both answers of caps_bind came up
