"""FSDP: the step profiled on a fake full-size twin of the model, so that profiling holds to the budget.

Under FSDP the live model's parameters are sharded flat parameters, which have no full-size fake twin. The
twin is built as ``lightning-ckpt plan`` builds a model from a YAML config: the LightningModule's class
called with its saved hyperparameters (``self.save_hyperparameters()``), then its ``configure_model``,
under ``FakeTensorMode`` in the dtype FSDP gathers parameters in. Its training step runs on a CPU copy of
the batch made fake; the static memory is the strategy's sharded one (sharding, world size, wrap policy
and mixed precision read from the live ``FSDPStrategy``). Nothing is allocated on the device.

A module that cannot be rebuilt this way (no saved hyperparameters, a constructor that needs more, a step
that does not run on fake tensors) returns ``None``: the caller falls back to one real, unchecked step
with a warning.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_ckpt._compat import tree_map_only
from lightning_ckpt.core.fsdp2 import user_class
from lightning_ckpt.core.profile_types import StepProfile
from lightning_ckpt.lightning.fake_run import RunProfile, profile_run_on_fake_tensors
from lightning_ckpt.lightning.run_spec import ClassSpec, RunConfig, module_spec

__all__ = ["fsdp_run_config", "fsdp_twin_profile", "twin_profile", "twin_run_config"]


def fsdp_twin_profile(
    trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, candidates: Sequence[str]
) -> StepProfile | None:
    """The memory profile of the step on a fake twin (see above), or ``None`` with a warning."""
    run = fsdp_run_config(trainer, pl_module)
    cpu_batch = tree_map_only(torch.Tensor, lambda t: t.detach().to("cpu"), batch)
    return twin_profile(
        "FSDP", pl_module, candidates, lambda: profile_run_on_fake_tensors(run, None, cpu_batch)
    )


def twin_profile(
    label: str,
    pl_module: pl.LightningModule,
    candidates: Sequence[str],
    profile_twin: Callable[[], RunProfile],
) -> StepProfile | None:
    """The profile ``profile_twin()`` makes of a twin, kept to the live model's ``candidates``; ``None``,
    with a warning naming the strategy (``label``), when the twin cannot be built or profiled or lacks a
    candidate."""
    try:
        profile = profile_twin().profile
    except Exception as error:  # a constructor that needs more than its hparams, a non-fake step, ...
        warnings.warn(
            f"AutoCheckpoint: {label}: cannot build a fake twin of {user_class(pl_module).__name__} from its"
            f" saved hyperparameters ({type(error).__name__}: {error}); call `self.save_hyperparameters()`"
            " in its __init__ so that profiling holds to `budget_gb`",
            stacklevel=3,
        )
        return None
    missing = sorted(set(candidates) - {m.name for m in profile.modules})
    if missing:
        warnings.warn(
            f"AutoCheckpoint: {label}: the fake twin lacks candidate modules {missing[:4]} of the live model",
            stacklevel=3,
        )
        return None
    modules = tuple(m for m in profile.modules if m.name in set(candidates))
    return dataclasses.replace(profile, modules=modules)


def fsdp_run_config(trainer: pl.Trainer, pl_module: pl.LightningModule) -> RunConfig:
    """What ``lightning-ckpt plan`` would read from a config for this fit: the model's class and
    hyperparameters, the precision, devices, nodes and the FSDP strategy's settings.

    Example:
        >>> from lightning.pytorch.strategies import FSDPStrategy
        >>> from examples.gpt import GPT, Block
        >>> trainer = type("T", (), {"precision": "bf16-mixed", "strategy": FSDPStrategy(auto_wrap_policy={Block})})
        >>> run = fsdp_run_config(trainer, GPT(n_layer=2, n_embd=16, n_head=2))
        >>> run.model.class_path, run.model.init_args["n_layer"], run.strategy_name, run.world_size
        ('examples.gpt.GPT', 2, 'fsdp', 1)
    """
    strategy = trainer.strategy
    strategy_args = {
        "sharding_strategy": strategy.sharding_strategy,
        "auto_wrap_policy": strategy.kwargs.get("auto_wrap_policy"),
        "mixed_precision": strategy.mixed_precision_config,
    }
    return twin_run_config(
        trainer, module_spec(pl_module), ClassSpec("lightning.pytorch.strategies.FSDPStrategy", strategy_args)
    )


def twin_run_config(trainer: pl.Trainer, model: ClassSpec, strategy: ClassSpec) -> RunConfig:
    """The run config of a twin: ``model`` trained under ``strategy`` with the live trainer's precision,
    devices and nodes."""
    settings = {
        "precision": str(trainer.precision),
        "devices": int(getattr(trainer.strategy, "num_processes", 1) or 1),
        "num_nodes": int(getattr(trainer.strategy, "num_nodes", 1) or 1),
        "strategy": strategy,
    }
    return RunConfig(model, None, settings, None)
