"""Time each candidate's forward under ``torch.no_grad()``: the recompute seconds of a checkpointed block.

Blocks alike (same class, training flag, submodule layout, parameter and buffer shapes, dtypes and
devices, and inputs of the same shapes, dtypes and plain values: a decoder's layers) cost the same to
recompute, so each kind is timed on its first two calls only, and every block of the kind is given the
faster of the two (the first call of a process pays one-off costs). The other calls of the kind do not
run: they return the output of the kind's last timed call, which has their shapes, and the forward goes
on from it. The values after a skipped block are not the model's, which nothing reads: the forward runs
without autograd and its loss is thrown away. If the forward fails that way, it is run again whole.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any

import torch
import torch.nn as nn

from lightning_ckpt._compat import tree_leaves

__all__ = ["block_kind", "timed_forwards"]

_CALLS_TIMED_PER_KIND = 2


def timed_forwards(
    modules: dict[str, nn.Module], step_fn: Callable[[], Any], repeats: int = 1, *, alike: bool = True
) -> dict[str, float]:
    """Per candidate, the seconds of its forward(s) in ``step_fn`` run under ``torch.no_grad()``, the
    fastest of ``repeats`` runs (CUDA events on CUDA, ``perf_counter`` on CPU); with ``alike``, blocks
    alike are timed once per kind (see the module docstring), unless candidates nest.

    Example:
        >>> model = nn.Sequential(*(nn.Linear(4, 4) for _ in range(4)))
        >>> seconds = timed_forwards(dict(model.named_children()), lambda: model(torch.randn(2, 4)).sum())
        >>> len(set(seconds.values())), all(s > 0 for s in seconds.values())
        (1, True)
    """
    alike = alike and not nested(modules)
    runs = [_timed_run(modules, step_fn, alike) for _ in range(repeats)]
    return {name: min(run[name] for run in runs) for name in modules}


def _timed_run(modules: dict[str, nn.Module], step_fn: Callable[[], Any], alike: bool) -> dict[str, float]:
    if alike:
        try:
            return _one_run(modules, step_fn, alike=True)
        except Exception:  # the model read a skipped block's values (a shape or a check): run it whole
            pass
    return _one_run(modules, step_fn, alike=False)


def _one_run(modules: dict[str, nn.Module], step_fn: Callable[[], Any], alike: bool) -> dict[str, float]:
    """Seconds of each candidate's forward(s) in one more forward of the step, without autograd."""
    kinds = _TimedKinds() if alike else None
    timers: dict[str, list[_Timer]] = {name: [] for name in modules}
    saved = {name: module.__dict__.get("forward") for name, module in modules.items()}
    try:
        for name, module in modules.items():
            module.forward = _timed_forward(name, module, timers[name], kinds)
        with torch.no_grad():  # keeps nothing for backward: the timing run stays within any budget
            step_fn()
    finally:
        for name, module in modules.items():
            if saved[name] is None:
                del module.forward
            else:
                module.forward = saved[name]
    seconds = {name: sum(timer.seconds() for timer in calls) for name, calls in timers.items()}
    return seconds if kinds is None else kinds.seconds_of_alike(seconds)


def _timed_forward(
    name: str, module: nn.Module, timers: list[_Timer], kinds: _TimedKinds | None
) -> Callable[..., Any]:
    forward = module.forward  # the bound method (or what the instance had: a wrapper's)
    cuda = any(t.is_cuda for t in (*module.parameters(), *module.buffers()))
    structure = None if kinds is None else block_kind(module)

    def call(*args: Any, **kwargs: Any) -> Any:
        kind = None if kinds is None else (structure, inputs_kind(args, kwargs))
        if kind is not None and kinds.timed_enough(kind):
            return kinds.skipped(name, kind)
        timer = _Timer.start(cuda)
        timers.append(timer)
        try:
            out = forward(*args, **kwargs)
        finally:
            timer.stop()
        if kind is not None:
            kinds.timed(name, kind, out)
        return out

    return call


