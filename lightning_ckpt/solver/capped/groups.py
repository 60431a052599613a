"""The capped engine's instance: groups of options, one chosen per group, under prefix capacities.

Group ``g`` has options ``starts[g]:starts[g + 1]`` of the flat arrays: option ``o`` weighs
``weights[o]``, is worth ``values[o]`` and may be chosen only while the chosen options of the groups
before ``g`` weigh at most ``caps[o]`` (below 0: never); everything chosen at most the capacity W.
A 0/1 knapsack with take and skip caps is the two-option case (``from_items``): option 0 leaves the
item out (weight 0, value 0, cap ``skip``), option 1 takes it (cap ``take``).

``reach`` is what every path starts from: ``R[g]``, the most the groups before ``g`` may weigh so
that the rest can still be completed (exact, since a lighter prefix can do whatever a heavier one
can), and each option's cap with the rest's room folded in (``min(cap, R[g + 1] - w)``). An
instance is feasible iff ``R[0] >= 0``.

Example:
    >>> groups = from_items(np.array([3, 3]), np.array([1.0, 2.0]), np.array([6, 0]), np.array([6, 6]))
    >>> groups.weights.tolist(), groups.caps.tolist(), groups.binary
    ([0, 3, 0, 3], [6, 6, 6, 0], True)
    >>> room, fitted = reach(groups, 6)
    >>> room.tolist(), fitted.tolist()  # item 1 taken only with nothing before it
    ([6, 6, 6], [6, 3, 6, 0])
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

__all__ = ["Groups", "choice_violation", "divided", "from_items", "from_options", "reach"]


class Groups(NamedTuple):
    """Options in flat arrays, group ``g`` owning ``starts[g]:starts[g + 1]``."""

    weights: np.ndarray
    """int64 option weights >= 0."""
    values: np.ndarray
    """float64 option values >= 0."""
    caps: np.ndarray
    """int64: the most the groups before may weigh when this option is chosen (below 0: never)."""
    starts: np.ndarray
    """int64, one more than there are groups: where each group's options start."""
    binary: bool
    """Every group is ``(0, 0.0, skip), (w, v, take)``: a 0/1 item (the kernels' fast path)."""

    @property
    def count(self) -> int:
        """How many groups."""
        return len(self.starts) - 1

    @property
    def work_items(self) -> int:
        """Item passes a profile makes per capacity unit: one per 0/1 item, else one per option."""
        return self.count if self.binary else len(self.weights)

    def sizes(self) -> np.ndarray:
        """Options per group."""
        return np.diff(self.starts)

    def group_of(self) -> np.ndarray:
        """The group of every option."""
        return self.per_option(np.arange(self.count))

    def per_option(self, per_group: np.ndarray) -> np.ndarray:
        """A per-group array repeated for each of the group's options."""
        return np.repeat(per_group, 2) if self.binary else np.repeat(per_group, self.sizes())

    def group_max(self, per_option: np.ndarray) -> np.ndarray:
        """The largest entry of each group (of a per-option array)."""
        if self.binary:
            return np.maximum(per_option[0::2], per_option[1::2])
        return np.maximum.reduceat(per_option, self.starts[:-1]) if self.count else per_option[:0]


def from_items(weights: np.ndarray, values: np.ndarray, take: np.ndarray, skip: np.ndarray) -> Groups:
    """The 0/1 knapsack with take and skip caps as two-option groups (leave out, take)."""
    n = len(weights)
    flat_w = np.zeros(2 * n, dtype=np.int64)
    flat_v = np.zeros(2 * n)
    caps = np.empty(2 * n, dtype=np.int64)
    flat_w[1::2], flat_v[1::2], caps[0::2], caps[1::2] = weights, values, skip, take
    return Groups(flat_w, flat_v, caps, np.arange(0, 2 * n + 1, 2, dtype=np.int64), True)


def from_options(weights: np.ndarray, values: np.ndarray, caps: np.ndarray, starts: np.ndarray) -> Groups:
    """Groups from flat arrays (``binary`` worked out)."""
    sizes = np.diff(starts)
    binary = bool((sizes == 2).all()) and not (weights[0::2].any() or values[0::2].any())
    return Groups(weights, values, caps, starts, binary)


