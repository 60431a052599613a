"""The knapsack planner on hand-made profiles: never over budget, optimal under its bound, clear errors."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest

from lightning_ckpt.config import AutoCheckpointConfig
from lightning_ckpt.core.profile_types import ModuleProfile, StaticMemory, StepProfile
from lightning_ckpt.planning import BudgetTooSmallError, make_plan
from lightning_ckpt.planning.additive import keep_cost_bytes
from lightning_ckpt.planning.peak import fixed_peak_bytes, predict_peak_bytes
from lightning_ckpt.planning.plan import CheckpointPlan

MB = 1_000_000


def hand_profile(activations_mb, inputs_mb=None, seconds=None, static_mb=100) -> StepProfile:
    inputs_mb = inputs_mb or [1] * len(activations_mb)
    seconds = seconds or [0.01 * (i + 1) for i in range(len(activations_mb))]
    modules = tuple(
        ModuleProfile(f"h.{i}", int(a * MB), int(x * MB), s, flops=int(s * 1e12))
        for i, (a, x, s) in enumerate(zip(activations_mb, inputs_mb, seconds, strict=True))
    )
    static = StaticMemory("single device", static_mb * MB, 0, 0, 0)
    return StepProfile(modules, static, other_activation_bytes=5 * MB, backward_extra_bytes=2 * MB)


def test_everything_fits_keeps_everything():
    profile = hand_profile([10, 20, 30])
    plan = make_plan(profile, budget_bytes=10_000 * MB)
    assert plan.checkpointed == () and plan.kept == ("h.0", "h.1", "h.2")
    assert plan.solver_method == "all-fit" and plan.recompute_seconds == 0
    assert plan.predicted_peak_bytes == predict_peak_bytes(profile, [])


def test_budget_below_minimum_names_the_smallest_budget():
    profile = hand_profile([10, 20, 30])
    minimum = fixed_peak_bytes(profile)
    minimum_gb = f"{minimum / 1e9:g}"  # static 100 + other 5 + inputs 3 + backward 2 + recompute 29 MB
    with pytest.raises(
        BudgetTooSmallError, match=rf"`budget_gb`=0\.1 is too small.*budget_gb={minimum_gb}"
    ) as info:
        make_plan(profile, budget_bytes=100 * MB)
    assert info.value.minimum_bytes == minimum
    plan = make_plan(profile, budget_bytes=minimum)  # the named minimum does work
    assert plan.checkpointed == ("h.0", "h.1", "h.2") and plan.predicted_peak_bytes <= minimum


@pytest.mark.parametrize("seed", range(25))
def test_random_budgets_never_over_and_optimal_under_the_bound(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 7)
    profile = hand_profile(
        [rng.uniform(1, 50) for _ in range(n)],
        inputs_mb=[rng.uniform(0, 2) for _ in range(n)],
        seconds=[rng.uniform(0.001, 0.05) for _ in range(n)],
    )
    low, high = fixed_peak_bytes(profile), predict_peak_bytes(profile, [])
    budget = rng.randint(low, high + MB)
    plan = make_plan(profile, budget, AutoCheckpointConfig(budget_gb=1, quantum_bytes=1))
    assert plan.predicted_peak_bytes <= budget
    assert plan.predicted_peak_bytes == predict_peak_bytes(profile, plan.checkpointed)
    # At least as good as the best set that fits under the knapsack's additive bound (brute force).
    names, costs = [m.name for m in profile.modules], keep_cost_bytes(profile)
    seconds = {m.name: m.recompute_seconds for m in profile.modules}
    best = max(
        sum(seconds[n] for n in kept)
        for r in range(n + 1)
        for kept in itertools.combinations(names, r)
        if low + sum(costs[n] for n in kept) <= budget
    )
    assert sum(seconds[n] for n in plan.kept) >= best - 1e-12


def test_coarse_quantum_stays_within_budget_in_bytes():
    profile = hand_profile([10.3, 20.7, 30.1, 5.5], inputs_mb=[0.5, 0.5, 0.5, 0.5])
    budget = fixed_peak_bytes(profile) + 20 * MB
    plan = make_plan(profile, budget, AutoCheckpointConfig(budget_gb=1, quantum_bytes=4 * MB))
    assert plan.predicted_peak_bytes <= budget
    assert 0 < len(plan.checkpointed) < 4


def test_flops_cost_uses_flops_and_plan_round_trips():
    profile = hand_profile([10, 10, 10], seconds=[0.03, 0.01, 0.02])
    plan = make_plan(
        profile, fixed_peak_bytes(profile) + 9 * MB + 1, AutoCheckpointConfig(budget_gb=1, cost="flops")
    )
    assert plan.kept == ("h.0",) and plan.checkpointed == ("h.1", "h.2")
    assert CheckpointPlan.from_dict(plan.to_dict()) == plan
    assert plan.recompute_seconds == pytest.approx(0.03)


def test_saved_mb_is_what_the_knapsack_weighed():
    """The table's "saved MB" of a checkpointed module is the weight the exact plan gave it: the most
    bytes keeping it adds to any point of the peak (here, with no timeline: activations less inputs)."""
    profile = hand_profile([10, 20, 30], inputs_mb=[1, 2, 3])
    plan = make_plan(profile, budget_bytes=fixed_peak_bytes(profile) + 20 * MB)
    weighed = {item.name: item.keep_bytes for item in plan.items}
    assert weighed == {"h.0": 9 * MB, "h.1": 18 * MB, "h.2": 27 * MB}
    rows = {line.split()[0]: line.split() for line in str(plan).splitlines() if line.startswith("h.")}
    for name in plan.checkpointed:
        assert rows[name][2] == f"{weighed[name] / MB:.2f}" and rows[name][-1] == "checkpoint"
    for name in plan.kept:
        assert rows[name][2] == "0.00" and rows[name][-1] == "keep"


def test_a_plan_without_recompute_times_shows_gflop_not_zero_ms():
    """Offline plans have FLOPs but no times: the table says so instead of a column of 0.000 ms."""
    profile = hand_profile([10, 20, 30], seconds=[0.01, 0.02, 0.03])
    untimed = dataclasses.replace(
        profile, modules=tuple(dataclasses.replace(m, recompute_seconds=0.0) for m in profile.modules)
    )
    budget = fixed_peak_bytes(profile) + 20 * MB
    timed_text = str(make_plan(profile, budget))
    untimed_plan = make_plan(untimed, budget, AutoCheckpointConfig(budget_gb=1, cost="flops"))
    untimed_text = str(untimed_plan)
    assert "recompute ms" in timed_text and "GFLOP" not in timed_text
    assert "recompute GFLOP" in untimed_text and "recompute ms" not in untimed_text
    flops = sum(m.flops for m in profile.modules if m.name in untimed_plan.checkpointed)
    assert f"+{flops / 1e9:.3f} GFLOP recompute per step; no recompute times were measured" in untimed_text
