"""Upper bounds for one option per group under prefix capacities: the LP over the chain of rooms.

Every feasible choice has at most ``room[k]`` chosen before group ``k`` (``groups.reach``): a chain
of nested prefix constraints. Its LP relaxation, each group a convex combination of its options, is
the chain LP of 0/1 items over each group's upper convex hull (its lightest option taken first, the
hull's segments as items of falling efficiency, as Sinha-Zoltners and Pisinger's ``mcknap`` relax a
multiple-choice knapsack). That LP has a dual that pool adjacent violators solves exactly
(``chain_dual``): between two cuts (where the room rises) a run of items has one price per unit of
weight, the prices never rise from run to run, and a pooled run is priced at its fractional
knapsack's break ratio. ``group_prices`` maps it back to a price per group, and ``GroupBounds`` gives

- the bound ``upper`` and each option's reduced value ``v - w * price``: forcing group ``g`` to
  option ``o`` costs at least its best reduced value less ``o``'s (reduced-cost fixing);
- a bound of a partial choice linear in its weight (``GroupBounds.lagrange``). (A fractional
  knapsack bound per state, split at the binding cuts, was tried on 0/1 items: it dropped under 10%
  more states and cost more time than it saved.)

Example:
    >>> from lightning_ckpt.solver.capped.groups import from_items, reach
    >>> groups = from_items(np.array([2, 2, 2]), np.array([3.0, 2.0, 4.0]), np.array([2, 0, 2]), np.array([4, 0, 4]))
    >>> room, fitted = reach(groups, 4)
    >>> room.tolist()  # item 1 needs nothing chosen before it, so item 0 is never chosen
    [0, 0, 4, 4]
    >>> price = group_prices(groups, room, fitted)
    >>> bounds = GroupBounds(groups._replace(caps=fitted), room, price, fitted >= 0)
    >>> bounds.upper, bounds.reduced.tolist()  # items 1 and 2: 6
    (6.0, [0.0, -inf, 0.0, 2.0, 0.0, 4.0])
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from lightning_ckpt.solver.capped.groups import Groups

__all__ = ["ChainDual", "GroupBounds", "chain_dual", "group_prices"]


class ChainDual(NamedTuple):
    """The chain LP's optimal dual: a price per item (``price[n] = 0``), reduced values and the bound."""

    price: np.ndarray
    reduced: np.ndarray
    upper: float


