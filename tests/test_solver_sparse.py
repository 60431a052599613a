"""The sparse states of the uncapped engine (``solver/sparse/``): brute force, HiGHS, the dense path."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_ckpt.solver import SolverOptions, solve_knapsack
from lightning_ckpt.solver.sparse.minknap import solve_minknap
from lightning_ckpt.solver.sparse.pareto import merge
from tests.test_solver_oracle import assert_optimal, brute_force_value

KINDS = ("uncorrelated", "weakly correlated", "strongly correlated")
DENSE = SolverOptions(sparse_max_states=0)


def pisinger_instance(kind: str, n: int, top: int, rng: np.random.Generator):
    """Weights uniform in ``[1, top]`` and values as in Pisinger's three classic families."""
    weights = rng.integers(1, top + 1, n).astype(np.int64)
    if kind == "uncorrelated":
        values = rng.uniform(1, top, n)
    elif kind == "weakly correlated":
        values = np.maximum(1.0, weights + rng.uniform(-top / 10, top / 10, n))
    else:
        values = weights + top / 10
    return weights, values


@pytest.mark.parametrize("kind", KINDS)
def test_minknap_matches_brute_force(kind):
    rng = np.random.default_rng(KINDS.index(kind))
    for i in range(300):
        n = int(rng.integers(1, 12))
        weights, values = pisinger_instance(kind, n, int(rng.integers(1, 40)), rng)
        if i % 3 == 0:
            values = np.round(values)  # ties
        capacity = int(rng.integers(0, weights.sum() + 2))
        chosen, states = solve_minknap(weights, values, capacity, max_states=10**6)
        assert int(weights[chosen].sum()) <= capacity and states >= 0
        assert float(values[chosen].sum()) == pytest.approx(
            brute_force_value(weights, values, capacity), rel=1e-12
        )


def test_minknap_never_exceeds_the_capacity_where_pytorch_did():
    chosen, _ = solve_minknap(np.array([1, 1, 1]), np.array([1.0, 1.0, 1.0]), 1, max_states=100)
    assert chosen.sum() == 1


HIGHS_CASES = [(kind, 200, 200_000) for kind in KINDS] + [(kind, 400, 3_000_000) for kind in KINDS[:2]]
"""(HiGHS proves no optimum within a minute on strongly correlated items at n = 400, W = 3e6.)"""


@pytest.mark.parametrize("kind, n, capacity", HIGHS_CASES)
def test_auto_matches_highs_with_zero_gap(kind, n, capacity):
    pytest.importorskip("scipy")
    rng = np.random.default_rng(n)
    weights, values = pisinger_instance(kind, n, 4 * capacity // n, rng)
    result = solve_knapsack(weights, values, capacity)
    reference = solve_knapsack(weights, values, capacity, method="ilp")
    assert result.weight <= capacity
    assert result.value == pytest.approx(reference.value, rel=1e-9)
    if kind != "strongly correlated":  # those outgrow the state bound at this capacity, or not
        assert result.stats.path == "sparse"


@pytest.mark.parametrize("kind", KINDS)
def test_sparse_and_dense_paths_give_the_same_value(kind):
    rng = np.random.default_rng(7)
    for _ in range(5):
        weights, values = pisinger_instance(kind, 60, 300, rng)
        capacity = int(weights.sum() // 2)
        sparse = solve_knapsack(weights, values, capacity)
        dense = solve_knapsack(weights, values, capacity, options=DENSE)
        assert dense.stats.path in ("hirschberg", "reductions")
        assert_optimal(sparse, weights, values, capacity, dense.value)


def test_past_the_state_bound_hirschberg_takes_over():
    rng = np.random.default_rng(3)
    weights, values = pisinger_instance("strongly correlated", 80, 1000, rng)
    capacity = int(weights.sum() // 2)
    assert solve_minknap(weights, values, capacity, max_states=50) is None
    few = solve_knapsack(weights, values, capacity, options=SolverOptions(sparse_max_states=50))
    assert few.stats.path == "hirschberg" and few.stats.cell_updates > 0
    assert few.value == pytest.approx(solve_knapsack(weights, values, capacity, method="ilp").value, rel=1e-9)


def test_the_state_bound_follows_the_capacity():
    """At most one state per capacity unit and item: never more memory than the dense path."""
    weights, values = np.array([3] * 20), np.arange(20, dtype=float) + 3.0
    result = solve_knapsack(weights + np.arange(20), values, 30)
    assert result.stats.path in ("sparse", "hirschberg")
    if result.stats.path == "sparse":
        assert result.stats.cell_updates <= result.stats.core_capacity + result.stats.core_items


def test_merge_keeps_the_undominated_states_and_their_sources():
    w, v, source = merge(
        np.array([0, 4]), np.array([0.0, 5.0]), np.array([2, 4, 6]), np.array([1.0, 5.0, 4.0])
    )
    assert (w.tolist(), v.tolist(), source.tolist()) == ([0, 2, 4], [0.0, 1.0, 5.0], [0, 2, 1])


def test_sparse_states_import_no_engine():
    """``solver/sparse/`` stands on numpy alone: both engines share it, it imports neither of them."""
    import ast
    from pathlib import Path

    import lightning_ckpt.solver.sparse as room

    for path in Path(room.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        inside = [m for m in names if m.startswith("lightning_ckpt")]
        assert all(m.startswith("lightning_ckpt.solver.sparse") for m in inside), (path.name, inside)
