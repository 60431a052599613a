"""A selective-checkpoint policy that saves chosen op calls by name and occurrence.

``SelectivePolicy(saved)`` names op calls as :class:`~lightning_ckpt.core.selective.ops.OpCall.key` does:
``("aten.addmm.default", 2)`` is the third ``addmm`` of the region. Its :meth:`~SelectivePolicy.context_fn`
is what ``torch.utils.checkpoint``'s ``context_fn`` takes: each call makes a fresh pair of
``create_selective_checkpoint_contexts`` modes with fresh occurrence counters (one region each, as
torchtitan's per-region ``meta`` counters do), ``MUST_SAVE`` for the named calls, ``PREFER_RECOMPUTE``
for the rest. Random ops are never named by the options (they are recomputed, and checkpoint's preserved
RNG state gives them the forward's random numbers).

Example:
    >>> import torch
    >>> from torch.utils.checkpoint import checkpoint
    >>> policy = SelectivePolicy(frozenset({("aten.mm.default", 0)}))
    >>> x = torch.randn(3, 3, requires_grad=True)
    >>> y = checkpoint(lambda t: (t @ t).sin(), x, use_reentrant=False, context_fn=policy.context_fn)
    >>> y.sum().backward()
    >>> x.grad.shape
    torch.Size([3, 3])
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

__all__ = ["SelectivePolicy"]


@dataclasses.dataclass(frozen=True)
class SelectivePolicy:
    """The op calls whose outputs a selective checkpoint saves; every other op is recomputed.

    Attributes:
        saved: ``(op name, occurrence)`` pairs, e.g. ``("aten._scaled_dot_product_flash_attention_for_cpu.default", 0)``.
    """

    saved: frozenset[tuple[str, int]]

    def __post_init__(self) -> None:
        bad = [key for key in self.saved if not _is_call_key(key)]
        if not isinstance(self.saved, frozenset) or bad:
            raise ValueError(
                "`saved` must be a frozenset of (op name, occurrence >= 0) pairs such as "
                f"('aten.mm.default', 0), got {bad[:3] if bad else type(self.saved).__name__}"
            )

    def context_fn(self) -> tuple[Any, Any]:
        """A fresh pair of selective-checkpoint modes for one region (forward, recomputation)."""
        return create_selective_checkpoint_contexts(_CallPolicy(self.saved))


def _is_call_key(key: Any) -> bool:
    return (
        isinstance(key, tuple)
        and len(key) == 2
        and isinstance(key[0], str)
        and isinstance(key[1], int)
        and key[1] >= 0
    )


class _CallPolicy:
    """Counts the calls of each op in one region's forward; saves the named occurrences."""

    def __init__(self, saved: frozenset[tuple[str, int]]) -> None:
        self.saved_names = {name for name, _ in saved}
        self.saved = saved
        self.counts: dict[Any, int] = defaultdict(int)

    def __call__(self, ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        index = self.counts[func]
        self.counts[func] += 1
        name = str(func)
        if name in self.saved_names and (name, index) in self.saved:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE
