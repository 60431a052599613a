"""An exact uncapped 0/1 knapsack on sparse states: an expanding core around the break item.

In the style of Pisinger's ``minknap`` (1997). Items are sorted by efficiency (value per weight);
the *break solution* takes them in that order until the next one, the break item, no longer fits.
States are sets that differ from the break solution only on a *core* of items ``s + 1 .. t - 1``
around the break item, kept as a Pareto list of ``(weight, value)`` (``pareto.merge``). The core
grows one item at a time, alternately at its right end (item ``t``, out in the break solution:
each state may add it) and at its left end (item ``s``, in: each state may drop it). Every item
outside the core is still in its break-solution side, so a state of weight ``x`` and value ``p``
can reach at most

- ``p + (c - x) * r[t]`` when ``x <= c`` (only items of efficiency at most ``r[t]`` can be added;
  dropping one of efficiency at least ``r[s]`` to make room never pays in the LP), and
- ``p - (x - c) * r[s]`` when ``x > c`` (at least ``x - c`` must go, at ``r[s]`` per unit or more),

with ``r[t] = 0`` past the last item and ``r[s] = inf`` before the first. States that cannot beat
the best feasible state seen (plus a 1e-11 relative margin, far inside the 1e-9 the optimum must
meet) are dropped; the solve ends when no state is left, every item is in the core, or the best
set found meets the strong upper bound. That bound, and a second lower bound, come once from
``bounds.py`` when the states made pass ``strong_after``, as ``combo`` adds its cardinality bounds
and pairing only to hard instances: on strongly correlated items (value = weight + constant) the
plain bounds keep millions of states, while the cardinality bound equals the value of any set of
the most items that fit that fills the capacity exactly, and one swap from the break solution
usually finds such a set. Most items
are never reached: on uncorrelated instances of a few thousand items the core stays at a few
dozen. The history (one source index per state made) gives the chosen set back; past
``max_states`` states made, the caller's O(W) engine takes over.

Example:
    >>> chosen, states = solve_minknap(np.array([2, 3, 4]), np.array([3.0, 4.0, 5.5]), 5, 100)
    >>> chosen.tolist()
    [True, True, False]
"""

from __future__ import annotations

import numpy as np

from lightning_ckpt.solver.sparse.bounds import best_pairing, best_swap, cardinality_bound
from lightning_ckpt.solver.sparse.pareto import merge

__all__ = ["solve_minknap"]

MARGIN_RELATIVE = 1e-11
"""A state must promise more than the best value plus this share of the total value to be kept."""

STRONG_AFTER_STATES = 1 << 17
"""States made before the strong bounds (``bounds.py``, about 1-10 ms at n = 2000) are computed:
uncorrelated, weakly correlated and transformer-like instances of 2000 items finish with fewer
(9,400-103,000 measured), strongly correlated ones pass it within a few dozen core items."""


def _break_solution(weights: np.ndarray, capacity: int) -> int:
    """The break item's position in efficiency order: the first that no longer fits after those before."""
    return int(np.searchsorted(np.cumsum(weights), capacity, side="right"))


def _bounds(fw: np.ndarray, fv: np.ndarray, capacity: int, add_ratio: float, drop_ratio: float) -> np.ndarray:
    """Each state's bound, ``fv + (capacity - fw) * r`` with ``r`` the ratio its side may use: the
    same floats as ``fv - (fw - capacity) * drop_ratio`` over the capacity (negation is exact), and
    no ``0 * inf`` (a state at the capacity takes ``add_ratio``), so no error state to switch off."""
    room = capacity - fw
    return fv + room * np.where(room < 0, drop_ratio, add_ratio)


def solve_minknap(
    weights: np.ndarray,
    values: np.ndarray,
    capacity: int,
    max_states: int,
    strong_after: int = STRONG_AFTER_STATES,
    counts: np.ndarray | None = None,
) -> tuple[np.ndarray, int] | None:
    """The optimal set (a mask) and the states made, or None past ``max_states`` states.

    Args:
        weights: int64 weights > 0.
        values: float64 values >= 0.
        capacity: The capacity, >= 0.
        max_states: Give up (return None) when the state lists made hold more entries, all together.
        strong_after: Past this many states made (or a quarter of ``max_states``, if fewer),
            compute the strong bounds of ``bounds.py`` once.
        counts: The items each one stands for (bundles of identical items count several in the
            cardinality bound); 1 each by default.
    """
    n = len(weights)
    order = np.lexsort((np.arange(n), -values / weights))  # efficiency descending, ties by index
    w, v = weights[order], values[order]
    ratio = v / w
    b = _break_solution(w, capacity)
    fw, fv = np.array([int(w[:b].sum())]), np.array([float(v[:b].sum())])
    margin = MARGIN_RELATIVE * max(float(values.sum()), 1e-300)
    best, best_at = float(fv[0]), (-1, 0, ())  # the best set: (step, state index, positions flipped)
    ceiling = np.inf  # the strong upper bound, once computed
    by_weight = np.argsort(w, kind="stable")
    strong_after = min(strong_after, max_states // 4)  # a small state budget: try them early
    history: list[tuple[int, np.ndarray, int]] = []
    s, t, total = b - 1, b, 0
    while len(fw) and (s >= 0 or t < n) and best < ceiling - margin:
        add = t < n and (s < 0 or len(history) % 2 == 0)  # alternately right and left
        item = t if add else s
        sign = 1 if add else -1
        n_old = len(fw)
        fw, fv, source = merge(fw, fv, fw + sign * int(w[item]), fv + sign * float(v[item]))
        t, s = (t + 1, s) if add else (t, s - 1)
        total += len(fw)
        if total > max_states:
            return None
        fits = int(fw.searchsorted(capacity, side="right"))
        if fits and fv[fits - 1] > best:
            best, best_at = float(fv[fits - 1]), (len(history), int(source[fits - 1]), ())
        if total > strong_after and ceiling == np.inf:
            ceiling = cardinality_bound(weights, values, capacity, counts)
            swapped, dropped, added = best_swap(w, v, capacity)
            if swapped > best:
                best, best_at = swapped, (-1, 0, (dropped, added))
        if ceiling < np.inf:
            paired, entry, flipped = best_pairing(fw, fv, capacity, w, v, by_weight, s, t)
            if paired > best:
                best, best_at = paired, (len(history), int(source[entry]), (flipped,))
        add_ratio = float(ratio[t]) if t < n else 0.0
        drop_ratio = float(ratio[s]) if s >= 0 else np.inf
        hopeful = _bounds(fw, fv, capacity, add_ratio, drop_ratio) > best + margin
        fw, fv, source = fw[hopeful], fv[hopeful], source[hopeful]
        history.append((item, source, n_old))
    chosen = np.zeros(n, dtype=np.bool_)
    chosen[order[_walk_back(n, b, best_at, history)]] = True
    return chosen, total


def _walk_back(n: int, b: int, best_at: tuple, history: list[tuple[int, np.ndarray, int]]) -> np.ndarray:
    """The best set as a mask over the items in efficiency order: the break solution, flipped on
    the way back from the best state (none at step -1), then at the positions ``best_at`` adds (a
    swap's or a pairing's; -1: none)."""
    chosen = np.zeros(n, dtype=np.bool_)
    chosen[:b] = True
    step, entry, flipped = best_at
    for k in range(step, -1, -1):
        item, _, n_old = history[k]
        if entry >= n_old:
            chosen[item] = not chosen[item]
            entry -= n_old
        entry = int(history[k - 1][1][entry]) if k else entry
    for position in flipped:
        if position >= 0:
            chosen[position] = not chosen[position]
    return chosen
