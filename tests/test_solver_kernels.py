"""The DP kernels (numba vs numpy twins) and the exact reductions, each against an oracle."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.bench.generators import FAMILIES, make_instance
from lightning_ckpt.solver.dense import _kernels_numpy
from lightning_ckpt.solver.dense.profile import cell_updates, profile
from lightning_ckpt.solver.sparse import reduce, reduce_lists

numba_kernels = pytest.importorskip("lightning_ckpt.solver.dense._kernels_numba")


def brute_force_profile(weights, values, capacity):
    n = len(weights)
    masks = ((np.arange(2**n)[:, None] >> np.arange(n)) & 1).astype(bool)
    total_w, total_v = masks @ weights, masks @ values
    return np.array([total_v[total_w <= c].max() for c in range(capacity + 1)])


def full_profile(kernels, weights, values, capacity, out, *grouping):
    """A whole profile from a kernel's ``extend`` (what ``profile.profile`` does)."""
    out[0] = 0.0
    reach = kernels.extend(weights, values, capacity, out, 0, *(grouping or (1, 1, 1)), np.zeros(1, np.uint8))
    out[reach + 1 : capacity + 1] = out[reach]


def random_items(rng, n_max=8, weight_max=20):
    n = int(rng.integers(1, n_max + 1))
    return rng.integers(0, weight_max, n).astype(np.int64), rng.uniform(0, 5, n), int(rng.integers(0, 50))


def test_profile_kernels_are_identical_and_optimal():
    rng = np.random.default_rng(0)
    for _ in range(500):
        weights, values, capacity = random_items(rng)
        outs = [np.full(capacity + 1, -1.0) for _ in range(2)]
        full_profile(_kernels_numpy, weights, values, capacity, outs[1])
        np.testing.assert_allclose(outs[1], brute_force_profile(weights, values, capacity), rtol=1e-12)
        # the numba kernel's grouped sweep, with small windows and tiles to take every branch
        window, group_items, tile = (int(x) for x in rng.integers(1, [60, 6, 12]))
        full_profile(numba_kernels, weights, values, capacity, outs[0], window, group_items, tile)
        np.testing.assert_array_equal(outs[0], outs[1])


