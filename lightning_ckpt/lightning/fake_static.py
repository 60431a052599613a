"""Per-device static memory of the configured strategy for a model built on fake tensors.

Parameters, gradients, optimizer state and strategy buffers, sized from the fake model's shapes in the
dtypes the precision and the strategy keep them in (:mod:`lightning_ckpt.core.memory.static` has the formulas).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lightning_ckpt.core.memory.optimizer import estimate_optimizer_bytes
from lightning_ckpt.core.memory.static import (
    ModelSizes,
    StaticMemory,
    fsdp_units,
    strategy_static,
    wrap_classes_of,
)
from lightning_ckpt.core.profile_types import StepProfile
from lightning_ckpt.lightning.run_spec import ClassSpec, RunConfig

_HALF = {"bf16": torch.bfloat16, "16": torch.float16}


def param_dtypes(run: RunConfig) -> tuple[torch.dtype, torch.dtype]:
    """(dtype the optimizer's parameters are kept in, dtype the forward sees the parameters in).

    They differ only under FSDP mixed precision, which gathers parameters in the compute dtype.
    """
    precision = run.precision
    prefix, _, kind = precision.partition("-")
    if precision == "64-true":
        master = torch.float64
    elif kind == "true" and prefix in _HALF:
        master = _HALF[prefix]
    else:
        master = torch.float32
    if run.strategy_name == "fsdp":
        return master, _fsdp_param_dtype(run, _HALF.get(prefix, master))
    return master, master


def _fsdp_param_dtype(run: RunConfig, default: torch.dtype) -> torch.dtype:
    mixed = run.strategy_args.get("mixed_precision")
    return getattr(mixed, "param_dtype", None) or default


@dataclass(frozen=True)
class FakeModel:
    """The fake model with its profile and what static memory needs to know about its dtypes."""

    model: torch.nn.Module
    profile: StepProfile
    optimizer: Any
    master_dtype: torch.dtype
    """Dtype the optimizer's (sharded) parameters are kept in."""
    compute_dtype: torch.dtype
    """Dtype the forward sees parameters in (FSDP's gather dtype)."""


def static_memory_of(run: RunConfig, built: FakeModel) -> StaticMemory:
    """The run's strategy's per-device static memory for the fake model."""
    _check_strategy(run)
    if run.strategy_name == "fsdp":
        return _fsdp_memory(run, built)
    single = built.profile.static
    sizes = ModelSizes(single.param_bytes, single.grad_bytes, single.optimizer_bytes, single.buffer_bytes)
    if run.strategy_name == "fsdp2":  # the model ran sharded: its sizes are this rank's shards already
        return strategy_static("fsdp2", sizes, shard_size=run.world_size)
    if run.strategy_name == "ddp":
        bucket_view = bool(run.strategy_args.get("gradient_as_bucket_view"))
        return strategy_static("ddp", sizes, gradient_as_bucket_view=bucket_view)
    return strategy_static("single", sizes)


def _check_strategy(run: RunConfig) -> None:
    strategy = run.trainer.get("strategy") or "auto"
    text = (strategy.class_path if isinstance(strategy, ClassSpec) else str(strategy)).lower()
    if any(word in text for word in ("deepspeed", "xla")):
        raise ValueError(
            f"`strategy` must be single-device, DDP, FSDP or ModelParallelStrategy (FSDP2) to plan (static"
            f" memory is modelled for those only), got {text!r}"
        )


def _fsdp_memory(run: RunConfig, built: FakeModel) -> StaticMemory:
    """Sizes in the sharded (master) dtype, built from the fake model's shapes on the meta device."""
    args = run.strategy_args
    params = list(built.model.parameters())
    master = [
        torch.empty(p.shape, dtype=built.master_dtype, device="meta", requires_grad=p.requires_grad)
        for p in params
    ]
    element_bytes = master[0].element_size() if master else 0
    sizes = ModelSizes(
        param_bytes=sum(p.numel() for p in params) * element_bytes,
        grad_bytes=sum(p.numel() for p in params if p.requires_grad) * element_bytes,
        optimizer_bytes=estimate_optimizer_bytes(master, built.optimizer),
        buffer_bytes=built.profile.static.buffer_bytes,
    )
    given = args.get("sharding_strategy") or "FULL_SHARD"
    sharding = str(getattr(given, "name", given)).upper()  # a ShardingStrategy member or its name
    shard_size = {
        "NO_SHARD": 1,
        "HYBRID_SHARD": run.devices_per_node,
        "_HYBRID_SHARD_ZERO2": run.devices_per_node,
    }
    return strategy_static(
        "fsdp",
        sizes,
        units=fsdp_units(built.model, wrap_classes_of(args.get("auto_wrap_policy"))),
        shard_size=shard_size.get(sharding, run.world_size),
        gather_bytes_per_param=torch.empty((), dtype=built.compute_dtype, device="meta").element_size(),
        sharding=sharding,
    )
