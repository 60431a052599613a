"""Sparse exact DP for small knapsacks with prefix capacities: Pareto frontiers of (weight, value).

After each item, the frontier holds the sets of the items so far that meet their caps and that no
other such set beats (lighter or as light, and worth at least as much). Every later constraint
only bounds a chosen weight from above, so a beaten set can never become the better one: pruning
is exact. On the module-level instances of a plan (a few dozen blocks, a few distinct sizes) the
frontiers stay tiny, whatever the capacity W is, and nothing is compiled or allocated per unit
of W. When a frontier grows past a given number of entries the dense O(W) solver takes over.

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
    history, total = [], 0
    for w, v, t, s in zip(weights.tolist(), values.tolist(), take.tolist(), skip.tolist(), strict=True):
        fw, fv, source, n_skip = _step(fw, fv, w, v, min(t, capacity - w), min(s, capacity))
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
