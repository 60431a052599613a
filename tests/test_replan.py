"""The one re-plan after a measured overshoot, where it cannot make a new plan: the plan in force stays."""

from __future__ import annotations

import pytest
from callback_helpers import fit, probe_profile, tiny_gpt, token_loader

from lightning_ckpt import AutoCheckpoint
from lightning_ckpt.core.memory.meter import track_peak_bytes
from lightning_ckpt.core.wrapping import checkpointed_names
from lightning_ckpt.planning.peak import fixed_peak_bytes, predict_peak_bytes


def _budget_bytes() -> int:
    """Half-way between the fixed peak and the peak with nothing checkpointed: some blocks checkpointed."""
    profile = probe_profile(tiny_gpt(), token_loader())
    return (fixed_peak_bytes(profile) + predict_peak_bytes(profile, [])) // 2


def _overshoot_once(monkeypatch, callback: AutoCheckpoint, measured_bytes: int) -> list[tuple[str, ...]]:
    """The first measured step reads ``measured_bytes``; returns the plan in force at each measurement."""
    real_stop, in_force = track_peak_bytes.stop, []

    def stop(meter):
        in_force.append(callback.plan.checkpointed)
        real = real_stop(meter)
        return measured_bytes if len(in_force) == 1 else real

    monkeypatch.setattr(track_peak_bytes, "stop", stop)
    return in_force


def test_an_overshoot_nothing_fits_under_keeps_the_plan_marked_replanned(monkeypatch):
    budget_bytes = _budget_bytes()
    callback = AutoCheckpoint(budget_gb=budget_bytes / 1e9)
    model = tiny_gpt()
    in_force = _overshoot_once(monkeypatch, callback, 2 * budget_bytes)  # the budget less that: 0
    with pytest.warns(UserWarning, match="cannot re-plan within the budget"):
        fit(model, [callback], max_steps=4)
    assert in_force == [callback.plan.checkpointed], "measured once; the plan in force stayed"
    assert callback.plan.replanned and callback.plan.measured_peak_bytes == 2 * budget_bytes
    assert callback.plan.budget_bytes == budget_bytes, "the user's budget, not the reduced one"
    assert not checkpointed_names(model), "the fit's end unwraps the model"


def test_an_overshoot_whose_shapes_no_longer_profile_keeps_the_plan(monkeypatch):
    budget_bytes = _budget_bytes()
    callback = AutoCheckpoint(budget_gb=budget_bytes / 1e9)
    in_force = _overshoot_once(monkeypatch, callback, budget_bytes + 10_000)
    real_stop = track_peak_bytes.stop

    def forget_profiles(meter):  # as after a resume: the plan's profile was made in another fit
        callback._book.profiles.clear()
        monkeypatch.setattr(callback, "_profile", lambda *args: None)  # the top does not run on fake tensors
        return real_stop(meter)

    monkeypatch.setattr(track_peak_bytes, "stop", forget_profiles)
    with pytest.warns(UserWarning, match="cannot profile again at the plan's shapes"):
        fit(tiny_gpt(), [callback], max_steps=4)
    assert in_force == [callback.plan.checkpointed] and callback.plan.checkpointed
    assert not callback.plan.replanned and callback.plan.measured_peak_bytes == budget_bytes + 10_000
