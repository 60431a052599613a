"""Each option's recompute priced as a step pays it: the block's forward and backward under keep, full
checkpoint and each selective policy, timed interleaved (issue 24).

Priced from the op record alone, a selective option costs its share of the forward's op times plus eager
SAC's overhead, measured apart (a policy that saves nothing against full checkpoint). Both parts
missed: on the example GPT's block one overhead measure gave 2.5, 4.7 or 8.0 ms from run to run (the
difference of two 40 ms runs), and SDPA + all matmuls recomputed 1.3 ms of the op record's forward where
it paid about 4.8 ms over the overhead in the step. :func:`timed_option_times` times every option whole
instead: ``repeats`` interleaved rounds of the real block's forward and backward per option, and prices
each selective option by its extra time over keep as a fraction of the full checkpoint's extra over
keep in the same rounds (SAC's dispatch modes, its cache and its recomputation all in it). The step's
own recompute time of the block, the full checkpoint's price, scales the fraction. A selective option
takes its paired differences with the full checkpoint, round by round, at their upper quartile plus
their interquartile range: the rounds' noise counts against it, so that it is chosen only where it
pays beyond what the measure can tell apart (on the example GPT under load, SDPA only and the top-2
prefix priced 0.98 and 0.94 of the checkpoint at the upper quartile alone were chosen, and that plan
ran 2.5% slower than the block-level one).

Example:
    >>> import torch
    >>> from examples.gpt import Block, GPTConfig
    >>> from lightning_ckpt.core.selective.options import profile_block
    >>> block, x = Block(GPTConfig(n_embd=32, n_head=2)), torch.randn(2, 16, 32, requires_grad=True)
    >>> times = timed_option_times(block, x, profile=profile_block(block, x, repeats=1), repeats=3)
    >>> [o.name for o in times.options][0], times.options[-1].name, times.options[0].recompute_seconds
    ('keep', 'checkpoint', 0.0)
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch.nn as nn

from lightning_ckpt.core.selective.costs import OptionTimes, option_times
from lightning_ckpt.core.selective.measure import interleaved_seconds, option_step
from lightning_ckpt.core.selective.options import BlockOpProfile, BlockOption

__all__ = ["timed_option_times"]


def timed_option_times(
    block: nn.Module,
    *args: Any,
    profile: BlockOpProfile,
    repeats: int = 5,
    clock: Callable[[], float] = time.perf_counter,
    max_prefixes: int = 4,
) -> OptionTimes:
    """:func:`~lightning_ckpt.core.selective.costs.option_times` of ``profile`` with each selective
    option's ``recompute_seconds`` measured whole: the block's forward (``profile.forward_seconds``)
    times its extra over keep as a fraction of the full checkpoint's, both timed on ``block(*args)``.

    Where the full checkpoint measured no slower than keep (nothing to scale by), the op record's prices
    are kept.

    Raises:
        ValueError: if ``repeats`` is not an integer of at least 2 (a quartile needs two rounds).
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 2:
        raise ValueError(f"`repeats` must be an integer of at least 2, got {repeats!r}")
    times = option_times(profile, max_prefixes=max_prefixes)
    runs = {option.name: option_step(block, args, option) for option in times.options}
    seconds = interleaved_seconds(runs, repeats, clock)
    keep, full = (statistics.median(seconds[name]) for name in ("keep", "checkpoint"))
    if full <= keep:
        return times
    priced = tuple(_priced(o, seconds, full - keep, profile.forward_seconds) for o in times.options)
    return dataclasses.replace(times, options=priced)


def _priced(option: BlockOption, seconds: dict[str, list[float]], span: float, forward: float) -> BlockOption:
    """A selective ``option`` with its recompute the forward times its measured fraction of the full
    checkpoint's extra time (``span``), its paired differences at their upper quartile plus their
    interquartile range; keep and full checkpoint as they are."""
    if option.kind != "selective":
        return option
    paired = [s - f for s, f in zip(seconds[option.name], seconds["checkpoint"], strict=True)]
    lower, _, upper = statistics.quantiles(paired, n=4, method="inclusive")
    fraction = (span + upper + (upper - lower)) / span
    return dataclasses.replace(option, recompute_seconds=forward * max(0.0, fraction))
