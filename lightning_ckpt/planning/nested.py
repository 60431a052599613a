"""When a step's peak points are *nested*, the plan is a knapsack with prefix capacities.

Nested: every point is ``base + sum of w[m] over the kept m in A``, with one weight ``w[m] >= 0`` per
candidate, no either term, and sets ``A`` that form a chain ``A_1 ⊂ A_2 ⊂ ...`` (the backward frees
blocks in reverse forward order, so a point sees the blocks before it). Ordering the candidates along
the chain, each point bounds the kept weight of a prefix; a point that counts only when candidate
``c`` is kept (or checkpointed) needs ``A`` to be exactly the candidates before ``c``, and binds ``c``'s
take (or skip) capacity. ``prefix_form`` finds that order or says the points are not nested (None);
``nested_instance`` turns it into the capped knapsack in quanta at a budget.

Example:
    >>> import numpy as np
    >>> from lightning_ckpt.planning.points import PeakPoint, PointMatrix
    >>> points = (
    ...     PeakPoint(10, np.array([0, 0])),  # before anything is kept
    ...     PeakPoint(12, np.array([5, 0]), when=(1, False)),  # b recomputed: a kept counts
    ...     PeakPoint(11, np.array([5, 7])),  # the end of the forward
    ... )
    >>> form = prefix_form(points)
    >>> form.order, form.weight_bytes, form.skip_base_bytes, form.total_base_bytes
    ((0, 1), (5, 7), (10, 12), 11)
    >>> nested_instance(form, [1.0, 2.0], budget_bytes=20, quantum_bytes=1)
    NestedInstance(items=(0, 1), weights=(5, 7), values=(1.0, 2.0), capacity=9, take_capacities=(9, 9), skip_capacities=(9, 8))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lightning_ckpt.planning.points import PeakPoint, PointMatrix

__all__ = ["NestedInstance", "PrefixForm", "nested_instance", "prefix_form"]

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


@dataclass(frozen=True)
class NestedInstance:
    """The capped knapsack of nested points at one budget, in quanta (what ``solve_knapsack`` takes).

    Item ``j`` is the candidate ``items[j]`` (profile order); it may be kept while the kept items before
    it weigh at most ``take_capacities[j]``, and checkpointed while they weigh at most
    ``skip_capacities[j]``; all kept items weigh at most ``capacity``.
    """

    items: tuple[int, ...]
    weights: tuple[int, ...]
    values: tuple[float, ...]
    capacity: int
    take_capacities: tuple[int, ...]
    skip_capacities: tuple[int, ...]


def prefix_form(points: tuple[PeakPoint, ...], matrix: PointMatrix | None = None) -> PrefixForm | None:
    """The prefix-capacity form of the points (``matrix``: the same, stacked), or None if not nested."""
    matrix = PointMatrix(points) if matrix is None else matrix
    keep = matrix.keep
    weights = keep.max(axis=0, initial=0)
    if matrix.either or (keep < 0).any() or ((keep != 0) & (keep != weights)).any():
        return None
    sets, grouped = _grouped(matrix)
    chain = _chain(sets)
    if chain is None:
        return None
    layers = [
        np.flatnonzero(sets[big] & ~sets[small]).tolist()
        for small, big in zip(chain[:-1], chain[1:], strict=True)
    ]
    order = _order(grouped, chain, layers, keep.shape[1])
    if order is None:
        return None
    return _bases(grouped, sets, order, weights, chain)


_Group = tuple[int, "tuple[int, bool] | None", int]
"""(index of the set of candidates with a weight, condition, largest base)."""


def _grouped(matrix: PointMatrix) -> tuple[list[np.ndarray], list[_Group]]:
    """The distinct sets of candidates with a weight (boolean masks; the empty set first), and the points
    as one group per distinct (set, condition), with the largest base. Sets are told apart by their packed
    bits (a hash each: no sort of points x candidates)."""
    nonzero = matrix.keep != 0
    empty = np.zeros(matrix.keep.shape[1], dtype=np.bool_)
    index_of: dict[bytes, int] = {np.packbits(empty).tobytes(): 0}
    sets = [empty]
    groups: dict[tuple[int, tuple[int, bool] | None], int] = {}
    columns = (matrix.when_index.tolist(), matrix.when_kept.tolist(), matrix.base.tolist())
    for row, (when_index, when_kept, base) in enumerate(zip(*columns, strict=True)):
        key = np.packbits(nonzero[row]).tobytes()
        index = index_of.setdefault(key, len(sets))
        if index == len(sets):
            sets.append(nonzero[row])
        group = (index, None if when_index < 0 else (when_index, when_kept))
        groups[group] = max(groups.get(group, base), base)
    return sets, [(index, when, base) for (index, when), base in groups.items()]


def _chain(sets: list[np.ndarray]) -> list[int] | None:
    """The set indices from the smallest set to the largest, or None if each is not inside the next."""
    chain = sorted(range(len(sets)), key=lambda index: int(sets[index].sum()))
    sizes = [int(sets[index].sum()) for index in chain]
    if any(small >= big for small, big in zip(sizes[:-1], sizes[1:], strict=True)):
        return None
    if any((sets[small] & ~sets[big]).any() for small, big in zip(chain[:-1], chain[1:], strict=True)):
        return None
    return chain


def _order(grouped: list[_Group], chain: list[int], layers: list[list[int]], n: int) -> list[int] | None:
    """Candidates along the chain, each conditional candidate right after its point's set."""
    level = {members: k for k, members in enumerate(chain)}
    layer_of = {m: k + 1 for k, layer in enumerate(layers) for m in layer}
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
            order += sorted(layers[k], key=lambda m: (m != firsts.get(k), m))
    placed = set(order)
    return order + [m for m in range(n) if m not in placed]


