"""Optimizer state bytes (measured when the optimizer has state, else estimated from its type), and
what an optimizer step's allocations depend on (:func:`optimizer_step_key`)."""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

import torch

from lightning_ckpt._compat import is_traceable_wrapper_subclass
from lightning_ckpt.core.storage import local_bytes, unique_storage_bytes

__all__ = ["estimate_optimizer_bytes", "optimizer_step_key"]

_SCHEDULED = frozenset({"lr", "initial_lr", "max_lr", "min_lr", "base_lr"})
"""Settings LR schedulers rewrite every step; torch's optimizers never branch on their value."""

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


def optimizer_step_key(
    param_groups: Sequence[Mapping[str, Any]], states: Sequence[Sequence[Mapping[str, Any]]]
) -> Hashable:
    """What one step of an optimizer allocates depends on, and nothing else: per param group its settings
    (a learning rate by type only: schedulers change its value, no step branches on it), the shape,
    strides, dtype, device and ``requires_grad`` of each parameter, and the same of its state values
    (``states[g][i]``: the state of parameter ``i`` of group ``g``). Real tensors and their fake twins
    give the same key.

    Example:
        >>> w = torch.zeros(4, requires_grad=True)
        >>> sgd = torch.optim.SGD([w], lr=0.1, momentum=0.9)
        >>> key = optimizer_step_key(sgd.param_groups, [[{}]])
        >>> sgd.param_groups[0]["lr"] = 0.05  # a scheduler's change: the same key
        >>> optimizer_step_key(sgd.param_groups, [[{}]]) == key
        True
        >>> optimizer_step_key(sgd.param_groups, [[{"momentum_buffer": torch.zeros(4)}]]) == key
        False
    """
    return tuple(
        (
            tuple(
                (name, _setting_key(value, scheduled=name in _SCHEDULED))
                for name, value in sorted(group.items())
                if name != "params"
            ),
            tuple(_value_key(param) for param in group["params"]),
            tuple(
                tuple((name, _value_key(value)) for name, value in sorted(state.items()))
                for state in group_states
            ),
        )
        for group, group_states in zip(param_groups, states, strict=True)
    )


def _value_key(value: Any) -> Hashable:
    if isinstance(value, torch.Tensor):  # a fake twin as its real tensor; a wrapper (DTensor) by its class
        kind = type(value).__name__ if is_traceable_wrapper_subclass(value) else "tensor"
        layout = (tuple(value.shape), value.stride(), str(value.dtype), str(value.device))
        return (kind, *layout, value.requires_grad)
    return _setting_key(value, scheduled=False)


def _setting_key(value: Any, *, scheduled: bool) -> Hashable:
    if isinstance(value, torch.Tensor):
        return _value_key(value)
    if isinstance(value, (list, tuple)):
        return tuple(_setting_key(item, scheduled=scheduled) for item in value)
    if scheduled and isinstance(value, (int, float)) and not isinstance(value, bool):
        return "number"
    if value is None or isinstance(value, (bool, int, float, str)):
        return (type(value).__name__, value)
    return (type(value).__name__, repr(value))
