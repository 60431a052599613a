"""Static memory per device by strategy: parameters, gradients, optimizer state, buffers, strategy buffers.

"Static" is what a training step holds besides activations: it does not depend on the checkpointing
choice. One device, DDP and FSDP differ only here; activations are per device in all of them (the batch
is per device). All functions are pure arithmetic on byte counts, except :func:`fsdp_units`, which reads
a model's module tree (real, meta or fake tensors alike).

What is modelled is listed in each :class:`StaticMemory`'s ``modelled``; what is not is
:data:`NOT_MODELLED` (leave headroom for it in ``budget_gb``).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch.nn as nn

from lightning_ckpt._compat import fsdp_policy_classes

__all__ = [
    "NOT_MODELLED",
    "FsdpUnits",
    "ModelSizes",
    "StaticMemory",
    "ddp_static",
    "fsdp_static",
    "fsdp2_static",
    "fsdp_units",
    "single_device_static",
    "strategy_static",
]

NOT_MODELLED: tuple[str, ...] = (
    "CUDA context and kernels loaded (about 0.3-1 GB per GPU, outside PyTorch's allocator)",
    "caching-allocator fragmentation and reserved-but-free blocks",
    "NCCL communication buffers and streams",
    "cuBLAS/cuDNN workspaces",
    "gradient-clipping temporaries (one scalar per parameter; the optimizer step's are modelled)",
    "CPU vs GPU kernel differences (the plan is profiled on CPU: autocast op lists, attention backend)",
    "FSDP flat-parameter padding (under one element per rank per unit)",
)
"""Memory a real run also uses that the plan does not predict."""

_FSDP_SHARDINGS = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2", "NO_SHARD")
_RESHARD_AFTER_FORWARD = ("FULL_SHARD", "HYBRID_SHARD")


@dataclass(frozen=True)
class ModelSizes:
    """Bytes of one full (unsharded) replica's training state, in the dtypes training keeps it in."""

    param_bytes: int
    grad_bytes: int
    """Gradients of trainable parameters (same dtype as the parameters)."""
    optimizer_bytes: int
    buffer_bytes: int = 0


