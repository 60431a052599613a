"""Run a live model on fake tensors: same shapes, dtypes and devices, no memory, nothing of it touched.

:func:`fake_model` swaps the model's parameters and buffers for fake copies for the duration of a block,
so that profiling a step there measures, byte for byte, what the real step would keep alive, without
allocating any of it. The optimizer step is measured the same way by :func:`optimizer_step_extra_bytes`.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from lightning_ckpt._compat import (
    FakeTensor,
    FakeTensorMode,
    default_foreach,
    grouped_mm_on_fake_tensors,
    tree_map_only,
)
from lightning_ckpt.core.fake_mode import CpuKernelFakeTensorMode
from lightning_ckpt.core.memory.optimizer import known_step_bytes, optimizer_step_key
from lightning_ckpt.core.storage import LiveStorageTracker

__all__ = ["FakeModel", "fake_model", "made_fake", "optimizer_step_extra_bytes"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FakeModel:
    """What :func:`fake_model` yields: the mode and the fake twin of each real tensor."""

    mode: FakeTensorMode
    twins: dict[int, torch.Tensor]
    """``id(real tensor)`` to its fake copy (parameters and buffers)."""

    def fake(self, tree: Any) -> Any:
        """The tensors of ``tree`` (a batch, any nesting) as fake tensors."""
        return tree_map_only(torch.Tensor, self.mode.from_tensor, tree)


@contextlib.contextmanager
def fake_model(model: nn.Module) -> Iterator[FakeModel]:
    """Inside the block, ``model``'s parameters and buffers are fake and ``FakeTensorMode`` is on.

    Tied weights stay tied and a module registered under two names is swapped once; the real tensors,
    their gradients and the model's buffers are untouched, and each is put back in its place on exit,
    also when the block raises.

    Example:
        >>> model = nn.Linear(1024, 1024)
        >>> with fake_model(model) as fake:
        ...     out = model(fake.fake(torch.randn(8, 1024)))
        ...     type(out).__name__, tuple(out.shape), model.weight.grad
        ('FakeTensor', (8, 1024), None)
        >>> type(model.weight).__name__
        'Parameter'
    """
    # the CPU kernels' norm outputs; views, other ops on ATen's and meta kernels
    mode = CpuKernelFakeTensorMode()
    slots = _tensor_slots(model)
    twins = _twins(slots, mode)
    with _swapped(slots, twins), mode, grouped_mm_on_fake_tensors():  # mixture-of-experts models in fp32
        yield FakeModel(mode, twins)


def made_fake(model: nn.Module, mode: FakeTensorMode) -> nn.Module:
    """``model`` with each of its real parameters and buffers replaced, for good, by a fake copy under
    ``mode`` (tied tensors stay tied): for a model built under ``mode`` whose constructor made real tensors
    all the same, as transformers' ``from_pretrained`` does reading weights from disk. Those real tensors
    are then freed with the model's last reference to them.

    Example:
        >>> mode = FakeTensorMode()
        >>> tied = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
        >>> tied[1].weight = tied[0].weight
        >>> fake = made_fake(tied, mode)
        >>> type(fake[0].weight).__name__, fake[0].weight is fake[1].weight
        ('FakeTensor', True)
    """
    slots = [(table, key, t) for table, key, t in _tensor_slots(model) if not isinstance(t, FakeTensor)]
    twins = _twins(slots, mode)
    for table, key, tensor in slots:
        table[key] = twins[id(tensor)]
    return model


def _twins(slots: list[_Slot], mode: FakeTensorMode) -> dict[int, torch.Tensor]:
    """``id(tensor)`` to its fake copy under ``mode``: one per tensor, however many slots hold it."""
    twins: dict[int, torch.Tensor] = {}
    for _, _, tensor in slots:
        if id(tensor) not in twins:
            twins[id(tensor)] = mode.from_tensor(tensor)
    return twins


_Slot = tuple[dict[str, Any], str, torch.Tensor]
"""A module's ``_parameters`` or ``_buffers`` table, a key of it, and the real tensor it holds."""


def _tensor_slots(model: nn.Module) -> list[_Slot]:
    """Every parameter and buffer slot of ``model``, once per module: a module registered under two names
    (``ModuleList([layer] * n)``, an attribute alias) has its slots listed once, not once per name."""
    return [
        (table, key, tensor)
        for module in model.modules()  # unique modules, by identity
        for table in (module._parameters, module._buffers)
        for key, tensor in table.items()
        if tensor is not None
    ]


@contextlib.contextmanager
def _swapped(slots: list[_Slot], twins: dict[int, torch.Tensor]) -> Iterator[None]:
    """Each slot holds its tensor's twin inside the block; after it, the very tensor it held before, put
    back exactly once, whatever the block (or the swap itself) raised."""
    try:
        for table, key, tensor in slots:
            table[key] = twins[id(tensor)]
        yield
    finally:
        for table, key, tensor in slots:
            table[key] = tensor


