"""``solve_choices`` (one option per group under prefix capacities) against brute force, on every path."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from lightning_ckpt.solver import ChoiceResult, SolverOptions, solve_choices, solve_knapsack
from lightning_ckpt.solver.capped import frontier
from lightning_ckpt.solver.capped import solve as capped


def brute_force(weights, values, capacity, caps) -> float | None:
    """The best value over every combination that meets every cap, or None when none does."""
    best = None
    for choice in itertools.product(*(range(len(group)) for group in weights)):
        before, value, ok = 0, 0.0, True
        for g, j in enumerate(choice):
            ok = ok and before <= caps[g][j]
            before, value = before + weights[g][j], value + values[g][j]
        if ok and before <= capacity and (best is None or value > best):
            best = value
    return best


def meets_caps(result: ChoiceResult, weights, capacity, caps) -> bool:
    before = 0
    for g, j in enumerate(result.choice):
        if before > caps[g][j]:
            return False
        before += weights[g][j]
    return before == result.weight <= capacity


def random_choice_instances(count: int, seed: int, max_groups: int = 5, max_options: int = 4):
    """Small instances: binding and loose caps, dominated options, equal weights, zero values, ties."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        n = int(rng.integers(1, max_groups + 1))
        capacity = int(rng.integers(0, 30))
        weights, values, caps = [], [], []
        for _ in range(n):
            k = int(rng.integers(1, max_options + 1))
            w = rng.integers(0, 10, k) * (1 + (i % 3 == 0))  # some common divisors
            if i % 2 == 0:
                w[0] = 0  # a weight-0 option, as the planner always gives
            v = rng.uniform(0.0, 6.0, k).round(int(rng.integers(0, 2)))  # ties and zeros when rounded
            v[rng.random(k) < 0.15] = 0.0
            c = np.where(rng.random(k) < 0.5, capacity, rng.integers(0, capacity + 3, k))
            weights.append(w.tolist()), values.append(v.tolist()), caps.append(c.tolist())
        yield weights, values, capacity, caps


@pytest.fixture(params=["sparse", "sparse pruned", "dense leaves", "dense splits"])
def path(request, monkeypatch) -> tuple[str, SolverOptions]:
    """The frontier (one pass at these sizes, or falling targets and fixing however small), the
    dense path's leaves, and its one-group Hirschberg splits."""
    if request.param == "sparse pruned":
        monkeypatch.setattr(frontier, "FEW_ITEMS", 0)
    elif request.param != "sparse":
        monkeypatch.setattr(capped, "SPARSE_MAX_ENTRIES", 0)
    expected = "frontier" if request.param.startswith("sparse") else "dense"
    return expected, SolverOptions(leaf_max_cells=0) if request.param == "dense splits" else SolverOptions()


def test_choices_match_brute_force(path):
    expected_path, options = path
    infeasible = 0
    for weights, values, capacity, caps in random_choice_instances(600, seed=7):
        optimum = brute_force(weights, values, capacity, caps)
        if optimum is None:
            infeasible += 1
            with pytest.raises(ValueError, match="`prefix_capacities` admit no choice"):
                solve_choices(weights, values, capacity, prefix_capacities=caps, options=options)
            continue
        result = solve_choices(weights, values, capacity, prefix_capacities=caps, options=options)
        assert meets_caps(result, weights, capacity, caps)
        assert result.value == pytest.approx(optimum, rel=1e-9, abs=1e-12)
        assert result.stats.path == expected_path
    assert 20 < infeasible < 300  # both kinds of instance were met


def test_more_groups_with_pruning_match_brute_force(monkeypatch):
    """Eight groups of up to five options: falling targets, option fixing and reordering at work."""
    monkeypatch.setattr(frontier, "FEW_ITEMS", 0)
    for weights, values, capacity, caps in random_choice_instances(60, seed=3, max_groups=8, max_options=5):
        optimum = brute_force(weights, values, capacity, caps)
        if optimum is not None:
            result = solve_choices(weights, values, capacity, prefix_capacities=caps)
            assert meets_caps(result, weights, capacity, caps)
            assert result.value == pytest.approx(optimum, rel=1e-9, abs=1e-12)


def test_two_option_groups_are_the_capped_knapsack():
    """A 0/1 item with take and skip caps is the group ``[(0, 0.0) cap skip, (w, v) cap take]``."""
    rng = np.random.default_rng(4)
    for _ in range(100):
        n, capacity = int(rng.integers(1, 12)), int(rng.integers(0, 60))
        w, v = rng.integers(0, 15, n), rng.uniform(0, 5, n).round(1)
        take, skip = rng.integers(0, capacity + 2, n), rng.integers(0, capacity + 2, n)
        plain = solve_knapsack(w, v, capacity, prefix_capacities=take, skip_capacities=skip)
        groups = solve_choices(
            [[0, int(x)] for x in w],
            [[0.0, float(x)] for x in v],
            capacity,
            prefix_capacities=[[int(s), int(t)] for t, s in zip(take, skip, strict=True)],
        )
        assert groups.value == pytest.approx(plain.value, rel=1e-12, abs=1e-12)
        assert groups.choice == tuple(int(i in plain.chosen) for i in range(n))


