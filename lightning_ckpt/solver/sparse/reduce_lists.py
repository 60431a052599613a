"""The exact reductions of ``reduce.py`` on Python lists, for instances of a few dozen items.

``reduce.reduce_instance`` makes some fifty numpy calls whatever the size (about 1-2 us each), which
is most of a ``torch.compile``-sized solve (n = 42-54). Below ``LISTS_MAX_ITEMS`` items the same
steps run on plain lists, in the same order and with the same rules (trivial items, LP fixing
against the greedy bound (raised by one move) with the same safe margin, bundles of identical items,
the common divisor), and give the same ``Core``: the same items fixed in and out, sorted and bundled
alike (the LP bound's sums are exactly rounded here, pairwise in numpy; the relative margin of 1e-9
dwarfs that difference, and either way a fixed item keeps its LP value in every optimum). The
``torch.compile``-sized solves took 1.04-1.27x less time with it (``python -m
benchmarks.bench.small``, 2026-12-07).

Example:
    >>> core = reduce_lists(np.array([0, 5, 2, 2]), np.array([1.0, 9.0, 1.0, 0.0]), 4)
    >>> core.taken.tolist(), core.weights.tolist(), core.capacity
    ([0, 2], [], 0)
"""

from __future__ import annotations

import bisect
import itertools
import math

import numpy as np

from lightning_ckpt.solver.sparse.reduce import LP_MARGIN_RELATIVE, SWAP_BELOW_FIXED_SHARE, Core, bundle_sizes

__all__ = ["LISTS_MAX_ITEMS", "reduce_lists"]

LISTS_MAX_ITEMS = 64
"""Up to this many items the lists are faster than numpy's calls (measured 2026-12-07: n = 42-54
54-97 us against 97-101 us; n = 128 120-258 us against 107-134 us)."""


def reduce_lists(weights: np.ndarray, values: np.ndarray, capacity: int) -> Core:
    """``reduce.reduce_instance(weights, values, capacity, use_lp=True)`` on lists: the same core."""
    w, v = weights.tolist(), values.tolist()
    taken, kept = _trivial(w, v, range(len(w)), capacity)
    if kept:
        fixed_in, fixed_out = _lp_fix([w[i] for i in kept], [v[i] for i in kept], capacity)
        if fixed_in or fixed_out:
            capacity -= sum(w[kept[j]] for j in fixed_in)
            taken += [kept[j] for j in fixed_in]
            settled = set(fixed_in) | set(fixed_out)
            more, kept = _trivial(w, v, [i for j, i in enumerate(kept) if j not in settled], capacity)
            taken += more
    if not kept:
        capacity = 0
    return _core(w, v, sorted(taken), kept, capacity)


def _trivial(w: list, v: list, index, capacity: int) -> tuple[list[int], list[int]]:
    """Zero weights taken, useless items dropped, all taken if all fit: ``(taken, kept)``."""
    taken = [i for i in index if w[i] == 0]
    kept = [i for i in index if 0 < w[i] <= capacity and v[i] > 0]
    if sum(w[i] for i in kept) <= capacity:
        return taken + kept, []
    return taken, kept


def _lp_fix(w: list[int], v: list[float], capacity: int) -> tuple[list[int], list[int]]:
    """``reduce.lp_fix`` on lists: positions fixed in and fixed out (all weights in (0, capacity])."""
    ratios = [b / a for a, b in zip(w, v, strict=True)]
    order = sorted(range(len(w)), key=ratios.__getitem__, reverse=True)  # stable: ties by index
    used, brk = 0, 0
    for i in order:
        if used + w[i] > capacity:
            break
        used += w[i]
        brk += 1
    if brk == len(w):
        return list(range(len(w))), []
    ratio = ratios[order[brk]]
    base, room = math.fsum(v[i] for i in order[:brk]), capacity - used  # the break solution
    z_lp = base + ratio * room
    lower = _greedy_lower_bound(w, v, order[brk:], base, room)
    margin = LP_MARGIN_RELATIVE * max(z_lp, 1e-300)
    fixable = [z_lp - abs(v[i] - ratio * w[i]) < lower - margin for i in order]
    if sum(fixable) * SWAP_BELOW_FIXED_SHARE < len(w):  # a weak bound: raise it by a swap
        swapped = _best_swap(w, v, order, brk, base, room)
        if swapped > lower:
            fixable = [z_lp - abs(v[i] - ratio * w[i]) < swapped - margin for i in order]
    fixed_in = [i for i, f in zip(order[:brk], fixable, strict=False) if f]
    fixed_out = [i for i, f in zip(order[brk + 1 :], fixable[brk + 1 :], strict=True) if f]
    return fixed_in, fixed_out