_measured_steps: weakref.WeakKeyDictionary[torch.optim.Optimizer, dict[Any, int]] = (
    weakref.WeakKeyDictionary()
)
"""Per live optimizer, its steps' temporaries by :func:`optimizer_step_key` (for ``reuse=True``)."""


def optimizer_step_extra_bytes(optimizer: Any, fake: FakeModel, *, reuse: bool = False) -> int:
    """Peak bytes one ``optimizer.step()`` allocates beyond what it keeps (its temporaries), measured on
    fake tensors inside :func:`fake_model`: a twin optimizer of the same class and settings, on the fake
    parameters with fake gradients and state. 0 for no optimizer or one that cannot be twinned (logged).
    Torch's own Adam, AdamW and SGD in their plain settings are not stepped: their temporaries follow
    from the parameters' layouts (:func:`~lightning_ckpt.core.memory.optimizer.known_step_bytes`, tested
    equal to the twin's step), a fake step's 0.1-0.3 s saved on a fit's first plan.

    With ``reuse``, a step measured before for this optimizer is not measured again while nothing it
    depends on has changed (:func:`~lightning_ckpt.core.memory.optimizer.optimizer_step_key`: the
    settings, the parameters and the state's shapes and dtypes): the later profiles of a fit, whose
    batch shapes change but whose optimizer step does not. A measurement without state is also filed
    under the state its twin made, so the first plan's measurement serves the plans after the first step.

    Example:
        >>> model = nn.Linear(256, 256)
        >>> adamw = torch.optim.AdamW(model.parameters(), foreach=True)
        >>> with fake_model(model) as fake:
        ...     optimizer_step_extra_bytes(adamw, fake) > 0
        True
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        return 0
    formula_bytes = known_step_bytes(optimizer)
    if formula_bytes is not None:
        return formula_bytes
    if reuse:  # the key walks every parameter and state tensor: only where a step may be reused
        params = [p for group in optimizer.param_groups for p in group["params"]]
        known = _measured_steps.setdefault(optimizer, {})
        key = optimizer_step_key(optimizer.param_groups, _states(optimizer, optimizer.param_groups))
        if key in known and all(id(p) in fake.twins for p in params):
            return known[key]
    try:
        twin = _twin_optimizer(optimizer, fake)
        twin.step()  # once, to make all of its state: a real step after the first has all of it
        with LiveStorageTracker() as tracker:
            twin.step()
    except Exception as error:  # an optimizer whose constructor or step needs more than its param groups
        warnings.warn(
            f"AutoCheckpoint: the step of {type(optimizer).__name__} could not run on fake tensors ({type(error).__name__}:"
            f" {error}); its temporaries are not in the prediction",
            stacklevel=2,
        )
        return 0
    extra_bytes = int(tracker.peak_bytes - tracker.live_bytes)
    if reuse:
        known[key] = extra_bytes
        known[optimizer_step_key(optimizer.param_groups, _states(twin, twin.param_groups))] = extra_bytes
    return extra_bytes


def _states(optimizer: torch.optim.Optimizer, groups: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The state of each parameter of ``groups``, in their order (``{}`` for one without state)."""
    return [[optimizer.state.get(p, {}) for p in group["params"]] for group in groups]


def _twin_optimizer(optimizer: torch.optim.Optimizer, fake: FakeModel) -> torch.optim.Optimizer:
    groups = []
    for group in optimizer.param_groups:
        params = [fake.twins.get(id(p)) for p in group["params"]]
        if any(p is None for p in params):
            raise ValueError("the optimizer holds tensors that are not the model's parameters")
        for param in params:
            param.grad = torch.zeros_like(param)
        foreach = group.get("foreach")
        if foreach is None and not group.get("fused"):  # what the real one picks (fake tensors never foreach)
            foreach = default_foreach(group["params"])
        groups.append({**group, "params": params, "foreach": foreach})
    twin = type(optimizer)(groups)
    for real, state in optimizer.state.items():
        twin.state[fake.twins[id(real)]] = {key: _fake_state(value, fake) for key, value in state.items()}
    return twin


def _fake_state(value: Any, fake: FakeModel) -> Any:
    """A fake copy of one optimizer state value. A CPU scalar (AdamW's ``step``, which a non-capturable
    step reads with ``.item()``, impossible on a fake copy) becomes a fake constant made inside the fake
    mode, 1 of its dtype: its value changes the step's numbers, not what the step allocates."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and value.device.type == "cpu":
        return torch.tensor(1, dtype=value.dtype)
    return fake.fake(value)
