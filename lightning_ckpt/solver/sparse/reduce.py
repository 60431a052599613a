"""Exact reductions: shrink a knapsack instance before any dynamic programming.

Each step is provably exact: the optimum of the reduced instance plus the items fixed in equals
the optimum of the original. ``reduce_instance`` chains them and returns a ``Core`` whose
``expand`` maps a solution of the core back to original item indices.

Steps: take zero-weight items; drop items heavier than the capacity and zero-value items; take
everything when everything fits; fix items by the LP (Dantzig) bound against a greedy lower
bound (Dembo-Hammer), raised to the best set one move from the break solution where it fixes few
items; merge repeated identical items into binary bundles (1, 2, 4, ...); divide weights and
capacity (floor) by the weights' common divisor.

Example:
    >>> core = reduce_instance(np.array([0, 5, 2, 2]), np.array([1.0, 9.0, 1.0, 0.0]), 4)
    >>> core.taken.tolist(), core.weights.tolist(), core.capacity
    ([0, 2], [], 0)
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from lightning_ckpt.solver.sparse.bounds import best_swap

__all__ = [
    "LP_MARGIN_RELATIVE",
    "SWAP_BELOW_FIXED_SHARE",
    "Core",
    "bundle_sizes",
    "lp_fix",
    "merge_identical",
    "reduce_instance",
]

# Only fix an item when its bound is below the lower bound by this relative margin: float64
# sums of a few thousand values are off by far less, so fixing stays exact.
LP_MARGIN_RELATIVE = 1e-9

SWAP_BELOW_FIXED_SHARE = 8
"""Where the greedy lower bound fixes fewer than one item in this many, it is raised to the best set
one move from the break solution (``bounds.best_swap``, which ``minknap`` uses on hard instances):
there the greedy is weak. Measured on the bench's families, seeds 1-5, n = 42-1000: strongly
correlated items (B) had none fixed in 29 of 30 instances, and 4-685 after the move (19-32 of the
recorded ``torch.compile`` instances' 42-54); family C's instances with none fixed, 0-124 after it.
The move costs about 12 us on lists (n = 54) and 24-27 us in numpy (n = 54-300). It would also fix
10-24 more items on some of family A's instances, where the greedy fixes a third to a half; on the
recorded ones (seed 1) a rule of one in two would only add the move to C n = 48, which it leaves as
it is."""


@dataclass(frozen=True)
class Core:
    """The reduced instance and how to map its solution back.

    Attributes:
        taken: Original indices fixed in the solution.
        weights: Core item weights (int64, divided by the common divisor).
        values: Core item values (float64).
        capacity: Core capacity (same units as ``weights``).
        group: For each core item, the group of identical original items it bundles.
        copies: For each core item, how many copies of its group it stands for.
        members: Original indices, grouped: group ``g`` is ``members[starts[g]:starts[g + 1]]``.
        starts: Group boundaries in ``members``.
    """

    taken: np.ndarray
    weights: np.ndarray
    values: np.ndarray
    capacity: int
    group: np.ndarray
    copies: np.ndarray
    members: np.ndarray
    starts: np.ndarray

    def expand(self, chosen: np.ndarray) -> np.ndarray:
        """Sorted original indices of ``taken`` plus the core items in the mask ``chosen``.

        Identical items are kept lowest index first.
        """
        if len(self.members) == len(self.group):  # no bundles: core item i is members[i]
            return np.sort(np.concatenate([self.taken, self.members[chosen]]).astype(np.int64))
        counts = np.bincount(self.group[chosen], weights=self.copies[chosen], minlength=len(self.starts) - 1)
        sizes = np.diff(self.starts)
        of = np.repeat(np.arange(len(sizes)), sizes)  # each member's group
        rank = np.arange(len(self.members)) - self.starts[of]  # its place in the group
        picked = self.members[rank < counts[of]]  # the first counts[g] members of each group g
        return np.sort(np.concatenate([self.taken, picked]).astype(np.int64))


def int_total(weights: np.ndarray) -> int:
    """Exact total of integer weights (Python ints: no int64 overflow)."""
    return sum(weights.tolist())


def _trivial(weights, values, index, capacity):
    """Take zero-weight items, drop useless ones; take all if all fit. Returns taken, kept
    (``index`` None: every item)."""
    w, v = (weights, values) if index is None else (weights[index], values[index])
    index = np.arange(len(weights)) if index is None else index
    free = w == 0
    useful = ~free & (v > 0) & (w <= capacity)
    taken, kept = index[free], index[useful]
    if int_total(w[useful]) <= capacity:
        return np.concatenate([taken, kept]), kept[:0]
    return taken, kept


def _greedy_lower_bound(weights: np.ndarray, values: np.ndarray, capacity: int, brk: int) -> float:
    """Value of the ratio-greedy solution (items sorted by ratio, best first; the first ``brk`` fit
    together; every weight at most ``capacity``). Past them only items lighter than the room left
    can fit (it only shrinks); values are added one by one in item order, as a plain loop over all
    items would."""
    total = 0.0
    for v in values[:brk].tolist():
        total += v
    room = capacity - int_total(weights[:brk])
    light = np.flatnonzero(weights[brk:] <= room) + brk
    for w, v in zip(weights[light].tolist(), values[light].tolist(), strict=True):
        if w <= room:
            room -= w
            total += v
    return max(total, float(values.max(initial=0.0)))  # the best single item: every weight fits


def lp_fix(weights: np.ndarray, values: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Fix items by the Dantzig bound (Dembo-Hammer); all weights in (0, capacity], values > 0.

    With ``r`` the ratio of the break item, any solution has value at most
    ``z_lp - |v_j - r * w_j|`` when it flips item ``j`` from its LP value. Items whose bound is
    below the greedy lower bound (by a safe margin; raised by one move where it fixes few items)
    keep their LP value in every optimum.

    Returns:
        Boolean masks ``(fixed_in, fixed_out)``.

    Example:
        >>> fixed_in, fixed_out = lp_fix(np.array([4, 4, 4]), np.array([8.0, 4.1, 1.0]), 6)
        >>> fixed_in.tolist(), fixed_out.tolist()
        ([True, False, False], [False, False, True])
    """
    order = np.argsort(-(values / weights), kind="stable")  # best ratio first, ties by index
    w, v = weights[order], values[order]
    prefix = np.cumsum(w)
    brk = int(np.searchsorted(prefix, capacity, side="right"))
    no_fix = np.zeros(len(weights), dtype=np.bool_)
    if brk >= len(w):
        return ~no_fix, no_fix
    ratio = v[brk] / w[brk]
    used = int(prefix[brk - 1]) if brk else 0
    z_lp = float(v[:brk].sum()) + ratio * (capacity - used)
    lower = _greedy_lower_bound(w, v, capacity, brk)
    margin = LP_MARGIN_RELATIVE * max(z_lp, 1e-300)
    bound = z_lp - np.abs(v - ratio * w)
    fixable = bound < lower - margin
    if np.count_nonzero(fixable) * SWAP_BELOW_FIXED_SHARE < len(w):  # a weak bound: raise it by a swap
        swapped = best_swap(w, v, capacity)[0]  # the best set one move from the break solution
        if swapped > lower:
            lower, fixable = swapped, bound < swapped - margin
    if not fixable.any():  # strongly correlated items: nothing to scatter back (B n=54: 18 us, now 13)
        return no_fix, no_fix.copy()
    positions = np.arange(len(w))
    fixed_in, fixed_out = no_fix.copy(), no_fix.copy()
    fixed_in[order] = fixable & (positions < brk)
    fixed_out[order] = fixable & (positions > brk)
    return fixed_in, fixed_out


def merge_identical(weights: np.ndarray, values: np.ndarray, index: np.ndarray) -> dict[str, np.ndarray]:
    """Group identical (weight, value) items and split each group into binary bundles.

    A group of ``m`` copies becomes bundles of 1, 2, 4, ... copies plus a remainder: every count
    0..m is a sum of some bundles. Output items are sorted by weight (for tighter clipping).
    """
    order = np.lexsort((index, values, weights))
    w, v, idx = weights[order], values[order], index[order]
    new_group = np.ones(len(w), dtype=np.bool_)
    new_group[1:] = (w[1:] != w[:-1]) | (v[1:] != v[:-1])
    starts = np.concatenate((np.flatnonzero(new_group), [len(w)]))  # not np.append, np.diff: 2 us less
    sizes = starts[1:] - starts[:-1]
    if len(sizes) == len(w):  # no two items alike: no bundles
        ones = np.ones(len(w), dtype=np.int64)
        return {
            "weights": w,
            "values": v,
            "group": np.arange(len(w)),
            "copies": ones,
            "members": idx,
            "starts": starts,
        }
    copies = [[1]] * len(sizes)  # a lone item is one bundle of one copy
    for g in np.flatnonzero(sizes > 1).tolist():
        copies[g] = bundle_sizes(int(sizes[g]))
    group = np.repeat(np.arange(len(sizes)), [len(c) for c in copies])
    copies_flat = np.fromiter(itertools.chain.from_iterable(copies), dtype=np.int64, count=len(group))
    first = starts[:-1][group]
    return {
        "weights": w[first] * copies_flat,
        "values": v[first] * copies_flat,
        "group": group,
        "copies": copies_flat,
        "members": idx,
        "starts": starts,
    }


def bundle_sizes(count: int) -> list[int]:
    """1, 2, 4, ... and a remainder, summing to ``count``: e.g. 10 -> [1, 2, 4, 3]."""
    sizes, size = [], 1
    while count > 0:
        sizes.append(min(size, count))
        count -= size
        size *= 2
    return sizes


def reduce_instance(weights: np.ndarray, values: np.ndarray, capacity: int, *, use_lp: bool = True) -> Core:
    """Apply every exact reduction; ``use_lp=False`` keeps only the trivial ones and gcd.

    Args:
        weights: Validated int64 weights.
        values: Validated float64 values.
        capacity: Validated capacity.
        use_lp: Also fix items by the LP bound and merge identical items.
    """
    taken, kept = _trivial(weights, values, None, capacity)
    kept_items = weights[kept], values[kept]
    if len(kept) and use_lp:
        fixed_in, fixed_out = lp_fix(*kept_items, capacity)
        if fixed_in.any() or fixed_out.any():  # else the trivial step would find what it found before
            capacity -= int_total(weights[kept[fixed_in]])
            taken = np.concatenate([taken, kept[fixed_in]])
            more, kept = _trivial(weights, values, kept[~fixed_in & ~fixed_out], capacity)
            taken = np.concatenate([taken, more])
            kept_items = weights[kept], values[kept]
    if not len(kept):
        capacity = 0
    parts = merge_identical(*kept_items, kept) if use_lp else _singletons(weights, values, kept)
    divisor = int(np.gcd.reduce(parts["weights"])) if len(kept) else 1
    return Core(
        taken=np.sort(taken),
        weights=parts["weights"] // divisor if divisor > 1 else parts["weights"],  # a fresh array either way
        values=parts["values"],
        capacity=min(capacity // divisor, int_total(parts["weights"]) // divisor),
        group=parts["group"],
        copies=parts["copies"],
        members=parts["members"],
        starts=parts["starts"],
    )


def _singletons(weights: np.ndarray, values: np.ndarray, index: np.ndarray) -> dict[str, np.ndarray]:
    """Core items one per original item, sorted by weight (tighter prefix clipping)."""
    order = np.lexsort((index, weights[index]))
    idx = index[order]
    return {
        "weights": weights[idx],
        "values": values[idx],
        "group": np.arange(len(idx)),
        "copies": np.ones(len(idx), dtype=np.int64),
        "members": idx,
        "starts": np.arange(len(idx) + 1),
    }