@dataclass(frozen=True)
class StaticMemory:
    """Static bytes one device holds under a strategy, by part (see :data:`NOT_MODELLED` for the rest)."""

    strategy: str
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    buffer_bytes: int
    strategy_bytes: int = 0
    """The strategy's own memory: DDP gradient buckets, FSDP's gathered (unsharded) units."""
    modelled: tuple[str, ...] = ()
    not_modelled: tuple[str, ...] = NOT_MODELLED

    @property
    def total_bytes(self) -> int:
        """The sum of the five parts.

        Example:
            >>> StaticMemory("single device", 4, 4, 8, 1, strategy_bytes=2).total_bytes
            19
        """
        return (
            self.param_bytes
            + self.grad_bytes
            + self.optimizer_bytes
            + self.buffer_bytes
            + self.strategy_bytes
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON, with ``total_bytes`` added."""
        return dataclasses.asdict(self) | {"total_bytes": self.total_bytes}


def strategy_static(strategy: str, sizes: ModelSizes, **settings: Any) -> StaticMemory:
    """The per-device static memory of ``sizes`` under ``strategy``: the one place strategies differ.

    Args:
        strategy: ``"single"``, ``"ddp"``, ``"fsdp"`` or ``"fsdp2"``.
        sizes: the single-replica sizes (FSDP: in the dtype the shards are kept in; FSDP2: this rank's
            shards, as a model sharded by ``fully_shard`` holds them).
        settings: the strategy's own (:func:`ddp_static`'s ``gradient_as_bucket_view``;
            :func:`fsdp_static`'s ``units``, ``shard_size``, ``gather_bytes_per_param``, ``sharding``;
            :func:`fsdp2_static`'s ``shard_size``).

    Raises:
        ValueError: for another strategy.

    Example:
        >>> strategy_static("ddp", ModelSizes(400, 400, 800)).total_bytes
        2000
    """
    builders = {"single": single_device_static, "ddp": ddp_static, "fsdp": fsdp_static, "fsdp2": fsdp2_static}
    if strategy not in builders:
        raise ValueError(
            f"`strategy` must be one of {sorted(builders)} to model its memory, got {strategy!r}"
        )
    return builders[strategy](sizes, **settings)


def single_device_static(sizes: ModelSizes) -> StaticMemory:
    """One device holds everything once.

    Example:
        >>> single_device_static(ModelSizes(400, 400, 800, 8)).total_bytes
        1608
    """
    return StaticMemory(
        "single device",
        sizes.param_bytes,
        sizes.grad_bytes,
        sizes.optimizer_bytes,
        sizes.buffer_bytes,
        modelled=("parameters", "gradients", "optimizer state", "buffers"),
    )


def ddp_static(sizes: ModelSizes, *, gradient_as_bucket_view: bool = False) -> StaticMemory:
    """DDP: a full replica per device, plus the gradient buckets (1x the gradients) unless they are views.

    Example:
        >>> ddp_static(ModelSizes(400, 400, 800)).strategy_bytes
        400
        >>> ddp_static(ModelSizes(400, 400, 800), gradient_as_bucket_view=True).strategy_bytes
        0
    """
    bucket_bytes = 0 if gradient_as_bucket_view else sizes.grad_bytes
    bucket_text = (
        "gradient buckets are views of the gradients"
        if gradient_as_bucket_view
        else ("gradient buckets (1x gradients; gradient_as_bucket_view=False)")
    )
    return StaticMemory(
        "ddp",
        sizes.param_bytes,
        sizes.grad_bytes,
        sizes.optimizer_bytes,
        sizes.buffer_bytes,
        strategy_bytes=bucket_bytes,
        modelled=("parameters", "gradients", "optimizer state", "buffers", bucket_text),
    )


def fsdp2_static(local_sizes: ModelSizes, *, shard_size: int) -> StaticMemory:
    """FSDP2 (``fully_shard``): this rank's shards of the parameters, gradients and optimizer state.

    Unlike :func:`fsdp_static` nothing is added for the gathered units: the step is profiled with FSDP2
    itself running (on fake tensors), so its unsharded parameters, unsharded gradients and communication
    buffers are measured where they are live, unit by unit, as activations are.

    Example:
        >>> fsdp2_static(ModelSizes(1000, 1000, 2000, 8), shard_size=4).total_bytes
        4008
    """
    return StaticMemory(
        f"fsdp2 over {shard_size}",
        local_sizes.param_bytes,
        local_sizes.grad_bytes,
        local_sizes.optimizer_bytes,
        local_sizes.buffer_bytes,
        modelled=(
            f"parameters, gradients, optimizer state: this rank's shards (1/{shard_size}, padded as FSDP2 pads)",
            "buffers (replicated)",
            "unsharded parameters and gradients, all-gather and reduce-scatter buffers: measured in the step",
        ),
    )


@dataclass(frozen=True)
class FsdpUnits:
    """Parameter counts of FSDP's units: the root (everything outside wrapped modules) and each wrapped one."""

    root_numel: int
    unit_numels: tuple[int, ...]

    @property
    def total_numel(self) -> int:
        return self.root_numel + sum(self.unit_numels)


def fsdp_units(model: nn.Module, wrap_classes: Collection[type] | None) -> FsdpUnits:
    """Split a model's parameters into FSDP units as ``auto_wrap_policy={classes}`` would.

    Each module of a wrapped class is a unit holding its parameters minus those of nested units; the
    root holds the rest. A parameter shared between modules counts once, in the first unit that has it.

    Example:
        >>> model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 3)))
        >>> fsdp_units(model, {nn.Linear})
        FsdpUnits(root_numel=0, unit_numels=(6, 9))
        >>> fsdp_units(model, None)
        FsdpUnits(root_numel=15, unit_numels=())
    """
    classes = tuple(wrap_classes or ())
    depth = {id(module): name.count(".") for name, module in model.named_modules() if module is not model}
    wrapped = [m for m in model.modules() if id(m) in depth and classes and isinstance(m, classes)]
    seen: set[int] = set()
    numels = {id(m): _take_params(m, seen) for m in sorted(wrapped, key=lambda m: -depth[id(m)])}
    return FsdpUnits(_take_params(model, seen), tuple(numels[id(m)] for m in wrapped))


def _take_params(module: nn.Module, seen: set[int]) -> int:
    numel = 0
    for param in module.parameters():
        if id(param) not in seen:
            seen.add(id(param))
            numel += param.numel()
    return numel


def fsdp_static(
    sizes: ModelSizes,
    units: FsdpUnits,
    *,
    shard_size: int,
    gather_bytes_per_param: int,
    sharding: str = "FULL_SHARD",
) -> StaticMemory:
    """FSDP: parameters, gradients and optimizer state sharded over ``shard_size`` ranks, plus gathered units.

    Gathered (unsharded) parameters are in the compute dtype (``gather_bytes_per_param``: 2 for bf16
    mixed precision). With ``FULL_SHARD``/``HYBRID_SHARD`` the root unit stays gathered for the step
    (FSDP does not reshard the root after forward) and at most two other units are gathered at once
    (the one computing and the one prefetched, the largest counted twice); with ``SHARD_GRAD_OP``
    (and ``NO_SHARD``, conservatively) every unit stays gathered through forward and backward. During
    the reduce-scatter of a unit its unsharded gradient exists too (the largest unit, compute dtype).
    Buffers are not sharded.

    Raises:
        ValueError: for an unknown ``sharding`` or a ``shard_size`` below 1.

    Example:
        >>> sizes = ModelSizes(param_bytes=4000, grad_bytes=4000, optimizer_bytes=8000)
        >>> units = FsdpUnits(root_numel=200, unit_numels=(400, 400))
        >>> static = fsdp_static(sizes, units, shard_size=4, gather_bytes_per_param=2)
        >>> static.param_bytes, static.optimizer_bytes, static.strategy_bytes  # 2*(200 + 2*400 + 400)
        (1000, 2000, 2800)
        >>> fsdp_static(sizes, units, shard_size=4, gather_bytes_per_param=2, sharding="SHARD_GRAD_OP").strategy_bytes
        2800
    """
    if sharding not in _FSDP_SHARDINGS:
        raise ValueError(f"`sharding` must be one of {_FSDP_SHARDINGS}, got {sharding!r}")
    if not isinstance(shard_size, int) or shard_size < 1:
        raise ValueError(f"`shard_size` must be a positive integer, got {shard_size!r}")
    largest = max(units.unit_numels, default=0)
    if sharding in _RESHARD_AFTER_FORWARD:
        gathered_numel = units.root_numel + 2 * largest
        gathered_text = "gathered units: the root for the whole step + the largest unit twice (prefetch)"
    else:
        gathered_numel = units.total_numel
        gathered_text = "gathered units: all of them through forward and backward (no reshard after forward)"
    unsharded_grad_numel = max(largest, units.root_numel)
    strategy_bytes = (gathered_numel + unsharded_grad_numel) * gather_bytes_per_param
    return StaticMemory(
        f"fsdp {sharding} over {shard_size}",
        _shard(sizes.param_bytes, shard_size),
        _shard(sizes.grad_bytes, shard_size),
        _shard(sizes.optimizer_bytes, shard_size),
        sizes.buffer_bytes,
        strategy_bytes=strategy_bytes,
        modelled=(
            f"parameters, gradients, optimizer state sharded 1/{shard_size}",
            "buffers (replicated)",
            f"{gathered_text}, in the compute dtype",
            "the unsharded gradient of the largest unit during its reduce-scatter",
        ),
    )


def _shard(total_bytes: int, shard_size: int) -> int:
    return math.ceil(total_bytes / shard_size)


def wrap_classes_of(policy: Any) -> Sequence[type] | None:
    """The module classes of an ``auto_wrap_policy`` given as classes, class paths or a ``ModuleWrapPolicy``.

    Raises:
        ValueError: for a policy that is not one of these (a callable policy cannot be read).

    Example:
        >>> wrap_classes_of(["torch.nn.Linear"]), wrap_classes_of(None)
        ([<class 'torch.nn.modules.linear.Linear'>], None)
    """
    if policy is None:
        return None
    classes = fsdp_policy_classes(policy)
    if classes is not None:
        return classes
    if isinstance(policy, (set, frozenset, list, tuple)):
        return [_load_class(item) for item in policy]
    raise ValueError(
        "`auto_wrap_policy` must be a set of module classes (or class paths) to plan offline,"
        f" got {type(policy).__name__}"
    )


def _load_class(item: Any) -> type:
    if isinstance(item, type):
        return item
    module_name, _, class_name = str(item).rpartition(".")
    return getattr(importlib.import_module(module_name), class_name)
