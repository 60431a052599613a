"""What each option of one block costs in a step: bytes held to its backward, the transient of its
backward, and its share of the block's recompute (issue 24, item 1).

:func:`option_costs` takes a block's options (keep, the named rules, the prefixes of its savable calls by
measured seconds per byte, full checkpoint: :mod:`~lightning_ckpt.core.selective.options`; not pruned
by time, since a plan may be priced in FLOPs) and runs each option once forward and backward on a fake twin of the block (nothing allocated),
counting live storages (:class:`~lightning_ckpt.core.storage.LiveStorageTracker`, as the memory meter
counts them):

- ``held_bytes``: the storages the forward leaves alive beyond its output (autograd's saved tensors when
  kept, a selective checkpoint's cache, nothing but the inputs for a full checkpoint);
- ``transient_bytes``: how much higher the block's own backward peaks, counted from before its forward,
  than the kept block's (a recomputation's outputs and temporaries beside what it held): what the option
  adds at that point of the step's peak on top of the kept block's point (0 for keep; at least 0);
- ``forward_extra_bytes`` and ``backward_extra_bytes`` (selective options): how much higher its forward,
  and its backward counted from before its forward, peak than a full checkpoint's: what it adds at the
  step's checkpointed-forward and recompute points of the block (the planner weighs the two apart).

Times are fractions of the block's forward, SAC's own cost in them, so the step's own measured recompute
time of each block (the full checkpoint's price) scales them; eager SAC's overhead measured apart is
reported beside them (:mod:`~lightning_ckpt.core.selective.timing` times each option whole).

Example:
    >>> import torch
    >>> from examples.gpt import Block, GPTConfig
    >>> from lightning_ckpt.core.selective.options import profile_block
    >>> block, x = Block(GPTConfig(n_embd=32, n_head=2)), torch.randn(2, 16, 32, requires_grad=True)
    >>> costs = option_costs(block, (x,), profile_block(block, x, repeats=1))
    >>> costs[0].name, costs[0].transient_bytes, costs[-1].name, costs[-1].held_bytes
    ('keep', 0, 'checkpoint', 0)
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any, Literal

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from lightning_ckpt._compat import tree_leaves
from lightning_ckpt.core.fake_tensors import fake_model
from lightning_ckpt.core.selective.ops import on_fake_tensors
from lightning_ckpt.core.selective.options import (
    BlockOpProfile,
    BlockOption,
    named_options,
    ratio_prefixes,
)
from lightning_ckpt.core.selective.policy import SelectivePolicy
from lightning_ckpt.core.storage import LiveStorageTracker, unique_storage_bytes

__all__ = ["OptionCost", "OptionTimes", "option_costs", "option_times"]


@dataclasses.dataclass(frozen=True)
class OptionTimes:
    """A block's options and the times that price them: what one rank measures and every rank uses.

    Plain picklable data (no tensors): on several devices rank 0 measures it and broadcasts it, and each
    rank sizes these same options on its own batch, so every rank weighs the same policies at the same
    seconds.

    Attributes:
        options: keep, the selective candidates and full checkpoint (:func:`option_times`).
        forward_seconds: the block's measured forward.
        sac_overhead_seconds: eager SAC's measured cost per call (None: not measured apart).
    """

    options: tuple[BlockOption, ...]
    forward_seconds: float
    sac_overhead_seconds: float | None


@dataclasses.dataclass(frozen=True)
class OptionCost:
    """One option of a block, measured.

    Attributes:
        name: ``"keep"``, ``"checkpoint"`` or the rule that chose the saved calls.
        kind: ``"keep"``, ``"checkpoint"`` or ``"selective"``.
        held_bytes: bytes held from the block's forward to its backward beyond its inputs and output.
        transient_bytes: what its backward's peak adds over the kept block's backward peak (>= 0).
        recompute_share: its backward's extra time as a fraction of the block's forward, SAC's own cost
            included (0 for keep, 1 for full checkpoint; a selective option may cost more than 1).
        overhead_seconds: eager SAC's own cost per call measured apart, reported (0 for keep and full
            checkpoint; already in ``recompute_share``; None when not measured apart).
        recompute_flops: FLOPs recomputed in backward.
        policy: the selective policy (None for keep and full checkpoint).
        forward_extra_bytes: how much higher its forward peaks than a fully checkpointed forward's
            (its cache grows beside the forward's temporaries; 0 for keep and checkpoint): the planner
            adds it at the block's checkpointed-forward point.
        backward_extra_bytes: how much higher its backward peaks, counted from before its forward, than
            a fully checkpointed block's (0 on a GPT block: the cache stands in for what a full
            recomputation remakes; 0 for keep and checkpoint): added at the block's recompute points.
    """

    name: str
    kind: Literal["keep", "checkpoint", "selective"]
    held_bytes: int
    transient_bytes: int
    recompute_share: float
    overhead_seconds: float | None
    recompute_flops: int
    policy: SelectivePolicy | None = None
    forward_extra_bytes: int = 0
    backward_extra_bytes: int = 0

    def recompute_seconds(self, forward_seconds: float) -> float:
        """Backward's extra time for a block whose forward takes ``forward_seconds``."""
        return self.recompute_share * forward_seconds

    @property
    def saved_ops(self) -> tuple[tuple[str, int], ...]:
        """The saved op calls, sorted (empty for keep and full checkpoint)."""
        return tuple(sorted(self.policy.saved)) if self.policy else ()


