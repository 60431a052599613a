"""Apply and remove non-reentrant activation checkpointing in place, without changing module names.

The wrapped module keeps its identity, its parameters and its ``state_dict()`` keys: only the instance's
``forward`` attribute is replaced by a callable that runs the original forward under
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` (RNG state preserved, so dropout masks
are the same in the recomputation). Forward hooks of the module still run once, outside the checkpoint.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from lightning_ckpt._compat import CHECKPOINT_WRAPPER_CLASS
from lightning_ckpt.core.names import outer_modules, resolve_modules, strip_wrapper_prefixes

__all__ = [
    "apply_checkpointing",
    "checkpointed_names",
    "checkpointing_removed",
    "remove_checkpointing",
    "strip_wrapper_prefixes",
]

log = logging.getLogger(__name__)

_MISSING = object()


class CheckpointedForward:
    """The replacement ``forward``: runs the original forward under non-reentrant checkpointing.

    Attributes:
        original: the ``forward`` attribute the module had before (a bound method, or a previous
            instance attribute), called inside the checkpoint.
        previous: the instance attribute to put back on removal (``_MISSING`` if there was none).
    """

    def __init__(self, original: Callable[..., Any], previous: Any) -> None:
        self.original = original
        self.previous = previous

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # kwargs go to the module, never to `checkpoint` (a module kwarg named `debug` or `context_fn`)
        forward = functools.partial(self.original, **kwargs) if kwargs else self.original
        return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=True)


def is_checkpointed(module: nn.Module) -> bool:
    """Whether ``module``'s forward was replaced by :func:`apply_checkpointing`."""
    return isinstance(module.__dict__.get("forward"), CheckpointedForward)


def _torch_wrapped(model: nn.Module, name: str) -> bool:
    """Whether torch's ``checkpoint_wrapper`` (``CheckpointWrapper``) already wraps the module ``name``."""
    return any(type(module).__name__ == CHECKPOINT_WRAPPER_CLASS for module in outer_modules(model, name))


def apply_checkpointing(model: nn.Module, names: Iterable[str]) -> list[str]:
    """Checkpoint the named submodules of ``model`` in place (non-reentrant, RNG preserved).

    All names are validated before anything is touched. Modules already checkpointed (by this function
    or by torch's ``checkpoint_wrapper``) are skipped with a warning, never recomputed twice.

    Args:
        model: the model; may be wrapped by DDP/FSDP/``torch.compile`` (names are given without the
            wrapper prefixes, see :func:`strip_wrapper_prefixes`).
        names: qualified submodule names, as in ``model.named_modules()``.

    Returns:
        The names that were wrapped by this call (stripped of wrapper prefixes), in the given order.

    Raises:
        ValueError: if a name is not a submodule of ``model`` (nothing is wrapped then).

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
        >>> apply_checkpointing(model, ["0"])
        ['0']
        >>> checkpointed_names(model), list(model.state_dict())
        (['0'], ['0.weight', '0.bias'])
        >>> remove_checkpointing(model)
        ['0']
    """
    modules = resolve_modules(model, list(names))
    wrapped = []
    for name, module in modules.items():
        if is_checkpointed(module) or _torch_wrapped(model, name):
            warnings.warn(f"module {name!r} is already checkpointed; not wrapping it twice", stacklevel=2)
            continue
        previous = module.__dict__.get("forward", _MISSING)
        module.forward = CheckpointedForward(module.forward, previous)
        wrapped.append(name)
    log.info("activation checkpointing applied to %d module(s): %s", len(wrapped), ", ".join(wrapped) or "-")
    return wrapped


def remove_checkpointing(model: nn.Module) -> list[str]:
    """Undo :func:`apply_checkpointing` on every submodule of ``model``; returns the names unwrapped."""
    removed = []
    for name, module in model.named_modules():
        forward = module.__dict__.get("forward")
        if not isinstance(forward, CheckpointedForward):
            continue
        if forward.previous is _MISSING:
            del module.forward
        else:
            module.forward = forward.previous
        removed.append(strip_wrapper_prefixes(name))
    if removed:
        log.info("activation checkpointing removed from %d module(s): %s", len(removed), ", ".join(removed))
    return removed


@contextlib.contextmanager
def checkpointing_removed(model: nn.Module) -> Iterator[list[str]]:
    """Remove this package's checkpointing for the duration of the block, then put it back.

    Yields the names that were unwrapped (to profile a model as it runs without checkpoints).

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> _ = apply_checkpointing(model, ["0"])
        >>> with checkpointing_removed(model) as names:
        ...     names, checkpointed_names(model)
        (['0'], [])
        >>> checkpointed_names(model)
        ['0']
    """
    names = remove_checkpointing(model)
    try:
        yield names
    finally:
        if names:
            apply_checkpointing(model, names)


def checkpointed_names(model: nn.Module) -> list[str]:
    """Names (stripped of wrapper prefixes) of the submodules checkpointed by :func:`apply_checkpointing`."""
    return [strip_wrapper_prefixes(name) for name, module in model.named_modules() if is_checkpointed(module)]
