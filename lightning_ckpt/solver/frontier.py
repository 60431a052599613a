"""Sparse exact DP for small knapsacks with prefix capacities: Pareto frontiers of (weight, value).

After each item, the frontier holds the sets of the items so far that meet their caps and that no
other such set beats (lighter or as light, and worth at least as much). Every later constraint
only bounds a chosen weight from above, so a beaten set can never become the better one: pruning
is exact. On the module-level instances of a plan (a few dozen blocks, a few distinct sizes) the
frontiers stay tiny, whatever the capacity W is, and nothing is compiled or allocated per unit
of W. Longer frontiers are pruned with a fractional-knapsack bound against a greedy feasible value
(exact: no entry of an optimal set is dropped). When the frontiers together grow past a given
number of entries the dense O(W) solver takes over.

Example:
    >>> w, v, caps = np.array([2, 3, 4]), np.array([3.0, 4.0, 5.5]), np.array([5, 5, 5])
    >>> chosen, entries = solve_sparse(w, v, 5, caps, caps, max_entries=100)
    >>> chosen.tolist(), entries
    ([True, True, False], 11)
"""

from __future__ import annotations

import numpy as np

__all__ = ["solve_sparse"]


def _step(fw: np.ndarray, fv: np.ndarray, w: int, v: float, take: int, skip: int) -> tuple:
    """One item on the frontier ``(fw, fv)`` (weights ascending, values strictly ascending).

    Returns the new frontier, where each entry came from (an index into the skip part, then the
    take part, of the old one) and the size of the skip part.
    """
    n_skip = int(fw.searchsorted(skip, side="right")) if skip >= 0 else 0
    n_take = int(fw.searchsorted(take, side="right")) if take >= 0 else 0
    weights = np.concatenate((fw[:n_skip], fw[:n_take] + w))
    values = np.concatenate((fv[:n_skip], fv[:n_take] + v))
    order = weights.argsort(kind="stable")  # lighter first; at equal weight, skipped first
    weights, values = weights[order], values[order]
    keep = np.empty(len(values), dtype=np.bool_)
    keep[0] = True
    np.greater(values[1:], np.maximum.accumulate(values)[:-1], out=keep[1:])
    kept = keep.nonzero()[0]
    last = np.ones(len(kept), dtype=np.bool_)  # equal weights: the most valuable only
    np.not_equal(weights[kept[1:]], weights[kept[:-1]], out=last[:-1])
    kept = kept[last]
    return weights[kept], values[kept], order[kept], n_skip


PRUNE_FROM_ENTRIES = 64
"""Frontiers longer than this are pruned by bounds (below it the bound costs more than it saves)."""


class _Bounds:
    """Prune frontier entries that cannot lead to a set worth a known feasible one (exact pruning).

    An entry of weight ``x`` and value ``val`` after item ``j - 1`` can reach at most ``val`` plus the
    fractional-knapsack bound of items ``j..`` at capacity ``W - x`` (the caps only lower it). A greedy
    pass under the caps (items by value per weight, each kept if every cap still holds) gives a
    feasible value; entries whose bound is below it are dropped. The optimum's own entries never are.
    """

    def __init__(self, weights, values, capacity, take, skip) -> None:
        self.items = (weights, values, capacity, take, skip)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(weights > 0, values / np.maximum(weights, 1), np.inf)
        self.order = np.lexsort((np.arange(len(weights)), -ratio))  # best ratio first
        self.lower: float | None = None

    def hopeful(self, j: int, fw: np.ndarray, fv: np.ndarray) -> np.ndarray:
        """Mask of the entries worth keeping after item ``j - 1``."""
        weights, values, capacity, _, _ = self.items
        if self.lower is None:
            self.lower = _greedy_value(*self.items, self.order)
        rest = self.order[self.order >= j]
        w, v = weights[rest], values[rest]
        cum_w, cum_v = np.concatenate(([0], np.cumsum(w))), np.concatenate(([0.0], np.cumsum(v)))
        room = capacity - fw
        k = np.searchsorted(cum_w[1:], room, side="right")  # items 0..k-1 of ``rest`` fit whole
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.append(np.where(w > 0, v / np.maximum(w, 1), 0.0), 0.0)
        bound = fv + cum_v[k] + (room - cum_w[k]) * ratio[k]
        return bound >= self.lower - 1e-9 * max(abs(self.lower), 1e-300)


def _greedy_value(weights, values, capacity, take, skip, order) -> float:
    """The value of a feasible set: items by ratio, each kept if every cap still holds."""
    chosen = np.zeros(len(weights), dtype=np.bool_)
    for i in order.tolist():
        chosen[i] = True
        kept = weights * chosen
        before = np.cumsum(kept) - kept
        fits = kept.sum() <= capacity and bool(np.where(chosen, before <= take, before <= skip).all())
        chosen[i] = fits
    return float(values[chosen].sum())


def solve_sparse(
    weights: np.ndarray,
    values: np.ndarray,
    capacity: int,
    take: np.ndarray,
    skip: np.ndarray,
    max_entries: int,
) -> tuple[np.ndarray, int] | None:
    """The best set (a mask) of a knapsack with prefix capacities and the frontier entries made, or
    None past ``max_entries``.

    Args:
        weights: int64 weights >= 0, in the order the caps refer to.
        values: float64 values >= 0.
        capacity: Bound on the total chosen weight.
        take: Per item, the most the chosen items before it may weigh when it is chosen
            (below 0: it cannot be chosen).
        skip: The same when it is not chosen (>= 0: the empty set always fits).
        max_entries: Give up (return None) when the frontiers together hold more entries.
    """
    fw, fv = np.zeros(1, dtype=np.int64), np.zeros(1)
    history, total, bounds = [], 0, _Bounds(weights, values, capacity, take, skip)
    for j, (w, v, t, s) in enumerate(
        zip(weights.tolist(), values.tolist(), take.tolist(), skip.tolist(), strict=True)
    ):
        fw, fv, source, n_skip = _step(fw, fv, w, v, min(t, capacity - w), min(s, capacity))
        if len(fw) > PRUNE_FROM_ENTRIES:
            hopeful = bounds.hopeful(j + 1, fw, fv)
            fw, fv, source = fw[hopeful], fv[hopeful], source[hopeful]
        history.append((source, n_skip))
        total += len(fw)
        if total > max_entries:
            return None
    chosen = np.zeros(len(weights), dtype=np.bool_)
    entry = len(fw) - 1  # the most valuable set
    for j in range(len(weights) - 1, -1, -1):
        source, n_skip = history[j]
        entry = int(source[entry])
        chosen[j] = entry >= n_skip
        entry -= n_skip if chosen[j] else 0
    return chosen, total
