"""The chain LP bound and the frontier's exact cuts (fixing, targets, reordering) against oracles."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import linprog

from lightning_ckpt.solver.capped import frontier
from lightning_ckpt.solver.capped import solve as capped
from lightning_ckpt.solver.capped.chain_bound import chain_dual, suffix_caps
from tests.test_solver_capped import brute_force_value, random_capped_instances


def chain_lp_value(weights, values, caps, usable) -> float:
    """The chain LP by scipy: the items before ``k`` weigh at most ``caps[k]`` (k = 1..n), x in [0, 1]."""
    n = len(weights)
    rows = np.tril(np.ones((n, n)), k=-1)[1:]  # row k - 1: items before k (k = 1..n-1)
    a_ub = np.vstack((rows, np.ones((1, n)))) * weights
    bounds = [(0.0, 1.0 if ok else 0.0) for ok in usable]
    done = linprog(-values, A_ub=a_ub, b_ub=caps[1:], bounds=bounds, method="highs")
    assert done.status == 0
    return -done.fun


def plan_like_instances(count: int, seed: int):
    """Like a plan (``benchmarks.bench.prefix``): blocks whose own caps the chain mostly implies, and
    a pinned last item (a large head) whose cap binds; sometimes a pinned block in the middle."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        n = int(rng.integers(2, 12))
        weights = rng.integers(1, 20, n)
        weights[-1] = 3 * weights[:-1].max()
        capacity = int(rng.integers(weights.sum() // 3, weights.sum()))
        values = weights * rng.uniform(0.5, 1.5, n)
        take = np.maximum(capacity - weights - rng.integers(0, 6, n), 0)
        skip = np.maximum(take - rng.integers(0, 8, n), 0)
        if i % 3 == 0:
            pinned = int(rng.integers(0, n - 1))
            skip[pinned] = int(rng.integers(0, capacity // 2 + 1))
        yield weights, values, capacity, take, skip


def test_chain_dual_equals_the_chain_lp_and_bounds_the_optimum():
    for weights, values, capacity, take, skip in random_capped_instances(300, seed=21, max_items=9):
        take, skip = np.minimum(take, capacity - weights), np.minimum(skip, capacity)
        caps = suffix_caps(weights, take, skip, capacity)
        usable = take >= 0
        dual = chain_dual(weights, values, caps, usable)
        assert dual.upper == pytest.approx(chain_lp_value(weights, values, caps, usable), rel=1e-9, abs=1e-9)
        assert dual.upper >= brute_force_value(weights, values, capacity, take, skip) - 1e-9
        assert (np.diff(dual.price) <= 1e-12).all() and dual.price[-1] == 0.0  # prices never rise


@pytest.mark.parametrize("target_steps", [1, 6, 30])
def test_frontier_matches_brute_force_on_plan_like_instances(monkeypatch, target_steps):
    """One target, the default, and so many that most passes miss theirs and the next one falls."""
    monkeypatch.setattr(frontier, "TARGET_STEPS", target_steps)
    monkeypatch.setattr(frontier, "FEW_ITEMS", 0)  # these instances are small: falling targets anyway
    reordered = 0
    for weights, values, capacity, take, skip in plan_like_instances(400, seed=target_steps):
        take_fit, skip_fit = np.minimum(take, capacity - weights), np.minimum(skip, capacity)
        caps = suffix_caps(weights, take_fit, skip_fit, capacity)
        implied = (take_fit >= caps[1:] - weights) & (skip_fit >= caps[1:])
        reordered += int(implied.sum() >= 2)
        chosen, _ = frontier.solve_sparse(weights, values, capacity, take, skip, max_entries=1 << 20)
        assert capped.cap_violation(weights, chosen, capacity, take, skip) is None
        optimum = brute_force_value(weights, values, capacity, take, skip)
        assert values[chosen].sum() == pytest.approx(optimum, rel=1e-9, abs=1e-12)
    assert reordered > 200  # most instances have items whose order the solver may change
