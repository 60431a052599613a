"""Sparse exact DP for one option per group under prefix capacities: Pareto frontiers of (weight, value).

After each group, the frontier holds the choices of the groups so far that meet their caps and that
no other such choice beats (lighter or as light, and worth at least as much). Every later constraint
only bounds a chosen weight from above, so a beaten choice can never become the better one: pruning
is exact. A group's step shifts the frontier by each of its options (the part of it under that
option's cap) and merges the copies (``sparse.pareto.merge_runs``). More exact cuts keep the
frontiers short whatever the capacity W is:

- each option's cap already holds what the groups after it need (``groups.reach``), so a state that
  could not be completed is never made;
- the multiple-choice chain LP's prices (``chain_bound.group_prices``: each group's upper convex hull,
  as Sinha-Zoltners and Pisinger's ``mcknap`` bound a multiple-choice knapsack) drop the options whose
  choice would cost more than the gap to a target value, fix the groups left with one option (a run of
  them passes as one shift, not a merge), and bound every state's best completion (linear in its
  weight); states that cannot reach the target are dropped;
- groups whose caps the chain implies go most decided first (``_processing_order``);
- the target starts just below the LP bound and falls (doubling the gap each time) until a pass
  reaches it, but never below the best choice seen (at worst a feasible rounding, ``_rounded_value``).
  A pass that reaches its target is optimal: every dropped state could reach less.

A 0/1 knapsack is the two-option case (``groups.from_items``), which is how ``solve_knapsack`` runs
here. Past a given number of entries the dense O(W) solver takes over.

Example:
    >>> from lightning_ckpt.solver.capped.groups import from_items
    >>> w, v, caps = np.array([2, 3, 4]), np.array([3.0, 4.0, 5.5]), np.array([5, 5, 5])
    >>> choice, entries = solve_sparse(from_items(w, v, caps, caps), 5, max_entries=100)
    >>> choice.tolist()  # option 1 (take) for items 0 and 1
    [1, 1, 0]
"""

from __future__ import annotations

import bisect

import numpy as np

from lightning_ckpt.solver.capped.chain_bound import GroupBounds, group_prices
from lightning_ckpt.solver.capped.groups import Groups, reach
from lightning_ckpt.solver.sparse.pareto import merge_runs

__all__ = ["solve_sparse"]

TARGET_STEPS = 6
"""The first target lies ``2**-TARGET_STEPS`` of the way from the LP bound to the known value."""

FEW_ITEMS = 16
"""Below this many groups, one pass at the known value (no falling targets) costs less than several."""


def _step(fw: np.ndarray, fv: np.ndarray, options: list[tuple[int, float, int]]) -> tuple:
    """One free group, given as its options ``(weight, value, cap)``, on the frontier ``(fw, fv)``
    (weights ascending, values strictly ascending): the new frontier, where each entry came from (an
    index into the options' copies, concatenated) and where each option's copy starts."""
    runs_w, runs_v, offsets = [], [], [0]
    for w, v, cap in options:
        count = int(fw.searchsorted(cap, side="right"))
        runs_w.append(fw[:count] + w if w else fw[:count])
        runs_v.append(fv[:count] + v if v else fv[:count])
        offsets.append(offsets[-1] + count)
    weights, values, source = merge_runs(runs_w, runs_v)
    return weights, values, source, offsets


def _rounded_value(groups: Groups, reduced: np.ndarray) -> float:
    """A feasible choice's value: per group, the option of the largest reduced value (the first of
    equals) whose cap the chosen weight meets (one always does: the caps hold what the rest needs)."""
    chosen, value = 0, 0.0
    weights, values, caps = groups.weights.tolist(), groups.values.tolist(), groups.caps.tolist()
    reduced, starts = reduced.tolist(), groups.starts.tolist()
    for g in range(groups.count):
        best = -1
        for o in range(starts[g], starts[g + 1]):
            if caps[o] >= chosen and (best < 0 or reduced[o] > reduced[best]):
                best = o
        chosen, value = chosen + weights[best], value + values[best]
    return value


def _allowed(groups: Groups, reduced: np.ndarray, upper: float, cut_off: float) -> np.ndarray:
    """The options a pass at ``cut_off`` keeps: those whose choice may still reach it (forcing option
    ``o`` of group ``g`` costs at least ``best_g - reduced[o]`` of the bound); the best always."""
    best = groups.per_option(groups.group_max(reduced))
    return (reduced > -np.inf) & ((upper - (best - reduced) >= cut_off) | (reduced == best))


