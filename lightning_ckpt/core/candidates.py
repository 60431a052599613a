"""Find the modules that may be checkpointed: the repeated blocks of a model, or user-chosen targets.

Rules:
- Default: the children of every ``nn.ModuleList`` (or ``nn.Sequential``) of two or more blocks of one
  class, where a block has submodules of its own (a list of bare ``Linear`` heads is not a stack of
  blocks): the layers of a decoder-only transformer, the encoder and the decoder of T5, BART or Whisper,
  each stage of a ResNet or U-Net. A list inside a block of another such list is left out (its outer
  block is the candidate). The lists taken are logged (Lightning's ``rank_zero_info``: shown at its
  default level, once per model).
- ``targets``: class names (``"Block"``) or glob patterns on qualified names (``"transformer.h.*.mlp"``,
  ``fnmatch`` syntax, ``*`` also matches dots). A module matches if its class name equals a target or its
  name matches a target as a glob.
- Overlaps: when a module and one of its descendants both match, the outermost wins (checkpointing it
  already recomputes the descendant); the dropped descendants are logged.
- Shared modules: a module registered under two names (``ModuleList([layer] * n)``, the same block listed
  twice, an attribute alias) is one candidate, under its first name in ``named_modules()`` order; the
  other names are logged. Descent is by identity too: a module inside a candidate under any name is
  dropped. (A shared block that runs more than once per forward is then left out by the profiler.)
- Norms with running statistics (BatchNorm) are safe: the recomputation leaves their statistics as the
  forward left them (see :func:`lightning_ckpt.core.wrapping.running_stats_frozen`).
"""

from __future__ import annotations

import fnmatch
import weakref
from collections.abc import Sequence

import torch.nn as nn
from lightning.pytorch.utilities.rank_zero import rank_zero_info

from lightning_ckpt.core.fsdp2 import user_class
from lightning_ckpt.core.names import (
    example_names,
    outermost_matching,
    strip_wrapper_prefixes,
    stripped_modules,
    within_any,
)

__all__ = ["as_target_list", "find_candidates"]

_SAID: weakref.WeakKeyDictionary[nn.Module, set[str]] = weakref.WeakKeyDictionary()
"""What was said about each model: the callback looks for candidates at setup and at each plan."""


def find_candidates(model: nn.Module, targets: Sequence[str] | None = None) -> list[str]:
    """Qualified names of the modules that may be checkpointed, in ``named_modules()`` order.

    Args:
        model: any ``nn.Module`` (wrapper prefixes such as ``module.`` or ``_orig_mod.`` are stripped).
        targets: class names or qualified-name globs; ``None`` picks the repeated blocks. A single string
            is taken as one target.

    Raises:
        ValueError: if a target matches nothing (the message lists names that exist), or ``targets`` is
            ``None`` and the model has no list of repeated modules.

    Example:
        >>> from torch import nn
        >>> class Block(nn.Module):
        ...     def __init__(self) -> None:
        ...         super().__init__()
        ...         self.attn = nn.Linear(8, 8)
        ...         self.mlp = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))
        >>> model = nn.Module()
        >>> model.embed, model.h = nn.Embedding(16, 8), nn.ModuleList([Block(), Block()])
        >>> find_candidates(model)
        ['h.0', 'h.1']
        >>> find_candidates(model, ["h.*.mlp", "Linear"])  # the Linears inside each mlp are dropped
        ['h.0.attn', 'h.0.mlp', 'h.1.attn', 'h.1.mlp']
    """
    modules = stripped_modules(model)
    if targets is None:
        names = _repeated_blocks(model, modules)
    else:
        names = _outermost(model, _match_targets(model, modules, as_target_list(targets)))
    return _distinct_modules(model, modules, names)


def as_target_list(targets: Sequence[str] | str) -> list[str]:
    """``targets`` as a list of non-empty strings (one string is one target).

    Raises:
        ValueError: for anything else, naming the argument and what was given.
    """
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, Sequence) or not all(isinstance(t, str) and t for t in targets):
        raise ValueError(
            f"`targets` must be None or a list of module class names or name globs, got {targets!r}"
        )
    return list(targets)