def _op_level_instance(seed: int, n: int = 30, capacity: int = 3000):
    """Blocks of five options (nothing saved, three selective policies, keep), growing caps."""
    rng = np.random.default_rng(seed)
    keep = rng.integers(60, 120, n)
    shares = np.sort(rng.uniform(0.1, 0.9, (n, 3)), axis=1)
    weights = np.column_stack((np.zeros(n, dtype=int), (keep[:, None] * shares).astype(int), keep))
    values = weights * rng.uniform(0.8, 1.2, (n, 5))
    caps = np.minimum(capacity, np.linspace(capacity // 2, capacity, n).astype(int)[:, None] + 0 * weights)
    return weights.tolist(), values.tolist(), capacity, caps.tolist()


def test_sparse_and_dense_paths_agree_on_an_op_level_stack(monkeypatch):
    weights, values, capacity, caps = _op_level_instance(seed=1)
    sparse = solve_choices(weights, values, capacity, prefix_capacities=caps)
    dense = solve_choices(weights, values, capacity, prefix_capacities=caps, method="hirschberg")
    assert sparse.stats.path == "frontier" and dense.stats.path == "dense"
    assert sparse.value == pytest.approx(dense.value, rel=1e-12)
    assert meets_caps(sparse, weights, capacity, caps) and meets_caps(dense, weights, capacity, caps)


def test_workers_two_equals_workers_one(monkeypatch):
    """Forces the worker processes on the dense path: one-group splits, no size thresholds."""
    options = SolverOptions(parallel_min_solve_cells=0, parallel_min_task_cells=0, leaf_max_cells=50)
    weights, values, capacity, caps = _op_level_instance(seed=2, n=12, capacity=600)
    kwargs = {"prefix_capacities": caps, "method": "hirschberg", "options": options}
    single = solve_choices(weights, values, capacity, workers=1, **kwargs)
    double = solve_choices(weights, values, capacity, workers=2, **kwargs)
    assert single.stats.workers_used == 1 and double.stats.workers_used == 2
    assert double == single
    assert solve_choices(weights, values, capacity, prefix_capacities=caps).value == pytest.approx(
        single.value
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"weights": [[0, 1], 3]}, r"`weights\[1\]` must be a sequence of options"),
        (
            {"weights": [[0, 1], []], "values": [[0.0, 1.0], []]},
            r"`weights\[1\]` must be a non-empty sequence",
        ),
        ({"weights": [[0, True]]}, r"`weights` must contain only integral numbers .* got True at \[0\]\[1\]"),
        ({"weights": [[0, 2.5]]}, r"`weights` must contain only integral numbers .* got 2.5 at \[0\]\[1\]"),
        ({"weights": [[0, -1]]}, r"`weights` must contain only integral numbers .* got -1 at \[0\]\[1\]"),
        (
            {"values": [[0.0, float("nan")]]},
            r"`values` must contain only finite real numbers >= 0, got nan at",
        ),
        ({"values": [[0.0]]}, r"`values\[0\]` must have one entry per option of `weights\[0\]` \(2\), got 1"),
        (
            {"values": [[0.0, 1.0], [1.0]]},
            r"`values` must have one group per group of `weights` \(1\), got 2",
        ),
        ({"prefix_capacities": [[3]]}, r"`prefix_capacities\[0\]` must have one entry per option"),
        (
            {"prefix_capacities": [[3, -2]]},
            r"`prefix_capacities` must contain only integral .* -2 at \[0\]\[1\]",
        ),
        ({"prefix_capacities": "ab"}, r"`prefix_capacities` must be a sequence"),
        ({"capacity": 2.5}, r"`capacity` must be an integral number in \[0, 2\*\*48\], got 2.5"),
        ({"method": "dp"}, r"`method` must be one of 'auto', 'hirschberg', got 'dp'"),
        ({"workers": 0}, r"`workers` must be an integral number in \[1, 1024\], got 0"),
        ({"weights": [[3, 4]], "capacity": 2}, r"`prefix_capacities` admit no choice"),
    ],
)
def test_bad_input_is_refused(kwargs, match):
    args = {"weights": [[0, 1]], "values": [[0.0, 1.0]], "capacity": 5} | kwargs
    rest = {k: v for k, v in args.items() if k not in ("weights", "values", "capacity")}
    with pytest.raises(ValueError, match=match):
        solve_choices(args["weights"], args["values"], args["capacity"], **rest)


def test_empty_instance_and_equality():
    empty = solve_choices([], [], 5)
    assert empty.choice == () and empty.value == 0.0 and empty.weight == 0
    one = solve_choices([[2, 0]], [[1.0, 1.0]], 5)
    assert one.choice == (1,)  # equal values: the lighter option (a dominated one is never chosen)
    assert one == solve_choices(np.array([[2, 0]]), np.array([[1.0, 1.0]]), 5, method="auto")