def _steps(groups: Groups, allowed: np.ndarray, lists: tuple[list, ...]) -> list[tuple]:
    """A pass's steps: ``(g, options, indices)`` for a free group (its allowed options as ``(weight,
    value, cap)`` and their indices in it), ``(first, end, most, weight, value, picks)`` for a run of
    groups left with one option each (``picks``): a state of weight ``x`` before the run meets every
    cap in it iff ``x <= most``, and gains ``weight`` and ``value``. ``lists``: the groups' weights,
    values, caps and starts as lists."""
    n, starts = groups.count, groups.starts
    if groups.binary:
        fixed = allowed[0::2] != allowed[1::2]
        pick = 2 * np.arange(n) + allowed[1::2]  # the allowed option, for a fixed group
    else:
        fixed = np.add.reduceat(allowed, starts[:-1]) == 1
        pick = np.zeros(n, dtype=np.int64)
        flat = allowed.nonzero()[0]
        pick[groups.group_of()[flat]] = flat
    gained_weight = np.concatenate(([0], np.cumsum(np.where(fixed, groups.weights[pick], 0))))
    gained_value = np.concatenate(([0.0], np.cumsum(np.where(fixed, groups.values[pick], 0.0))))
    edges = np.flatnonzero(np.diff(np.concatenate(([0], fixed.astype(np.int8), [0]))))
    firsts, ends = edges[::2], edges[1::2]
    slack = np.append(groups.caps[pick] - gained_weight[:-1], 0)
    most = np.minimum.reduceat(slack, edges)[::2] + gained_weight[firsts] if len(edges) else []
    runs = {
        first: (
            first,
            end,
            int(m),
            int(gained_weight[end] - gained_weight[first]),
            float(gained_value[end] - gained_value[first]),
            pick[first:end] - starts[first:end],
        )
        for first, end, m in zip(firsts.tolist(), ends.tolist(), list(most), strict=True)
    }
    steps, g = [], 0
    weights, values, caps, _ = lists
    while g < n:
        if g in runs:
            steps.append(runs[g])
            g = runs[g][1]
            continue
        first = int(starts[g])
        indices = allowed[first : int(starts[g + 1])].nonzero()[0].tolist()
        steps.append(
            (g, [(weights[first + k], values[first + k], caps[first + k]) for k in indices], indices)
        )
        g += 1
    return steps


def _pass(groups, room, price, bounds, target, tol, max_entries, lists):
    """One DP pass dropping the states that cannot reach ``target``: ``(choice or None, best value,
    entries)``, or None past ``max_entries``."""
    allowed = _allowed(groups, bounds.reduced, bounds.upper, target - tol)
    bounds = GroupBounds(groups, room, price, allowed, bounds.unmasked)
    fw, fv = np.zeros(1, dtype=np.int64), np.zeros(1)
    history, total, n = [], 0, groups.count
    for step in _steps(groups, allowed, lists):
        if len(step) == 3:
            j = step[0]
            fw, fv, source, offsets = _step(fw, fv, step[1])
        else:
            j, offsets = step[1] - 1, None
            count = int(fw.searchsorted(step[2], side="right"))
            fw, fv, source = fw[:count] + step[3], fv[:count] + step[4], None
        if j + 1 < n and len(fw):
            hopeful = bounds.lagrange(j, fw, fv) >= target - tol
            if not hopeful.all():
                fw, fv = fw[hopeful], fv[hopeful]
                source = hopeful.nonzero()[0] if source is None else source[hopeful]
        history.append((step, source, offsets))
        total += len(fw)
        if total > max_entries:
            return None
        if not len(fw):
            return None, -np.inf, total
    return _backtrack(history, len(fw) - 1, groups), float(fv[-1]), total


def _processing_order(groups: Groups, room: np.ndarray, reduced: np.ndarray) -> np.ndarray:
    """A processing order of the groups.

    Every feasible choice has at most ``room[g + 1]`` chosen through group ``g``. A group whose
    options' caps are all implied by that (each at least ``room[g + 1] - w``, or the option too heavy
    anyway) may move anywhere within a run of such groups of equal ``room`` after them (a run ends at
    a cut, where ``room`` rises, and at any other group). Within a run they go most decided first (the
    largest gap between their best and second best reduced values): the frontier grows only near the
    end of each run.
    """
    n = groups.count
    after = groups.per_option(room[1:]) - groups.weights
    implied = ~groups.group_max(~((groups.caps >= after) | (after < 0)))
    decided = _decided(groups, reduced)
    cut = np.append(True, room[1:n] < room[2:])
    run_starts = ~implied | np.append(True, ~implied[:-1]) | cut
    return np.lexsort((-decided, np.cumsum(run_starts)))


