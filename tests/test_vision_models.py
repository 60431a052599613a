"""Vision models this project did not write, from their transformers configs (random weights, nothing
downloaded): Swin (windowed attention with shifted windows, patch merging) and ResNet (basic layers with
BatchNorm, whose running statistics a recomputation holds copies of). Each is trained under
:class:`lightning_ckpt.testing.memory_cap` with the cap equal to the budget, at the advised minimum and at
a budget halfway to the unchecked peak: no step over it, and the prediction within 2% of the measured
peak and not under it."""

from __future__ import annotations

import pytest
from callback_helpers import assert_within_two_percent, probe_profile
from real_models import HFVision, image_loader
from test_real_models import _capped_fit, _middle_budget

from lightning_ckpt.planning.peak import fixed_peak_bytes


@pytest.mark.parametrize("kind", ["swin", "resnet"])
def test_transformers_vision_models_train_within_the_budget_as_predicted(kind):
    profile = probe_profile(HFVision(kind), image_loader())
    assert len(profile.modules) == 2  # the stages of its encoder
    for budget in (fixed_peak_bytes(profile), _middle_budget(profile)):
        callback, peak = _capped_fit(HFVision(kind), image_loader(), budget, steps=3)
        assert callback.plan.checkpointed
        assert peak <= callback.plan.predicted_peak_bytes <= budget
        assert_within_two_percent(callback.plan.predicted_peak_bytes, peak, f"{kind} at {budget} B")


@pytest.mark.parametrize("kind", ["resnet", "swin"])
def test_vision_models_under_bf16_mixed_fit_the_advised_minimum(kind):
    """CPU autocast feeds BatchNorm (ResNet) and LayerNorm (Swin) bf16 activations with float32 weights:
    their saved statistics are float32, and the fake profile must count them so."""
    profile = probe_profile(HFVision(kind), image_loader(), precision="bf16-mixed")
    budget = fixed_peak_bytes(profile)
    callback, peak = _capped_fit(HFVision(kind), image_loader(), budget, steps=3, precision="bf16-mixed")
    assert peak <= callback.plan.predicted_peak_bytes <= budget
    assert_within_two_percent(callback.plan.predicted_peak_bytes, peak, f"{kind} bf16-mixed at {budget} B")