def test_grouped_sweep_matches_item_by_item_on_long_profiles():
    rng = np.random.default_rng(2)
    for _ in range(100):
        n, capacity = int(rng.integers(2, 40)), int(rng.integers(100, 3000))
        weights = rng.integers(1, capacity // 4, n).astype(np.int64)
        values = weights * rng.uniform(0.5, 1.5, n)
        outs = [np.empty(capacity + 1) for _ in range(2)]
        full_profile(numba_kernels, weights, values, capacity, outs[0], 400, 8, int(rng.integers(1, 64)))
        full_profile(_kernels_numpy, weights, values, capacity, outs[1])
        np.testing.assert_array_equal(outs[0], outs[1])


def test_leaf_kernels_record_identical_bits_and_optimal_sets():
    rng = np.random.default_rng(1)
    for _ in range(500):
        weights, values, capacity = random_items(rng)
        bits = [np.zeros((len(weights), capacity // 8 + 1), dtype=np.uint8) for _ in range(2)]
        for kernels, table in zip((numba_kernels, _kernels_numpy), bits, strict=True):
            kernels.fill_leaf(weights, values, capacity, np.empty(capacity + 1), table, np.zeros(1, np.uint8))
        np.testing.assert_array_equal(bits[0], bits[1])
        chosen = np.zeros(len(weights), dtype=np.bool_)
        numba_kernels.backtrack(weights, capacity, bits[0], chosen)
        for twin in (_kernels_numpy.backtrack, _kernels_numpy.backtrack_loops):  # the same set read back
            again = np.zeros(len(weights), dtype=np.bool_)
            twin(weights, capacity, bits[1], again)
            np.testing.assert_array_equal(again, chosen)
        assert weights[chosen].sum() <= capacity
        assert values[chosen].sum() == pytest.approx(brute_force_profile(weights, values, capacity)[-1])


def test_leaf_kernels_agree_on_long_rows_of_many_blocks_and_bytes():
    """The numba leaf updates blocks of <= w cells and packs its decisions eight bytes at a time:
    rows of thousands of cells, light and heavy items, ties (integral values) included."""
    rng = np.random.default_rng(3)
    for trial in range(60):
        n, capacity = int(rng.integers(2, 30)), int(rng.integers(100, 3000))
        weights = rng.integers(1, [9, capacity // 3][trial % 2], n).astype(np.int64)
        values = rng.integers(0, 6, n).astype(np.float64) if trial % 3 else weights * rng.uniform(0.5, 1.5, n)
        outs = [np.full(capacity + 1, -1.0) for _ in range(2)]
        bits = [np.zeros((n, capacity // 8 + 1), dtype=np.uint8) for _ in range(2)]
        for kernels, out, table in zip((numba_kernels, _kernels_numpy), outs, bits, strict=True):
            kernels.fill_leaf(weights, values, capacity, out, table, np.zeros(1, np.uint8))
        np.testing.assert_array_equal(outs[0], outs[1])
        np.testing.assert_array_equal(bits[0], bits[1])


def test_leaf_rows_choose_the_set_the_bit_table_backtracks():
    """``solve_leaf_rows`` (a row per item, windows from both ends) against ``fill_leaf`` and
    ``backtrack``: the same mask, ties (integral values), zero weights and items heavier than the
    capacity included; a set stop flag gives None."""
    rng = np.random.default_rng(4)
    stop = np.zeros(1, np.uint8)
    for trial in range(400):
        weights, values, capacity = random_items(rng, n_max=12, weight_max=[20, 60][trial % 2])
        if trial % 3 == 0:
            values = np.floor(values)
        bits = np.zeros((len(weights), capacity // 8 + 1), dtype=np.uint8)
        _kernels_numpy.fill_leaf(weights, values, capacity, np.empty(capacity + 1), bits, stop)
        expected = np.zeros(len(weights), dtype=np.bool_)
        _kernels_numpy.backtrack(weights, capacity, bits, expected)
        np.testing.assert_array_equal(
            _kernels_numpy.solve_leaf_rows(weights, values, capacity, stop), expected
        )
    weights, values, capacity = make_instance("B", 54, 5000, seed=1)  # long rows, windows from both ends
    bits = np.zeros((54, 5000 // 8 + 1), dtype=np.uint8)
    _kernels_numpy.fill_leaf(weights, values, capacity, np.empty(capacity + 1), bits, stop)
    expected = np.zeros(54, dtype=np.bool_)
    _kernels_numpy.backtrack(weights, capacity, bits, expected)
    np.testing.assert_array_equal(_kernels_numpy.solve_leaf_rows(weights, values, capacity, stop), expected)
    assert _kernels_numpy.solve_leaf_rows(weights, values, capacity, np.ones(1, np.uint8)) is None


def test_checkpoint_on_the_way_equals_the_prefix_profile_and_keeps_the_full_one():
    rng = np.random.default_rng(4)
    for _ in range(300):
        weights, values, capacity = random_items(rng, n_max=10)
        save_at = int(rng.integers(0, len(weights) + 1))
        slot = min(capacity, int(weights[:save_at].sum()) + int(rng.integers(0, 3))) + 1
        out, saved, prefix = np.empty(capacity + 1), np.full(slot, -1.0), np.empty(capacity + 3)
        profile(weights, values, capacity, out, save_at=save_at, saved=saved)
        np.testing.assert_allclose(out, brute_force_profile(weights, values, capacity), rtol=1e-12)
        profile(weights[:save_at], values[:save_at], slot - 1, prefix)
        np.testing.assert_array_equal(saved, prefix[:slot])


def test_best_split_kernels_pick_the_first_maximum():
    left, right = np.array([0.0, 2.0, 2.0, 3.0]), np.array([0.0, 1.0, 1.0, 1.0])
    for kernels in (numba_kernels, _kernels_numpy):
        assert kernels.best_split(left, right, 3) == 1  # c=1: 2+1, c=2: 2+1, c=3: 3+0


def test_windows_on_lists_and_in_numpy_agree():
    rng = np.random.default_rng(4)
    for _ in range(500):  # up to LIST_ITEMS on plain ints, numpy above
        weights, capacity = rng.integers(0, 60, int(rng.integers(0, 130))), int(rng.integers(0, 400))
        small = _kernels_numpy._windows_on_lists(weights.tolist(), capacity)
        padded = np.concatenate([weights, np.full(_kernels_numpy.LIST_ITEMS + 1, capacity + 1)])
        large = _kernels_numpy.windows(padded, capacity)  # heavier items: numpy, the same prefix
        assert small == tuple(x[: len(weights)] for x in large)
        assert _kernels_numpy.windows(weights, capacity) == small


def test_cell_updates_counts_clipped_cells():
    assert cell_updates(np.array([4, 4, 4]), 10) == 1 + 5 + 7  # reaches 4, 8, 10
    rng = np.random.default_rng(3)
    for _ in range(300):  # plain ints up to 64 items, numpy above: the same count
        weights, capacity = rng.integers(0, 200, int(rng.integers(0, 130))), int(rng.integers(0, 3000))
        reach = np.minimum(np.cumsum(weights), capacity)
        assert cell_updates(weights, capacity) == int(np.maximum(reach - weights + 1, 0).sum())


@pytest.mark.parametrize("family", FAMILIES)
def test_lp_fixing_keeps_every_optimum(family):
    """An item fixed in (out) must be in (out of) every optimal set: flipping it loses value."""
    rng = np.random.default_rng(FAMILIES.index(family))
    fixed_count = 0
    for seed in range(300):
        n, capacity = int(rng.integers(2, 11)), int(rng.integers(5, 80))
        weights, values, _ = make_instance(family, n, capacity, seed=seed)
        keep = weights <= capacity
        weights, values = weights[keep], values[keep]
        if not len(weights) or weights.sum() <= capacity:
            continue
        fixed_in, fixed_out = reduce.lp_fix(weights, values, capacity)
        masks = ((np.arange(2 ** len(weights))[:, None] >> np.arange(len(weights))) & 1).astype(bool)
        feasible = masks[masks @ weights <= capacity]
        optimum = (feasible @ values).max()
        for j in np.flatnonzero(fixed_in | fixed_out):
            flipped = feasible[:, j] != fixed_in[j]
            assert not flipped.any() or (feasible[flipped] @ values).max() < optimum
        fixed_count += int((fixed_in | fixed_out).sum())
    assert fixed_count > 0  # the reduction actually fires on these families


def test_merge_identical_bundles_represent_every_count():
    weights, values = np.array([3, 3, 3, 3, 3, 5]), np.array([1.0] * 5 + [2.0])
    parts = reduce.merge_identical(weights, values, np.arange(6))
    assert parts["copies"].tolist() == [1, 2, 2, 1]  # 5 copies -> 1 + 2 + 2, then the single item
    assert parts["weights"].tolist() == [3, 6, 6, 5]


def test_reduce_instance_divides_by_gcd_and_maps_back_lowest_indices():
    weights, values = np.array([4, 4, 4, 8, 6]), np.array([1.0, 1.0, 1.0, 1.5, 0.1])
    core = reduce.reduce_instance(weights, values, 9, use_lp=False)
    assert core.capacity == 4 and core.weights.tolist() == [2, 2, 2, 3, 4]  # gcd 2, capacity 9 // 2
    mask = np.array([True, True, False, False, False])
    assert core.expand(mask).tolist() == [0, 1]
    merged = reduce.reduce_instance(np.array([4, 4, 4, 2]), np.array([1.0, 1.0, 1.0, 0.2]), 9)
    counts = {
        tuple(core_item) for core_item in zip(merged.weights.tolist(), merged.copies.tolist(), strict=True)
    }
    assert all(copies in (1, 2) for _, copies in counts)


def test_streaming_groups_of_items_heavier_than_the_window_match_item_by_item():
    """Items heavier than the window are grouped anyway (the large-W path): same numbers."""
    rng = np.random.default_rng(3)
    for _ in range(50):
        n, capacity, window = int(rng.integers(2, 30)), int(rng.integers(200, 2000)), int(rng.integers(1, 50))
        weights = rng.integers(window // 2 + 1, capacity // 3, n).astype(np.int64)
        values = weights + rng.uniform(0, 5, n)
        outs = [np.empty(capacity + 1) for _ in range(2)]
        full_profile(numba_kernels, weights, values, capacity, outs[0], window, 8, int(rng.integers(1, 64)))
        full_profile(_kernels_numpy, weights, values, capacity, outs[1])
        np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("family", FAMILIES)
def test_compile_sized_solves_choose_the_same_set_on_numpy_and_numba(family, monkeypatch):
    """``torch.compile``-sized uncapped solves (n = 42-54, W up to 5,000; one leaf, on numpy the rows
    of ``solve_leaf_rows``): the same value and set as with the numba kernels."""
    from lightning_ckpt.solver import solve_knapsack
    from lightning_ckpt.solver.runtime import backend

    cases = [
        make_instance(family, n, w, seed) for n, w in ((42, 1000), (48, 5000), (54, 5000)) for seed in (1, 2)
    ]
    backend.load_numba()
    on_numba = [solve_knapsack(*case) for case in cases]
    monkeypatch.setattr(backend, "KERNEL", "numpy")
    on_numpy = [solve_knapsack(*case) for case in cases]
    assert backend.compiled(1, backend.DENSE_NUMBA) is None  # numpy kernels throughout
    assert [(r.value, r.chosen) for r in on_numpy] == [(r.value, r.chosen) for r in on_numba]
    assert sum(r.stats.path == "hirschberg" for r in on_numpy) >= 5  # a leaf left to solve


def _random_instance(rng, kind):
    """Small instances with zero weights, zero values, items heavier than the capacity and repeats."""
    n = int(rng.integers(0, reduce_lists.LISTS_MAX_ITEMS + 1))
    if kind == 0:  # many repeats, zeros
        weights, values = rng.integers(0, 20, n), rng.integers(0, 5, n).astype(float)
    elif kind == 1:  # all distinct
        weights, values = rng.integers(1, 1000, n), rng.random(n) * 100
    elif kind == 2:  # strongly correlated, a common divisor
        weights = rng.integers(1, 50, n) * 6
        values = (weights + 10).astype(float)
    else:  # tiny weights: everything fits often
        weights, values = rng.integers(0, 5, n), rng.integers(0, 3, n) * 0.5
    return weights.astype(np.int64), values, int(rng.integers(0, max(1, int(weights.sum()) + 2)))


def test_reduce_lists_gives_reduce_instances_core():
    """The lists' reductions (small instances) give the same core as numpy's, field by field."""
    rng = np.random.default_rng(7)
    fixed = 0
    for trial in range(4000):
        weights, values, capacity = _random_instance(rng, trial % 4)
        expected = reduce.reduce_instance(weights, values, capacity)
        core = reduce_lists.reduce_lists(weights, values, capacity)
        assert core.capacity == expected.capacity
        for field in ("taken", "weights", "values", "group", "copies", "members", "starts"):
            got, want = getattr(core, field), getattr(expected, field)
            assert got.dtype == want.dtype and np.array_equal(got, want), (trial, field)
        fixed += len(weights) - int(expected.copies.sum())
    assert fixed > 4000  # the reductions settled items: the comparison covers the fixing
    for family in FAMILIES:
        for n, capacity in ((42, 1000), (54, 5000)):
            weights, values, _ = make_instance(family, n, capacity, seed=1)
            expected, core = (
                reduce.reduce_instance(weights, values, capacity),
                reduce_lists.reduce_lists(weights, values, capacity),
            )
            assert np.array_equal(core.taken, expected.taken)
            assert np.array_equal(core.weights, expected.weights) and core.capacity == expected.capacity


def test_one_move_from_the_break_solution_fixes_strongly_correlated_items(monkeypatch):
    """On strongly correlated items (the recorded ``torch.compile`` family B) the greedy bound fixes
    nothing; raised to the best set one move from the break solution it fixes most items, on lists and
    in numpy alike, and the answer is HiGHS's optimum."""
    from lightning_ckpt.solver import solve_knapsack

    pytest.importorskip("scipy")
    for n, capacity, most_left in ((42, 1000, 18), (48, 5000, 29), (54, 5000, 22)):
        weights, values, _ = make_instance("B", n, capacity, seed=1)
        swapped = reduce.reduce_instance(weights, values, capacity)
        on_lists = reduce_lists.reduce_lists(weights, values, capacity)
        assert np.array_equal(on_lists.members, swapped.members) and on_lists.capacity == swapped.capacity
        with monkeypatch.context() as patched:  # no swap: the greedy bound alone
            patched.setattr(reduce, "best_swap", lambda *_: (0.0, -1, -1))
            patched.setattr(reduce_lists, "_best_swap", lambda *_: 0.0)
            plain = reduce.reduce_instance(weights, values, capacity)
            assert len(reduce_lists.reduce_lists(weights, values, capacity).members) == len(plain.members)
        assert len(plain.members) == n and len(swapped.members) <= most_left
        result = solve_knapsack(weights, values, capacity)
        assert result.value == pytest.approx(solve_knapsack(weights, values, capacity, method="ilp").value)
        assert result.value == pytest.approx(
            solve_knapsack(weights, values, capacity, method="hirschberg").value
        )
