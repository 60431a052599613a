"""Hugging Face transformers models under AutoCheckpoint: no KV cache in training, their own checkpointing off.

Both are what transformers' own gradient checkpointing does, found by duck typing (transformers is never
imported here):

- **KV cache.** A checkpointed decoder layer that writes the cache writes it again when backward recomputes
  it (the cache doubles, masks stop matching the keys, or torch finds a different number of saved
  tensors). :func:`training_without_cache` adds a forward pre-hook to each outermost model whose
  ``forward`` takes ``use_cache``: ``use_cache=False`` is passed to a forward that trains, one in training
  mode or with autograd on (a model left in eval mode trains all the same: ``from_pretrained`` returns it
  so, and Lightning keeps each submodule's mode), and to the measuring forwards of a training step under
  :func:`training_step_running` (the no-grad forwards that time the candidates). Evaluation and
  generation, in eval mode without autograd, keep the cache.
- **Fake-tensor profiles.** transformers cannot read a fake tensor's values, so on fake tensors it takes its
  tracing path: it treats the position ids it made itself (``arange``) as possibly packed sequences and
  builds a full mask, where the real step uses the causal kernel (Llama's profile was 2-4% high).
  :func:`unpacked_positions_on_fake_tensors` tells it, for the profile only, that they are not packed,
  unless the batch brings its own ``position_ids`` (packed training).
- **Their own checkpointing.** ``model.gradient_checkpointing_enable()`` sets ``gradient_checkpointing`` on
  the layers, which then checkpoint themselves and hide their activations from the profile.
  :func:`own_checkpointing_off` turns it off (AutoCheckpoint takes over) and returns an undo.

Example:
    >>> import torch
    >>> class TinyLM(torch.nn.Module):
    ...     def forward(self, x, use_cache=None):
    ...         return use_cache
    >>> model = TinyLM()
    >>> with training_without_cache(model) as names:
    ...     names, model(torch.ones(1), use_cache=True)
    ([''], False)
    >>> model(torch.ones(1), use_cache=True)
    True
    >>> with training_without_cache(model.eval()):  # eval mode: off with autograd, kept without it
    ...     trains = model(torch.ones(1), use_cache=True)
    ...     with torch.no_grad():
    ...         generates = model(torch.ones(1), use_cache=True)
    ...         with training_step_running():
    ...             measures = model(torch.ones(1), use_cache=True)
    >>> trains, generates, measures
    (False, True, False)
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import logging
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.nn as nn
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch.utils.hooks import RemovableHandle

from lightning_ckpt._compat import FakeTensor
from lightning_ckpt.core.names import outermost_matching, strip_wrapper_prefixes

__all__ = [
    "cache_off_in_training",
    "own_checkpointing_off",
    "training_step_running",
    "training_without_cache",
    "unpacked_positions_on_fake_tensors",
]

log = logging.getLogger(__name__)
_SAID: set[str] = set()  # model classes whose cache was turned off, said once each
_STEP_RUNNING: contextvars.ContextVar[bool] = contextvars.ContextVar("training_step_running", default=False)


@contextlib.contextmanager
def training_without_cache(model: nn.Module) -> Iterator[list[str]]:
    """Pass ``use_cache=False`` to every outermost submodule whose ``forward`` takes it, while it trains.

    Yields the names of the hooked modules; the hooks are removed on exit.
    """
    names, handles = cache_off_in_training(model)
    try:
        yield names
    finally:
        for handle in handles:
            handle.remove()


def cache_off_in_training(model: nn.Module) -> tuple[list[str], list[RemovableHandle]]:
    """The hooks of :func:`training_without_cache`, left on: (hooked names, their handles to remove).

    Example:
        >>> cache_off_in_training(nn.Linear(1, 1))
        ([], [])
    """
    names = outermost_matching(model.named_modules(), lambda _, module: _takes_use_cache(module))
    handles = [
        model.get_submodule(name).register_forward_pre_hook(_no_cache, with_kwargs=True) for name in names
    ]
    return [strip_wrapper_prefixes(name) for name in names], handles


@contextlib.contextmanager
def training_step_running() -> Iterator[None]:
    """Inside the block, the hooked models run without their cache in any mode: the forwards that measure a
    training step, the no-grad ones included (see the module docstring)."""
    token = _STEP_RUNNING.set(True)
    try:
        yield
    finally:
        _STEP_RUNNING.reset(token)


def _trains(module: nn.Module) -> bool:
    """Whether a forward of ``module`` may be recomputed by a backward, or measures a training step."""
    return module.training or torch.is_grad_enabled() or _STEP_RUNNING.get()


def _no_cache(module: nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict] | None:
    if not _trains(module) or kwargs.get("use_cache") is False:
        return None
    config_cache = getattr(getattr(module, "config", None), "use_cache", False)
    if (kwargs.get("use_cache") or config_cache) and type(module).__name__ not in _SAID:
        _SAID.add(type(module).__name__)
        rank_zero_info(  # Lightning's log, rank 0: shown at its default level
            f"AutoCheckpoint: use_cache=False while {type(module).__name__} trains (a checkpointed layer's"
            " recomputation would write its KV cache again), as transformers' own gradient checkpointing does"
        )
    return args, {**kwargs, "use_cache": False}


def own_checkpointing_off(model: nn.Module) -> Callable[[], None]:
    """Turn off transformers' ``gradient_checkpointing`` wherever it is on; returns the undo.

    Example:
        >>> model = nn.Sequential(nn.Linear(1, 1))
        >>> model[0].gradient_checkpointing = True
        >>> undo = own_checkpointing_off(model)
        >>> model[0].gradient_checkpointing
        False
        >>> undo(); model[0].gradient_checkpointing
        True
    """
    switched = [m for m in model.modules() if m.__dict__.get("gradient_checkpointing") is True]
    for module in switched:
        module.gradient_checkpointing = False
    if switched:
        log.warning(
            "AutoCheckpoint: turned off the model's own gradient checkpointing (%d module(s) had"
            " `gradient_checkpointing=True`, e.g. from `gradient_checkpointing_enable()`); AutoCheckpoint"
            " chooses what to checkpoint now, and turns it back on after the fit",
            len(switched),
        )

    def undo() -> None:
        for module in switched:
            module.gradient_checkpointing = True

    return undo


def _takes_use_cache(module: nn.Module) -> bool:
    try:
        return "use_cache" in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):  # a builtin or C-implemented forward
        return False


@contextlib.contextmanager
def unpacked_positions_on_fake_tensors(batch: Any) -> Iterator[bool]:
    """While profiling on fake tensors: transformers' packed-sequence check answers "not packed" for fake
    position ids, as it does for the real ``arange`` positions a model makes itself. Nothing is patched
    when transformers is not loaded or when the batch has a ``position_ids`` entry (checked against
    transformers 4.5x-5.24: ``masking_utils.find_packed_sequence_indices``). Yields whether it patched.
    """
    masking = sys.modules.get("transformers.masking_utils")
    original = getattr(masking, "find_packed_sequence_indices", None)
    if original is None or _has_position_ids(batch):
        yield False
        return

    def find_packed_sequence_indices(position_ids: Any) -> Any:
        return None if isinstance(position_ids, FakeTensor) else original(position_ids)

    masking.find_packed_sequence_indices = find_packed_sequence_indices
    try:
        yield True
    finally:
        masking.find_packed_sequence_indices = original


def _has_position_ids(batch: Any) -> bool:
    """Whether a (nested) mapping of the batch has a ``position_ids`` key.

    Example:
        >>> _has_position_ids([{"input_ids": 1}, {"position_ids": 2}]), _has_position_ids((1, 2))
        (True, False)
    """
    if isinstance(batch, Mapping):
        return "position_ids" in batch or any(_has_position_ids(value) for value in batch.values())
    if isinstance(batch, list | tuple):
        return any(_has_position_ids(item) for item in batch)
    return False
