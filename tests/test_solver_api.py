"""solve_knapsack's contract: edge cases, the capacity-leak regression, validation, quantize."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

from lightning_ckpt import KnapsackResult, quantize, solve_knapsack
from lightning_ckpt.solver import SolverOptions, SolveStats, fits

EXACT = ("auto", "hirschberg", "dp", "ilp")

EDGE_CASES = {
    # name: (weights, values, capacity, optimal value)
    "empty input": ([], [], 5, 0.0),
    "capacity 0": ([1, 2], [1.0, 1.0], 0, 0.0),
    "capacity 0, free item": ([0, 1], [2.0, 1.0], 0, 2.0),
    "zero-weight items": ([0, 0, 3], [1.0, 0.0, 2.0], 2, 1.0),
    "zero-value items": ([1, 1], [0.0, 0.0], 2, 0.0),
    "heavier than capacity": ([10, 2], [100.0, 1.0], 5, 1.0),
    "all items fit": ([1, 2, 3], [1.0, 1.0, 1.0], 10, 3.0),
    "ties": ([2, 2, 2], [1.0, 1.0, 1.0], 4, 2.0),
    "exact fill beats ratio": ([1, 3, 3], [2.0, 4.0, 4.0], 6, 8.0),
    "numpy and float inputs": (np.array([2, 3]), (1.5, 2.5), 5.0, 4.0),
}


@pytest.mark.parametrize("method", EXACT)
@pytest.mark.parametrize("case", list(EDGE_CASES))
def test_edge_cases(case, method):
    weights, values, capacity, optimum = EDGE_CASES[case]
    result = solve_knapsack(weights, values, capacity, method=method)
    assert result.value == pytest.approx(optimum)
    assert result.weight <= capacity
    assert result.weight == sum(int(weights[i]) for i in result.chosen)
    assert sorted(result.chosen + result.rejected) == list(range(len(weights)))
    assert list(result.chosen) == sorted(result.chosen) and result.method == method


@pytest.mark.parametrize("method", EXACT + ("greedy",))
def test_capacity_leak_regression(method):
    """PyTorch's Hirschberg leaks one unit per split and can return weight 2 here."""
    result = solve_knapsack([1, 1, 1], [1.0, 1.0, 1.0], 1, method=method)
    assert (result.weight, result.value, len(result.chosen)) == (1, 1.0, 1)