def _bases(
    grouped: list[_Group], sets: list[np.ndarray], order: list[int], weights: np.ndarray, chain
) -> PrefixForm:
    """The largest base binding each item's take and skip capacity, and the total's."""
    position = np.empty(len(order), dtype=np.int64)
    position[order] = np.arange(len(order))
    take, skip = [NO_BOUND] * len(order), [NO_BOUND] * len(order)
    total = NO_BOUND
    after_set = [int(position[mask].max(initial=-1)) + 1 for mask in sets]  # the first item past each set
    for members, when, base in grouped:
        if when is not None:
            bound = take if when[1] else skip
            bound[position[when[0]]] = max(bound[position[when[0]]], base)
            continue
        after = after_set[members]
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


def _quanta(budget_bytes: int, base_bytes: float, quantum_bytes: int) -> float:
    """Whole quanta of room under the budget above a base (``inf`` for no base)."""
    return (
        float("inf")
        if base_bytes == float("-inf")
        else (int(budget_bytes) - int(base_bytes)) // quantum_bytes
    )


def nested_instance(
    form: PrefixForm, values: Sequence[float], budget_bytes: int, quantum_bytes: int
) -> NestedInstance | None:
    """The capped knapsack at the budget, in quanta, or None when nothing can be kept.

    Weights are rounded up and rooms down to whole quanta. Candidates that cannot be kept are left out,
    their skip cap moved to the next item (the same kept items lie before it).

    Raises:
        ValueError: when nothing fits, not even checkpointing every candidate.
    """
    weights = [-(-w // quantum_bytes) for w in form.weight_bytes]
    capacity = _quanta(budget_bytes, form.total_base_bytes, quantum_bytes)
    if capacity == float("inf"):
        capacity = sum(weights)
    if capacity < 0:
        raise ValueError("no set of kept candidates fits the budget, not even checkpointing every one")
    items, kept_weights, kept_values, take, skip = [], [], [], [], []
    carried = float("inf")  # the skip caps of left-out items, binding the next item
    for j, candidate in enumerate(form.order):
        take_j = min(_quanta(budget_bytes, form.take_base_bytes[j], quantum_bytes), carried, capacity)
        skip_j = min(_quanta(budget_bytes, form.skip_base_bytes[j], quantum_bytes), carried, capacity)
        if skip_j < 0:
            raise ValueError("no set of kept candidates fits the budget, not even checkpointing every one")
        if take_j < 0 or weights[j] > capacity:
            carried = skip_j
            continue
        carried = float("inf")
        items.append(candidate)
        kept_weights.append(weights[j])
        kept_values.append(float(values[candidate]))
        take.append(int(take_j))
        skip.append(int(skip_j))
    if not items:
        return None
    capacity = int(min(capacity, carried))
    return NestedInstance(
        tuple(items), tuple(kept_weights), tuple(kept_values), capacity, tuple(take), tuple(skip)
    )
