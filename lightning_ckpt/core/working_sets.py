"""What each candidate's forward holds while it runs keeping nothing for backward: a checkpointed block's.

Measured on one forward of the step with grad on and every saved tensor dropped, as a non-reentrant
checkpoint runs a block's forward (fake tensors in a fit: nothing allocated). Its ops and their inputs
are the step's own forward's, so on fake tensors FakeTensor's cache answers them (a ``torch.no_grad()``
forward made about 40 new entries on the example GPT: 0.02-0.05 CPU s of a fit's first plan). Blocks alike,
their plain attributes included but a transformers layer's ``layer_idx`` (a decoder's layers, see
:func:`~lightning_ckpt.core.timing.block_kind`), hold the same: once a kind's first two calls have
measured the same bytes, its later calls do not run and are given those bytes (they return the kind's
last output, which has their shapes). A kind whose two calls differ has every call measured, and a
forward that fails with calls skipped is run again whole.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch
import torch.nn as nn

from lightning_ckpt.core.step_tracker import StepTracker
from lightning_ckpt.core.timing import block_kind, inputs_kind, nested

__all__ = ["forward_working_sets"]


def forward_working_sets(
    modules: dict[str, nn.Module], step_fn: Callable[[], Any], *, alike: bool = True
) -> dict[str, int]:
    """Per candidate, the most its forward allocates above what is live when it starts, in ``step_fn`` run
    with every saved tensor dropped: what a checkpointed candidate's forward holds.

    Example:
        >>> model = nn.Sequential(*(nn.Linear(8, 8) for _ in range(4)))
        >>> forward_working_sets(dict(model.named_children()), lambda: model(torch.ones(2, 8)))
        {'0': 64, '1': 64, '2': 64, '3': 64}
    """
    if alike and not nested(modules):
        try:
            return _measured(modules, step_fn, skip_alike=True)
        except BackwardInForwardError:
            raise
        except Exception:  # the model read what a skipped block returned: measure every call
            pass
    return _measured(modules, step_fn, skip_alike=False)


def _measured(modules: dict[str, nn.Module], step_fn: Callable[[], Any], skip_alike: bool) -> dict[str, int]:
    tracker, starts, kinds = StepTracker(frozenset()), [], _MeasuredKinds()
    working = dict.fromkeys(modules, 0)
    current: dict[str, list[Hashable | None]] = {name: [] for name in modules}  # each running call's kind
    handles, saved = [], {name: module.__dict__.get("forward") for name, module in modules.items()}

    def pre(name: str):
        def hook(*_: Any) -> None:
            starts.append(tracker.live_bytes)
            tracker.open_window()

        return hook

    def post(name: str):
        def hook(*_: Any) -> None:
            held = tracker.close_window() - starts.pop()
            working[name] = max(working[name], held)
            kinds.measured(current[name].pop() if current[name] else None, held)

        return hook

    try:
        for name, module in modules.items():
            handles.append(module.register_forward_pre_hook(pre(name)))
            handles.append(module.register_forward_hook(post(name), always_call=True))
            if skip_alike:
                module.forward = _skipping(name, module, kinds, current[name])
        with tracker, torch.autograd.graph.saved_tensors_hooks(_dropped, _unpacked):
            step_fn()
    finally:
        for handle in handles:
            handle.remove()
        for name, module in modules.items():
            if skip_alike and saved[name] is None:
                del module.forward
            elif skip_alike:
                module.forward = saved[name]
    return kinds.with_skipped(working)


def _skipping(
    name: str, module: nn.Module, kinds: _MeasuredKinds, current: list[Hashable | None]
) -> Callable[..., Any]:
    forward = module.forward
    structure = block_kind(module, attributes=True)

    def call(*args: Any, **kwargs: Any) -> Any:
        kind = (structure, inputs_kind(args, kwargs))
        if kinds.settled(kind):
            current.append(None)  # measured as nothing; given the kind's bytes after
            return kinds.skipped(name, kind)
        current.append(kind)
        out = forward(*args, **kwargs)
        kinds.outputs[kind] = out
        return out

    return call


class _MeasuredKinds:
    """Per kind, the bytes its measured calls held and its last output; the calls skipped."""

    def __init__(self) -> None:
        self.held: dict[Hashable, list[int]] = {}
        self.outputs: dict[Hashable, Any] = {}
        self.skipped_kind: dict[str, Hashable] = {}

    def measured(self, kind: Hashable | None, held: int) -> None:
        if kind is not None:
            self.held.setdefault(kind, []).append(held)

    def settled(self, kind: Hashable) -> bool:
        held = self.held.get(kind, ())
        return len(held) >= 2 and len(set(held)) == 1 and kind in self.outputs

    def skipped(self, name: str, kind: Hashable) -> Any:
        self.skipped_kind[name] = kind
        return self.outputs[kind]

    def with_skipped(self, working: dict[str, int]) -> dict[str, int]:
        return {
            name: max(held, self.held[self.skipped_kind[name]][0]) if name in self.skipped_kind else held
            for name, held in working.items()
        }


def _dropped(_: Any) -> None:
    """A saved-tensor pack hook that keeps nothing: the forward measured keeps nothing for backward."""
    return None


class BackwardInForwardError(RuntimeError):
    """The step's forward runs a backward inside itself, which the working-set measurement cannot run."""


def _unpacked(_: Any) -> None:
    """The unpack hook: reached only by a backward inside the forward (``torch.autograd.grad`` in it)."""
    raise BackwardInForwardError(
        "AutoCheckpoint measures what each checkpointed candidate holds by running the step's forward with"
        " nothing saved for backward, and this forward runs a backward inside itself (torch.autograd.grad,"
        " a gradient penalty): not supported; if a candidate module does it, leave it out of `targets`"
    )
