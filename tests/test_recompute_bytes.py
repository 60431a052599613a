"""A checkpointed block's recomputation in its backward, predicted to the byte against a live-storage count
of the real step, on blocks made to show each thing it holds: an input that nothing inside the block saves
(kept by the checkpoint to the end of the block's backward, as a padded model's mask is), the copies of
BatchNorm's running statistics, and a large temporary after the block's last save (torch's early stop ends
the recomputation before it). And an input that nothing saves, given to every block and alive anyway to
the end of the forward, where the peak is (a no-grad metric): one storage, counted once there however
many checkpoints keep it (it was counted a second time, 8,192 B over, with any block checkpointed). And
the same input freed once the last block returns, before a head whose temporary is the peak only when a
checkpoint keeps that input: the forward's end is a phase of its own (it was 4,096 B under). And a block
that returns what its softmax saved, which the caller holds through the next block's call (as Bloom's loop
holds attention weights): alive there whatever is checkpointed (32,768 B under with the block checkpointed,
before the recorder followed returned tensors). And a block whose output only its own ReLU saves, taken by
the next block's add (which saves nothing) while that block's temporary makes the peak."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from lightning_ckpt.core.memory.meter import state_tensors
from lightning_ckpt.core.profiler import profile_step
from lightning_ckpt.core.storage import LiveStorageTracker
from lightning_ckpt.core.wrapping import apply_checkpointing, remove_checkpointing
from lightning_ckpt.planning.peak import predict_peak_bytes


class _Block(nn.Module):
    def __init__(self, kind: str, width: int = 32) -> None:
        super().__init__()
        self.kind, self.linear = kind, nn.Linear(width, width)
        self.norm = nn.BatchNorm1d(width) if kind == "batchnorm" else nn.Identity()

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        unsaved = self.kind in ("unsaved_input", "alive_anyway", "freed_before_head", "relu_output")
        mixed = x + bias if unsaved else x * bias  # the add saves nothing, the mul both
        if (
            self.kind == "relu_output"
        ):  # only its own ReLU saves the output; the next block's add saves nothing
            return torch.relu(self.linear(mixed))
        h = torch.tanh(self.norm(self.linear(mixed)))
        if self.kind == "late_temporary":  # after the last save: cat and sum save nothing
            return torch.cat([h] * 8).view(8, *h.shape).sum(0)
        if self.kind == "freed_before_head":  # the forward's peak with every block kept: 32 KiB here
            with torch.no_grad():
                self.metric = x.repeat(1, 4).mean()
            return h + x  # a residual add, as transformers' blocks end: the output is not saved here
        if self.kind == "held_output":  # returns what its softmax saved, as Bloom its attention weights
            weights = torch.softmax(h.repeat(1, 4), -1)
            with torch.no_grad():  # a temporary that makes this call's forward the peak when checkpointed
                self.metric = h.repeat(1, 12).mean()
            return h * weights[:, :32], weights
        return h


class _Model(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.kind = kind
        self.blocks = nn.ModuleList(_Block(kind) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = x.detach().mean(0, keepdim=True).expand_as(x).contiguous()  # made here, given to every block
        outputs = None
        for block in self.blocks:  # `outputs` holds a block's weights through the next block's call
            outputs = block(x, bias)
            x = outputs[0] if self.kind == "held_output" else outputs
        if self.kind == "alive_anyway":  # the forward's peak: a large no-grad temporary, bias still alive
            with torch.no_grad():
                self.metric = (x.repeat(1, 64) > bias.repeat(1, 64)).float().mean()
        if self.kind == "freed_before_head":  # bias freed, then 36 KiB: the peak once a checkpoint keeps bias
            del bias
            with torch.no_grad():
                self.metric = x[:, :16].repeat(1, 9).mean()
        return x.square().mean()


def _measured_peak_bytes(model: nn.Module, x: torch.Tensor, checkpointed: list[str]) -> int:
    apply_checkpointing(model, checkpointed)
    try:
        with LiveStorageTracker(existing=[*state_tensors(model, None), x]) as tracker:
            model(x).backward()
    finally:
        remove_checkpointing(model)
        model.zero_grad(set_to_none=True)
    return tracker.peak_bytes


@pytest.mark.parametrize(
    "kind",
    [
        "unsaved_input",
        "batchnorm",
        "late_temporary",
        "alive_anyway",
        "freed_before_head",
        "held_output",
        "relu_output",
    ],
)
def test_every_checkpointing_choice_is_predicted_to_the_byte(kind):
    model, x = _Model(kind), torch.randn(64, 32, requires_grad=False)
    names = [f"blocks.{i}" for i in range(3)]
    profile = profile_step(model, lambda: model(x), names, "flops", batch=x)
    model.zero_grad(set_to_none=True)
    for count in range(4):
        for checkpointed in itertools.combinations(names, count):
            predicted = predict_peak_bytes(profile, checkpointed, zero_grad="before_forward")
            assert predicted == _measured_peak_bytes(model, x, list(checkpointed)), (kind, checkpointed)
