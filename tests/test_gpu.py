"""CUDA-only checks (skipped cleanly without a GPU): allocator-measured peaks, bf16 and FSDP."""

from __future__ import annotations

import pytest
import torch
from callback_helpers import TINY_GPT, fast_trainer, tiny_gpt, token_loader
from lightning.pytorch.callbacks import Callback

from examples.gpt import Block
from lightning_ckpt import AutoCheckpoint
from lightning_ckpt.core.wrapping import is_checkpointed
from lightning_ckpt.planning.peak import fixed_peak_bytes, predict_peak_bytes

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

GB = 1e9
BIG = dict(TINY_GPT, n_embd=256, n_head=4, block_size=256, n_layer=6)


def _budget_between(profile) -> float:
    return (fixed_peak_bytes(profile) + predict_peak_bytes(profile, [])) / 2 / GB


def _fit(callback, extra_callbacks=(), **trainer_kwargs):
    model = tiny_gpt(**BIG)
    trainer = fast_trainer([callback, *extra_callbacks], max_steps=4, accelerator="gpu", **trainer_kwargs)
    trainer.fit(model, train_dataloaders=token_loader(batch_size=8, block_size=BIG["block_size"]))
    return callback


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_cuda_plan_fits_and_prediction_is_close_to_the_allocator_peak(precision):
    probe = _fit(AutoCheckpoint(budget_gb=1000), precision=precision)
    assert (
        abs(probe.plan.measured_peak_bytes - probe.plan.predicted_peak_bytes)
        <= 0.1 * probe.plan.measured_peak_bytes
    )
    callback = _fit(AutoCheckpoint(budget_gb=_budget_between(probe.profile)), precision=precision)
    plan = callback.plan
    assert 0 < len(plan.checkpointed) < BIG["n_layer"]
    assert plan.measured_peak_bytes <= plan.budget_bytes
    assert abs(plan.measured_peak_bytes - plan.predicted_peak_bytes) <= 0.1 * plan.measured_peak_bytes


class InsideFsdpSpy(Callback):
    """Records the raw module names of checkpointed modules while training runs."""

    raw_names: list[str] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.raw_names = [name for name, module in pl_module.named_modules() if is_checkpointed(module)]


def test_fsdp_single_gpu_wraps_inside_fsdp_units():
    from lightning.pytorch.strategies import FSDPStrategy

    probe = _fit(AutoCheckpoint(budget_gb=1000), strategy=FSDPStrategy(auto_wrap_policy={Block}))
    spy = InsideFsdpSpy()
    callback = _fit(
        AutoCheckpoint(budget_gb=_budget_between(probe.profile)),
        strategy=FSDPStrategy(auto_wrap_policy={Block}),
        extra_callbacks=[spy],
    )
    assert spy.raw_names and all(name.endswith("_fsdp_wrapped_module") for name in spy.raw_names)
    assert callback.plan.checkpointed
    assert all(name.startswith("transformer.h.") for name in callback.plan.checkpointed)
    assert callback.plan.measured_peak_bytes <= callback.plan.budget_bytes


def test_fsdp2_single_gpu_fits_and_prediction_is_close_to_the_allocator_peak():
    """ModelParallelStrategy with one data-parallel rank: the example GPT shards itself in configure_model
    (its blocks become FSDP2 units), the callback plans on the sharded twin, the allocator's peak fits."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    def fsdp2():
        return ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=1)

    probe = _fit(AutoCheckpoint(budget_gb=1000), strategy=fsdp2(), use_distributed_sampler=False)
    callback = _fit(
        AutoCheckpoint(budget_gb=_budget_between(probe.profile)),
        strategy=fsdp2(),
        use_distributed_sampler=False,
    )
    plan = callback.plan
    assert 0 < len(plan.checkpointed) < BIG["n_layer"]
    assert plan.measured_peak_bytes <= plan.budget_bytes
    assert abs(plan.measured_peak_bytes - plan.predicted_peak_bytes) <= 0.1 * plan.measured_peak_bytes
    assert callback.profile.static.strategy == "fsdp2 over 1"  # profiled on the sharded twin
