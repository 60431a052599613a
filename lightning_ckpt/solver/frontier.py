"""Sparse exact DP for knapsacks with prefix capacities: Pareto frontiers of (weight, value).

After each item, the frontier holds the sets of the items so far that meet their caps and that no
other such set beats (lighter or as light, and worth at least as much). Every later constraint
only bounds a chosen weight from above, so a beaten set can never become the better one: pruning
is exact. Three more exact cuts keep the frontiers short whatever the capacity W is:

- a set heavier than any feasible set's prefix there (``chain_bound.suffix_caps``) is dropped;
- the chain LP's dual (``chain_bound``) fixes the items whose flip would cost more than the gap to
  a target value, and bounds every set's best completion (linear in its weight, then a fractional
  knapsack split at the binding caps); sets that cannot reach the target are dropped;
- the target starts just below the LP bound and falls (doubling the gap each time) until a pass
  reaches it, down to a known feasible value at worst. A pass that reaches its target is optimal:
  every dropped set could reach less.

Fixed items cost a slice, not a merge, so a plan's few dozen blocks, or a few thousand items of
which most are clearly in or out, solve in milliseconds without numba. Past a given number of
entries the dense O(W) solver takes over.

Example:
    >>> w, v, caps = np.array([2, 3, 4]), np.array([3.0, 4.0, 5.5]), np.array([5, 5, 5])
    >>> chosen, entries = solve_sparse(w, v, 5, caps, caps, max_entries=100)
    >>> chosen.tolist()
    [True, True, False]
"""

from __future__ import annotations

import numpy as np

from lightning_ckpt.solver.chain_bound import ChainDual, StateBounds, chain_dual, suffix_caps

__all__ = ["solve_sparse"]

PRUNE_FROM_ENTRIES = 64
"""Frontiers longer than this also get the fractional-knapsack bound (below it costs more than it saves)."""

TARGET_STEPS = 6
"""The first target lies ``2**-TARGET_STEPS`` of the way from the LP bound to the known value."""


def _step(fw: np.ndarray, fv: np.ndarray, w: int, v: float, take: int, skip: int) -> tuple:
    """One free item on the frontier ``(fw, fv)`` (weights ascending, values strictly ascending).

    Returns the new frontier, where each entry came from (an index into the skip part, then the
    take part, of the old one) and the size of the skip part.
    """
    n_skip = int(fw.searchsorted(skip, side="right")) if skip >= 0 else 0
    n_take = int(fw.searchsorted(take, side="right")) if take >= 0 else 0
    weights = np.concatenate((fw[:n_skip], fw[:n_take] + w))
    values = np.concatenate((fv[:n_skip], fv[:n_take] + v))
    if not len(weights):
        return weights, values, np.zeros(0, dtype=np.int64), 0
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


def _item(fw, fv, w: int, v: float, take: int, skip: int, next_cap: int) -> tuple:
    """``_step``, a slice for a fixed item (``take < 0``: out, ``skip < 0``: in), then the sets
    heavier than ``next_cap`` dropped."""
    if take < 0 or skip < 0:
        chosen = skip < 0
        count = int(fw.searchsorted(min(take, next_cap - w) if chosen else min(skip, next_cap), side="right"))
        source = np.arange(count)
        return (
            (fw[:count] + w, fv[:count] + v, source, 0) if chosen else (fw[:count], fv[:count], source, count)
        )
    fw, fv, source, n_skip = _step(fw, fv, w, v, take, skip)
    count = int(fw.searchsorted(next_cap, side="right"))
    return fw[:count], fv[:count], source[:count], n_skip


def _rounded_value(weights, values, take, skip, caps, reduced) -> float:
    """A feasible set's value: the LP's items in order, each only while every later skip cap holds."""
    later_skip = np.minimum.accumulate(np.append(skip, caps[-1])[::-1])[::-1]
    chosen, value = 0, 0.0
    for j, w in enumerate(weights.tolist()):
        if reduced[j] > 0 and chosen <= take[j] and chosen + w <= min(later_skip[j + 1], caps[j + 1]):
            chosen, value = chosen + w, value + float(values[j])
    return value


