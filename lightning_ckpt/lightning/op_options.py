"""Each candidate's op-level options inside a fit (``granularity="op"``, issue 24 item 1).

The candidates' inputs are caught in one more forward of the training step under ``torch.no_grad()``
(nothing kept for backward), one input per distinct block: the same class, parameter shapes and input
shapes give the same op calls and bytes, so the blocks of a decoder are measured once. Each distinct
block is then measured alone on real tensors (:func:`~lightning_ckpt.core.selective.costs.option_costs`):
one block's forward and backward, within any budget the step fits at all (the fixed peak holds a
checkpointed block's whole recomputation). Times are fractions of the block's forward, each option's
forward and backward timed whole against keep and full checkpoint (the step's own recompute time of
each block scales them). Gradients, buffers and
RNG streams are restored afterwards, as for the step's profile.

On several devices only rank 0 times its blocks; it broadcasts each candidate's options and times
(:class:`~lightning_ckpt.core.selective.costs.OptionTimes`, plain data), and every rank sizes those same
options on its own batch (a fake twin, nothing allocated): every rank weighs the same policies at the
same seconds, each with its own bytes. It is a collective: every rank calls it at the same step.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn as nn

from lightning_ckpt._compat import tree_flatten, tree_leaves, tree_map_only, tree_unflatten
from lightning_ckpt.core.fake_tensors import fake_model
from lightning_ckpt.core.fsdp2 import iteration_state_reset
from lightning_ckpt.core.names import resolve_modules
from lightning_ckpt.core.selective.costs import OptionCost, OptionTimes, option_costs
from lightning_ckpt.core.selective.measure import device_clock
from lightning_ckpt.core.selective.ops import record_ops
from lightning_ckpt.core.selective.options import BlockOption, profile_block
from lightning_ckpt.core.selective.policy import SelectivePolicy
from lightning_ckpt.core.selective.timing import timed_option_times
from lightning_ckpt.core.wrapping import checkpointing_removed
from lightning_ckpt.lightning.plain_blocks import plain_blocks
from lightning_ckpt.lightning.ranks import run_on_rank, run_together
from lightning_ckpt.lightning.step import no_gradient_sync, training_loss_fn, untouched_training_state
from lightning_ckpt.planning.plan import CheckpointPlan

__all__ = ["caught_inputs", "options_in_fit", "prepared_block", "saved_options_in_fit"]


class _Called(nn.Module):
    """``block`` called with its keyword arguments' tensors passed positionally after its own inputs
    (so that a fake twin's run sees them fake, as it sees the inputs), the rest of them fixed; a policy's
    op counts see only the block's own ops."""

    def __init__(self, block: nn.Module, num_args: int, kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.block, self.num_args = block, num_args
        self.leaves, self.spec = tree_flatten(kwargs)
        self.tensor_at = [i for i, leaf in enumerate(self.leaves) if isinstance(leaf, torch.Tensor)]

    def inputs(self) -> tuple[torch.Tensor, ...]:
        """The keyword arguments' tensors, in the order :meth:`forward` takes them after the inputs."""
        return tuple(self.leaves[i] for i in self.tensor_at)

    def forward(self, *args: Any) -> Any:
        leaves = list(self.leaves)
        for i, tensor in zip(self.tensor_at, args[self.num_args :], strict=True):
            leaves[i] = tensor
        return self.block(*args[: self.num_args], **tree_unflatten(leaves, self.spec))


def _signature(module: nn.Module, args: tuple, kwargs: dict) -> tuple:
    """What makes two blocks' op records the same: class, parameter shapes, input shapes and dtypes."""
    params = tuple((tuple(p.shape), p.dtype) for p in module.parameters())
    leaves = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    return type(module), params, tuple((tuple(t.shape), t.dtype) for t in leaves)


def caught_inputs(
    trainer: pl.Trainer,
    pl_module: pl.LightningModule,
    batch: Any,
    batch_idx: int,
    modules: dict[str, nn.Module],
) -> tuple[dict[str, tuple], dict[tuple, tuple[str, tuple, dict]]]:
    """Each candidate's (``modules``: name -> module) signature, and one candidate per signature with its
    (detached) inputs, caught in a no-grad forward that leaves FSDP2's per-iteration state as it was."""
    signatures: dict[str, tuple] = {}
    first: dict[tuple, tuple[str, tuple, dict]] = {}

    def catch(name: str, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if name in signatures:
            return
        signature = signatures[name] = _signature(module, args, kwargs)
        if signature not in first:
            first[signature] = (
                name,
                *tree_map_only(torch.Tensor, lambda t: t.detach().clone(), (args, kwargs)),
            )

    handles = [
        module.register_forward_pre_hook(lambda m, a, k, n=name: catch(n, m, a, k), with_kwargs=True)
        for name, module in modules.items()
    ]
    try:
        with torch.no_grad(), iteration_state_reset(pl_module):  # FSDP2: the root resharded after it
            training_loss_fn(trainer, pl_module, batch, batch_idx)()
    finally:
        for handle in handles:
            handle.remove()
    return signatures, first


def options_in_fit(
    trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, candidates: Sequence[str]
) -> dict[str, list[OptionCost]]:
    """Candidate name -> its measured options (keep first, full checkpoint last); candidates the step
    did not call are left out (the planner gives them keep and checkpoint only)."""
    modules = resolve_modules(pl_module, list(candidates), argument="candidates")
    with (
        checkpointing_removed(pl_module),
        untouched_training_state(pl_module),
        no_gradient_sync(trainer),
    ):
        caught = functools.partial(caught_inputs, trainer, pl_module, batch, batch_idx, modules)
        signatures, first = run_together(trainer, "catching the blocks' inputs", caught)
        modules = plain_blocks(pl_module, {name: modules[name] for name, _, _ in first.values()})
        times = _rank_zero_times(trainer, modules, signatures, first)
        measured = run_together(
            trainer,
            "sizing the op-level options",
            lambda: {
                signature: _sized(trainer, modules[name], args, kwargs, times[name])
                for signature, (name, args, kwargs) in first.items()
                if name in times
            },
        )
    return {name: measured[signature] for name, signature in signatures.items() if signature in measured}


def _rank_zero_times(
    trainer: pl.Trainer,
    modules: dict[str, nn.Module],
    signatures: dict[str, tuple],
    first: dict[tuple, tuple[str, tuple, dict]],
) -> dict[str, OptionTimes]:
    """Candidate name -> its options and times, measured on rank 0 (broadcast on several devices)."""

    def timed() -> dict[str, OptionTimes]:
        by_signature = {
            signature: _timed(trainer, modules[name], args, kwargs)
            for signature, (name, args, kwargs) in first.items()
        }
        return {name: by_signature[signature] for name, signature in signatures.items()}

    return run_on_rank(trainer, 0, "timing the op-level options", timed)


def prepared_block(trainer: pl.Trainer, block: nn.Module, args: tuple, kwargs: dict):
    """The block as called in the step with all its tensors as positional inputs, its own floating
    inputs requiring gradients as in training, and the step's precision context."""
    args = tuple(
        a.requires_grad_(True) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args
    )
    context = getattr(trainer.precision_plugin, "train_step_context", contextlib.nullcontext)
    if not kwargs:
        return block, args, context()
    called = _Called(block, len(args), kwargs)
    return called, (*args, *called.inputs()), context()


def _timed(trainer: pl.Trainer, block: nn.Module, args: tuple, kwargs: dict) -> OptionTimes:
    """One block's options and their times, measured on real tensors: each option's forward and
    backward timed whole (:func:`~lightning_ckpt.core.selective.timing.timed_option_times`; eager SAC's
    overhead only where that falls back to the op record's prices)."""
    called, args, context = prepared_block(trainer, block, args, kwargs)
    clock = device_clock(block)
    with context:
        profile = profile_block(called, *args, repeats=3, clock=clock, sac_overhead=False)
        return timed_option_times(called, *args, profile=profile, repeats=TIMED_ROUNDS, clock=clock)


TIMED_ROUNDS = 5
"""Interleaved rounds of each option's forward and backward (the fastest of five, and their spread)."""


def _sized(
    trainer: pl.Trainer, block: nn.Module, args: tuple, kwargs: dict, times: OptionTimes
) -> list[OptionCost]:
    """The options of ``times`` sized on this rank's inputs (a fake twin)."""
    called, args, context = prepared_block(trainer, block, args, kwargs)
    with context:
        return option_costs(called, args, times)


def saved_options_in_fit(
    trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, plan: CheckpointPlan
) -> tuple[dict[str, list[OptionCost]], str | None]:
    """A saved op-level plan's own options sized on ``batch`` (a resume: nothing timed, nothing
    allocated), or why they cannot be: a saved op call that is not a savable call of its block's forward
    now (the model's code changed). Not a collective: each rank sizes its own."""
    names = [item.name for item in plan.items]
    saved = {item.name: (item.option, tuple(item.saved_ops)) for item in plan.items if item.saved_ops}
    with (
        checkpointing_removed(pl_module),
        untouched_training_state(pl_module),
        no_gradient_sync(trainer),
    ):
        modules = resolve_modules(pl_module, names, argument="candidates")
        signatures, first = caught_inputs(trainer, pl_module, batch, batch_idx, modules)
        modules = plain_blocks(pl_module, {name: modules[name] for name, _, _ in first.values()})
        measured = {}
        for signature, (name, args, kwargs) in first.items():
            wanted = {saved[n] for n, s in signatures.items() if s == signature and n in saved}
            if not wanted:
                continue
            called, args, context = prepared_block(trainer, modules[name], args, kwargs)
            with context:
                problem = _unmatched_calls(called, args, wanted, name)
                if problem:
                    return {}, problem
                measured[signature] = option_costs(called, args, _saved_times(wanted))
    return {n: measured[s] for n, s in signatures.items() if s in measured}, None


def _unmatched_calls(block: nn.Module, args: tuple, wanted: set, name: str) -> str | None:
    """Why the saved op calls ``wanted`` do not name savable calls of ``block``'s forward (a fake run)."""
    with fake_model(block) as fake:
        savable = {call.key for call in record_ops(block, *fake.fake(args), repeats=1) if call.savable}
    for option, calls in sorted(wanted):
        missing = [call for call in calls if tuple(call) not in savable]
        if missing:
            return (
                f"its saved op calls no longer match the model: {name}'s option {option!r} saves"
                f" {tuple(missing[0])}, which is not a savable call of its forward now"
            )
    return None


def _saved_times(wanted: set) -> OptionTimes:
    """Keep, full checkpoint and the saved selective options, untimed (a resume checks their bytes)."""
    selective = [
        BlockOption(f"{option} [{k}]", "selective", 0, 0.0, 0, SelectivePolicy(frozenset(calls)))
        for k, (option, calls) in enumerate(sorted(wanted))
    ]
    keep = BlockOption("keep", "keep", 0, 0.0, 0)
    return OptionTimes((keep, *selective, BlockOption("checkpoint", "checkpoint", 0, 0.0, 0)), 0.0, 0.0)