class _TimedKinds:
    """The kinds of blocks met in one timing forward: who was timed, who skipped, the last output."""

    def __init__(self) -> None:
        self.timed_names: dict[Hashable, list[str]] = {}
        self.outputs: dict[Hashable, Any] = {}
        self.kind_of: dict[str, Hashable] = {}

    def timed_enough(self, kind: Hashable) -> bool:
        return len(self.timed_names.get(kind, ())) >= _CALLS_TIMED_PER_KIND

    def timed(self, name: str, kind: Hashable, out: Any) -> None:
        self.timed_names.setdefault(kind, []).append(name)
        self.outputs[kind] = out
        self.kind_of.setdefault(name, kind)

    def skipped(self, name: str, kind: Hashable) -> Any:
        self.kind_of.setdefault(name, kind)
        return self.outputs[kind]

    def seconds_of_alike(self, seconds: dict[str, float]) -> dict[str, float]:
        """Every block of a kind: the fastest of the kind's timed calls (a block called once)."""
        fastest = {kind: min(seconds[name] for name in names) for kind, names in self.timed_names.items()}
        return {
            name: fastest[self.kind_of[name]] if name in self.kind_of else s for name, s in seconds.items()
        }


def block_kind(module: nn.Module, *, attributes: bool = False) -> Hashable:
    """What makes two blocks alike before their inputs: class, training flag, the submodules' names and
    classes, and the parameters' and buffers' names, shapes, dtypes, devices and ``requires_grad``; with
    ``attributes``, also every submodule's public plain attributes (numbers, strings) but a
    transformers layer's ``layer_idx``, which only names its slot in a KV cache (off while training).

    Example:
        >>> block_kind(nn.Linear(4, 4)) == block_kind(nn.Linear(4, 4)) != block_kind(nn.Linear(4, 5))
        True
    """
    tensors = (*module.named_parameters(), *module.named_buffers())
    subs = tuple(
        (name, type(sub), sub.training, _plain_attributes(sub) if attributes else ())
        for name, sub in module.named_modules()
    )
    return (type(module), module.training, subs, tuple((name, _tensor_kind(t)) for name, t in tensors))


def _plain_attributes(module: nn.Module) -> Hashable:
    return tuple(
        (key, value)
        for key, value in sorted(vars(module).items())
        if not key.startswith("_")
        and key not in _INDEX_ATTRIBUTES
        and (value is None or isinstance(value, (bool, int, float, str)))
    )


_INDEX_ATTRIBUTES = frozenset({"layer_idx"})
"""What transformers layers differ by alone: the layer's index, read by the KV cache. A layer whose
memory does depend on it differs in another attribute too (``attention_type``, ``sliding_window``, an
MLP class), or its first two calls hold different bytes, and then every call is measured."""


def inputs_kind(args: tuple, kwargs: dict) -> Hashable:
    """What makes two calls' inputs alike: the keywords, each tensor's class, shape, strides, dtype,
    device and ``requires_grad``, each plain value, and the class of anything else."""
    leaves = tree_leaves((args, kwargs))
    return (repr(sorted(kwargs)), tuple(_leaf_kind(leaf) for leaf in leaves))


def _leaf_kind(leaf: Any) -> Hashable:
    if isinstance(leaf, torch.Tensor):
        return _tensor_kind(leaf)
    if leaf is None or isinstance(leaf, (bool, int, float, str)):
        return (type(leaf), leaf)
    return type(leaf)


def _tensor_kind(tensor: torch.Tensor) -> Hashable:
    try:
        strides = tensor.stride()
    except (RuntimeError, NotImplementedError):  # sparse, nested: never alike another
        return object()
    return (type(tensor), tuple(tensor.shape), strides, tensor.dtype, tensor.device, tensor.requires_grad)


def nested(modules: dict[str, nn.Module]) -> bool:
    """Whether a candidate holds another (a skipped outer block would leave the inner one untimed)."""
    chosen = {id(module) for module in modules.values()}
    return any(id(sub) in chosen for module in modules.values() for sub in list(module.modules())[1:])


class _Timer:
    """Wall time on CPU; CUDA events (read after a synchronize) for modules on CUDA."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.begin: Any = None
        self.end: Any = None

    @classmethod
    def start(cls, cuda: bool) -> _Timer:
        timer = cls(cuda)
        timer.begin = timer._now()
        return timer

    def stop(self) -> None:
        self.end = self._now()

    def _now(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self) -> float:
        if self.end is None:
            return 0.0
        if not self.cuda:
            return self.end - self.begin
        self.end.synchronize()
        return self.begin.elapsed_time(self.end) / 1000.0
