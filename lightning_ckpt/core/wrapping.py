"""Apply and remove non-reentrant activation checkpointing in place, without changing module names.

Checkpointing is two forward hooks with removable handles: a pre-hook (``prepend=True``, with kwargs)
opens torch's non-reentrant checkpoint region (``checkpoint_region``, the generator behind
``torch.utils.checkpoint.checkpoint``; RNG state preserved, so dropout masks are the same in the
recomputation) and a forward hook (``prepend=True``, ``always_call=True``) closes it. Backward recomputes
by calling the module again on its original arguments, up to that closing hook. The module keeps its
identity, its ``forward``, its parameters and its ``state_dict()`` keys.

Why hooks of our own, and not torch's composable ``checkpoint`` (``torch.distributed._composable``: the
same two hooks around the same generator). Replacing ``module.forward`` (the former design) is hidden by a
library that patches ``forward`` on top (accelerate wraps the old one): checkpointing no longer shows nor
comes off, and the library's own pre/post-forward steps are not recomputed. Hooks survive the patch, and
the patched forward is recomputed too. Both hook designs keep names and ``state_dict`` keys and give the
plain model's gradients with dropout. Composable (checked on torch 2.13) cannot be removed (no handles,
which ``remove_checkpointing`` and ``checkpointing_removed`` need), raises ``AssertionError`` when applied
twice, passes the module's kwargs into its generator's own parameters (a module kwarg ``debug`` is a
``TypeError``), and opens its region after the module's earlier pre-hooks, so one that rewrites the
arguments is replayed on rewritten ones (silently wrong gradients); the user's forward hooks run outside
its region yet again in the recomputation unless torch's early stop cuts it short (without it, a hook that
saves a tensor fails the backward). It is a private package, documented only by its docstring; the
generator is private too (ours reaches it through ``lightning_ckpt._compat``). So ours opens the region
first: the module's pre-hooks run inside it, once in forward and once more in the recomputation, on the
original arguments; its forward hooks run outside, once. Neither hook design can checkpoint inside a
``torch.compile`` graph (composable fails the backward with a ``CheckpointError``): ours steps aside there
with a warning, where the former ``forward`` replacement was compiled with its checkpoint.

Example:
    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    >>> _ = apply_checkpointing(model, ["0"])
    >>> inner = model[0].forward
    >>> model[0].forward = lambda *args, **kwargs: inner(*args, **kwargs)  # as accelerate does
    >>> is_checkpointed(model[0]), remove_checkpointing(model)
    (True, ['0'])
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import warnings
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

import torch
import torch.nn as nn
from torch.utils.hooks import RemovableHandle

from lightning_ckpt._compat import CHECKPOINT_WRAPPER_CLASS, NormBase, checkpoint_region, composable_api_names
from lightning_ckpt.core.hf_models import cache_off_in_training
from lightning_ckpt.core.names import resolve_modules, strip_wrapper_prefixes

__all__ = [
    "apply_checkpointing",
    "checkpointed_by_torch",
    "checkpointed_names",
    "checkpointing_removed",
    "is_checkpointed",
    "remove_checkpointing",
    "strip_wrapper_prefixes",
    "wrap_modules",
]

log = logging.getLogger(__name__)

_STATE = "_lightning_ckpt_checkpoint"
"""Instance attribute holding a module's :class:`_Checkpoint` (a plain attribute: not in ``state_dict``)."""

_NO_CACHE = "_lightning_ckpt_no_cache"
"""Instance attribute of a model given to :func:`apply_checkpointing`: the handles of its KV-cache hooks."""


last_recomputed: str | None = None
"""The name of the checkpointed module whose recomputation ran last (to name it in an error)."""


def recompute_failure_note(name: str) -> str:
    """What to tell a user whose checkpointed module ``name`` did something else when recomputed."""
    return (
        f"(while recomputing checkpointed module {name!r} in backward: its second call must compute what the"
        " first did. A cache or other state written in forward breaks that: pass use_cache=False in training,"
        " or leave the module out of `targets`.)"
    )


@contextlib.contextmanager
def running_stats_frozen(module: nn.Module) -> Iterator[None]:
    """Leave the running statistics of ``module``'s norms (BatchNorm, ...) as they were before the block.

    A recomputation normalizes with the batch's statistics as the forward did; only the running mean,
    variance and batch count would be updated a second time.

    Example:
        >>> import torch
        >>> norm = torch.nn.BatchNorm1d(2)
        >>> with running_stats_frozen(norm):
        ...     _ = norm(torch.randn(4, 2))
        >>> norm.running_mean.tolist(), int(norm.num_batches_tracked)
        ([0.0, 0.0], 0)
    """
    saved = [(buffer, buffer.clone()) for buffer in running_stat_buffers(module)]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)


def running_stat_buffers(module: nn.Module) -> list[torch.Tensor]:
    """The running statistics (mean, var, count) of ``module``'s norms in training that track them: what
    :func:`running_stats_frozen` copies (and the profile counts, ``recorder.running_stats_bytes``)."""
    norms = [m for m in module.modules() if isinstance(m, NormBase) and m.track_running_stats and m.training]
    stats = [(m.running_mean, m.running_var, m.num_batches_tracked) for m in norms]
    return [buffer for triple in stats for buffer in triple if buffer is not None]


class _ReplayDone(BaseException):
    """Ends a recomputation at the closing hook (a BaseException: ``Module.__call__`` lets it through)."""


class _Checkpoint:
    """The two hooks that checkpoint one module, their handles, and its calls in flight.

    It holds no reference to the module (hooks receive it), so ``copy.deepcopy`` of a model gives the copy
    its own hooks on its own modules.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.handles: list[RemovableHandle] = []
        self.regions: list[Generator[None, None, None] | None] = []
        self.replaying = 0

    def start(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Forward pre-hook: open the region, saving what backward needs to call the module again."""
        if torch.compiler.is_compiling():
            _warn_compiled(module)
            return
        if self.replaying:
            self.replay_started()
            return
        self.regions.append(self.open_region(module, args, kwargs) if torch.is_grad_enabled() else None)

    def open_region(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Generator[None, None, None]:
        """Open the checkpoint region of one call (a subclass opens it under a policy)."""
        # kwargs travel in the partial, never as the generator's own parameters (`debug`, `context_fn`)
        region = checkpoint_region(functools.partial(self.replay, module, dict(kwargs)), *args)
        next(region)
        return region

    def replay_started(self) -> None:
        """Called when backward's recomputation reaches the module's pre-hook (a subclass enters a mode)."""

    def fresh(self) -> _Checkpoint:
        """A new state of the same kind for the same module (no calls in flight): what re-wrapping it
        installs (a subclass keeps its policy)."""
        return _Checkpoint(self.name)

    def finish(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        """Forward hook (also called when the forward raised): close the region; in a replay, stop it."""
        if torch.compiler.is_compiling():
            return
        if self.replaying:
            if sys.exc_info()[1] is None:  # else the recomputation failed: let its error through
                raise _ReplayDone
            return
        region = self.regions.pop() if self.regions else None
        if region is not None:
            next(region, None)

    def replay(self, module: nn.Module, kwargs: dict[str, Any], *args: Any) -> None:
        """Recompute the region in backward: the module's call (pre-hooks, forward) up to :meth:`finish`."""
        global last_recomputed
        last_recomputed = self.name
        self.replaying += 1
        try:
            with running_stats_frozen(module):
                module(*args, **kwargs)
        except _ReplayDone:
            pass
        except Exception as error:
            error.add_note(recompute_failure_note(self.name))
            raise
        finally:
            self.replaying -= 1


@torch.compiler.disable
def _warn_compiled(module: nn.Module) -> None:
    warnings.warn(
        f"a {type(module).__name__} checkpointed by `apply_checkpointing` runs inside torch.compile, whose"
        " graph these hooks cannot checkpoint: it runs without checkpointing there (gradients unchanged)",
        stacklevel=2,
    )


def _wrap(module: nn.Module, state: _Checkpoint) -> None:
    setattr(module, _STATE, state)  # first, so that `_unwrap` undoes a failure in between
    state.handles.append(module.register_forward_pre_hook(state.start, prepend=True, with_kwargs=True))
    state.handles.append(module.register_forward_hook(state.finish, prepend=True, always_call=True))


def _unwrap(module: nn.Module) -> bool:
    state = module.__dict__.pop(_STATE, None)
    for handle in getattr(state, "handles", ()):
        handle.remove()
    for region in reversed(getattr(state, "regions", ())):  # left open by an interrupt (no always_call)
        if region is not None:
            region.close()
    return state is not None


def is_checkpointed(module: nn.Module) -> bool:
    """Whether :func:`apply_checkpointing` checkpoints ``module`` (whatever was patched on top since)."""
    return isinstance(module.__dict__.get(_STATE), _Checkpoint)


def checkpointed_by_torch(model: nn.Module, names: Iterable[str]) -> set[str]:
    """The ``names`` (stripped of wrapper prefixes) that torch's ``checkpoint_wrapper`` or composable
    ``checkpoint`` already covers: the module itself or one around it.

    Example:
        >>> import torch
        >>> from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
        >>> model = torch.nn.Sequential(checkpoint_wrapper(torch.nn.Sequential(torch.nn.Linear(2, 2))))
        >>> sorted(checkpointed_by_torch(model, ["0", "0.0"]))
        ['0', '0.0']
    """
    covering = {
        strip_wrapper_prefixes(qualified)
        for qualified, module in model.named_modules()
        if type(module).__name__ == CHECKPOINT_WRAPPER_CLASS or "checkpoint" in composable_api_names(module)
    }
    return {name for name in names if any(_within(name, outer) for outer in covering)}


def _within(name: str, outer: str) -> bool:
    """Whether module ``name`` is ``outer`` or inside it (``""`` is the root)."""
    return not outer or name == outer or name.startswith(outer + ".")


def apply_checkpointing(model: nn.Module, names: Iterable[str]) -> list[str]:
    """Checkpoint the named submodules of ``model`` in place (non-reentrant, RNG preserved).

    All names are validated before anything is touched, and an error part-way undoes this call. Modules
    already checkpointed (by this function or by torch's ``checkpoint_wrapper`` or composable
    ``checkpoint``) are skipped with a warning, never recomputed twice. A transformers model's KV cache
    is off while it trains, as AutoCheckpoint and transformers' own checkpointing turn it off (a
    recomputed layer would write it twice): every outermost submodule whose ``forward`` takes
    ``use_cache`` gets ``use_cache=False`` in training mode, until :func:`remove_checkpointing`.

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
    return wrap_modules(model, [(name, _Checkpoint) for name in names])


def wrap_modules(
    model: nn.Module,
    states: list[tuple[str, Callable[[str], _Checkpoint]]],
    *,
    argument: str = "names",
    what: str = "activation",
) -> list[str]:
    """Put on each named submodule the hooks of the state its factory makes (given the stripped name),
    as :func:`apply_checkpointing` describes (names checked first, undone on an error, already
    checkpointed ones skipped with a warning, the KV cache off while training); the selective kind
    (``core.selective``) comes through here too. Returns the names wrapped; ``argument`` names the
    names in errors, ``what`` the kind in the log."""
    modules = resolve_modules(model, [name for name, _ in states], argument=argument)
    factories = {strip_wrapper_prefixes(name): make for name, make in states}  # names checked: all str
    by_torch = checkpointed_by_torch(model, modules)
    wrapped: list[str] = []
    try:
        for name, module in modules.items():
            if is_checkpointed(module) or name in by_torch:
                warnings.warn(f"module {name!r} is already checkpointed; not wrapping it twice", stacklevel=3)
                continue
            wrapped.append(name)  # before `_wrap`, so that a failure inside it is undone too
            _wrap(module, factories[name](name))
    except BaseException:
        for name in wrapped:
            _unwrap(modules[name])
        raise
    _cache_off(model, wrapped)
    log.info("%s checkpointing applied to %d module(s): %s", what, len(wrapped), ", ".join(wrapped) or "-")
    return wrapped


def _cache_off(model: nn.Module, wrapped: list[str]) -> None:
    """A transformers model's KV cache off in training while something is wrapped (until removed)."""
    if wrapped and _NO_CACHE not in model.__dict__:
        model.__dict__[_NO_CACHE] = cache_off_in_training(model)[1]


def remove_checkpointing(model: nn.Module) -> list[str]:
    """Undo :func:`apply_checkpointing` on every submodule of ``model``; returns the names unwrapped.

    It also closes the checkpoint regions that an interrupt (``KeyboardInterrupt``, which skips
    ``always_call`` hooks) left open in the middle of a forward.
    """
    removed = [strip_wrapper_prefixes(name) for name, module in model.named_modules() if _unwrap(module)]
    for module in model.modules():
        for handle in module.__dict__.pop(_NO_CACHE, ()):  # the KV cache as it was
            handle.remove()
    if removed:
        log.info("activation checkpointing removed from %d module(s): %s", len(removed), ", ".join(removed))
    return removed


@contextlib.contextmanager
def checkpointing_removed(model: nn.Module) -> Iterator[list[str]]:
    """Remove this package's checkpointing for the duration of the block, then put it back as it was
    (a selective checkpoint comes back selective, with its policy).

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
    states = {
        strip_wrapper_prefixes(name): (module, module.__dict__[_STATE])
        for name, module in model.named_modules()
        if is_checkpointed(module)
    }
    names = remove_checkpointing(model)
    try:
        yield names
    finally:
        for name in names:  # the same kind of state (a selective one keeps its policy)
            module, state = states[name]
            _wrap(module, state.fresh())
        _cache_off(model, names)


def checkpointed_names(model: nn.Module) -> list[str]:
    """Names (stripped of wrapper prefixes) of the submodules checkpointed by :func:`apply_checkpointing`."""
    return [strip_wrapper_prefixes(name) for name, module in model.named_modules() if is_checkpointed(module)]
