"""Module names that survive wrappers: strip FSDP/DDP/compile/checkpoint prefixes and resolve names."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch.nn as nn

from lightning_ckpt._compat import WRAPPER_NAME_PARTS

_WRAPPER_PARTS = WRAPPER_NAME_PARTS
_LEADING_PARTS = frozenset({"module"})  # DDP / DataParallel: only as the first components


def strip_wrapper_prefixes(name: str) -> str:
    """Drop the name components that wrappers insert, so names match the unwrapped model.

    ``_fsdp_wrapped_module``, ``_orig_mod`` (torch.compile), ``_checkpoint_wrapped_module`` and
    ``_forward_module`` (Lightning) are dropped anywhere; ``module`` (DDP) only at the start, since a
    user's model may have a submodule of that name.

    Example:
        >>> strip_wrapper_prefixes("module._orig_mod.transformer.h.0._fsdp_wrapped_module.mlp")
        'transformer.h.0.mlp'
        >>> strip_wrapper_prefixes("encoder.module.fc")
        'encoder.module.fc'
    """
    parts = name.split(".") if name else []
    while parts and parts[0] in _LEADING_PARTS | _WRAPPER_PARTS:
        parts.pop(0)
    return ".".join(part for part in parts if part not in _WRAPPER_PARTS)


def stripped_modules(model: nn.Module) -> dict[str, nn.Module]:
    """Map each stripped name to its innermost module (the user's module, not the wrapper around it).

    Every name a module is registered under is a key: a module shared by two names (an alias, or
    ``ModuleList([layer] * n)``) is reached by each of them.

    Example:
        >>> layer = nn.Linear(1, 1)
        >>> sorted(stripped_modules(nn.ModuleList([layer, layer])))
        ['', '0', '1']
    """
    modules: dict[str, nn.Module] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        modules[strip_wrapper_prefixes(name)] = module  # named_modules yields outer before inner
    return modules


def outermost_matching(
    named: Iterable[tuple[str, nn.Module]], wanted: Callable[[str, nn.Module], bool]
) -> list[str]:
    """Names of the modules ``wanted`` accepts that lie inside no other accepted one (in the given order,
    ``named_modules()`` order: ancestors first).

    Example:
        >>> model = nn.Sequential(nn.Sequential(nn.Linear(1, 1)), nn.Linear(1, 1))
        >>> outermost_matching(model.named_modules(), lambda name, m: isinstance(m, nn.Sequential) and name != "")
        ['0']
    """
    names: list[str] = []
    accepted: set[str] = set()
    for name, module in named:
        if not within_any(name, accepted) and wanted(name, module):
            names.append(name)
            accepted.add(name)
    return names


def within_any(name: str, outers: set[str] | dict[str, object]) -> str | None:
    """The name in ``outers`` that ``name`` lies strictly inside (``""`` is the root), or None: one look-up
    per dotted prefix of ``name``, whatever the number of ``outers``.

    Example:
        >>> within_any("h.0.mlp.fc", {"h.0", "h.1"}), within_any("h.10", {"h.1"})
        ('h.0', None)
    """
    if "" in outers and name:
        return ""
    end = name.rfind(".")
    while end > 0:
        prefix = name[:end]
        if prefix in outers:
            return prefix
        end = name.rfind(".", 0, end)
    return None


def resolve_modules(model: nn.Module, names: Iterable[str], argument: str = "names") -> dict[str, nn.Module]:
    """Resolve stripped (or wrapped) names to modules, all or nothing.

    Raises:
        ValueError: if a name is not a module of ``model``; the message lists a few that are.
    """
    modules = stripped_modules(model)
    resolved: dict[str, nn.Module] = {}
    unknown = []
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"`{argument}` must hold module names (str), got {type(name).__name__}: {name!r}")
        key = strip_wrapper_prefixes(name)
        if key in modules and key:
            resolved[key] = modules[key]
        else:
            unknown.append(name)
    if unknown:
        raise ValueError(
            f"`{argument}` must name submodules of the model, got unknown {unknown[:5]}; "
            f"valid names include {example_names(model)}"
        )
    return resolved


def example_names(model: nn.Module, limit: int = 6) -> list[str]:
    """A few qualified submodule names of ``model`` with their classes, for error messages."""
    names = [f"{name} ({type(m).__name__})" for name, m in stripped_modules(model).items() if name]
    if len(names) <= limit:
        return names
    step = len(names) / limit
    return [names[int(i * step)] for i in range(limit)]
