"""Optimizer state bytes (measured when the optimizer has state, else estimated from its type), what an
optimizer step's allocations depend on (:func:`optimizer_step_key`), and the step's temporaries of
torch's own Adam, AdamW and SGD from the parameters' layouts (:func:`known_step_bytes`)."""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

import torch

from lightning_ckpt._compat import default_foreach, is_traceable_wrapper_subclass
from lightning_ckpt.core.storage import local_bytes, unique_storage_bytes

__all__ = ["estimate_optimizer_bytes", "known_step_bytes", "optimizer_step_key"]

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


_FORMULA_TORCH = ("2.13.",)
"""The torch releases whose ``torch/optim/adam.py`` and ``sgd.py`` :func:`known_step_bytes` follows;
on another one it answers ``None`` (the step is measured on fake twins)."""
_STATE_KEYS = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer"}


def known_step_bytes(optimizer: Any) -> int | None:
    """The peak bytes one step of ``optimizer`` allocates beyond what it keeps, from the layouts of its
    parameters, when it is torch's own ``Adam``, ``AdamW`` or ``SGD`` in a setting whose step this follows
    (for-loop or foreach, not fused, capturable, differentiable or maximizing; dense real parameters of
    one layout with their state): what a step of its fake twin measures
    (:func:`~lightning_ckpt.core.fake_tensors.optimizer_step_extra_bytes`, tested equal). ``None``
    otherwise: the caller measures a fake step.

    A for-loop Adam step holds, at parameter ``i``, the previous parameter's ``denom``, the square root
    and its quotient (two copies of parameter ``i``) and, with L2 weight decay (``Adam``), the decayed
    gradient; a foreach step holds its device and dtype group's square roots beside the previous group's.
    SGD holds a gradient-sized temporary for weight decay and one for Nesterov's (for-loop) update.

    Example:
        >>> w, b = torch.zeros(256, 64, requires_grad=True), torch.zeros(64, requires_grad=True)
        >>> known_step_bytes(torch.optim.AdamW([w, b], foreach=False))  # 2 copies of w, then w + 2 b
        131072
        >>> known_step_bytes(torch.optim.AdamW([w, b], foreach=True))  # one copy of each
        65792
        >>> known_step_bytes(torch.optim.Adam([w], maximize=True)) is None
        True
    """
    kind = type(optimizer)
    if kind not in (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD):
        return None
    if not torch.__version__.startswith(_FORMULA_TORCH):
        return None
    peaks = [_group_step_bytes(kind, group, optimizer.state) for group in optimizer.param_groups]
    return None if None in peaks else max(peaks, default=0)


def _group_step_bytes(kind: type, group: Mapping[str, Any], state: Mapping[Any, Any]) -> int | None:
    params = list(group["params"])
    if not params:
        return 0
    if not _plain_setting(group) or not all(_plain_param(p, state.get(p, {})) for p in params):
        return None
    foreach = group.get("foreach")
    foreach = default_foreach(params) if foreach is None else bool(foreach)
    sizes = [p.numel() * p.element_size() for p in params]
    decay = group["weight_decay"] != 0
    if kind is torch.optim.SGD:
        nesterov = bool(group["nesterov"]) and group["momentum"] != 0
        if foreach:  # Nesterov's update runs in place on the gradients
            return max(_layout_totals(params, sizes)) if decay else 0
        return max(size * (int(decay) + int(nesterov)) for size in sizes)
    if foreach:
        totals = _layout_totals(params, sizes)
        if len(totals) > 2:  # which group follows which is torch's to choose
            return None
        pairs = [previous + total for previous, total in zip([0, *totals[:-1]], totals, strict=True)]
        return max(_CPU_STEP_SCALAR_BYTES, *pairs)
    l2 = decay and not group.get("decoupled_weight_decay", kind is torch.optim.AdamW)
    return max(
        previous + (2 + int(l2)) * size for previous, size in zip([0, *sizes[:-1]], sizes, strict=True)
    )


_CPU_STEP_SCALAR_BYTES = 4
"""The ``torch.tensor(1.0)`` a foreach Adam step adds to its CPU ``step`` counts."""


def _layout_totals(params: list[torch.Tensor], sizes: list[int]) -> list[int]:
    """Bytes per (device, dtype) group, in order of first appearance, as foreach steps group them."""
    totals: dict[tuple[str, torch.dtype], int] = {}
    for param, size in zip(params, sizes, strict=True):
        key = (str(param.device), param.dtype)
        totals[key] = totals.get(key, 0) + size
    return list(totals.values())


def _plain_setting(group: Mapping[str, Any]) -> bool:
    """Not fused, capturable, differentiable or maximizing, and no setting a tensor."""
    flags = ("fused", "capturable", "differentiable", "maximize")
    numbers = [group.get(name) for name in ("lr", "weight_decay", "momentum", "eps", "dampening")]
    numbers += list(group.get("betas", ()))
    tensors = any(isinstance(value, torch.Tensor) for value in numbers)
    return not tensors and not any(group.get(flag) for flag in flags)


def _plain_param(param: Any, state: Mapping[str, Any]) -> bool:
    """A dense, contiguous, real (or fake) tensor whose state is its own layout's, with a CPU ``step``."""
    if not isinstance(param, torch.Tensor) or is_traceable_wrapper_subclass(param):
        return False
    if param.layout != torch.strided or param.is_complex() or not param.is_contiguous():
        return False
    if not set(state) <= _STATE_KEYS | {"step"}:
        return False
    step = state.get("step")
    if step is not None and not (
        isinstance(step, torch.Tensor) and step.dim() == 0 and step.device.type == "cpu"
    ):
        return False
    buffers = [state[name] for name in _STATE_KEYS & set(state) if state[name] is not None]
    return all(isinstance(buffer, torch.Tensor) and _same_layout(buffer, param) for buffer in buffers)


def _same_layout(value: torch.Tensor, param: torch.Tensor) -> bool:
    return (value.shape, value.stride(), value.dtype, value.device) == (
        param.shape,
        param.stride(),
        param.dtype,
        param.device,
    )
