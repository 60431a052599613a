"""Families of batch shapes: one plan for every batch a padded collator can make, not one per length.

Dynamic padding (each batch padded to its own longest sequence) gives a new shape nearly every step. A
plan made for a shape holds for every smaller one of the same structure (same tensors, ranks and
dtypes, each size at most the planned one): activation memory only grows with the sizes. So a batch
whose shapes some plan covers uses that plan (the one with the smallest predicted peak), and a batch
that nothing covers is planned at the top of its family: the fit's first batch at its sequence length
rounded up to a power of two, a later one with each size that differs from the first planned shapes of
its structure rounded up. Lengths 16 to 256 then cost at most five plans, usually one or two.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from lightning_ckpt._compat import tree_flatten, tree_leaves, tree_unflatten

__all__ = ["BatchShapes", "batch_shapes", "covers", "family_top", "ladder_size", "length_rung", "pad_batch"]

BatchShapes = tuple[tuple[tuple[int, ...], str], ...]
"""The shape and dtype of every tensor of a batch, in ``tree_leaves`` order: what a plan depends on."""


def batch_shapes(batch: Any) -> BatchShapes:
    """The shapes and dtypes of the batch's tensors (non-tensors are ignored).

    Example:
        >>> batch_shapes({"ids": torch.zeros(2, 8, dtype=torch.long), "meta": "x"})
        (((2, 8), 'torch.int64'),)
    """
    return tuple((tuple(t.shape), str(t.dtype)) for t in tree_leaves(batch) if isinstance(t, torch.Tensor))


def ladder_size(size: int) -> int:
    """The rung of the ladder a size belongs to: the smallest power of two at least ``size``.

    Raises:
        ValueError: for a size that is not a non-negative int.

    Example:
        >>> [ladder_size(n) for n in (0, 1, 3, 16, 17, 200, 256)]
        [0, 1, 4, 16, 32, 256, 256]
    """
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f"`size` must be a non-negative int, got {size!r}")
    return 0 if size == 0 else 1 << (size - 1).bit_length()


def same_structure(a: BatchShapes, b: BatchShapes) -> bool:
    """Whether two batches have the same tensors: as many, of the same ranks and dtypes."""
    return len(a) == len(b) and all(
        len(sa) == len(sb) and da == db for (sa, da), (sb, db) in zip(a, b, strict=True)
    )


def covers(top: BatchShapes, shapes: BatchShapes) -> bool:
    """Whether a plan made for ``top`` holds for ``shapes``: the same structure, no size larger.

    Example:
        >>> covers((((8, 256), "torch.int64"),), (((8, 100), "torch.int64"),))
        True
        >>> covers((((8, 256), "torch.int64"),), (((9, 100), "torch.int64"),))
        False
    """
    return same_structure(top, shapes) and all(
        n <= m for (st, _), (ss, _) in zip(top, shapes, strict=True) for m, n in zip(st, ss, strict=True)
    )


def family_top(shapes: BatchShapes, planned: Iterable[BatchShapes]) -> BatchShapes:
    """The shapes to plan a new family at: ``shapes`` with each size that differs from the first of
    ``planned`` of the same structure (the anchor) rounded up to the ladder; when none has that
    structure (the fit's first batch), ``shapes`` at the rung of its sequence length (:func:`length_rung`).

    Example:
        >>> anchor = (((8, 133), "torch.int64"),)
        >>> family_top((((8, 200), "torch.int64"),), [anchor])
        (((8, 256), 'torch.int64'),)
        >>> family_top((((8, 200), "torch.int64"),), [])
        (((8, 256), 'torch.int64'),)
    """
    anchor = next((p for p in planned if same_structure(p, shapes)), None)
    if anchor is None:
        return length_rung(shapes)
    return tuple(
        (tuple(n if n == a else ladder_size(n) for n, a in zip(shape, anchor_shape, strict=True)), dtype)
        for (shape, dtype), (anchor_shape, _) in zip(shapes, anchor, strict=True)
    )


def length_rung(shapes: BatchShapes) -> BatchShapes:
    """``shapes`` with the sequence length rounded up to the ladder: the sizes at dimension 1 of the
    batch's 2-d integer or bool tensors (token ids, masks, labels: ``(batch, length)``), wherever they
    appear past dimension 0 of any tensor. Shapes with no such tensor (images) stay as they are.

    A fit's first plan is made there, so that dynamic padding finds its first family already planned;
    a fixed length that is not a power of two is planned at its own shapes on the fit's second step.

    Example:
        >>> length_rung(((((8, 133), "torch.int64"), ((8, 1, 133, 133), "torch.float32"))))
        (((8, 256), 'torch.int64'), ((8, 1, 256, 256), 'torch.float32'))
        >>> length_rung((((8, 3, 224, 224), "torch.float32"), ((8,), "torch.int64")))
        (((8, 3, 224, 224), 'torch.float32'), ((8,), 'torch.int64'))
    """
    lengths = {shape[1] for shape, dtype in shapes if len(shape) == 2 and _is_token_dtype(dtype)}
    return tuple(
        (tuple(n if dim == 0 or n not in lengths else ladder_size(n) for dim, n in enumerate(shape)), dtype)
        for shape, dtype in shapes
    )


def _is_token_dtype(dtype: str) -> bool:
    return dtype == "torch.bool" or (dtype.startswith(("torch.int", "torch.uint")))


def pad_batch(batch: Any, shapes: BatchShapes) -> Any:
    """``batch`` with each tensor grown to ``shapes`` (in ``tree_leaves`` order) by repeating its last
    entry along every dimension that grows: token ids, masks and labels stay values the model accepts.
    Under ``FakeTensorMode`` (the profile) nothing is allocated.

    Raises:
        ValueError: when ``shapes`` does not cover the batch.

    Example:
        >>> pad_batch({"ids": torch.tensor([[1, 2]])}, (((1, 4), "torch.int64"),))
        {'ids': tensor([[1, 2, 2, 2]])}
    """
    leaves, spec = tree_flatten(batch)
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    own = tuple((tuple(t.shape), str(t.dtype)) for t in tensors)
    if not covers(shapes, own):
        raise ValueError(f"`shapes` must cover the batch's shapes {own}, got {shapes}")
    grown = iter(_grown(t, target) for t, (target, _) in zip(tensors, shapes, strict=True))
    return tree_unflatten([next(grown) if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves], spec)


def _grown(tensor: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    for dim, size in enumerate(shape):
        have = tensor.shape[dim]
        if size == have:
            continue
        if have == 0:
            grown_shape = (*tensor.shape[:dim], size, *tensor.shape[dim + 1 :])
            tensor = tensor.new_zeros(grown_shape)
            continue
        index = torch.arange(size, device=tensor.device).clamp_(max=have - 1)
        tensor = tensor.index_select(dim, index)
    return tensor
