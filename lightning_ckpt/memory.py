"""Peak-memory model of a training step for any set of checkpointed candidates, and a real counter.

The prediction replays the backward of the profiled step. For each measured phase (a point of the
backward, see :class:`lightning_ckpt.profiler.BackwardPhase`) it adds the saved storages alive there
under the checkpointing choice and the phase's measured extra (gradients, temporaries); a checkpointed
candidate being recomputed at that point counts as kept. The peak is the largest phase plus the static
bytes (parameters, gradients, optimizer state, buffers).

Knapsack form: for every set ``S`` of checkpointed candidates,
``predict_peak_bytes(p, S) <= fixed_peak_bytes(p) + sum(keep_cost_bytes(p)[m] for m not in S)``,
with equality when ``S`` holds every candidate (``fixed_peak_bytes`` *is* that prediction).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lightning_ckpt._storage import LiveStorageTracker, unique_storage_bytes
from lightning_ckpt._timeline import alive_bytes

if TYPE_CHECKING:
    from lightning_ckpt.profiler import SavedStorage, StepProfile

__all__ = [
    "estimate_optimizer_bytes",
    "fixed_peak_bytes",
    "keep_cost_bytes",
    "measure_peak_bytes",
    "predict_peak_bytes",
    "static_total_bytes",
    "track_peak_bytes",
]

_STATIC_PARTS = ("param_bytes", "grad_bytes", "optimizer_bytes", "buffer_bytes", "strategy_bytes")


def static_total_bytes(parts: Any) -> int:
    """Sum of the static parts (parameters, gradients, optimizer state, buffers and the strategy's
    own memory) of a ``StepProfile`` or a ``StaticMemory``.

    Example:
        >>> from types import SimpleNamespace
        >>> static_total_bytes(SimpleNamespace(param_bytes=4, grad_bytes=4, optimizer_bytes=8,
        ...                                    buffer_bytes=1, strategy_bytes=2))
        19
    """
    return sum(int(getattr(parts, name)) for name in _STATIC_PARTS)


def predict_peak_bytes(profile: StepProfile, checkpointed: Iterable[str]) -> int:
    """Predicted peak bytes of a training step with the candidates ``checkpointed`` checkpointed.

    Raises:
        ValueError: if a name in ``checkpointed`` is not a candidate of ``profile``.
    """
    chosen = _checked(profile, checkpointed)
    if not profile.storages:
        return _predict_from_totals(profile, chosen)
    peak = 0
    for candidate in {phase.candidate for phase in profile.phases}:
        phases = [phase for phase in profile.phases if phase.candidate == candidate]
        held = alive_bytes(profile.storages, [phase.time for phase in phases], chosen - {candidate})
        extra = np.array([phase.extra_bytes for phase in phases], dtype=np.int64)
        peak = max(peak, int((held + extra).max()))
    return profile.static_bytes + peak


def fixed_peak_bytes(profile: StepProfile) -> int:
    """The knapsack's fixed part: the predicted peak with every candidate checkpointed.

    It holds the static bytes, the activations saved outside candidates, the inputs that the checkpoints
    keep, the backward's extra and the recomputation of a checkpointed candidate during its backward.
    """
    return predict_peak_bytes(profile, [module.name for module in profile.modules])


def keep_cost_bytes(profile: StepProfile) -> dict[str, int]:
    """Per candidate, the bytes that keeping its activations adds over checkpointing it (>= 0).

    That is the storages it saves that nothing else holds from the same point on (not an input the
    candidate's own checkpoint would keep, not saved earlier outside the candidates).
    """
    names = [module.name for module in profile.modules]
    if not profile.storages:
        return {m.name: max(m.activation_bytes - m.input_bytes, 0) for m in profile.modules}
    costs = dict.fromkeys(names, 0)
    for storage in profile.storages:
        for owner in {
            owner for owner, seq in storage.saves if owner is not None and not _covered(storage, owner, seq)
        }:
            if owner in costs:
                costs[owner] += storage.nbytes
    return costs


def _covered(storage: SavedStorage, owner: str, seq: int) -> bool:
    """Whether the storage is held from ``seq`` on even when ``owner`` is checkpointed: saved before
    outside the candidates, or an input of an earlier call of ``owner`` (kept by its checkpoint)."""
    by_other = any(o is None and s <= seq for o, s in storage.saves)
    return by_other or any(name == owner and s <= seq for name, s in storage.inputs)


def _checked(profile: StepProfile, checkpointed: Iterable[str]) -> frozenset[str]:
    if isinstance(checkpointed, str):
        raise TypeError(
            f"`checkpointed` must be a collection of candidate names, got the string {checkpointed!r}"
        )
    names = {module.name for module in profile.modules}
    chosen = frozenset(checkpointed)
    unknown = sorted(chosen - names)
    if unknown:
        raise ValueError(
            f"`checkpointed` must hold candidates of the profile {sorted(names)[:6]}, got {unknown[:6]}"
        )
    return chosen


def _predict_from_totals(profile: StepProfile, chosen: frozenset[str]) -> int:
    """For hand-made profiles without a storage timeline: every candidate's saved bytes held at once."""
    held = profile.other_activation_bytes
    recompute = 0
    for module in profile.modules:
        if module.name in chosen:
            held += module.input_bytes
            recompute = max(recompute, module.activation_bytes - module.input_bytes)
        else:
            held += module.activation_bytes
    return profile.static_bytes + held + profile.backward_extra_bytes + recompute


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
    param_bytes = sum(p.numel() * p.element_size() for p in params)
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


class track_peak_bytes:  # noqa: N801 - used like a function: `with track_peak_bytes() as meter`
    """Measure the real peak memory of the code in a ``with`` block; read ``meter.peak_bytes`` after.

    On CUDA: the caching allocator's counters (reset on entry; the peak of everything on the device). On
    any other device (and fake tensors): a dispatch mode that counts the storages created inside the block
    while they live, plus ``baseline_bytes`` (by default the distinct storages of the ``model``'s
    parameters, gradients and buffers and of the ``optimizer``'s state, alive on entry).

    Example:
        >>> with track_peak_bytes(baseline_bytes=100) as meter:
        ...     x = torch.ones(1024)
        ...     y = (x * 2).sum()
        >>> meter.peak_bytes
        8296
    """

    def __init__(
        self,
        device: torch.device | str | None = None,
        *,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        baseline_bytes: int | None = None,
    ) -> None:
        self.device = torch.device(device) if device is not None else _model_device(model)
        self.baseline_bytes = (
            baseline_bytes if baseline_bytes is not None else _baseline_bytes(model, optimizer)
        )
        self.peak_bytes = 0
        self._tracker: LiveStorageTracker | None = None

    def __enter__(self) -> track_peak_bytes:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._tracker = LiveStorageTracker().__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device)
        else:
            self._tracker.__exit__(*exc_info)
            self.peak_bytes = self.baseline_bytes + self._tracker.peak_bytes


def measure_peak_bytes(
    step_fn: Callable[[], Any],
    *,
    device: torch.device | str | None = None,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> int:
    """Run ``step_fn`` once (and ``backward()`` on what it returns, if that requires grad); real peak bytes.

    Gradients are left as the step makes them (the caller zeroes or restores them). See
    :class:`track_peak_bytes` for what is counted on each device.

    Example:
        >>> model = torch.nn.Linear(256, 256)
        >>> x = torch.randn(64, 256)
        >>> measure_peak_bytes(lambda: model(x).square().sum(), model=model) > 0
        True
    """
    with track_peak_bytes(device, model=model, optimizer=optimizer) as meter:
        loss = step_fn()
        if isinstance(loss, torch.Tensor) and loss.requires_grad:
            loss.backward()
    return meter.peak_bytes


def _model_device(model: torch.nn.Module | None) -> torch.device:
    param = next(model.parameters(), None) if model is not None else None
    return param.device if param is not None else torch.device("cpu")


def _baseline_bytes(model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None) -> int:
    tensors: list[Any] = []
    if model is not None:
        params = list(model.parameters())
        tensors += params + [p.grad for p in params] + list(model.buffers())
    if optimizer is not None:
        tensors += [t for state in optimizer.state.values() for t in state.values()]
    return unique_storage_bytes(tensors)
