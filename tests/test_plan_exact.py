"""Plans against brute force over every kept set under the replayed peak (heterogeneous blocks)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from lightning_ckpt.config import AutoCheckpointConfig
from lightning_ckpt.planning import make_plan
from lightning_ckpt.planning.peak import fixed_peak_bytes, predict_peak_bytes
from tests.hetero_models import profiled
from tests.peak_replay import replay_peak_bytes


def every_kept_set(profile):
    """Per kept set (rows of a mask): its predicted peak and its recompute seconds."""
    names = [m.name for m in profile.modules]
    seconds = np.array([m.recompute_seconds for m in profile.modules])
    masks = np.array(list(itertools.product([False, True], repeat=len(names))))
    peaks = np.array(
        [replay_peak_bytes(profile, [n for n, k in zip(names, kept, strict=True) if not k]) for kept in masks]
    )
    return peaks, (~masks) @ seconds


@pytest.mark.parametrize("name, seed", [("mixed", 0), ("mixed", 1), ("mixed10", 2), ("unet", 3), ("head", 4)])
def test_plan_recompute_equals_brute_force_optimum(name, seed):
    profile = profiled(name, seed=seed)
    n = len(profile.modules)
    peaks, recompute = every_kept_set(profile)
    low = fixed_peak_bytes(profile)
    for budget in np.linspace(low, peaks.max(), 16 if n > 8 else 24).astype(int).tolist():
        for quantum in (1, 4096):
            plan = make_plan(profile, budget, AutoCheckpointConfig(budget_gb=1, quantum_bytes=quantum))
            assert plan.predicted_peak_bytes == replay_peak_bytes(profile, plan.checkpointed) <= budget
            best_at_budget = recompute[peaks <= budget].min()
            best_a_quantum_per_candidate_below = recompute[peaks <= budget - n * quantum].min(initial=np.inf)
            assert plan.recompute_seconds >= best_at_budget - 1e-12  # the oracle is right
            assert plan.recompute_seconds <= best_a_quantum_per_candidate_below + 1e-12, (budget, quantum)


def test_non_nested_plans_are_optimal_at_the_budget_itself():
    """The U-Net's skips are not nested: its 8 candidates are enumerated in bytes, so no quantum is
    lost whatever ``quantum_bytes`` is (the enumeration's oracle is the budget itself)."""
    profile = profiled("unet", seed=3)
    peaks, recompute = every_kept_set(profile)
    enumerated = 0
    for budget in np.linspace(fixed_peak_bytes(profile), peaks.max(), 24).astype(int).tolist():
        plan = make_plan(profile, budget, AutoCheckpointConfig(budget_gb=1, quantum_bytes=1 << 16))
        assert plan.solver_method in ("all-fit", "exact (enumeration)")
        assert plan.recompute_seconds == pytest.approx(recompute[peaks <= budget].min(), abs=1e-12)
        enumerated += plan.solver_method != "all-fit"
    assert enumerated > 15


def test_exact_plan_never_recomputes_more_than_the_additive_plan():
    """The additive bound plus its greedy pass is a feasible plan, so the exact one is at least as good."""
    profile = profiled("mixed", seed=5)
    peaks, _ = every_kept_set(profile)
    worse = 0
    for budget in np.linspace(fixed_peak_bytes(profile), peaks.max(), 20).astype(int).tolist():
        exact = make_plan(profile, budget, AutoCheckpointConfig(budget_gb=1, quantum_bytes=1))
        additive = make_plan(
            profile, budget, AutoCheckpointConfig(budget_gb=1, quantum_bytes=1, solver="ilp")
        )
        assert exact.recompute_seconds <= additive.recompute_seconds + 1e-12
        worse += exact.recompute_seconds < additive.recompute_seconds - 1e-12
    assert worse > 0  # on mixed widths the additive bound does lose somewhere


def test_milp_fallback_matches_enumeration(monkeypatch):
    """Above ``ENUMERATE_MAX_ITEMS`` a non-nested step goes to the MILP (either terms, conditions)."""
    pytest.importorskip("scipy")
    from lightning_ckpt.planning import non_nested as fallback
    from lightning_ckpt.planning.points import peak_points

    profile = profiled("unet", seed=6)
    points, values = peak_points(profile), [m.recompute_seconds for m in profile.modules]
    peaks, _ = every_kept_set(profile)
    for budget in np.linspace(fixed_peak_bytes(profile), peaks.max(), 12).astype(int).tolist():
        enumerated, how = fallback.solve_points(points, values, budget, 64)
        assert how == "enumeration"
        monkeypatch.setattr(fallback, "ENUMERATE_MAX_ITEMS", 0)
        solved, how = fallback.solve_points(points, values, budget, 64)
        monkeypatch.setattr(fallback, "ENUMERATE_MAX_ITEMS", 14)
        assert how == "milp"
        assert np.dot(solved, values) == pytest.approx(np.dot(enumerated, values), rel=1e-9)
        assert fallback._fits(fallback.quantize_points(points, budget, 64), solved[None, :])[0]


def test_a_step_without_candidates_plans_nothing():
    import dataclasses

    from lightning_ckpt.planning import BudgetTooSmallError

    profile = dataclasses.replace(profiled("mixed"), modules=())
    peak = predict_peak_bytes(profile, [])
    assert make_plan(profile, peak).solver_method == "all-fit"
    with pytest.raises(BudgetTooSmallError):
        make_plan(profile, peak - 1)


def test_many_mixed_candidates_are_planned_exactly():
    """No candidate limit: 60 mixed blocks go to the exact solve, which beats or equals the additive
    plan (``dp`` and its keep-more pass) at every budget; both fit."""
    import random

    import torch

    from lightning_ckpt.core.profiler import profile_step
    from tests.hetero_models import Mixed

    rng = np.random.default_rng(0)
    widths, hiddens = rng.choice([32, 48, 64, 96], 60).tolist(), rng.choice([64, 128, 256, 512], 60).tolist()
    torch.manual_seed(0)
    model, x = Mixed(widths, hiddens), torch.randn(32, 16)
    profile = profile_step(model, lambda: model(x), [f"h.{i}" for i in range(60)], "flops", optimizer="sgd")
    seconds = random.Random(0)
    modules = tuple(
        dataclasses.replace(m, recompute_seconds=seconds.uniform(0.001, 0.01)) for m in profile.modules
    )
    profile = dataclasses.replace(profile, modules=modules)
    low, high = fixed_peak_bytes(profile), predict_peak_bytes(profile, [])
    for budget in np.linspace(low, high, 6)[1:-1].astype(int).tolist():
        exact = make_plan(profile, budget, AutoCheckpointConfig(budget_gb=1, quantum_bytes=64))
        additive = make_plan(
            profile, budget, AutoCheckpointConfig(budget_gb=1, quantum_bytes=64, solver="dp")
        )
        assert "prefix" in exact.solver_method and "additive" in additive.solver_method
        assert max(exact.predicted_peak_bytes, additive.predicted_peak_bytes) <= budget
        assert exact.recompute_seconds <= additive.recompute_seconds + 1e-12
