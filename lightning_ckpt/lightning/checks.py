"""Trainer set-ups AutoCheckpoint cannot serve, refused in ``setup`` with a message that says why; the
model's own checkpointing and KV cache taken over for the fit; errors of a recomputation explained."""

from __future__ import annotations

import contextlib

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch.utils.checkpoint import CheckpointError

from lightning_ckpt._compat import (
    COMPILED_MODULE_CLASS,
    compiled_by_lightning,
    strategy_checkpointing_kwargs,
)
from lightning_ckpt.core import wrapping
from lightning_ckpt.core.hf_models import own_checkpointing_off, training_without_cache


def check_trainer(trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
    """Raise for what cannot work; warn where the strategy already checkpoints modules.

    Raises:
        ValueError: manual optimization, or a ``torch.compile``-d module.
    """
    if not pl_module.automatic_optimization:
        raise ValueError(
            "AutoCheckpoint needs automatic optimization (`automatic_optimization=True`): it profiles one"
            " extra forward/backward of `training_step`, which with manual optimization would step the optimizer."
        )
    if compiled_by_lightning(pl_module) or any(_is_compiled(m) for m in pl_module.modules()):
        raise ValueError(
            "AutoCheckpoint does not support torch.compile-d modules: wrapping a compiled graph's submodules"
            " after compilation would be ignored or force recompiles. Compile after planning is not supported"
            " yet; remove torch.compile or the callback."
        )
    if strategy_checkpointing_kwargs(trainer.strategy):
        rank_zero_warn(
            "The strategy's own `activation_checkpointing_policy` is set: AutoCheckpoint will not wrap the modules"
            " it already checkpoints (never twice) and plans only the others."
        )


def check_single(trainer: pl.Trainer, callback: pl.Callback) -> None:
    """Refuse a second ``AutoCheckpoint`` on one Trainer (both would wrap the model, each for its budget).

    Raises:
        ValueError: naming the budgets of the callbacks found.
    """
    same = [c for c in trainer.callbacks if type(c) is type(callback)]
    if len(same) > 1:
        budgets = ", ".join(f"budget_gb={c.budget_gb:g}" for c in same)
        raise ValueError(
            f"one AutoCheckpoint per Trainer is allowed, got {len(same)} ({budgets}): keep the one whose"
            " budget is the device's memory"
        )


def take_over_model(pl_module: torch.nn.Module) -> contextlib.ExitStack:
    """For the fit: the model's own (transformers) gradient checkpointing off, and no KV cache in training.

    Returns the stack that undoes both (closed in ``teardown``).
    """
    stack = contextlib.ExitStack()
    stack.callback(own_checkpointing_off(pl_module))
    stack.enter_context(training_without_cache(pl_module))
    return stack


def explain_recompute_error(exception: BaseException) -> None:
    """Add to torch's ``CheckpointError`` which checkpointed module diverged when recomputed, and the fix."""
    name = wrapping.last_recomputed
    if isinstance(exception, CheckpointError) and name is not None:
        note = wrapping.recompute_failure_note(name)
        if note not in getattr(exception, "__notes__", ()):
            exception.add_note(note)


def _is_compiled(module: torch.nn.Module) -> bool:
    return type(module).__name__ == COMPILED_MODULE_CLASS
