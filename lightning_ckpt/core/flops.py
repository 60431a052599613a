"""FLOPs of a profiled step counted by torch's own counter, without what only its per-module table needs.

Example:
    >>> import torch
    >>> with TotalFlopCounter(display=False) as counter:
    ...     _ = torch.ones(2, 3) @ torch.ones(3, 4)
    >>> counter.get_total_flops()
    48
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from lightning_ckpt._compat import FlopDispatchMode, HigherOrderOperator, has_composite_implicit_kernel

__all__ = ["TotalFlopCounter"]


class TotalFlopCounter(FlopCounterMode):
    """``FlopCounterMode``'s count, totals only: its own dispatch mode (decompositions included, so the
    ops below it are the same) without the module tracker that only its per-module table needs, whose
    hooks cost a fake profile 3-7% (the recorder splits the total per candidate itself), and with the
    per-op facts of that mode's dispatch looked up once per op (:class:`_TotalsDispatch`). On a torch
    without that separate mode (2.4) it is ``FlopCounterMode`` as it is."""

    def __enter__(self) -> TotalFlopCounter:
        if FlopDispatchMode is None:
            return super().__enter__()
        self.flop_counts.clear()
        self.mode = _TotalsDispatch(self)
        self.mode.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> Any:
        if FlopDispatchMode is None:
            return super().__exit__(*exc_info)
        mode, self.mode = self.mode, None
        return mode.__exit__(*exc_info)


_DEVICE = torch.ops.prim.device.default
"""``tensor.device`` of a fake tensor: most of the ops a fake forward dispatches (the autograd engine and
every op ask it), never decomposed nor counted."""


class _TotalsDispatch(FlopDispatchMode or object):
    """``FlopCounterMode``'s dispatch, op for op the same decompositions and counts, faster: ``prim.device``
    goes straight through, and whether an op can decompose (a ``CompositeImplicitAutograd`` kernel) is
    looked up once per op, not tried on every call by entering the mode again. Size and stride queries
    and higher-order operators take the parent's own path."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs if kwargs else {}
        if func is _DEVICE:
            return func(*args, **kwargs)
        if isinstance(func, HigherOrderOperator) or func in _SIZE_QUERIES:
            return super().__torch_dispatch__(func, types, args, kwargs)
        if func not in self.counter.flop_registry and _decomposes(func):  # as the parent: by overload
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        out = func(*args, **kwargs)
        formula = self.counter.flop_registry.get(func.overloadpacket)
        if formula is not None:
            flops = formula(*args, **kwargs, out_val=out)
            for parent in set(self.counter.mod_tracker.parents):
                self.counter.flop_counts[parent][func.overloadpacket] += flops
        return out


_SIZE_QUERIES = frozenset(
    getattr(torch.ops.aten, name).default
    for name in (
        "sym_is_contiguous", "is_contiguous", "is_strides_like_format", "is_non_overlapping_and_dense",
        "size", "sym_size", "stride", "sym_stride", "storage_offset", "sym_storage_offset", "numel",
        "sym_numel", "dim",
    )
    if hasattr(torch.ops.aten, name)
) | {torch.ops.aten.is_contiguous.memory_format, torch.ops.prim.layout.default}  # fmt: skip
"""The ops ``FlopCounterMode``'s dispatch hands back (``NotImplemented``) for subclasses with their own
size and stride policy."""

_decomposes_of: dict[Any, bool] = {}


def _decomposes(func: Any) -> bool:
    """Whether ``func.decompose`` can do anything (see :func:`has_composite_implicit_kernel`), once per op."""
    known = _decomposes_of.get(func)
    if known is None:
        known = _decomposes_of[func] = has_composite_implicit_kernel(func)
    return known
