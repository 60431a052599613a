"""FSDP2 (``ModelParallelStrategy``): the step profiled on a fake twin sharded as the live model is.

The live model's parameters are ``DTensor`` shards and its forward runs FSDP2's hooks, which gather and
reshard real tensors: it cannot be run on fake tensors as it is. The twin is the LightningModule's class
called with its saved hyperparameters (``self.save_hyperparameters()``) under ``FakeTensorMode``, given the
live device mesh, then its own ``configure_model``: the user's ``fully_shard`` calls shard it as the live
model is sharded (units, ``reshard_after_forward``, ``MixedPrecisionPolicy``; an int
``reshard_after_forward`` reshards to the live model's own smaller meshes), and FSDP2 runs its step for
real on fake tensors, collectives included (they move no data). So the profile holds this rank's shards,
and, where they are live, the unsharded parameters of each unit gathered and prefetched, the unsharded
gradients and the all-gather and reduce-scatter buffers. Nothing is allocated.

A module that cannot be rebuilt this way (no saved hyperparameters, a constructor that needs more, a
twin whose parameters differ from the live ones, a step that does not run on fake tensors) returns
``None``: the caller falls back to one real, unchecked step with a warning.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_ckpt._compat import lightning_device_mesh
from lightning_ckpt.core.fsdp2 import post_forward_meshes, user_class
from lightning_ckpt.core.profile_types import StepProfile
from lightning_ckpt.lightning.fake_run import RunProfile, profile_run_on_fake_tensors
from lightning_ckpt.lightning.fsdp_twin import twin_profile, twin_run_config
from lightning_ckpt.lightning.run_spec import ClassSpec, RunConfig, module_spec

__all__ = ["fsdp2_run_config", "fsdp2_twin_profile"]


def fsdp2_twin_profile(
    trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, candidates: Sequence[str]
) -> StepProfile | None:
    """The memory profile of the step on the sharded fake twin (see above), or ``None`` with a warning."""
    run = fsdp2_run_config(trainer, pl_module)
    mesh = lightning_device_mesh(pl_module)

    def profile_twin() -> RunProfile:
        with post_forward_meshes(pl_module):  # `reshard_after_forward=N`: the live N-rank meshes
            profiled = profile_run_on_fake_tensors(
                run, list(candidates), batch, device_mesh=mesh, plugin=trainer.precision_plugin
            )
        _check_same_parameters(profiled, pl_module)
        return profiled

    return twin_profile("FSDP2", pl_module, candidates, profile_twin)


def fsdp2_run_config(trainer: pl.Trainer, pl_module: pl.LightningModule) -> RunConfig:
    """What ``lightning-ckpt plan`` would read from a config for this fit: the model's class and
    hyperparameters, the precision, devices, nodes and ``ModelParallelStrategy``."""
    strategy = ClassSpec("lightning.pytorch.strategies.ModelParallelStrategy")
    return twin_run_config(trainer, module_spec(pl_module, user_class(pl_module)), strategy)


def _check_same_parameters(profiled: RunProfile, pl_module: torch.nn.Module) -> None:
    """Raise if the twin has another number of parameters than the live model (changed after __init__)."""
    live = sum(p.numel() for p in pl_module.parameters())  # a DTensor's numel is its global one
    if profiled.num_parameters != live:
        raise ValueError(f"the twin has {profiled.num_parameters} parameters, the live model {live}")