def option_times(profile: BlockOpProfile, *, max_prefixes: int = 4) -> OptionTimes:
    """The block's options to size (keep first, full checkpoint last) with the times that price them.

    Raises:
        ValueError: if ``max_prefixes`` is not a positive integer.
    """
    options = tuple(_candidates(profile, max_prefixes))
    return OptionTimes(options, profile.forward_seconds, profile.sac_overhead_seconds)


def option_costs(
    block: nn.Module, args: Sequence[Any], profile: BlockOpProfile | OptionTimes, *, max_prefixes: int = 4
) -> list[OptionCost]:
    """Each option of the block with its measured bytes, keep first, full checkpoint last.

    Args:
        block: the module (its fake twin is run: nothing allocated, parameter gradients untouched).
        args: its positional inputs (floating tensors should require gradients, as in training).
        profile: the block's :func:`~lightning_ckpt.core.selective.options.profile_block` record, or
            :func:`option_times` of it (measured on another rank: the same options are sized here).
        max_prefixes: ratio-sorted prefixes to try besides the named rules (with a profile).
    """
    times = profile if isinstance(profile, OptionTimes) else option_times(profile, max_prefixes=max_prefixes)
    options = times.options
    with _fake_run(block, args) as fake_args:  # nothing allocated
        measured = {option.name: _memory(block, fake_args, option) for option in options}
    keep_peak, full_peak = (sum(measured[name][:2]) for name in ("keep", "checkpoint"))
    full_forward = measured["checkpoint"][2]
    costs = [_cost(option, times, *measured[option.name][:2], keep_peak) for option in options]
    return [
        dataclasses.replace(
            c,
            forward_extra_bytes=max(0, measured[c.name][2] - full_forward),
            backward_extra_bytes=max(0, sum(measured[c.name][:2]) - full_peak),
        )
        if c.kind == "selective"
        else c
        for c in costs
    ]


@contextlib.contextmanager
def _fake_run(block: nn.Module, args: Sequence[Any]) -> Iterator[tuple[Any, ...]]:
    """``args`` as ``block``'s fake twin takes them, the twin in place until the block ends; a block of a
    fake model (``lightning-ckpt plan``) runs as it is."""
    if on_fake_tensors(block, args):
        yield tuple(args)
        return
    with fake_model(block) as fake:
        yield fake.fake(tuple(args))


def _candidates(profile: BlockOpProfile, max_prefixes: int) -> list[BlockOption]:
    """Keep, the named rules, the ratio prefixes and full checkpoint, one per distinct saved set, not
    pruned by time (the planner prunes by its own cost, seconds or FLOPs); a selective option that saves
    at least what keep holds is left out (keep beats it at any cost: on the 384 GPT's block the top-8
    prefix saved 50.41 MB where keep holds 47.27, and was timed for nothing)."""
    if not isinstance(max_prefixes, int) or max_prefixes < 1:
        raise ValueError(f"`max_prefixes` must be a positive integer, got {max_prefixes!r}")
    named = named_options(profile)
    keep = named["keep"]
    options = [keep, *(o for o in named.values() if o.kind == "selective")]
    options += [*ratio_prefixes(profile, max_prefixes), named["checkpoint"]]
    distinct: dict[Any, BlockOption] = {}
    for option in options:
        if option.kind == "selective" and option.saved_bytes >= keep.saved_bytes:
            continue  # saves as much as keep holds and recomputes more: never chosen, so never timed
        distinct.setdefault(option.policy.saved if option.policy else option.kind, option)
    return list(distinct.values())


def _cost(option: BlockOption, profile: OptionTimes, held: int, peak: int, keep_peak: int) -> OptionCost:
    """``held`` and ``peak`` as :func:`_memory` gives them; ``keep_peak``: the kept block's backward peak
    counted from before its forward (its held bytes and its backward's rise)."""
    overhead = profile.sac_overhead_seconds if option.kind == "selective" else 0.0
    forward = profile.forward_seconds
    share = 0.0 if option.kind == "keep" else 1.0
    if option.kind == "selective":
        share = max(0.0, option.recompute_seconds / forward) if forward > 0 else 1.0
    return OptionCost(
        name=option.name,
        kind=option.kind,
        held_bytes=0 if option.kind == "checkpoint" else held,
        transient_bytes=max(0, held + peak - keep_peak),
        recompute_share=share,
        overhead_seconds=overhead,
        recompute_flops=option.recompute_flops,
        policy=option.policy,
    )


def _run(block: nn.Module, args: tuple[Any, ...], option: BlockOption) -> Any:
    if option.kind == "keep":
        return block(*args)
    context = {} if option.policy is None else {"context_fn": option.policy.context_fn}
    return checkpoint(block, *args, use_reentrant=False, **context)


def _memory(block: nn.Module, args: tuple[Any, ...], option: BlockOption) -> tuple[int, int, int]:
    """(bytes held after the forward beyond its output, the backward's peak above its start, the
    forward's peak)."""
    inputs = [t for t in (*block.parameters(), *tree_leaves(args)) if isinstance(t, torch.Tensor)]
    inputs = [t for t in inputs if t.requires_grad]
    with torch.enable_grad(), LiveStorageTracker() as tracker:
        out = _run(block, args, option)
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
        forward_peak = tracker.peak_bytes
        held = tracker.live_bytes - unique_storage_bytes(tree_leaves(out))
        grads = [torch.ones_like(t) for t in outputs]
        start = tracker.peak_bytes = tracker.live_bytes
        results = torch.autograd.grad(outputs, inputs, grads, allow_unused=True)
        peak = tracker.peak_bytes - start
        del results, grads, out, outputs
    return held, peak, forward_peak