def _fixed(dual: ChainDual, target: float, tol: float, take, skip) -> tuple[np.ndarray, np.ndarray]:
    """The caps with the items fixed whose flip costs more than ``dual.upper - target``."""
    cut_off = target - tol
    fixed_in = (dual.reduced > 0) & (dual.upper - dual.reduced < cut_off)
    fixed_out = (dual.reduced < 0) & (dual.upper + dual.reduced < cut_off)
    return np.where(fixed_out, -1, take), np.where(fixed_in, -1, skip)


def _targets(upper: float, lower: float):
    """Falling targets from just below ``upper`` down to ``lower``."""
    gap = upper - lower
    for step in range(TARGET_STEPS, 0, -1):
        target = upper - gap / 2**step
        if target > lower:
            yield target
    yield lower


def _pass(weights, values, capacity, caps, dual, take, skip, target, tol, max_entries):
    """One DP pass dropping the sets that cannot reach ``target``: ``(mask or None, best value,
    entries)``, or None past ``max_entries``."""
    take, skip = _fixed(dual, target, tol, take, skip)
    bounds = StateBounds(weights, values, capacity, caps, dual, take, skip)
    fw, fv = np.zeros(1, dtype=np.int64), np.zeros(1)
    history, total, n = [], 0, len(weights)
    for j, (w, v, t, s) in enumerate(
        zip(weights.tolist(), values.tolist(), take.tolist(), skip.tolist(), strict=True)
    ):
        fw, fv, source, n_skip = _item(fw, fv, w, v, t, s, int(caps[j + 1]))
        if j + 1 < n and len(fw):
            hopeful = bounds.lagrange(j, fw, fv) >= target - tol
            if len(fw) > PRUNE_FROM_ENTRIES:
                hopeful &= bounds.dantzig(j, fw, fv) >= target - tol
            fw, fv, source = fw[hopeful], fv[hopeful], source[hopeful]
        history.append((source, n_skip))
        total += len(fw)
        if total > max_entries:
            return None
        if not len(fw):
            return None, -np.inf, total
    return _backtrack(history, len(fw) - 1), float(fv[-1]), total


def _processing_order(take, skip, caps, reduced, capacity, weights) -> tuple:
    """A processing order and the caps in it.

    An item whose caps are at least the prefix cap after it (``caps[j + 1]``) has its caps implied
    by the chain, in any order of such items between two others (the chain's cuts fall on those
    others: a cut's own caps are below the next prefix cap). Such items lose their caps and, between
    two pinned items, go most decided first (largest ``|reduced|``): the frontier grows only near
    the end of each run.
    """
    implied = (take >= caps[1:]) & (skip >= caps[1:])
    starts = ~implied | np.append(True, ~implied[:-1])
    order = np.lexsort((-np.abs(reduced), np.cumsum(starts)))
    take = np.where(implied, capacity - weights, take)[order]
    skip = np.where(implied, capacity, skip)[order]
    return order, take, skip


def _backtrack(history, entry: int) -> np.ndarray:
    chosen = np.zeros(len(history), dtype=np.bool_)
    for j in range(len(history) - 1, -1, -1):
        source, n_skip = history[j]
        entry = int(source[entry])
        chosen[j] = entry >= n_skip
        entry -= n_skip if chosen[j] else 0
    return chosen


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
    take, skip = np.minimum(take, capacity - weights), np.minimum(skip, capacity)
    caps = suffix_caps(take, skip, capacity)
    dual = chain_dual(weights, values, caps, take >= 0)
    tol = 1e-9 * max(float(values.sum()), 1e-300)
    lower, total = _rounded_value(weights, values, take, skip, caps, dual.reduced), 0
    order, take, skip = _processing_order(take, skip, caps, dual.reduced, capacity, weights)
    weights, values = weights[order], values[order]
    dual = ChainDual(np.append(dual.price[order], 0.0), dual.reduced[order], dual.upper)
    for target in _targets(dual.upper, lower):
        done = _pass(
            weights, values, capacity, caps, dual, take, skip, max(target, lower), tol, max_entries - total
        )
        if done is None:
            return None
        chosen, best, entries = done
        total += entries
        if chosen is not None and best >= target - tol:
            unpermuted = np.zeros(len(chosen), dtype=np.bool_)
            unpermuted[order] = chosen
            return unpermuted, total
    raise AssertionError("the last target is a feasible value: a pass must reach it")
