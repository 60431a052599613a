"""Trainer set-ups AutoCheckpoint cannot serve, refused in ``setup`` with a message that says why; the
model's own checkpointing and KV cache taken over for the fit; errors of a recomputation explained."""

from __future__ import annotations

import contextlib

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch.utils.checkpoint import CheckpointError

from lightning_ckpt._compat import (
    COMPILED_MODULE_CLASS,
    compiled_by_lightning,
    strategy_checkpointing_kwargs,
)
from lightning_ckpt.core import wrapping
from lightning_ckpt.core.fsdp2 import check_data_parallel
from lightning_ckpt.core.hf_models import own_checkpointing_off, training_without_cache


def check_trainer(trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
    """Raise for what cannot work; warn where the strategy already checkpoints modules.

    Raises:
        ValueError: manual optimization, a ``torch.compile``-d module, or a ``ModelParallelStrategy``
            with tensor parallelism.
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
    _check_tensor_parallel_size(trainer.strategy)
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


def check_sharding(pl_module: torch.nn.Module) -> None:
    """Once the model is sharded (``configure_model`` has run): FSDP2 data parallelism only.

    Raises:
        ValueError: see :func:`lightning_ckpt.core.fsdp2.check_data_parallel`.
    """
    check_data_parallel(pl_module)


def _check_tensor_parallel_size(strategy: object) -> None:
    """``ModelParallelStrategy`` with a tensor-parallel mesh dimension of 2 or more is refused."""
    if not isinstance(strategy, ModelParallelStrategy):
        return
    mesh = strategy.device_mesh  # made in setup_environment, before the callbacks' setup
    size = mesh["tensor_parallel"].size() if "tensor_parallel" in (mesh.mesh_dim_names or ()) else 1
    if size > 1:
        raise ValueError(
            "AutoCheckpoint plans FSDP2 data parallelism only, got ModelParallelStrategy with a tensor-parallel"
            f" mesh dimension of {size} (tensor_parallel_size={size}): tensor parallelism is not planned for"
            " yet; use tensor_parallel_size=1 and shard with fully_shard over device_mesh['data_parallel']"
        )


def _is_compiled(module: torch.nn.Module) -> bool:
    return type(module).__name__ == COMPILED_MODULE_CLASS