def test_result_is_frozen_and_deterministic():
    weights, values = [5, 4, 6, 3, 5], [10.0, 40.0, 30.0, 50.0, 10.0]
    first = solve_knapsack(weights, values, 10)
    assert isinstance(first, KnapsackResult) and first == solve_knapsack(weights, values, 10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.value = 0.0  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"weights": "abc"}, r"`weights` must be a sequence of integral numbers.*got str"),
        ({"weights": 3}, r"`weights` must be a sequence of integral numbers.*got int"),
        ({"weights": [[1, 2]], "values": [1.0]}, r"`weights` must be a flat sequence.*shape \(1, 2\)"),
        (
            {"weights": [1, -2]},
            r"`weights` must contain only integral numbers in \[0, 2\*\*48\], got -2 at index 1",
        ),
        ({"weights": [1, 2.5]}, r"`weights` must contain only integral numbers.*got 2.5 at index 1"),
        ({"weights": [1, 2**60]}, r"`weights` must contain only integral numbers.*at index 1"),
        ({"weights": ["a", 1]}, r"`weights` must contain only integral numbers.*got 'a' at index 0"),
        (
            {"values": [1.0, float("nan")]},
            r"`values` must contain only finite real numbers >= 0, got nan at index 1",
        ),
        (
            {"values": [1.0, -1.0]},
            r"`values` must contain only finite real numbers >= 0, got -1.0 at index 1",
        ),
        ({"values": None}, r"`values` must be a sequence of finite real numbers >= 0, got NoneType"),
        ({"values": [1.0]}, r"`weights` and `values` must have the same length, got 2 and 1"),
        ({"capacity": -1}, r"`capacity` must be an integral number in \[0, 2\*\*48\], got -1"),
        ({"capacity": 2.5}, r"`capacity` must be an integral number.*got 2.5"),
        ({"capacity": True}, r"`capacity` must be an integral number.*got True"),
        (
            {"method": "fast"},
            r"`method` must be one of 'auto', 'hirschberg', 'dp', 'greedy', 'ilp', got 'fast'",
        ),
        ({"workers": 0}, r"`workers` must be an integral number in \[1, 1024\], got 0"),
        # exact numbers only: no silent rounding, no bool, no lost mask, no overflow later
        (
            {"capacity": np.float32(5.5)},
            r"`capacity` must be an integral number in \[0, 2\*\*48\], got np.float32\(5.5\)",
        ),
        ({"capacity": np.float16(4.5)}, r"`capacity` must be an integral number.*got np.float16\(4.5\)"),
        ({"capacity": Fraction(11, 2)}, r"`capacity` must be an integral number.*got Fraction\(11, 2\)"),
        ({"capacity": np.bool_(True)}, r"`capacity` must be an integral number.*got np.True_"),
        (
            {"workers": np.float32(2.5)},
            r"`workers` must be an integral number in \[1, 1024\], got np.float32\(2.5\)",
        ),
        ({"workers": True}, r"`workers` must be an integral number in \[1, 1024\], got True"),
        (
            {"weights": np.ma.array([1, 2], mask=[False, True])},
            r"`weights` must be a plain sequence of integral numbers.*got a masked array",
        ),
        (
            {"values": np.ma.array([1.0, 2.0], mask=[True, False])},
            r"`values` must be a plain sequence of finite real numbers >= 0, got a masked array",
        ),
        ({"weights": [1, True]}, r"`weights` must contain only integral numbers.*got True at index 1"),
        ({"weights": np.array([True, False])}, r"`weights` must contain only integral numbers.*at index 0"),
        (
            {"values": [1.0, True]},
            r"`values` must contain only finite real numbers >= 0, got True at index 1",
        ),
        (
            {"values": [1.0, None]},
            r"`values` must contain only finite real numbers >= 0, got None at index 1",
        ),
        ({"weights": [1, "a"]}, r"`weights` must contain only integral numbers.*got 'a' at index 1"),
        (
            {"weights": [1, Fraction(3, 2)]},
            r"`weights` must contain only integral.*got Fraction\(3, 2\) at index 1",
        ),
        (
            {"values": [1e308, 1e308]},
            r"`values` must sum to at most 1e\+300 \(so that totals stay finite\), got inf",
        ),
    ],
)
def test_validation_messages(kwargs, message):
    arguments = {"weights": [1, 2], "values": [1.0, 2.0], "capacity": 3, **kwargs}
    extra = {k: arguments.pop(k) for k in ("method", "workers") if k in arguments}
    with pytest.raises(ValueError, match=message):
        solve_knapsack(arguments["weights"], arguments["values"], arguments["capacity"], **extra)


def test_exact_numbers_of_other_types_are_taken():
    expected = solve_knapsack([1, 2], [1.0, 2.0], 3)
    assert solve_knapsack([1, 2.0], np.array([1, 2], dtype=np.float16), np.float32(3.0)) == expected
    assert solve_knapsack([Fraction(1), np.int8(2)], [Fraction(1), 2.0], Fraction(6, 2)) == expected


def test_weights_whose_sum_could_overflow_are_refused():
    with pytest.raises(ValueError, match=r"`weights` must sum to at most 2\*\*62, got 4611967493404098560"):
        solve_knapsack([2**48] * 16_385, [1.0] * 16_385, 5)


def test_dp_refuses_a_table_that_does_not_fit():
    options = SolverOptions(dp_table_limit_bytes=1000)
    with pytest.raises(MemoryError, match=r"method='dp' \(3 x 1001 table\) needs .* GiB.*use method='auto'"):
        solve_knapsack([1, 2], [1.0, 1.0], 1000, method="dp", options=options)
    assert solve_knapsack([1, 2], [1.0, 1.0], 1000, method="hirschberg", options=options).value == 2.0
    assert solve_knapsack([1, 2], [1.0, 1.0], 1000, method="dp").value == 2.0  # the default limit: 2 GiB


def test_the_o_w_method_out_of_memory_advises_something_else_than_itself(monkeypatch):
    monkeypatch.setattr(fits, "_physical_bytes", lambda: 1000)
    with pytest.raises(MemoryError, match=r"profiles \(capacity 10000\).*lower the capacity") as caught:
        solve_knapsack([3, 4, 5] * 1000, [4.0, 5.0, 6.0] * 1000, 10_000, method="hirschberg")
    assert "method=" not in str(caught.value)


def test_ilp_raises_when_it_runs_out_of_time_instead_of_answering():
    rng = np.random.default_rng(0)
    weights = rng.integers(100_000, 1_000_000, 300)
    values = weights + rng.uniform(0, 1000, 300)  # nearly equal ratios: many near-optimal sets
    tight = SolverOptions(ilp_time_limit_s=0.05)
    with pytest.raises(
        TimeoutError, match=r"method='ilp' found no proven optimum within its time limit of 0.05 s"
    ):
        solve_knapsack(weights, values, 10**7, method="ilp", options=tight)
    assert SolverOptions().ilp_time_limit_s == 60.0  # finite by default