def divided(groups: Groups, capacity: int) -> tuple[Groups, int]:
    """Weights, caps and capacity divided (floor) by the weights' common divisor, the caps clipped to
    the capacity: chosen weights are multiples of the divisor, so every bound may be floored.

    Example:
        >>> g = from_items(np.array([4, 6]), np.array([1.0, 1.0]), np.array([20, 7]), np.array([5, 9]))
        >>> g, cap = divided(g, 13)
        >>> g.weights.tolist(), cap, g.caps.tolist()
        ([0, 2, 0, 3], 6, [2, 6, 4, 3])
    """
    divisor = math.gcd(*groups.weights.tolist()) or 1
    capacity //= divisor
    caps = np.minimum(groups.caps // divisor, capacity)
    return groups._replace(weights=groups.weights // divisor, caps=caps), capacity


def reach(groups: Groups, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """``(R, fitted)``: ``R[g]`` (``g = 0..n``), the most the groups before ``g`` may weigh with a
    feasible completion (``R[n] = capacity``; below 0 from some ``g`` down: infeasible), and every
    option's cap less what the rest needs (``min(cap, R[g + 1] - w)``; below 0: never chosen)."""
    if groups.binary:
        return _binary_reach(groups, capacity)
    n = groups.count
    room = [0] * n + [capacity]
    fitted = groups.caps.tolist()
    weights, starts = groups.weights.tolist(), groups.starts.tolist()
    after = capacity
    for g in range(n - 1, -1, -1):
        best = -1
        for o in range(starts[g], starts[g + 1]):
            cap = min(fitted[o], after - weights[o])
            fitted[o] = cap
            best = cap if cap > best else best
        after = room[g] = best
        if best < 0:  # nothing fits from here down: every earlier prefix fails too
            room[:g] = [-1] * g
            fitted[: starts[g]] = [-1] * starts[g]
            break
    return np.array(room, dtype=np.int64), np.array(fitted, dtype=np.int64)


def _binary_reach(groups: Groups, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """``reach`` for 0/1 items (options: leave out, take), in one loop over the items."""
    n = groups.count
    skip, take, weights = (
        groups.caps[0::2].tolist(),
        groups.caps[1::2].tolist(),
        groups.weights[1::2].tolist(),
    )
    room, fit_skip, fit_take = [0] * n + [capacity], [0] * n, [0] * n
    after = capacity
    for g in range(n - 1, -1, -1):
        s, t = skip[g], after - weights[g]
        s = after if after < s else s
        t = take[g] if take[g] < t else t
        fit_skip[g], fit_take[g] = s, t
        after = room[g] = s if s > t else t
    fitted = np.empty(2 * n, dtype=np.int64)
    fitted[0::2], fitted[1::2] = fit_skip, fit_take
    room_array = np.array(room, dtype=np.int64)
    infeasible = np.flatnonzero(room_array < 0)
    if len(infeasible):  # nothing fits from there down: every earlier prefix fails too
        last = int(infeasible.max())
        room_array[:last] = -1
        fitted[: 2 * last] = np.minimum(fitted[: 2 * last], -1)
    return room_array, fitted


def choice_violation(groups: Groups, choice: np.ndarray, capacity: int) -> str | None:
    """What the choice (an option index per group, within its group) breaks, or None.

    Example:
        >>> g = from_items(np.array([2, 2]), np.array([1.0, 1.0]), np.array([4, 1]), np.array([4, 4]))
        >>> choice_violation(g, np.array([1, 1]), 4)
        'group 1 takes option 1 after 2 of chosen weight, over its cap 1'
    """
    before, sizes = 0, groups.sizes().tolist()
    for g, j in enumerate(choice.tolist()):
        if not 0 <= j < sizes[g]:
            return f"group {g} takes option {j}, not one of its {sizes[g]}"
        o = int(groups.starts[g]) + j
        if before > int(groups.caps[o]):
            return (
                f"group {g} takes option {j} after {before} of chosen weight, over its cap {groups.caps[o]}"
            )
        before += int(groups.weights[o])
    return None if before <= capacity else f"chosen weight {before} over the capacity {capacity}"
