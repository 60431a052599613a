"""The baselines ``dp``, ``ilp`` and ``greedy`` plan on the additive bound and say so; ``auto`` (exact under
the peak model) never recomputes more than any of them on the same profile, and ``dp`` and ``ilp``, both
exact on the additive knapsack, agree on its optimum."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from lightning_ckpt.config import AutoCheckpointConfig
from lightning_ckpt.core.profile_types import ModuleProfile, StaticMemory, StepProfile
from lightning_ckpt.planning import make_plan
from lightning_ckpt.planning.additive import additive_knapsack, keep_cost_bytes
from lightning_ckpt.planning.make import item_values
from lightning_ckpt.planning.peak import fixed_peak_bytes, predict_peak_bytes
from lightning_ckpt.solver import quantize
from tests.hetero_models import profiled
from tests.test_planner import MB, hand_profile

BASELINES = ("dp", "ilp", "greedy")


def _random_profile(seed: int) -> StepProfile:
    """2-8 candidates of 1-50 kB (small, so that ``dp``'s full table at one-byte quanta stays small)."""
    rng = random.Random(seed)
    modules = tuple(
        ModuleProfile(
            f"h.{i}", rng.randint(1_000, 50_000), rng.randint(0, 2_000), rng.uniform(0.001, 0.05), 0
        )
        for i in range(rng.randint(2, 8))
    )
    return StepProfile(modules, StaticMemory("single device", 100_000, 0, 0, 0), 5_000, 2_000)


def _profiles():
    """Random hand-made profiles (no timeline) and profiled tiny models whose blocks differ."""
    yield from ((f"random-{seed}", _random_profile(seed)) for seed in range(6))
    yield from ((f"{name}-{seed}", profiled(name, seed=seed)) for name, seed in [("mixed", 0), ("head", 4)])
    yield "unet-3", profiled("unet", seed=3)


@pytest.fixture(scope="module")
def profiles():
    return list(_profiles())


def _budgets(profile, count: int = 8) -> list[int]:
    low, high = fixed_peak_bytes(profile), predict_peak_bytes(profile, [])
    return np.linspace(low, high, count).astype(int).tolist()


def test_auto_never_recomputes_more_than_a_baseline(profiles):
    """``quantum_bytes=1``: the exact plan is optimal in bytes, so no feasible plan beats it."""
    beaten = 0
    for name, profile in profiles:
        for budget in _budgets(profile):
            plans = {
                solver: make_plan(profile, budget, AutoCheckpointConfig(1, solver=solver, quantum_bytes=1))
                for solver in ("auto", *BASELINES)
            }
            for solver, plan in plans.items():
                assert plan.predicted_peak_bytes == predict_peak_bytes(profile, plan.checkpointed) <= budget
                assert plans["auto"].recompute_seconds <= plan.recompute_seconds + 1e-12, (
                    name,
                    budget,
                    solver,
                )
            beaten += plans["auto"].recompute_seconds < plans["dp"].recompute_seconds - 1e-12
    assert beaten > 0  # on the profiled models the additive bound does lose somewhere


def test_dp_and_ilp_agree_on_the_additive_optimum_and_it_is_the_brute_force_one(profiles):
    pytest.importorskip("scipy")
    for name, profile in profiles:
        costs = list(keep_cost_bytes(profile).values())
        values = item_values(profile, "time")
        for budget in _budgets(profile):
            room = budget - fixed_peak_bytes(profile)
            for quantum in (1, 4096):
                dp, ilp, greedy = (
                    additive_knapsack(costs, room, values, method=m, quantum_bytes=quantum) for m in BASELINES
                )
                assert ilp.value == pytest.approx(dp.value, rel=1e-9, abs=1e-12), (name, budget, quantum)
                assert greedy.value <= dp.value + 1e-12
                weights, capacity = quantize(costs, room, quantum)
                best = max(
                    sum(values[i] for i in chosen)
                    for r in range(len(costs) + 1)
                    for chosen in itertools.combinations(range(len(costs)), r)
                    if sum(weights[i] for i in chosen) <= capacity
                )
                assert dp.value == pytest.approx(best, rel=1e-12, abs=1e-15)


def test_a_baseline_plan_says_it_is_a_baseline_on_the_additive_bound():
    profile = hand_profile([10, 20, 30])
    budget = fixed_peak_bytes(profile) + 20 * MB
    for solver in BASELINES:
        plan = make_plan(profile, budget, AutoCheckpointConfig(1, solver=solver))
        assert plan.solver_method == f"{solver} (baseline: additive bound)"
        assert f"solver {solver} (baseline: additive bound) in " in str(plan)
    exact = make_plan(profile, budget)
    assert "baseline" not in exact.solver_method and "baseline" not in str(exact)
