"""When a step's peak points are *nested*, the plan is a knapsack with prefix capacities.

Nested: every point is ``base + sum of w[m] over the kept m in A``, with one weight ``w[m] >= 0`` per
candidate, no either term, and sets ``A`` that form a chain ``A_1 ⊂ A_2 ⊂ ...`` (the backward frees
blocks in reverse forward order, so a point sees the blocks before it). Ordering the candidates along
the chain, each point bounds the kept weight of a prefix; a point that counts only when candidate
``c`` is kept (or checkpointed) needs ``A`` to be exactly the candidates before ``c``, and binds ``c``'s
take (or skip) capacity. ``prefix_form`` finds that order or says the points are not nested (None).

Example:
    >>> import numpy as np
    >>> from lightning_ckpt.core.memory.points import PeakPoint
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

from lightning_ckpt.core.memory.points import PeakPoint

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


def prefix_form(points: tuple[PeakPoint, ...]) -> PrefixForm | None:
    """The prefix-capacity form of the points, or None when they are not nested."""
    n = len(points[0].keep_bytes) if points else 0
    weights = _common_weights(points, n)
    if weights is None:
        return None
    sets = [frozenset(np.flatnonzero(point.keep_bytes).tolist()) for point in points]
    chain = sorted({frozenset(), *sets}, key=len)
    if any(not small < big for small, big in zip(chain[:-1], chain[1:], strict=True)):
        return None
    order = _order(points, sets, chain, n)
    if order is None:
        return None
    return _bases(points, sets, order, weights, chain)


def _common_weights(points: tuple[PeakPoint, ...], n: int) -> np.ndarray | None:
    """One weight per candidate that every nonzero coefficient equals, or None."""
    if any(point.either_bytes for point in points):
        return None
    coefficients = np.array([point.keep_bytes for point in points], dtype=np.int64).reshape(len(points), n)
    weights = coefficients.max(axis=0, initial=0)
    if (coefficients < 0).any() or ((coefficients != 0) & (coefficients != weights)).any():
        return None
    return weights


def _order(points, sets, chain, n: int) -> list[int] | None:
    """Candidates along the chain, each conditional candidate right after its point's set."""
    level = {members: k for k, members in enumerate(chain)}
    layer_of = {m: k for k in range(1, len(chain)) for m in chain[k] - chain[k - 1]}
    slot: dict[int, int] = {}  # conditional candidate -> the chain level it must follow
    for point, members in zip(points, sets, strict=True):
        if point.when is not None and slot.setdefault(point.when[0], level[members]) != level[members]:
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


def _bases(points, sets, order: list[int], weights: np.ndarray, chain) -> PrefixForm:
    """The largest base binding each item's take and skip capacity, and the total's."""
    position = {m: j for j, m in enumerate(order)}
    take, skip = [NO_BOUND] * len(order), [NO_BOUND] * len(order)
    total = NO_BOUND
    for point, members in zip(points, sets, strict=True):
        if point.when is not None:
            j = position[point.when[0]]
            bound = take if point.when[1] else skip
            bound[j] = max(bound[j], point.base_bytes)
            continue
        after = max((position[m] for m in members), default=-1) + 1  # the first item past the set
        if members == chain[-1]:
            total = max(total, point.base_bytes)
        elif after < len(order):
            take[after], skip[after] = max(take[after], point.base_bytes), max(skip[after], point.base_bytes)
    return PrefixForm(
        order=tuple(order),
        weight_bytes=tuple(int(weights[m]) for m in order),
        take_base_bytes=tuple(take),
        skip_base_bytes=tuple(skip),
        total_base_bytes=total,
    )
