"""Small models whose blocks differ, profiled on CPU: the cases where an additive bound is loose.

- ``mixed``, ``mixed10``: stacks of 8 and 10 MLP blocks of mixed widths and hidden sizes;
- ``unet``: an encoder-decoder whose decoder blocks also take the matching encoder output (skips);
- ``head``: a block list before a large output head that is a candidate too.
"""

from __future__ import annotations

import dataclasses
import random

import torch
import torch.nn as nn

from lightning_ckpt.core.profile_types import StepProfile
from lightning_ckpt.core.profiler import profile_step

__all__ = ["MODELS", "profiled"]


class MLPBlock(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, width)
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Resize(nn.Module):
    def __init__(self, width_in: int, width_out: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width_in, width_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.proj(x))


class Mixed(nn.Module):
    """Blocks of widths 32..96 with hidden sizes from 1x to 8x: activations differ block to block."""

    def __init__(
        self, widths=(32, 64, 48, 96, 32, 64, 40, 80), hiddens=(64, 512, 96, 384, 256, 64, 320, 160)
    ):
        super().__init__()
        self.h = nn.ModuleList()
        for i, (width, hidden) in enumerate(zip(widths, hiddens, strict=True)):
            prev = widths[i - 1] if i else 16
            self.h.append(nn.Sequential(Resize(prev, width), MLPBlock(width, hidden)))
        self.out = nn.Linear(widths[-1], 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.h:
            x = block(x)
        return self.out(x).square().mean()


class Merge(nn.Module):
    """A decoder block: joins the running tensor and a skip inside the block (the skip is its input)."""

    def __init__(self, width_in: int, width_out: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width_in, width_out)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.proj(torch.cat([x, skip], dim=-1)))


class UNet(nn.Module):
    """Encoder blocks narrowing 64 -> 16, decoder blocks widening back, each decoder block taking the
    matching encoder output as a second input (a skip connection)."""

    def __init__(self, widths=(64, 48, 32, 16)) -> None:
        super().__init__()
        self.enc = nn.ModuleList(Resize(a, b) for a, b in zip((16, *widths[:-1]), widths, strict=True))
        self.dec = nn.ModuleList(Merge(2 * b, a) for a, b in zip((16, *widths[:-1]), widths, strict=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for block in self.enc:
            x = block(x)
            skips.append(x)
        for block, skip in zip(reversed(self.dec), reversed(skips), strict=True):
            x = block(x, skip)
        return x.square().mean()


class Head(nn.Module):
    """Identical blocks, then a head whose activations outweigh several blocks."""

    def __init__(self, n_blocks: int = 6, width: int = 48, vocab: int = 1024) -> None:
        super().__init__()
        self.h = nn.ModuleList(MLPBlock(width, 2 * width) for _ in range(n_blocks))
        self.head = nn.Sequential(nn.Linear(width, vocab), nn.GELU(), nn.Linear(vocab, vocab))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.pad(x, (0, self.h[0].norm.normalized_shape[0] - x.shape[-1]))
        for block in self.h:
            x = block(x)
        return self.head(x).logsumexp(-1).mean()


def _mixed10() -> Mixed:
    return Mixed(
        widths=(24, 96, 32, 64, 48, 128, 40, 32, 72, 56),
        hiddens=(48, 96, 640, 64, 256, 128, 40, 512, 72, 200),
    )


MODELS = {
    "mixed": (Mixed, [f"h.{i}" for i in range(8)]),
    "mixed10": (_mixed10, [f"h.{i}" for i in range(10)]),
    "unet": (UNet, [*(f"enc.{i}" for i in range(4)), *(f"dec.{i}" for i in range(4))]),
    "head": (Head, [*(f"h.{i}" for i in range(6)), "head"]),
}


def profiled(name: str, seed: int = 0, batch: int = 64) -> StepProfile:
    """The model's profile (CPU, FLOPs), with random recompute seconds that differ block to block."""
    torch.manual_seed(seed)
    model_class, candidates = MODELS[name]
    model = model_class()
    x = torch.randn(batch, 16)
    profile = profile_step(model, lambda: model(x), candidates, "flops", optimizer="sgd")
    rng = random.Random(seed)
    modules = tuple(
        dataclasses.replace(m, recompute_seconds=rng.uniform(0.001, 0.01)) for m in profile.modules
    )
    return dataclasses.replace(profile, modules=modules)
