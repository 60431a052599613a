"""A block's options along its own memory/recompute frontier: keep, full checkpoint, selective policies.

:func:`profile_block` records a block's op calls (:func:`~lightning_ckpt.core.selective.ops.record_ops`),
its forward time and eager selective checkpointing's own overhead; :func:`block_options` turns that into
a short list of :class:`BlockOption`, most saved bytes first, each saving fewer bytes at more recompute
than the one before: keep (autograd's saved tensors, no recompute) at one end, full checkpoint (only the
block's inputs, the whole forward again) at the other, and between them selective policies that save
the outputs of chosen op calls. The candidates between are the named rules people use (SDPA only, SDPA
and every matmul, torchtitan's every-other-matmul) and the prefixes of the savable calls sorted by
recompute seconds per byte. A selective option costs the forward less the share of it the saved calls
take, plus the measured overhead of its dispatch modes; options another one beats on both counts are dropped,
so an option is offered only where it pays.

Example:
    >>> import torch
    >>> from examples.gpt import Block, GPTConfig
    >>> block, x = Block(GPTConfig(n_embd=32, n_head=2)), torch.randn(2, 16, 32, requires_grad=True)
    >>> options = block_options(profile_block(block, x, repeats=1))
    >>> options[0].name, options[-1].name, options[-1].saved_bytes
    ('keep', 'checkpoint', 0)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch.nn as nn

from lightning_ckpt.core.selective.measure import forward_seconds, sac_overhead_seconds
from lightning_ckpt.core.selective.ops import OpCall, record_ops
from lightning_ckpt.core.selective.policy import SelectivePolicy

__all__ = [
    "BlockOpProfile",
    "BlockOption",
    "block_options",
    "named_options",
    "profile_block",
    "ratio_prefixes",
    "selective_option",
]

SDPA_OPS = frozenset(
    {
        "aten._scaled_dot_product_flash_attention_for_cpu.default",
        "aten._scaled_dot_product_flash_attention.default",
        "aten._scaled_dot_product_efficient_attention.default",
        "aten._scaled_dot_product_cudnn_attention.default",
        "aten._flash_attention_forward.default",
        "aten._efficient_attention_forward.default",
    }
)
"""The fused attention kernels (SDPA's dispatch targets on CPU and CUDA)."""

MATMUL_OPS = frozenset({"aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default"})
"""Matrix products: a Linear on CPU or CUDA is ``addmm`` (with bias) or ``mm``; math attention is ``bmm``."""


@dataclasses.dataclass(frozen=True)
class BlockOpProfile:
    """One block measured op by op.

    Attributes:
        calls: its forward's op calls, in order.
        forward_seconds: its whole forward with gradients enabled (a full recomputation runs its calls up
            to torch's early stop: see ``OpCall.recomputed``).
        sac_overhead_seconds: eager selective checkpointing's own cost per forward and backward; None
            when not measured (``profile_block(..., sac_overhead=False)``: options priced by timing each
            whole, see :func:`~lightning_ckpt.core.selective.timing.timed_option_times`).
    """

    calls: tuple[OpCall, ...]
    forward_seconds: float
    sac_overhead_seconds: float | None

    @property
    def keep_bytes(self) -> int:
        """What the block holds for backward when it is kept (the storages autograd saves)."""
        return sum(call.saved_bytes for call in self.calls)

    @property
    def forward_flops(self) -> int:
        return sum(call.flops for call in self.calls)

    def recompute_seconds(self, calls: Sequence[OpCall]) -> float:
        """The forward's time, times the share of the op calls' measured time that ``calls`` take (the
        calls are timed under a dispatch mode, the forward without one)."""
        total = sum(call.seconds for call in self.calls)
        return self.forward_seconds * sum(call.seconds for call in calls) / total if total > 0 else 0.0

    @property
    def recomputed_calls(self) -> list[OpCall]:
        """The calls a full checkpoint's recomputation runs (up to torch's early stop)."""
        return [call for call in self.calls if call.recomputed]


@dataclasses.dataclass(frozen=True)
class BlockOption:
    """One way to run a block: what it holds for backward and what its backward recomputes.

    Attributes:
        name: ``"keep"``, ``"checkpoint"`` or the rule that chose the saved calls.
        kind: ``"keep"``, ``"checkpoint"`` (full) or ``"selective"``.
        saved_bytes: bytes held from forward to backward beyond the block's inputs and output.
        recompute_seconds: backward's extra time (for a selective option, SAC's overhead included).
        recompute_flops: FLOPs recomputed in backward.
        policy: the selective policy (None for keep and full checkpoint).
    """

    name: str
    kind: Literal["keep", "checkpoint", "selective"]
    saved_bytes: int
    recompute_seconds: float
    recompute_flops: int
    policy: SelectivePolicy | None = None


def profile_block(
    block: nn.Module,
    *args: Any,
    repeats: int = 3,
    clock: Callable[[], float] = time.perf_counter,
    sac_overhead: bool = True,
) -> BlockOpProfile:
    """Measure ``block(*args)`` op by op on real tensors (``repeats`` timed runs of each measurement, on
    ``clock``: wall time by default, ``time.process_time`` for CPU time on a shared CPU); with
    ``sac_overhead=False``, not eager SAC's own cost (about a fifth of the work: 0.42 of 2.3 s on the
    example GPT's block with its timed options), which pricing by timing each option whole leaves out.

    It runs forwards and checkpointed backwards; parameter gradients are left untouched, random numbers
    are consumed (restore the RNG state if it matters).
    """
    calls = tuple(record_ops(block, *args, repeats=repeats, clock=clock))
    return BlockOpProfile(
        calls=calls,
        forward_seconds=forward_seconds(block, *args, repeats=repeats, clock=clock),
        sac_overhead_seconds=sac_overhead_seconds(block, *args, repeats=repeats, clock=clock)
        if sac_overhead
        else None,
    )


def selective_option(profile: BlockOpProfile, name: str, chosen: Sequence[OpCall]) -> BlockOption:
    """The option that saves the outputs of ``chosen`` calls (the savable ones) and recomputes the rest.

    Its recompute time is the forward's share of the calls it recomputes (those a full recomputation
    runs, less the saved ones), plus SAC's overhead where measured.
    """
    saved = [call for call in chosen if call.savable]
    recomputed = [call for call in profile.recomputed_calls if call not in saved]
    return BlockOption(
        name=name,
        kind="selective",
        saved_bytes=sum(call.output_bytes for call in saved),
        recompute_seconds=profile.recompute_seconds(recomputed) + (profile.sac_overhead_seconds or 0.0),
        recompute_flops=sum(call.flops for call in recomputed),
        policy=SelectivePolicy(frozenset(call.key for call in saved)),
    )


def _every_other_matmul(calls: Sequence[OpCall]) -> list[OpCall]:
    """torchtitan's rule: SDPA and matmuls saved, except every second matmul (the 2nd, 4th, ...)."""
    matmuls = [call for call in calls if str(call.func) in MATMUL_OPS]
    return [call for call in calls if str(call.func) in SDPA_OPS] + matmuls[::2]


_RULES: dict[str, Callable[[Sequence[OpCall]], list[OpCall]]] = {
    "sdpa": lambda calls: [c for c in calls if str(c.func) in SDPA_OPS],
    "sdpa+matmuls": lambda calls: [c for c in calls if str(c.func) in SDPA_OPS | MATMUL_OPS],
    "sdpa+every other matmul": _every_other_matmul,
}


def named_options(profile: BlockOpProfile) -> dict[str, BlockOption]:
    """Keep, full checkpoint and the named selective rules, dominated or not (a rule that saves nothing
    in this block is left out)."""
    options = {
        "keep": BlockOption("keep", "keep", profile.keep_bytes, 0.0, 0),
        "checkpoint": BlockOption(
            "checkpoint",
            "checkpoint",
            0,
            profile.recompute_seconds(profile.recomputed_calls),
            sum(call.flops for call in profile.recomputed_calls),
        ),
    }
    for name, rule in _RULES.items():
        option = selective_option(profile, name, rule(profile.calls))
        if option.saved_bytes:
            options[name] = option
    return options


def ratio_prefixes(profile: BlockOpProfile, limit: int) -> list[BlockOption]:
    """Prefixes of the savable calls sorted by recompute seconds per saved byte, at most ``limit``."""
    ranked = sorted(
        (c for c in profile.calls if c.savable), key=lambda c: c.seconds / c.output_bytes, reverse=True
    )
    step = max(1, -(-len(ranked) // limit))
    sizes = sorted({*range(step, len(ranked), step), len(ranked)}) if ranked else []
    return [selective_option(profile, f"top {k} by s/byte", ranked[:k]) for k in sizes]


def block_options(profile: BlockOpProfile, *, max_prefixes: int = 8) -> list[BlockOption]:
    """The block's options on its own frontier, most saved bytes (least recompute) first.

    Args:
        profile: from :func:`profile_block`.
        max_prefixes: how many ratio-sorted prefixes to try besides the named rules.

    Raises:
        ValueError: if ``max_prefixes`` is not a positive integer.
    """
    if not isinstance(max_prefixes, int) or max_prefixes < 1:
        raise ValueError(f"`max_prefixes` must be a positive integer, got {max_prefixes!r}")
    candidates = [*named_options(profile).values(), *ratio_prefixes(profile, max_prefixes)]
    candidates.sort(key=lambda o: (o.saved_bytes, o.recompute_seconds, o.kind != "keep"))
    frontier: list[BlockOption] = []
    for option in candidates:  # fewest bytes first: keep one only if it recomputes less than all before
        if not frontier or option.recompute_seconds < frontier[-1].recompute_seconds:
            frontier.append(option)
    return frontier[::-1]
