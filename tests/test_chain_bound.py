"""The multiple-choice chain LP bound and the frontier's exact cuts (fixing, targets, reordering) against oracles."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import linprog

from lightning_ckpt.solver.capped import frontier
from lightning_ckpt.solver.capped import solve as capped
from lightning_ckpt.solver.capped.chain_bound import GroupBounds, group_prices
from lightning_ckpt.solver.capped.groups import from_items, from_options, reach
from tests.test_solver_capped import brute_force_value, random_capped_instances
from tests.test_solver_choices import brute_force, random_choice_instances


def choice_lp_value(groups, room, usable) -> float:
    """The multiple-choice chain LP by scipy: per group a convex combination of its usable options,
    the groups before ``k`` at most ``room[k]`` (k = 1..n)."""
    n, group_of = groups.count, groups.group_of()
    rows = (group_of[None, :] < np.arange(1, n + 1)[:, None]) * groups.weights
    a_eq = (group_of[None, :] == np.arange(n)[:, None]).astype(float)
    bounds = [(0.0, 1.0 if ok else 0.0) for ok in usable]
    done = linprog(-groups.values, A_ub=rows, b_ub=room[1:], A_eq=a_eq, b_eq=np.ones(n), bounds=bounds)
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


def test_group_bound_equals_the_chain_lp_and_bounds_the_optimum():
    """0/1 items as two-option groups, and groups of up to five options (their hulls)."""
    instances = [
        (from_items(w, v, take, skip), capacity, brute_force_value(w, v, capacity, take, skip))
        for w, v, capacity, take, skip in random_capped_instances(200, seed=21, max_items=9)
    ]
    for weights, values, capacity, caps in random_choice_instances(200, seed=22, max_options=5):
        optimum = brute_force(weights, values, capacity, caps)
        if optimum is not None:
            starts = np.cumsum([0] + [len(g) for g in weights])
            flat = [np.array([x for g in a for x in g]) for a in (weights, values, caps)]
            instances.append(
                (from_options(flat[0], flat[1].astype(float), flat[2], starts), capacity, optimum)
            )
    for groups, capacity, optimum in instances:
        room, fitted = reach(groups, capacity)
        groups = groups._replace(caps=fitted)
        price = group_prices(groups, room, fitted)
        upper = GroupBounds(groups, room, price, fitted >= 0).upper
        assert upper == pytest.approx(choice_lp_value(groups, room, fitted >= 0), rel=1e-9, abs=1e-9)
        assert upper >= optimum - 1e-9
        assert (np.diff(price) <= 1e-12).all() and price[-1] == 0.0  # prices never rise


@pytest.mark.parametrize("target_steps", [1, 6, 30])
def test_frontier_matches_brute_force_on_plan_like_instances(monkeypatch, target_steps):
    """One target, the default, and so many that most passes miss theirs and the next one falls."""
    monkeypatch.setattr(frontier, "TARGET_STEPS", target_steps)
    monkeypatch.setattr(frontier, "FEW_ITEMS", 0)  # these instances are small: falling targets anyway
    reordered = 0
    for weights, values, capacity, take, skip in plan_like_instances(400, seed=target_steps):
        groups = from_items(weights, values, take, skip)
        room, fitted = reach(groups, capacity)
        implied = (fitted[1::2] >= room[1:] - weights) & (fitted[0::2] >= room[1:])
        reordered += int(implied.sum() >= 2)
        choice, _ = frontier.solve_sparse(groups, capacity, max_entries=1 << 20)
        chosen = choice == 1
        assert capped.cap_violation(weights, chosen, capacity, take, skip) is None
        optimum = brute_force_value(weights, values, capacity, take, skip)
        assert values[chosen].sum() == pytest.approx(optimum, rel=1e-9, abs=1e-12)
    assert reordered > 200  # most instances have items whose order the solver may change