def _decided(groups: Groups, reduced: np.ndarray) -> np.ndarray:
    """Per group, its best reduced value less its second best (infinite with one usable option)."""
    if groups.binary:
        both = (reduced[0::2] > -np.inf) & (reduced[1::2] > -np.inf)
        return np.where(both, np.abs(reduced[1::2] - reduced[0::2]), np.inf)
    starts, sizes = groups.starts[:-1], groups.sizes()
    best = np.maximum.reduceat(reduced, starts)
    index = np.arange(len(reduced))
    first_best = np.minimum.reduceat(np.where(reduced == np.repeat(best, sizes), index, len(index)), starts)
    second = np.maximum.reduceat(np.where(index == np.repeat(first_best, sizes), -np.inf, reduced), starts)
    return np.where(second > -np.inf, best - second, np.inf)


def _chain(groups: Groups, room: np.ndarray) -> np.ndarray:
    """The rooms the bounds use: ``room`` (what the rest allows before each group) and what the
    caps in front allow (at most ``max_o cap_o + w_o`` through a group), never falling. Within a run
    of groups whose caps the chain implies it equals ``room``, so reordering a run keeps it."""
    through = groups.group_max(np.where(groups.caps >= 0, groups.caps + groups.weights, -1))
    chain = np.minimum(room, np.concatenate((room[:1], through)))
    return np.minimum.accumulate(chain[::-1])[::-1]


def _permuted(groups: Groups, order: np.ndarray) -> Groups:
    if (np.diff(order) == 1).all():
        return groups
    sizes = groups.sizes()[order]
    starts = np.concatenate(([0], np.cumsum(sizes)))
    index = np.repeat(groups.starts[order] - starts[:-1], sizes) + np.arange(starts[-1])
    return Groups(groups.weights[index], groups.values[index], groups.caps[index], starts, groups.binary)


def _backtrack(history, entry: int, groups: Groups) -> np.ndarray:
    """The choice of the frontier's ``entry`` after the last step, walked back through ``history``."""
    choice = np.zeros(groups.count, dtype=np.int64)
    for step, source, offsets in reversed(history):
        entry = entry if source is None else int(source[entry])
        if len(step) > 3:  # a run of fixed groups: the entry index runs through unchanged
            choice[step[0] : step[1]] = step[5]
            continue
        k = bisect.bisect_right(offsets, entry) - 1
        choice[step[0]] = step[2][k]
        entry -= offsets[k]
    return choice


def solve_sparse(groups: Groups, capacity: int, max_entries: int) -> tuple[np.ndarray, int] | None:
    """The best choice (an option index per group, within it) and the frontier entries made, or None
    past ``max_entries``. The instance must be feasible (``groups.reach``'s ``R[0] >= 0``).

    Args:
        groups: The options, in the order the caps refer to (caps below 0: never chosen).
        capacity: Bound on the total chosen weight.
        max_entries: Give up (return None) when the frontiers together hold more entries.
    """
    room, fitted = reach(groups, capacity)
    groups = groups._replace(caps=fitted)
    chain = _chain(groups, room)
    price = group_prices(groups, chain, fitted)
    reduced = np.where(fitted >= 0, groups.values - groups.per_option(price[:-1]) * groups.weights, -np.inf)
    tol = 1e-9 * max(float(groups.group_max(groups.values).sum()), 1e-300)
    lower, total = _rounded_value(groups, reduced), 0
    order = _processing_order(groups, room, reduced)
    groups = _permuted(groups, order)
    price = np.minimum.accumulate(np.append(price[:-1][order], 0.0))  # equal within a run: unchanged
    bounds = GroupBounds(groups, chain, price, groups.caps >= 0)
    gap, step = bounds.upper - lower, TARGET_STEPS if groups.count >= FEW_ITEMS else 0
    lists = tuple(array.tolist() for array in (groups.weights, groups.values, groups.caps, groups.starts))
    while True:
        target = max(bounds.upper - gap / 2**step, lower) if step > 0 else lower
        done = _pass(groups, chain, price, bounds, target, tol, max_entries - total, lists)
        if done is None:
            return None
        choice, best, entries = done
        total += entries
        if choice is not None and best >= target - tol:
            unpermuted = np.zeros(len(choice), dtype=np.int64)
            unpermuted[order] = choice
            return unpermuted, total
        if target <= lower:
            raise AssertionError("a pass whose target is a feasible value must reach it")
        lower, step = max(lower, best), step - 1  # a choice worth ``best`` was seen: aim no lower