def _repeated_blocks(model: nn.Module, modules: dict[str, nn.Module]) -> list[str]:
    lists = outermost_matching(modules.items(), lambda name, module: _is_block_list(name, module, modules))
    if not lists:
        raise ValueError(
            "`targets` is None, so the blocks of every nn.ModuleList (or nn.Sequential) of repeated modules"
            f" are used, but the model has none; pass `targets` (class names or name globs), e.g. one of "
            f"{example_names(model)}"
        )
    taken = (
        f"{name or 'the model'} ({len(modules[name])} x {_child_class(name, modules)})" for name in lists
    )
    _say_once(model, f"AutoCheckpoint candidates: the blocks of {', '.join(taken)}")
    return [
        f"{name}.{index}" if name else str(index) for name in lists for index in range(len(modules[name]))
    ]


def _is_block_list(name: str, module: nn.Module, modules: dict[str, nn.Module]) -> bool:
    """Two or more blocks of one class (seen through checkpoint/FSDP wrappers and FSDP2's class swap),
    each with submodules."""
    if not isinstance(module, nn.ModuleList | nn.Sequential) or len(module) < 2:
        return False
    children = _blocks(name, module, modules)
    return len({user_class(child) for child in children}) == 1 and any(True for _ in children[0].children())


def _blocks(name: str, module: nn.Module, modules: dict[str, nn.Module]) -> list[nn.Module]:
    prefix = f"{name}." if name else ""
    return [modules.get(f"{prefix}{index}", child) for index, child in enumerate(module)]


def _child_class(name: str, modules: dict[str, nn.Module]) -> str:
    return user_class(_blocks(name, modules[name], modules)[0]).__name__


def _match_targets(model: nn.Module, modules: dict[str, nn.Module], targets: list[str]) -> list[str]:
    matched: list[str] = []
    for target in targets:
        pattern = strip_wrapper_prefixes(target)
        hits = [
            name
            for name, module in modules.items()
            if name and (user_class(module).__name__ == target or fnmatch.fnmatchcase(name, pattern))
        ]
        if not hits:
            raise ValueError(
                f"`targets` entry {target!r} matches no module (class name or qualified-name glob); "
                f"modules include {example_names(model)}"
            )
        seen = set(matched)
        matched += [name for name in hits if name not in seen]
    order = {name: index for index, name in enumerate(modules)}
    return sorted(matched, key=order.__getitem__)


def _say_once(model: nn.Module, message: str) -> None:
    """Tell the user, in Lightning's log on rank 0 (shown at its default level), once per model."""
    said = _SAID.setdefault(model, set())
    if message not in said:
        said.add(message)
        rank_zero_info(message)


def _outermost(model: nn.Module, names: list[str]) -> list[str]:
    kept: dict[str, None] = {}
    for name in names:  # sorted in named_modules() order: ancestors come before descendants
        ancestor = within_any(name, kept)
        if ancestor is None:
            kept[name] = None
        else:
            _say_once(
                model,
                f"AutoCheckpoint candidate {name!r} dropped: its ancestor {ancestor!r} is a candidate too"
                " (outermost wins)",
            )
    return list(kept)


def _distinct_modules(model: nn.Module, modules: dict[str, nn.Module], names: list[str]) -> list[str]:
    """One name per module (the first), and none for a module inside another candidate under another name:
    a shared module is one candidate, wrapped once and counted once."""
    names_of: dict[int, list[str]] = {}
    for name in names:
        names_of.setdefault(id(modules[name]), []).append(name)
    for first, *others in (aliases for aliases in names_of.values() if len(aliases) > 1):
        _say_once(
            model,
            f"AutoCheckpoint candidate {first!r} is also registered as {', '.join(map(repr, others))} (one"
            " shared module): it is one candidate",
        )
    kept = [aliases[0] for aliases in names_of.values()]
    outer_of = {id(inner): name for name in kept for inner in _descendants(modules[name])}
    for name in kept:
        if id(modules[name]) in outer_of:
            _say_once(
                model,
                f"AutoCheckpoint candidate {name!r} dropped: it is inside candidate"
                f" {outer_of[id(modules[name])]!r} under another name (outermost wins)",
            )
    return [name for name in kept if id(modules[name]) not in outer_of]


def _descendants(module: nn.Module) -> list[nn.Module]:
    return [inner for inner in module.modules() if inner is not module]
