"""Padded transformers models in a plain loop: the predicted peak equals a live-storage count of the real
step to the byte, with the KV cache off in the profile and in the step, as AutoCheckpoint trains them.

The inputs every layer takes and nothing saves (Llama's 4D mask, T5's position biases, held by the model
to the end of its forward) are counted once however many checkpoints keep them."""

from __future__ import annotations

import pytest
import torch
from real_models import hf_model, padded_token_loader

from lightning_ckpt.core.hf_models import training_without_cache
from lightning_ckpt.core.memory.meter import state_tensors
from lightning_ckpt.core.profiler import profile_step
from lightning_ckpt.core.storage import LiveStorageTracker
from lightning_ckpt.core.wrapping import apply_checkpointing, remove_checkpointing
from lightning_ckpt.planning.peak import predict_peak_bytes

CANDIDATES = {
    "llama": [f"model.layers.{i}" for i in range(4)],
    "t5": [f"{stack}.block.{i}" for stack in ("encoder", "decoder") for i in range(4)],
}


def _measured_peak_bytes(model, step, batch, checkpointed) -> int:
    apply_checkpointing(model, checkpointed)
    try:
        with (
            training_without_cache(model),
            LiveStorageTracker(existing=[*state_tensors(model, None), *batch]) as tracker,
        ):
            step().backward()
    finally:
        remove_checkpointing(model)
        model.zero_grad(set_to_none=True)
    return tracker.peak_bytes


@pytest.mark.parametrize("kind", ["llama", "t5"])
def test_every_checkpointing_choice_is_predicted_to_the_byte(kind):
    pytest.importorskip("transformers")
    torch.manual_seed(0)
    model, names = hf_model(kind), CANDIDATES[kind]
    ids, mask = next(iter(padded_token_loader(num_batches=1)))
    batch = (ids, mask, ids.masked_fill(mask == 0, -100))

    def step():
        return model(input_ids=batch[0], attention_mask=batch[1], labels=batch[2]).loss

    with training_without_cache(model):
        profile = profile_step(model, step, names, "flops", batch=batch)
    model.zero_grad(set_to_none=True)
    for checkpointed in ([], names[:3], names[::2], names):
        predicted = predict_peak_bytes(profile, checkpointed, zero_grad="before_forward")
        assert predicted == _measured_peak_bytes(model, step, batch, checkpointed), (kind, checkpointed)
