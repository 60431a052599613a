"""Each option's recompute priced as a step pays it: the block's forward and backward under keep, full
checkpoint and each selective policy, timed interleaved (issue 24).

Priced from the op record alone, a selective option costs its share of the forward's op times plus eager
SAC's overhead, measured apart (a policy that saves nothing against full checkpoint). Both parts
missed: on the example GPT's block one overhead measure gave 2.5, 4.7 or 8.0 ms from run to run (the
difference of two 40 ms runs), and SDPA + all matmuls recomputed 1.3 ms of the op record's forward where
it paid about 4.8 ms over the overhead in the step. :func:`timed_option_times` times every option whole
instead: ``repeats`` interleaved rounds of the real block's forward and backward per option, and prices
each selective option by its extra time over keep as a fraction of the full checkpoint's extra over
keep (SAC's dispatch modes, its cache and its recomputation all in it). The step's own recompute time of
the block, the full checkpoint's price, scales the fraction.

Each run counts at its fastest round: a shared machine only ever adds time, so the fastest round is the
least disturbed one, as ``timeit`` and the block-level profile take it. A selective option then pays one
standard error more, the interquartile range of its paired differences with the full checkpoint over
the square root of the rounds: it is chosen only where it pays beyond what the rounds can tell apart.
On the 6-block n_embd 384 GPT's block (every window of 5 of 9 and of 15 rounds), the upper quartile plus
the whole interquartile range this replaced priced SDPA + all matmuls at 0.80-1.02 of the checkpoint on
average and SDPA + every other matmul at 0.77-1.02, above what full-step benchmarks measured for them
(about keep's time); at their fastest rounds they priced 0.12-0.37 and 0.32-0.36.

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
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch.nn as nn

from lightning_ckpt.core.selective.costs import OptionTimes, option_times
from lightning_ckpt.core.selective.measure import interleaved_seconds, option_step, sac_overhead_seconds
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

    Where the full checkpoint's fastest round was no slower than keep's (nothing to scale by), the op
    record's prices are kept, eager SAC's overhead in them (measured here when ``profile`` was made
    without it: ``profile_block(..., sac_overhead=False)``, as the callback makes it).

    Raises:
        ValueError: if ``repeats`` is not an integer of at least 2 (a quartile needs two rounds).
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 2:
        raise ValueError(f"`repeats` must be an integer of at least 2, got {repeats!r}")
    times = option_times(profile, max_prefixes=max_prefixes)
    runs = {option.name: option_step(block, args, option) for option in times.options}
    seconds = interleaved_seconds(runs, repeats, clock)
    keep, full = (min(seconds[name]) for name in ("keep", "checkpoint"))
    if full <= keep and profile.sac_overhead_seconds is None:
        overhead = sac_overhead_seconds(block, *args, repeats=repeats, clock=clock)
        return option_times(
            dataclasses.replace(profile, sac_overhead_seconds=overhead), max_prefixes=max_prefixes
        )
    if full <= keep:
        return times
    priced = tuple(_priced(o, seconds, keep, full - keep, profile.forward_seconds) for o in times.options)
    return dataclasses.replace(times, options=priced)


def _priced(
    option: BlockOption, seconds: dict[str, list[float]], keep: float, span: float, forward: float
) -> BlockOption:
    """A selective ``option`` with its recompute the forward times its fraction of the full checkpoint's
    extra time over keep (``span``, fastest rounds): its fastest round over ``keep``'s, plus the
    interquartile range of its paired differences with the checkpoint over the square root of the
    rounds; keep and full checkpoint as they are."""
    if option.kind != "selective":
        return option
    rounds = seconds[option.name]
    paired = [s - f for s, f in zip(rounds, seconds["checkpoint"], strict=True)]
    lower, _, upper = statistics.quantiles(paired, n=4, method="inclusive")
    fraction = (min(rounds) - keep + (upper - lower) / math.sqrt(len(rounds))) / span
    return dataclasses.replace(option, recompute_seconds=forward * max(0.0, fraction))
