"""Measurements of one block on real tensors: bytes held for backward, forward time, SAC's own cost.

Example:
    >>> import torch
    >>> block = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 4))
    >>> held_bytes(block, torch.randn(2, 4))  # the (2, 8) outputs of the Linear and the GELU
    128
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from lightning_ckpt._compat import tree_leaves
from lightning_ckpt.core.selective.policy import SelectivePolicy
from lightning_ckpt.core.storage import LiveStorageTracker, unique_storage_bytes

__all__ = [
    "device_clock",
    "forward_seconds",
    "held_bytes",
    "interleaved_seconds",
    "option_step",
    "sac_overhead_seconds",
]


def held_bytes(module: nn.Module, *args: Any) -> int:
    """Bytes of the storages ``module(*args)`` creates that are still alive after its forward, its output
    left out: what it holds for backward (autograd's saved tensors, or a selective checkpoint's cache)."""
    with torch.enable_grad(), LiveStorageTracker() as tracker:
        out = module(*args)
        live = tracker.live_bytes
    return live - unique_storage_bytes(tree_leaves(out))


Clock = Callable[[], float]
"""Seconds now: ``time.perf_counter`` (wall time, the default) or ``time.process_time`` (CPU time, for a
shared CPU). Times on a GPU would need a synchronize, which these measurements do not do yet."""


def device_clock(module: nn.Module) -> Clock:
    """The clock to time ``module`` with: this process's CPU time on a CPU, wall time on an accelerator.

    Other jobs on a shared CPU stretch wall time, and eager SAC's overhead is a difference of two such
    times: on the example GPT's block under load average 5, three wall-time measures gave 19.5, 0 and
    0 ms, three CPU-time ones 11.4, 14.0 and 4.1 ms (the bench's CPU-time steps implied about 14).

    Example:
        >>> device_clock(torch.nn.Linear(2, 2)) is time.process_time
        True
    """
    parameter = next(module.parameters(), None)
    on_cpu = parameter is None or parameter.device.type == "cpu"
    return time.process_time if on_cpu else time.perf_counter


def _median_seconds(fn: Callable[[], Any], repeats: int, clock: Clock) -> float:
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def forward_seconds(
    block: nn.Module, *args: Any, repeats: int = 5, clock: Clock = time.perf_counter
) -> float:
    """Median time of ``block(*args)`` with gradients enabled (what a recomputation pays), one warm-up."""
    with torch.enable_grad():
        block(*args)
        return _median_seconds(lambda: block(*args), repeats, clock)


def interleaved_seconds(
    runs: dict[str, Callable[[], Any]], repeats: int, clock: Clock
) -> dict[str, list[float]]:
    """Each run's time in each of ``repeats`` rounds, the runs interleaved (the order rotating each round,
    one warm-up each first): a shared machine's drift falls on every run alike."""
    for run in runs.values():
        run()
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(repeats):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = clock()
            runs[name]()
            seconds[name].append(clock() - start)
    return seconds


def option_step(block: nn.Module, args: tuple[Any, ...], option: Any) -> Callable[[], None]:
    """One forward and backward of ``block`` as ``option`` (a ``BlockOption``: keep, full checkpoint or
    its selective policy) runs it, gradients returned, never accumulated; with gradients enabled."""
    if option.kind == "keep":
        return lambda: _step(block, args, None, checkpointed=False)
    context_fn = option.policy.context_fn if option.policy is not None else None
    return lambda: _step(block, args, context_fn)


def _step(
    block: nn.Module,
    args: tuple[Any, ...],
    context_fn: Callable[[], Any] | None,
    *,
    checkpointed: bool = True,
) -> None:
    """One (checkpointed) forward and backward of ``block``; gradients are returned, never accumulated."""
    options = {} if context_fn is None else {"context_fn": context_fn}
    with torch.enable_grad():
        out = checkpoint(block, *args, use_reentrant=False, **options) if checkpointed else block(*args)
    outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
    inputs = [t for t in (*block.parameters(), *tree_leaves(args)) if isinstance(t, torch.Tensor)]
    inputs = [t for t in inputs if t.requires_grad]
    torch.autograd.grad(outputs, inputs, [torch.ones_like(t) for t in outputs], allow_unused=True)


def sac_overhead_seconds(
    block: nn.Module, *args: Any, repeats: int = 5, clock: Clock = time.perf_counter
) -> float:
    """What eager selective checkpointing costs by itself per call of ``block``: the median forward and
    backward under a policy that saves nothing, minus the same under full checkpointing (both recompute
    everything; the difference is the two dispatch modes). Runs interleaved, the median of the paired
    differences; at least 0."""
    nothing = SelectivePolicy(frozenset()).context_fn
    with torch.enable_grad():
        _step(block, args, None), _step(block, args, nothing)  # warm-up
        differences = []
        for _ in range(repeats):
            full = _median_seconds(lambda: _step(block, args, None), 1, clock)
            differences.append(_median_seconds(lambda: _step(block, args, nothing), 1, clock) - full)
    return max(0.0, statistics.median(differences))