def _ratios(weights: np.ndarray, values: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(weights > 0, values / np.maximum(weights, 1), np.inf)


def _break_ratio(weights: np.ndarray, values: np.ndarray, room: int) -> float:
    """The price at which a fractional knapsack of ``room`` fills: the break item's ratio (0 if all fit)."""
    ratio = _ratios(weights, values)
    order = np.argsort(-ratio, kind="stable")
    at = int(np.searchsorted(np.cumsum(weights[order]), room, side="right"))
    return float(ratio[order[at]]) if at < len(order) else 0.0


def chain_dual(weights: np.ndarray, values: np.ndarray, caps: np.ndarray, usable: np.ndarray) -> ChainDual:
    """The dual of the chain LP of 0/1 items in order, the items before ``k`` at most ``caps[k]``
    (``k = 1..n``, never falling); items not ``usable`` are never chosen."""
    n = len(weights)
    cuts = np.append(np.flatnonzero(caps[1:n] < caps[2:]) + 1, n).tolist()
    blocks: list[tuple[int, int, int, float]] = []  # (first item, end, room, price)
    start, before = 0, 0
    for end in cuts:
        block = (start, end, int(caps[end]) - before)
        start, before = end, int(caps[end])
        while True:
            lo, hi, room = block
            price = _break_ratio(weights[lo:hi][usable[lo:hi]], values[lo:hi][usable[lo:hi]], room)
            if not blocks or blocks[-1][3] >= price:
                break
            lo0, _, room0, _ = blocks.pop()  # a later group priced higher: pool the two
            block = (lo0, hi, room0 + room)
        blocks.append((*block, price))
    price = np.zeros(n + 1)
    for lo, hi, _, block_price in blocks:
        price[lo:hi] = block_price
    reduced = np.where(usable, values - weights * price[:n], -np.inf)
    upper = sum(room * p for _, _, room, p in blocks) + float(np.maximum(reduced, 0.0).sum())
    return ChainDual(price, reduced, upper)


def _binary_hull(groups: Groups, usable: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``_hull`` for two-option groups ``(0, 0), (w, v)``, in numpy."""
    w, v = groups.weights[1::2], groups.values[1::2]
    leave, take = usable[0::2], usable[1::2]
    base = np.where(leave, 0, np.where(take, w, 0))
    segment = leave & take & (w > 0) & (v > 0)
    return w[segment], v[segment], segment.astype(np.int64), base


def _hull(groups: Groups, usable: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each group's upper convex hull of its usable options as segments from its lightest one:
    ``(segment weights, segment values, segments per group, lightest weight per group)``."""
    if groups.binary:
        return _binary_hull(groups, usable)
    seg_w, seg_v, counts, base = [], [], [], []
    weights, values, starts = groups.weights.tolist(), groups.values.tolist(), groups.starts.tolist()
    for g in range(groups.count):
        points = sorted((weights[o], -values[o]) for o in range(starts[g], starts[g + 1]) if usable[o])
        hull: list[tuple[int, float]] = []
        for w, minus_v in points:
            v = -minus_v
            if hull and v <= hull[-1][1]:
                continue  # as heavy or heavier and worth no more than a hull point
            while len(hull) >= 2 and (hull[-1][0] - hull[-2][0]) * (v - hull[-1][1]) >= (
                hull[-1][1] - hull[-2][1]
            ) * (w - hull[-1][0]):
                hull.pop()  # the last point lies under the chord: off the hull
            hull.append((w, v))
        base.append(hull[0][0] if hull else 0)
        counts.append(max(len(hull) - 1, 0))
        for (w0, v0), (w1, v1) in zip(hull[:-1], hull[1:], strict=True):
            seg_w.append(w1 - w0)
            seg_v.append(v1 - v0)
    as_int = lambda x: np.array(x, dtype=np.int64)  # noqa: E731
    return as_int(seg_w), np.array(seg_v, dtype=np.float64), as_int(counts), as_int(base)


def group_prices(groups: Groups, room: np.ndarray, fitted: np.ndarray) -> np.ndarray:
    """A price per unit of weight per group (``n + 1`` entries, never rising, the last 0): the
    optimal dual of the multiple-choice chain LP (each group a convex combination of its options,
    the groups before ``g`` at most ``room[g]``), by ``chain_dual`` over the groups' hull segments
    with each group's lightest option taken first. Any prices that never rise give a valid bound
    (``GroupBounds``); these give the LP's."""
    seg_w, seg_v, counts, base = _hull(groups, fitted >= 0)
    n = groups.count
    relative = room - np.concatenate(([0], np.cumsum(base)))  # less the lightest options before
    first = np.concatenate(([0], np.cumsum(counts)))  # each group's first segment
    caps = np.full(len(seg_w) + 1, np.iinfo(np.int64).max)  # the room before each segment:
    np.minimum.at(caps, first[1:], relative[1 : n + 1])  # a group's, at its first segment,
    caps = np.minimum.accumulate(caps[::-1])[::-1]  # and within a group the room after it
    dual = chain_dual(seg_w, seg_v, caps, np.ones(len(seg_w), dtype=np.bool_))
    return np.minimum.accumulate(np.append(dual.price[first[:-1]], 0.0))


class GroupBounds:
    """The Lagrangian bound of the chain of rooms with prices ``price`` (``group_prices``): with
    ``mu[k] = price[k - 1] - price[k] >= 0`` on the room before group ``k``, every choice is worth at
    most ``sum_k mu[k] room[k] + sum_g max_o (v - price[g] w)``; after group ``j``, a state of chosen
    weight ``x`` and value ``val`` at most ``lagrange(j, x, val)``. ``allowed`` masks the options a
    pass still considers (the others fixed away)."""

    def __init__(self, groups: Groups, room: np.ndarray, price: np.ndarray, allowed: np.ndarray) -> None:
        self.reduced = np.where(allowed, groups.values - price[groups.group_of()] * groups.weights, -np.inf)
        best = np.maximum.reduceat(self.reduced, groups.starts[:-1]) if groups.count else np.zeros(0)
        self.tail = np.append(np.cumsum(best[::-1])[::-1], 0.0)
        priced = np.concatenate(([0.0], (price[:-1] - price[1:]) * room[1:]))
        self.priced_caps = np.append(np.cumsum(priced[::-1])[::-1], 0.0)
        self.price = price
        self.upper = float(self.priced_caps[1] + self.tail[0]) if groups.count else 0.0

    def lagrange(self, j: int, weight: np.ndarray, value: np.ndarray) -> np.ndarray:
        return value + self.priced_caps[j + 2] - self.price[j + 1] * weight + self.tail[j + 1]