def _greedy_lower_bound(w: list, v: list, rest: list[int], base: float, room: int) -> float:
    """The ratio-greedy value: the break solution's ``base`` (``room`` left), then each item of
    ``rest`` (in efficiency order) that fits."""
    total = base
    for i in rest:
        if w[i] <= room:
            room -= w[i]
            total += v[i]
    return max(total, max(v))


def _best_swap(w: list, v: list, order: list[int], brk: int, base: float, room: int) -> float:
    """``bounds.best_swap``'s value on lists: the best set one move from the break solution (the first
    ``brk`` items in ``order``, value ``base``, ``room`` left): one item added where it fits, or added
    in place of the least valuable item in at least as heavy as it needs."""
    inside = sorted(order[:brk], key=w.__getitem__)
    in_weights = list(map(w.__getitem__, inside))
    cheapest = list(itertools.accumulate(map(v.__getitem__, reversed(inside)), min))[::-1]
    gain = 0.0
    for j in order[brk:]:
        if w[j] <= room:
            more = v[j]
        else:
            k = bisect.bisect_left(in_weights, w[j] - room)
            more = v[j] - cheapest[k] if k < brk else 0.0
        if more > gain:
            gain = more
    return base + gain  # + 0.0 where no move gains: base itself


def _core(w: list, v: list, taken: list[int], kept: list[int], capacity: int) -> Core:
    """Identical items bundled (1, 2, 4, ... copies), sorted by weight, value and index; divided by
    the weights' common divisor."""
    kept = sorted(sorted(kept, key=v.__getitem__), key=w.__getitem__)  # stable: by weight, value, index
    weights, values = [w[i] for i in kept], [v[i] for i in kept]
    pairs, n = list(zip(weights, values, strict=True)), len(kept)
    if len(set(pairs)) == n:  # no two items alike: one core item each, no bundles
        group, copies, starts = np.arange(n), np.ones(n, dtype=np.int64), np.arange(n + 1)
    else:
        repeats = [j for j in range(1, n) if pairs[j] == pairs[j - 1]]
        weights, values, group_list, copy_list, start_list = _bundles(weights, values, repeats)
        group, copies = np.array(group_list, dtype=np.int64), np.array(copy_list, dtype=np.int64)
        starts = np.array(start_list, dtype=np.int64)
    divisor = math.gcd(*weights) if weights else 1
    if divisor > 1:
        weights = [x // divisor for x in weights]
    return Core(
        taken=np.array(taken, dtype=np.int64),
        weights=np.array(weights, dtype=np.int64),
        values=np.array(values, dtype=np.float64),
        capacity=min(capacity // divisor, sum(weights)),
        group=group,
        copies=copies,
        members=np.array(kept, dtype=np.int64),
        starts=starts,
    )


def _bundles(weights: list, values: list, repeats: list[int]) -> tuple[list, list, list, list, list]:
    """``(weights, values, group, copies, starts)`` of the bundles of items sorted by weight and value,
    where ``repeats`` lists the positions that repeat the item before them."""
    repeated = set(repeats)
    starts = [j for j in range(len(weights)) if j not in repeated] + [len(weights)]
    out_w, out_v, out_g, copies = [], [], [], []
    for g, (start, end) in enumerate(zip(starts, starts[1:], strict=False)):
        for size in [1] if end - start == 1 else bundle_sizes(end - start):
            out_w.append(weights[start] * size)
            out_v.append(values[start] * size)
            out_g.append(g)
            copies.append(size)
    return out_w, out_v, out_g, copies, starts