def test_result_stats_report_the_core():
    stats = solve_knapsack([3, 4, 5, 6], [4.0, 5.0, 6.0, 7.0], 9, method="hirschberg").stats
    assert stats.method == "hirschberg" and stats.kernel in ("numba", "numpy")
    assert (stats.items, stats.capacity, stats.core_items, stats.core_capacity) == (4, 9, 4, 9)
    assert stats.cell_updates > 0 and stats.workers_used == 1


@pytest.mark.parametrize("method", ("dp", "greedy", "ilp"))
def test_result_stats_of_methods_without_reductions(method):
    stats = solve_knapsack([3, 4, 5, 6], [4.0, 5.0, 6.0, 7.0], 9, method=method).stats
    assert stats == SolveStats(method, stats.kernel, 4, 9, core_items=4, core_capacity=9)
    assert (stats.cell_updates, stats.workers_used) == (0, 1)


def test_result_stats_when_reductions_settle_everything():
    result = solve_knapsack([1, 2, 3], [1.0, 1.0, 1.0], 10)  # everything fits
    assert result.chosen == (0, 1, 2)
    assert (result.stats.method, result.stats.core_items, result.stats.cell_updates) == ("auto", 0, 0)


def test_result_stats_are_carried_but_not_compared():
    rng = np.random.default_rng(4)
    weights, values = rng.integers(1, 50, 30), rng.uniform(1, 10, 30)
    deep = SolverOptions(leaf_max_cells=0, checkpoint_share=0.0)
    split = solve_knapsack(weights, values, 300, method="hirschberg", options=deep)
    plain = solve_knapsack(weights, values, 300, method="hirschberg")
    assert split.stats.cell_updates != plain.stats.cell_updates  # different work ...
    assert split == plain and hash(split) == hash(plain)  # ... equal answers
    assert dataclasses.replace(plain, stats=SolveStats()) == plain
    assert KnapsackResult(1.0, 1, (0,), (), "auto").stats == SolveStats()
    with pytest.raises(dataclasses.FrozenInstanceError):
        plain.stats.cell_updates = 0  # type: ignore[misc]


def test_quantize_rounds_items_up_and_budget_down():
    assert quantize([0, 1, 512, 513], budget_bytes=1535, quantum_bytes=512) == ([0, 1, 1, 2], 2)
    assert quantize([0.5, 1.5], budget_bytes=3.9, quantum_bytes=0.5) == ([1, 3], 7)


def test_quantize_feasible_in_quanta_is_feasible_in_bytes():
    rng = np.random.default_rng(0)
    for _ in range(300):
        item_bytes = rng.integers(0, 10_000, int(rng.integers(1, 12))).tolist()
        budget_bytes = int(rng.integers(0, 40_000))
        quantum_bytes = int(rng.choice([1, 7, 512, 4096]))
        weights, capacity = quantize(item_bytes, budget_bytes, quantum_bytes)
        result = solve_knapsack(weights, [1.0] * len(weights), capacity)
        assert sum(item_bytes[i] for i in result.chosen) <= budget_bytes


@pytest.mark.parametrize(
    "args, message",
    [
        (([1], 10, 0), r"`quantum_bytes` must be a finite number > 0, got 0"),
        (([1], -1, 512), r"`budget_bytes` must be a finite number >= 0, got -1"),
        (([1, -5], 10, 512), r"`item_bytes\[1\]` must be a finite number >= 0, got -5"),
        ((5, 10, 512), r"`item_bytes` must be a sequence of finite numbers >= 0, got 5"),
    ],
)
def test_quantize_validation_messages(args, message):
    with pytest.raises(ValueError, match=message):
        quantize(*args)


def _run_python(code: str, **env: str) -> str:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    full_env = {**os.environ, "PYTHONPATH": root, **env}
    return subprocess.run(
        [sys.executable, "-c", code], env=full_env, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_solver_imports_neither_torch_nor_lightning():
    code = (
        "import sys, lightning_ckpt.solver as s; s.solve_knapsack([1], [1.0], 1); "
        "print(sorted(m for m in ('torch', 'lightning') if m in sys.modules))"
    )
    assert _run_python(code) == "[]"


def test_numpy_fallback_is_selected_by_the_environment():
    code = (
        "import lightning_ckpt.solver as s; print(s.KERNEL, s.solve_knapsack([1, 1, 1], [1.0] * 3, 1).weight)"
    )
    assert _run_python(code, LIGHTNING_CKPT_NO_NUMBA="1") == "numpy 1"
