"""LoRA as people train it: adapters from the ``peft`` library (``get_peft_model`` on a tiny Llama built
from its config, dropout on the adapters' input), fitted under a cap equal to the budget, with the
adapters' gradients and the saved adapter's keys as without the callback.

Batches are made before the cap (the loader's tensors are not the step's memory).
"""

from __future__ import annotations

import pytest
import torch
from callback_helpers import assert_within_two_percent, fast_trainer, probe_profile
from real_models import PeftLoRA, padded_token_loader
from test_budget_promise import exact_budget

from lightning_ckpt import AutoCheckpoint
from lightning_ckpt.core.wrapping import apply_checkpointing
from lightning_ckpt.planning.peak import fixed_peak_bytes, predict_peak_bytes
from lightning_ckpt.testing import memory_cap

peft = pytest.importorskip("peft")

LAYERS = [f"model.base_model.model.model.layers.{i}" for i in range(4)]
"""The decoder layers as ``named_modules`` names them through peft's two wrappers."""


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_peft_lora_trains_within_the_budget_at_three_budgets(precision):
    profile = probe_profile(PeftLoRA(), padded_token_loader())
    assert [m.name for m in profile.modules] == LAYERS
    low, high = fixed_peak_bytes(profile), predict_peak_bytes(profile, [])
    if precision == "bf16-mixed":  # the probe above is float32: bf16 has its own bounds
        probe = AutoCheckpoint(budget_gb=1000, measure=False)
        fast_trainer([probe], max_steps=1, precision=precision).fit(
            PeftLoRA(), train_dataloaders=padded_token_loader(1)
        )
        low, high = fixed_peak_bytes(probe.profile), predict_peak_bytes(probe.profile, [])
    for budget in map(exact_budget, (low, (low + high) // 2, high)):
        model, callback, data = PeftLoRA(), AutoCheckpoint(budget_gb=budget / 1e9), padded_token_loader(3)
        keys = list(peft.get_peft_model_state_dict(model.model))
        with memory_cap(budget, model=model) as cap:
            fast_trainer([callback], max_steps=3, precision=precision).fit(model, train_dataloaders=data)
        what = f"peft LoRA {precision} at {budget} B"
        assert callback.plan.predicted_peak_bytes <= budget, what
        assert_within_two_percent(callback.plan.predicted_peak_bytes, cap.peak_bytes, what)
        assert list(peft.get_peft_model_state_dict(model.model)) == keys  # the saved adapter as before
        if budget == exact_budget(low):
            assert list(callback.plan.checkpointed) == LAYERS, what
        elif budget == exact_budget(high):
            assert not callback.plan.checkpointed, what


def test_checkpointed_peft_layers_give_the_plain_adapter_gradients_with_dropout():
    ids, mask = next(iter(padded_token_loader(1)))
    grads = []
    for checkpointed in (False, True):
        model = PeftLoRA(zero_b=False)
        if checkpointed:
            apply_checkpointing(model, LAYERS)
        torch.manual_seed(1)  # the adapters' dropout draws the same masks in both runs
        model.training_step((ids, mask), 0).backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) == 4 * 2 * 2  # A and B on q and v
    for name, grad in grads[0].items():
        assert grad is not None and grad.abs().sum() > 0, name
        torch.testing.assert_close(grads[1][name], grad, msg=name)
