"""Sparse exact DP for knapsacks with prefix capacities: Pareto frontiers of (weight, value).

After each item, the frontier holds the sets of the items so far that meet their caps and that no
other such set beats (lighter or as light, and worth at least as much). Every later constraint
only bounds a chosen weight from above, so a beaten set can never become the better one: pruning
is exact. More exact cuts keep the frontiers short whatever the capacity W is:

- a set heavier than any feasible set's prefix there (``chain_bound.suffix_caps``) is dropped;
- the chain LP's dual (``chain_bound``) fixes the items whose flip would cost more than the gap to
  a target value, and bounds every set's best completion (linear in its weight); sets that cannot
  reach the target are dropped;
- items whose caps the chain implies go most decided first (``_processing_order``);
- the target starts just below the LP bound and falls (doubling the gap each time) until a pass
  reaches it, but never below the best set seen (at worst a feasible rounding of the LP). A pass
  that reaches its target is optimal: every dropped set could reach less.

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

from lightning_ckpt.solver.capped.chain_bound import ChainDual, StateBounds, chain_dual, suffix_caps
from lightning_ckpt.solver.sparse.pareto import merge

__all__ = ["solve_sparse"]

TARGET_STEPS = 6
"""The first target lies ``2**-TARGET_STEPS`` of the way from the LP bound to the known value."""

FEW_ITEMS = 16
"""Below this many items, one pass at the known value (no falling targets) costs less than several."""


def _step(fw: np.ndarray, fv: np.ndarray, w: int, v: float, take: int, skip: int) -> tuple:
    """One free item on the frontier ``(fw, fv)`` (weights ascending, values strictly ascending).

    Returns the new frontier, where each entry came from (an index into the skip part, then the
    take part, of the old one) and the size of the skip part.
    """
    n_skip = int(fw.searchsorted(skip, side="right")) if skip >= 0 else 0
    n_take = int(fw.searchsorted(take, side="right")) if take >= 0 else 0
    weights, values, source = merge(fw[:n_skip], fv[:n_skip], fw[:n_take] + w, fv[:n_take] + v)
    return weights, values, source, n_skip


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


def _steps(weights, values, caps, take, skip) -> list[tuple]:
    """A pass's steps: ``(j,)`` for a free item, ``(first, end, most, weight, value)`` for a run of
    fixed items (``take < 0``: out, ``skip < 0``: in): a set of weight ``x`` before the run meets
    every cap in it (its own, and ``caps`` after each item) iff ``x <= most``, and gains ``weight``
    and ``value``."""
    n = len(weights)
    chosen = skip < 0
    fixed = (take < 0) | chosen
    room = np.where(chosen, np.minimum(take, caps[1:] - weights), np.minimum(skip, caps[1:]))
    gained_weight = np.concatenate(([0], np.cumsum(np.where(chosen, weights, 0))))
    gained_value = np.concatenate(([0.0], np.cumsum(np.where(chosen, values, 0.0))))
    edges = np.flatnonzero(np.diff(np.concatenate(([0], fixed.astype(np.int8), [0]))))
    firsts, ends = edges[::2], edges[1::2]
    slack = np.append(room - gained_weight[:-1], 0)
    most = np.minimum.reduceat(slack, edges)[::2] + gained_weight[firsts] if len(edges) else []
    runs = {
        first: (
            first,
            end,
            int(m),
            int(gained_weight[end] - gained_weight[first]),
            float(gained_value[end] - gained_value[first]),
        )
        for first, end, m in zip(firsts.tolist(), ends.tolist(), list(most), strict=True)
    }
    steps, j = [], 0
    while j < n:
        steps.append(runs.get(j, (j,)))
        j = steps[-1][1] if len(steps[-1]) > 1 else j + 1
    return steps


def _pass(weights, values, caps, dual, take, skip, target, tol, max_entries):
    """One DP pass dropping the sets that cannot reach ``target``: ``(mask or None, best value,
    entries)``, or None past ``max_entries``."""
    take, skip = _fixed(dual, target, tol, take, skip)
    bounds = StateBounds(caps, dual, take, skip)
    fw, fv = np.zeros(1, dtype=np.int64), np.zeros(1)
    history, total, n = [], 0, len(weights)
    for step in _steps(weights, values, caps, take, skip):
        if len(step) == 1:
            j = step[0]
            fw, fv, source, n_skip = _step(
                fw, fv, int(weights[j]), float(values[j]), int(take[j]), int(skip[j])
            )
            count = int(fw.searchsorted(caps[j + 1], side="right"))
            fw, fv, source = fw[:count], fv[:count], source[:count]
        else:
            j, n_skip = step[1] - 1, 0
            count = int(fw.searchsorted(step[2], side="right"))
            fw, fv, source = fw[:count] + step[3], fv[:count] + step[4], None
        if j + 1 < n and len(fw):
            hopeful = bounds.lagrange(j, fw, fv) >= target - tol
            if not hopeful.all():
                fw, fv = fw[hopeful], fv[hopeful]
                source = hopeful.nonzero()[0] if source is None else source[hopeful]
        history.append((step, source, n_skip))
        total += len(fw)
        if total > max_entries:
            return None
        if not len(fw):
            return None, -np.inf, total
    return _backtrack(history, len(fw) - 1, skip < 0, n), float(fv[-1]), total


def _processing_order(take, skip, caps, reduced, capacity, weights) -> tuple:
    """A processing order and the caps in it.

    Every feasible set has at most ``caps[j + 1]`` chosen before ``j + 1``: so at most that less
    ``w`` before ``j`` when ``j`` is chosen, and at most that when not. An item whose caps are at
    least these has them implied by the chain, in any order of such items within a run of equal
    ``caps`` (a run ends at a cut, where ``caps`` rises, and at any other item). Such items lose their
    caps and, within a run, go most decided first (largest ``|reduced|``): the frontier grows only
    near the end of each run.
    """
    n = len(take)
    after = caps[1:]
    implied = (take >= 0) & (take >= after - weights) & (skip >= after)
    cut = np.append(True, caps[1:n] < caps[2:])
    starts = ~implied | np.append(True, ~implied[:-1]) | cut
    order = np.lexsort((-np.abs(reduced), np.cumsum(starts)))
    take = np.where(implied, capacity - weights, take)[order]
    skip = np.where(implied, capacity, skip)[order]
    return order, take, skip


def _backtrack(history, entry: int, fixed_in: np.ndarray, n: int) -> np.ndarray:
    chosen = np.zeros(n, dtype=np.bool_)
    for step, source, n_skip in reversed(history):
        entry = entry if source is None else int(source[entry])
        if len(step) > 1:  # a run of fixed items: the entry index runs through unchanged
            chosen[step[0] : step[1]] = fixed_in[step[0] : step[1]]
            continue
        chosen[step[0]] = entry >= n_skip
        entry -= n_skip if chosen[step[0]] else 0
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
    caps = suffix_caps(weights, take, skip, capacity)
    dual = chain_dual(weights, values, caps, take >= 0)
    tol = 1e-9 * max(float(values.sum()), 1e-300)
    lower, total = _rounded_value(weights, values, take, skip, caps, dual.reduced), 0
    order, take, skip = _processing_order(take, skip, caps, dual.reduced, capacity, weights)
    weights, values = weights[order], values[order]
    dual = ChainDual(np.append(dual.price[order], 0.0), dual.reduced[order], dual.upper)
    gap, step = dual.upper - lower, TARGET_STEPS if len(weights) >= FEW_ITEMS else 0
    while True:
        target = max(dual.upper - gap / 2**step, lower) if step > 0 else lower
        done = _pass(weights, values, caps, dual, take, skip, target, tol, max_entries - total)
        if done is None:
            return None
        chosen, best, entries = done
        total += entries
        if chosen is not None and best >= target - tol:
            unpermuted = np.zeros(len(chosen), dtype=np.bool_)
            unpermuted[order] = chosen
            return unpermuted, total
        if target <= lower:
            raise AssertionError("a pass whose target is a feasible value must reach it")
        lower, step = max(lower, best), step - 1  # a set worth ``best`` was seen: aim no lower
