"""Strong bounds for the expanding core, in the style of ``combo`` (Martello, Pisinger, Toth 1999).

When the plain bounds of ``minknap.py`` leave too many states, the engine asks for two figures:

- an **upper bound with a cardinality constraint** (``cardinality_bound``): no feasible set holds
  more than ``k_max`` items (the most that fit, lightest first), so for any ``lam >= 0``
  ``value(S) = sum(v - lam over S) + lam * |S| <= LP(v - lam) + lam * k_max``, where ``LP`` is the
  Dantzig bound of the items whose reduced value ``v - lam`` is positive (a bundle of ``m``
  identical items counts ``m``: ``v - lam * m``). The bound is convex in
  ``lam``; a golden-section search takes the least (``lam = 0`` is the Dantzig bound itself). On
  strongly correlated items (``v = w + k``) it reaches ``capacity + k * k_max`` at ``lam = k``,
  the value of any ``k_max`` items that fill the capacity exactly;
- **lower bounds by pairing**: the best set that differs from the break solution by adding one
  item, or by swapping one item in for one out (``best_swap``), and the best set one item outside
  the core away from a state (``best_pairing``: a state that fits adds one, a state over the
  capacity drops one), found by sorting and binary search.

Where the best set found meets the upper bound, no state can beat it and the solve ends.

Example:
    >>> w, v = np.array([3, 4, 5, 6]), np.array([13.0, 14.0, 15.0, 16.0])  # v = w + 10
    >>> round(cardinality_bound(w, v, 10), 6), best_swap(w, v, 10)  # 2 items fit: 10 + 2 * 10
    (30.0, (30.0, 0, 3))
"""

from __future__ import annotations

import numpy as np

__all__ = ["best_pairing", "best_swap", "cardinality_bound", "max_cardinality"]

_GOLDEN = (5**0.5 - 1) / 2
_SEARCH_STEPS = 64
"""Golden-section steps: the interval shrinks by 0.618**64 ~ 4e-14 of the largest value."""


def max_cardinality(weights: np.ndarray, capacity: int, counts: np.ndarray | None = None) -> int:
    """The most items any feasible set holds, each core item standing for ``counts`` of them (1
    each by default): the floor of the LP of ``max sum(counts * x) s.t. sum(weights * x) <= capacity``,
    which with counts of 1 is the number of the lightest items that fit together.

    Example:
        >>> max_cardinality(np.array([5, 1, 3, 2]), 6), max_cardinality(np.array([6, 1]), 6, np.array([4, 1]))
        (3, 4)
    """
    counts = np.ones(len(weights), dtype=np.int64) if counts is None else counts
    order = np.lexsort((weights, weights / counts))  # least weight per item first
    w, k = weights[order].tolist(), counts[order].tolist()
    room, most = capacity, 0
    for weight, count in zip(w, k, strict=True):
        if weight > room:
            return most + room * count // weight  # the floor of the fractional item's share
        room, most = room - weight, most + count
    return most


def _lagrangian(
    weights: np.ndarray, values: np.ndarray, counts: np.ndarray, capacity: int, lam: float, k_max: int
) -> float:
    """``LP(values - lam * counts) + lam * k_max``: an upper bound on the optimum for any ``lam >= 0``."""
    reduced = values - lam * counts
    useful = reduced > 0
    w, u = weights[useful], reduced[useful]
    order = np.argsort(-u / w, kind="stable")
    w, u = w[order], u[order]
    filled = np.cumsum(w)
    b = int(np.searchsorted(filled, capacity, side="right"))
    lp = float(u[:b].sum())
    if b < len(w):
        lp += (capacity - (int(filled[b - 1]) if b else 0)) * float(u[b]) / float(w[b])
    return lp + lam * k_max


def cardinality_bound(
    weights: np.ndarray, values: np.ndarray, capacity: int, counts: np.ndarray | None = None
) -> float:
    """An upper bound on the optimum, never above the Dantzig bound: the least Lagrangian bound of
    the cardinality constraint found, raised by a float64 rounding allowance. ``counts``: the items
    each core item stands for (a bundle of identical items, ``sparse/reduce.py``), 1 by default."""
    counts = np.ones(len(weights), dtype=np.int64) if counts is None else counts
    k_max = max_cardinality(weights, capacity, counts)
    bound = lambda lam: _lagrangian(weights, values, counts, capacity, lam, k_max)  # noqa: E731
    top = float((values / counts).max(initial=0.0))
    lo, hi = 0.0, top
    a, b = hi - _GOLDEN * (hi - lo), lo + _GOLDEN * (hi - lo)
    fa, fb = bound(a), bound(b)
    least = min(bound(0.0), fa, fb)
    for _ in range(_SEARCH_STEPS):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - _GOLDEN * (hi - lo)
            fa = bound(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + _GOLDEN * (hi - lo)
            fb = bound(b)
        least = min(least, fa, fb)
    rounding = (len(values) + 8) * 2.3e-16 * (float(values.sum()) + k_max * top)
    return least + rounding


def best_swap(w: np.ndarray, v: np.ndarray, capacity: int) -> tuple[float, int, int]:
    """The best set one move from the break solution of items in efficiency order:
    ``(value, dropped, added)``, positions in ``w`` (-1: none; ``(break value, -1, -1)`` when no
    move improves). The break solution takes ``w[:b]``, the longest prefix that fits."""
    b = int(np.searchsorted(np.cumsum(w), capacity, side="right"))
    room = capacity - int(w[:b].sum())
    base = float(v[:b].sum())
    if b == len(w):
        return base, -1, -1
    inside = np.argsort(w[:b], kind="stable")  # items in, by weight
    in_w, in_v = w[:b][inside], v[:b][inside]
    cheapest = np.minimum.accumulate(in_v[::-1])[::-1]  # least value among items at least this heavy
    out_w, out_v = w[b:], v[b:]
    first = np.searchsorted(in_w, out_w - room, side="left")  # the lightest item whose drop makes room
    gain = np.full(len(out_w), -np.inf)
    can = first < b
    gain[can] = out_v[can] - cheapest[first[can]]
    fits = out_w <= room
    gain[fits] = out_v[fits]
    j = int(gain.argmax())
    if not gain[j] > 0:
        return base, -1, -1
    if fits[j]:
        return base + float(gain[j]), -1, b + j
    i = int(first[j]) + int(in_v[first[j] :].argmin())
    return base + float(gain[j]), int(inside[i]), b + j


def best_pairing(
    fw: np.ndarray,
    fv: np.ndarray,
    capacity: int,
    w: np.ndarray,
    v: np.ndarray,
    by_weight: np.ndarray,
    s: int,
    t: int,
) -> tuple[float, int, int]:
    """The best set one item outside the core away from a state (``combo``'s pairing): a state that
    fits adds an item of ``w[t:]`` (out in every state), one over the capacity drops an item of
    ``w[:s + 1]`` (in in every state). Returns ``(value, state index, item position)``, or
    ``(-inf, -1, -1)``; ``by_weight`` lists every position by weight."""
    best = (-np.inf, -1, -1)
    fits = int(fw.searchsorted(capacity, side="right"))
    if fits and t < len(w):
        right = by_weight[by_weight >= t]  # by weight, ascending
        most = np.maximum.accumulate(v[right])  # the best value among items at most this heavy
        last = np.searchsorted(w[right], capacity - fw[:fits], side="right") - 1
        gain = np.where(last >= 0, fv[:fits] + most[np.maximum(last, 0)], -np.inf)
        e = int(gain.argmax())
        if gain[e] > best[0]:
            best = (float(gain[e]), e, int(right[int(v[right[: last[e] + 1]].argmax())]))
    if fits < len(fw) and s >= 0:
        left = by_weight[by_weight <= s]
        least = np.minimum.accumulate(v[left][::-1])[::-1]  # the least value among items at least this heavy
        first = np.searchsorted(w[left], fw[fits:] - capacity, side="left")
        gain = np.where(first < len(left), fv[fits:] - least[np.minimum(first, len(left) - 1)], -np.inf)
        e = int(gain.argmax())
        if gain[e] > best[0]:
            best = (float(gain[e]), fits + e, int(left[first[e] + int(v[left[first[e] :]].argmin())]))
    return best
