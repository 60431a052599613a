"""FSDP: the first step is profiled on a fake full-size twin, so profiling holds to the budget.

Lightning runs FSDP only on GPUs; here the twin path is exercised on CPU: directly against an
``FSDPStrategy`` object (no process group), and inside a fit where the callback is told the strategy is
FSDP (the static memory is then FSDP's over one device, a little above the single-device one), under a
memory cap equal to the budget. The real FSDP run is in ``scripts/gpu_check.py --strategy fsdp``'s reach
only on a GPU machine.
"""

from __future__ import annotations

import dataclasses
import types

import lightning as L
import pytest
import torch
from callback_helpers import tiny_gpt
from lightning.pytorch.strategies import FSDPStrategy
from test_budget_promise import GB, LONG, bounds, capped_fit, exact_budget, loader

from examples.gpt import Block
from lightning_ckpt import AutoCheckpoint
from lightning_ckpt.lightning import profile as profile_module
from lightning_ckpt.lightning.fake_run import profile_training_step
from lightning_ckpt.lightning.fsdp_twin import fsdp_twin_profile
from lightning_ckpt.planning.peak import fixed_peak_bytes

CANDIDATES = [f"transformer.h.{i}" for i in range(4)]


def _trainer(sharding: str = "FULL_SHARD", devices: int = 1) -> types.SimpleNamespace:
    strategy = FSDPStrategy(auto_wrap_policy={Block}, sharding_strategy=sharding)
    strategy.parallel_devices = [torch.device("cpu")] * devices
    return types.SimpleNamespace(precision="32-true", strategy=strategy)


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    return next(iter(loader((32,))))


def test_the_twin_profile_equals_the_live_models_and_its_static_memory_is_sharded():
    model, batch = tiny_gpt(), _batch()
    twin = fsdp_twin_profile(_trainer(devices=4), model, batch, CANDIDATES)
    live = profile_training_step(model, batch, "32-true")
    sizes = [(m.name, m.activation_bytes, m.input_bytes, m.flops) for m in twin.modules]
    assert sizes == [(m.name, m.activation_bytes, m.input_bytes, m.flops) for m in live.modules]
    assert twin.static.strategy == "fsdp FULL_SHARD over 4"
    assert twin.static.param_bytes == -(-live.static.param_bytes // 4)


class NoHparams(L.LightningModule):
    """Takes a built module and saves no hyperparameters: it cannot be rebuilt fake."""

    def __init__(self, gpt: torch.nn.Module) -> None:
        super().__init__()
        self.gpt = gpt


def test_a_module_that_cannot_be_rebuilt_from_its_hyperparameters_falls_back_with_a_warning():
    with pytest.warns(UserWarning, match="cannot build a fake twin of NoHparams .*save_hyperparameters"):
        assert fsdp_twin_profile(_trainer(), NoHparams(tiny_gpt()), _batch(), CANDIDATES) is None


@pytest.mark.parametrize("twin", [True, False], ids=["fake-twin", "real-fallback"])
def test_the_first_fsdp_step_is_profiled_within_the_budget(monkeypatch, twin):
    """On the fake twin the first step fits a device of exactly the budget; the real-tensor fallback
    (the former FSDP path) runs one unchecked step and does not."""
    monkeypatch.setattr(profile_module, "_is_fsdp", lambda trainer: True)
    twin_on_one_device = lambda trainer, pl_module, batch, candidates: fsdp_twin_profile(  # noqa: E731
        _trainer(), pl_module, batch, candidates
    )
    monkeypatch.setattr(profile_module, "fsdp_twin_profile", twin_on_one_device if twin else lambda *_: None)
    if twin:  # FSDP's static memory over one device adds the gathered units: its own minimum
        profile = fsdp_twin_profile(_trainer(), tiny_gpt(), _batch(), CANDIDATES)
        budget = exact_budget(fixed_peak_bytes(dataclasses.replace(profile, zero_grad="after_forward")))
    else:
        budget = bounds().budget("minimum")
    callback = AutoCheckpoint(budget_gb=budget / GB)
    if not twin:
        with pytest.warns(UserWarning), pytest.raises(torch.OutOfMemoryError):
            capped_fit(budget, [callback], loader((LONG,) * 3), max_steps=3)
        return
    trainer, _ = capped_fit(budget, [callback], loader((LONG,) * 3), max_steps=3)
    assert trainer.global_step == 3 and callback.plan.checkpointed
    assert callback.profile.static.strategy == "fsdp FULL_SHARD over 1"
