"""When a step's peak points are *nested*, the plan is a knapsack with prefix capacities.

Nested: every point is ``base + sum of w[m] over the kept m in A``, with one weight ``w[m] >= 0`` per
candidate, no either term, and sets ``A`` that form a chain ``A_1 ⊂ A_2 ⊂ ...`` (the backward frees
blocks in reverse forward order, so a point sees the blocks before it). Ordering the candidates along
the chain, each point bounds the kept weight of a prefix; a point that counts only when candidate
``c`` is kept (or checkpointed) needs ``A`` to be exactly the candidates before ``c``, and binds ``c``'s
take (or skip) capacity. ``prefix_form`` finds that order or says the points are not nested (None).

Example:
    >>> import numpy as np
    >>> from lightning_ckpt.core.memory.points import PeakPoint, PointMatrix
    >>> points = (
    ...     PeakPoint(10, np.array([0, 0])),  # before anything is kept
    ...     PeakPoint(12, np.array([5, 0]), when=(1, False)),  # b recomputed: a kept counts
    ...     PeakPoint(11, np.array([5, 7])),  # the end of the forward
    ... )
    >>> form = prefix_form(points)
    >>> form.order, form.weight_bytes, form.skip_base_bytes, form.total_base_bytes
    ((0, 1), (5, 7), (10, 12), 11)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lightning_ckpt.core.memory.points import PeakPoint, PointMatrix

__all__ = ["PrefixForm", "prefix_form"]

NO_BOUND = -math.inf


@dataclass(frozen=True)
class PrefixForm:
    """The nested points as a capped knapsack over the candidates in ``order``.

    At a budget ``B``, item ``j`` (the candidate ``order[j]``) may be kept while the kept items before
    it weigh at most ``B - take_base_bytes[j]``; checkpointed, at most ``B - skip_base_bytes[j]``; all
    kept items at most ``B - total_base_bytes``. ``-inf`` bases bind nothing.
    """

    order: tuple[int, ...]
    weight_bytes: tuple[int, ...]
    take_base_bytes: tuple[float, ...]
    skip_base_bytes: tuple[float, ...]
    total_base_bytes: float


def prefix_form(points: tuple[PeakPoint, ...], matrix: PointMatrix | None = None) -> PrefixForm | None:
    """The prefix-capacity form of the points (``matrix``: the same, stacked), or None if not nested."""
    matrix = PointMatrix(points) if matrix is None else matrix
    keep = matrix.keep
    weights = keep.max(axis=0, initial=0)
    if matrix.either or (keep < 0).any() or ((keep != 0) & (keep != weights)).any():
        return None
    grouped = _grouped(matrix)
    chain = sorted({frozenset(), *(members for members, _, _ in grouped)}, key=len)
    if any(not small < big for small, big in zip(chain[:-1], chain[1:], strict=True)):
        return None
    order = _order(grouped, chain, keep.shape[1])
    if order is None:
        return None
    return _bases(grouped, order, weights, chain)


def _grouped(matrix: PointMatrix) -> list[tuple[frozenset[int], tuple[int, bool] | None, int]]:
    """The points as (set of candidates with a weight, condition, largest base), one per distinct pair."""
    if not len(matrix.base):
        return []
    rows, set_index = np.unique(matrix.keep != 0, axis=0, return_inverse=True)
    sets = [frozenset(np.flatnonzero(row).tolist()) for row in rows]
    groups: dict[tuple[int, tuple[int, bool] | None], int] = {}
    columns = (
        set_index.ravel().tolist(),
        matrix.when_index.tolist(),
        matrix.when_kept.tolist(),
        matrix.base.tolist(),
    )
    for index, when_index, when_kept, base in zip(*columns, strict=True):
        key = (index, None if when_index < 0 else (when_index, when_kept))
        groups[key] = max(groups.get(key, base), base)
    return [(sets[index], when, base) for (index, when), base in groups.items()]


def _order(grouped, chain, n: int) -> list[int] | None:
    """Candidates along the chain, each conditional candidate right after its point's set."""
    level = {members: k for k, members in enumerate(chain)}
    layer_of = {m: k for k in range(1, len(chain)) for m in chain[k] - chain[k - 1]}
    slot: dict[int, int] = {}  # conditional candidate -> the chain level it must follow
    for members, when, _ in grouped:
        if when is not None and slot.setdefault(when[0], level[members]) != level[members]:
            return None
    firsts: dict[int, int] = {}  # chain level -> the weighted candidate that must open the next layer
    for m, k in slot.items():
        if m in layer_of and (layer_of[m] != k + 1 or firsts.setdefault(k, m) != m):
            return None
    order: list[int] = []
    for k in range(len(chain)):
        order += sorted(m for m, at in slot.items() if at == k and m not in layer_of)  # weightless
        if k + 1 < len(chain):
            layer = sorted(chain[k + 1] - chain[k], key=lambda m: (m != firsts.get(k), m))
            order += layer
    return order + sorted(set(range(n)) - set(order))


def _bases(grouped, order: list[int], weights: np.ndarray, chain) -> PrefixForm:
    """The largest base binding each item's take and skip capacity, and the total's."""
    position = {m: j for j, m in enumerate(order)}
    take, skip = [NO_BOUND] * len(order), [NO_BOUND] * len(order)
    total = NO_BOUND
    for members, when, base in grouped:
        if when is not None:
            bound = take if when[1] else skip
            bound[position[when[0]]] = max(bound[position[when[0]]], base)
            continue
        after = max((position[m] for m in members), default=-1) + 1  # the first item past the set
        if members == chain[-1]:
            total = max(total, base)
        elif after < len(order):
            take[after], skip[after] = max(take[after], base), max(skip[after], base)
    return PrefixForm(
        order=tuple(order),
        weight_bytes=tuple(int(weights[m]) for m in order),
        take_base_bytes=tuple(take),
        skip_base_bytes=tuple(skip),
        total_base_bytes=total,
    )
