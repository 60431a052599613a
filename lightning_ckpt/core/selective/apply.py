"""Apply selective checkpointing to modules in place, with the removable hooks of full checkpointing.

The hooks are :mod:`lightning_ckpt.core.wrapping`'s (a pre-hook opens torch's non-reentrant checkpoint
region, a forward hook closes it, backward replays the module's call), with one difference: the region
runs under the module's :class:`~lightning_ckpt.core.selective.policy.SelectivePolicy` (its
``context_fn``), so backward recomputes only the ops the policy does not save. Module names,
``state_dict`` keys and parameters are unchanged; :func:`~lightning_ckpt.core.wrapping.remove_checkpointing`
removes these hooks as it removes full checkpointing, and
:func:`~lightning_ckpt.core.wrapping.is_checkpointed` sees them.

Example:
    >>> import torch
    >>> from lightning_ckpt.core.wrapping import remove_checkpointing
    >>> model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.GELU()))
    >>> apply_selective_checkpointing(model, {"0": SelectivePolicy(frozenset({("aten.addmm.default", 0)}))})
    ['0']
    >>> selective_policy_of(model[0]).saved, list(model.state_dict())
    (frozenset({('aten.addmm.default', 0)}), ['0.0.weight', '0.0.bias'])
    >>> remove_checkpointing(model), selective_policy_of(model[0])
    (['0'], None)
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping
from typing import Any

import torch.nn as nn

from lightning_ckpt._compat import checkpoint_region
from lightning_ckpt.core import wrapping
from lightning_ckpt.core.selective.policy import SelectivePolicy

__all__ = ["apply_selective_checkpointing", "selective_policy_of"]


class _SelectiveCheckpoint(wrapping._Checkpoint):
    """Full checkpointing's hooks, the region opened under a selective policy.

    The recomputation's dispatch mode (the one that hands back the saved outputs) is entered by this
    module's pre-hook and left by its forward hook, as the forward's caching mode is, not around the
    whole replayed call: global forward pre-hooks (``FlopCounterMode``'s module tracker) run before the
    region in forward and again in the replay, and their ops must not shift the policy's op counts.
    """

    def __init__(self, name: str, policy: SelectivePolicy) -> None:
        super().__init__(name)
        self.policy = policy
        self.pending: list[Any] = []  # the recomputation modes of the replays under way
        self.entered: list[Any] = []  # those entered by `start`, left by `finish`

    def fresh(self) -> _SelectiveCheckpoint:
        """A new state under the same policy (what :func:`~lightning_ckpt.core.wrapping.checkpointing_removed`
        puts back)."""
        return _SelectiveCheckpoint(self.name, self.policy)

    def replay_started(self) -> None:
        """Enter the recomputation's mode of the replay under way (left by :meth:`finish`)."""
        if self.pending and len(self.entered) < len(self.pending):
            self.pending[-1].__enter__()
            self.entered.append(self.pending[-1])

    def open_region(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The checkpoint region of one call, its forward under the policy's caching mode."""
        caching, cached = self.policy.context_fn()
        replay = functools.partial(self.replay_cached, cached, module, dict(kwargs))
        region = checkpoint_region(replay, *args, context_fn=lambda: (caching, contextlib.nullcontext()))
        next(region)
        return region

    def finish(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        """Forward hook: leave the recomputation's mode in a replay, then as the full checkpoint's."""
        if self.replaying and self.entered and len(self.entered) == len(self.pending):
            self.entered.pop().__exit__(None, None, None)
        super().finish(module, args, output)

    def replay_cached(self, cached: Any, module: nn.Module, kwargs: dict[str, Any], *args: Any) -> None:
        """Backward's recomputation, with ``cached`` (the region's recomputation mode) for its hooks."""
        self.pending.append(cached)
        try:
            self.replay(module, kwargs, *args)
        finally:
            self.pending.pop()
            if len(self.entered) > len(self.pending):  # the forward hook did not run (an interrupt)
                self.entered.pop().__exit__(None, None, None)


def selective_policy_of(module: nn.Module) -> SelectivePolicy | None:
    """The policy :func:`apply_selective_checkpointing` put on ``module``, or None."""
    state = module.__dict__.get(wrapping._STATE)
    return state.policy if isinstance(state, _SelectiveCheckpoint) else None


def apply_selective_checkpointing(model: nn.Module, policies: Mapping[str, SelectivePolicy]) -> list[str]:
    """Checkpoint the named submodules of ``model`` in place, each saving what its policy names.

    As :func:`~lightning_ckpt.core.wrapping.apply_checkpointing` (both through
    :func:`~lightning_ckpt.core.wrapping.wrap_modules`): names are checked before anything is touched, an
    error part-way undoes this call, modules already checkpointed (by either function or by torch) are
    skipped with a warning, and a transformers model's KV cache is off while it trains.

    Args:
        model: the model (names without wrapper prefixes).
        policies: qualified submodule name -> its :class:`SelectivePolicy`.

    Returns:
        The names wrapped by this call, in the given order.

    Raises:
        ValueError: if a name is not a submodule of ``model``.
        TypeError: if a value is not a :class:`SelectivePolicy`.
    """
    for name, policy in policies.items():
        if not isinstance(policy, SelectivePolicy):
            raise TypeError(f"`policies[{name!r}]` must be a SelectivePolicy, got {type(policy).__name__}")
    states = [
        (name, functools.partial(_SelectiveCheckpoint, policy=policy)) for name, policy in policies.items()
    ]
    return wrapping.wrap_modules(model, states, argument="policies", what="selective")
