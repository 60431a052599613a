"""Optimizer state bytes: measured when the optimizer has state, else estimated from its type."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

import torch

from lightning_ckpt.core.storage import local_bytes, unique_storage_bytes

__all__ = ["estimate_optimizer_bytes"]

_STATE_COPIES = {
    "adam": 2,
    "adamw": 2,
    "nadam": 2,
    "radam": 2,
    "adamax": 2,
    "adadelta": 2,
    "adagrad": 1,
    "rmsprop": 1,
}
_STEP_SCALAR_BYTES = 4  # Adam-style optimizers keep a float32 ``step`` tensor per parameter


def estimate_optimizer_bytes(params: Iterable[torch.Tensor], optimizer: Any = None) -> int:
    """Bytes of optimizer state for ``params``: measured if the optimizer has state, else estimated.

    Estimates by type: Adam family 2 copies of the parameters (3 with ``amsgrad``) plus a step scalar
    each, SGD 1 copy with momentum (a class or name cannot tell, so 1) and 0 without, Adagrad and RMSprop
    1; ``None`` means no optimizer (0); anything else warns and assumes 2 copies.

    Example:
        >>> params = [torch.zeros(10, requires_grad=True)]
        >>> estimate_optimizer_bytes(params, "AdamW"), estimate_optimizer_bytes(params, torch.optim.SGD(params, lr=1.0))
        (84, 0)
    """
    params = [p for p in params if p.requires_grad]
    if optimizer is None:
        return 0
    if isinstance(optimizer, torch.optim.Optimizer) and optimizer.state:
        return unique_storage_bytes(t for state in optimizer.state.values() for t in state.values())
    param_bytes = sum(local_bytes(p) for p in params)  # a DTensor's state is as sharded as it is
    kind = _optimizer_kind(optimizer)
    copies = _state_copies(kind, optimizer)
    step_bytes = _STEP_SCALAR_BYTES * len(params) if kind.startswith(("adam", "nadam", "radam")) else 0
    return copies * param_bytes + step_bytes


def _optimizer_kind(optimizer: Any) -> str:
    if isinstance(optimizer, str):
        return optimizer.lower()
    if isinstance(optimizer, type):
        return optimizer.__name__.lower()
    return type(optimizer).__name__.lower()


def _state_copies(kind: str, optimizer: Any) -> int:
    groups = optimizer.param_groups if isinstance(optimizer, torch.optim.Optimizer) else [{}]
    if kind == "sgd":
        return int(any(group.get("momentum", 1) != 0 for group in groups))
    if kind in _STATE_COPIES:
        return _STATE_COPIES[kind] + int(any(group.get("amsgrad", False) for group in groups))
    warnings.warn(
        f"unknown optimizer {kind!r}: assuming its state is 2 copies of the parameters", stacklevel=3
    )
    return 2
