"""Value profiles of a knapsack with prefix capacities: the DP under the dense capped engine.

Items come in a fixed order. Item ``j`` carries two caps on the chosen weight of the items before
it: ``take[j]`` when it is chosen, ``skip[j]`` when it is not (a cap below 0 forbids that choice).
Two profiles, over a segment's relative capacity ``0..C``:

- *forward*: ``f[c]`` = best value of the segment's items with weight at most ``c`` that meet
  their caps. Item ``j``: ``f'[c] = max(f[min(c, skip)], f[min(c - w, take)] + v)``, the profile
  capped at ``W_j`` before the item is added;
- *backward*: ``h[x]`` = best value of the segment's items when the items before the segment
  weigh at most ``x`` (and everything at most ``C``). Item ``j``, from the last:
  ``h'[x] = max(h[x] if x <= skip, h[x + w] + v if x <= take)``: the caps ride along.

Infeasible entries are ``-inf``. Each item costs O(C) time; a profile is C + 1 floats. Every
function takes an optional ``stop`` flag (``interrupt.new_stop_flag``), checked before each item:
once it is set they return early, their profile unfinished, and the caller raises. The pure
numpy versions here serve small calls without loading numba; ``_kernels_numba`` does the same
arithmetic in compiled loops for large ones (bit-identical: one max of two sums per cell), for all
three passes. ``runtime.backend`` chooses, with the same rule as the uncapped engine's.

Example:
    >>> f = np.zeros(6)  # items of weight 2 and 3, value 1 and 2; item 1 only if item 0 weighs <= 0
    >>> forward(np.array([2, 3]), np.array([1.0, 2.0]), np.array([5, 0]), np.array([5, 5]), f)
    >>> f.tolist()
    [0.0, 0.0, 1.0, 2.0, 2.0, 2.0]
"""

from __future__ import annotations

import numpy as np

from lightning_ckpt.solver.capped.groups import Groups
from lightning_ckpt.solver.runtime import backend
from lightning_ckpt.solver.runtime.interrupt import new_stop_flag

__all__ = ["backward", "backward_groups", "forward", "forward_groups", "solve_leaf", "solve_leaf_groups"]

NEG = -np.inf


def _as_arrays(weights, values, take, skip) -> tuple[np.ndarray, ...]:
    return (
        np.ascontiguousarray(weights, dtype=np.int64),
        np.ascontiguousarray(values, dtype=np.float64),
        np.ascontiguousarray(take, dtype=np.int64),
        np.ascontiguousarray(skip, dtype=np.int64),
    )


def _take_candidates(f: np.ndarray, w: int, v: float, take: int) -> np.ndarray:
    """``f[min(c - w, take)] + v`` for every ``c`` (``-inf`` where ``c < w`` or ``take < 0``)."""
    size = len(f)
    out = np.full(size, NEG)
    if take < 0 or w >= size:
        return out
    span = size - w  # c - w in 0..span - 1
    direct = min(span, take + 1)
    out[w : w + direct] = f[:direct] + v
    if direct < span:
        out[w + direct :] = f[take] + v
    return out


def forward_item(f: np.ndarray, w: int, v: float, take: int, skip: int) -> None:
    """Add one item to the forward profile ``f`` in place."""
    candidates = _take_candidates(f, w, v, take)
    if skip < 0:
        f[:] = NEG
    elif skip + 1 < len(f):
        f[skip + 1 :] = f[skip]
    np.maximum(f, candidates, out=f)


def _flag(stop: np.ndarray | None) -> np.ndarray:
    return new_stop_flag() if stop is None else stop


def _ran_compiled(kernel: str, weights, values, take, skip, profile: np.ndarray, stop: np.ndarray) -> bool:
    """Run the numba ``kernel`` ("forward" or "backward") on ``profile`` when the backend picks numba
    for this many cells; whether it ran."""
    compiled = backend.compiled(len(weights) * len(profile), backend.CAPPED_NUMBA)
    if compiled is None:
        return False
    getattr(compiled, kernel)(*_as_arrays(weights, values, take, skip), profile, stop)
    return True


def forward(
    weights: np.ndarray,
    values: np.ndarray,
    take: np.ndarray,
    skip: np.ndarray,
    f: np.ndarray,
    stop: np.ndarray | None = None,
) -> None:
    """Add the items, in order, to the forward profile ``f`` (start from zeros: the empty set)."""
    stop = _flag(stop)
    if _ran_compiled("forward", weights, values, take, skip, f, stop):
        return
    for w, v, t, s in zip(weights.tolist(), values.tolist(), take.tolist(), skip.tolist(), strict=True):
        if stop[0]:
            return
        forward_item(f, w, v, t, s)


def backward(
    weights: np.ndarray,
    values: np.ndarray,
    take: np.ndarray,
    skip: np.ndarray,
    h: np.ndarray,
    stop: np.ndarray | None = None,
) -> None:
    """Add the items, last first, to the backward profile ``h`` (start from zeros).

    Example:
        >>> h = np.zeros(4)  # one item of weight 2 that fits only when at most 1 comes before it
        >>> backward(np.array([2]), np.array([5.0]), np.array([1]), np.array([3]), h)
        >>> h.tolist()
        [5.0, 5.0, 0.0, 0.0]
    """
    size, stop = len(h), _flag(stop)
    if _ran_compiled("backward", weights, values, take, skip, h, stop):
        return
    items = zip(weights.tolist(), values.tolist(), take.tolist(), skip.tolist(), strict=True)
    for w, v, t, s in reversed(list(items)):
        if stop[0]:
            return
        candidates = np.full(size, NEG)
        upto = min(t, size - 1 - w)
        if upto >= 0:
            candidates[: upto + 1] = h[w : w + upto + 1] + v
        if s + 1 < size:
            h[max(s + 1, 0) :] = NEG
        np.maximum(h, candidates, out=h)


def solve_leaf(
    weights: np.ndarray,
    values: np.ndarray,
    take: np.ndarray,
    skip: np.ndarray,
    f: np.ndarray,
    stop: np.ndarray | None = None,
) -> np.ndarray:
    """The best set of a small segment at capacity ``len(f) - 1``: forward with a decision bit per
    item and capacity (take strictly better), then a backtrack from the top. Returns a mask.

    Example:
        >>> w, v = np.array([2, 3, 4]), np.array([3.0, 4.0, 5.5])
        >>> solve_leaf(w, v, np.array([5, 5, 5]), np.array([5, 5, 5]), np.zeros(6)).tolist()
        [True, True, False]
    """
    n, size, stop = len(weights), len(f), _flag(stop)
    took = np.zeros((n, size), dtype=np.bool_)
    compiled = backend.compiled(n * size, backend.CAPPED_NUMBA)
    if compiled is not None:
        compiled.fill_leaf(*_as_arrays(weights, values, take, skip), f, took, stop)
        return backtrack(weights, take, skip, took, size - 1)
    f[:] = 0.0
    for j in range(n):
        if stop[0]:
            break
        candidates = _take_candidates(f, int(weights[j]), float(values[j]), int(take[j]))
        s = int(skip[j])
        if s < 0:
            f[:] = NEG
        elif s + 1 < size:
            f[s + 1 :] = f[s]
        took[j] = candidates > f
        np.maximum(f, candidates, out=f)
    return backtrack(weights, take, skip, took, size - 1)


def backtrack(weights: np.ndarray, take: np.ndarray, skip: np.ndarray, took, top: int) -> np.ndarray:
    """Read the chosen items back from decision bits (``took[j][c]``: item ``j`` taken at ``c``)."""
    chosen = np.zeros(len(weights), dtype=np.bool_)
    c = top
    for j in range(len(weights) - 1, -1, -1):
        if took[j][c]:
            chosen[j] = True
            c = min(c - int(weights[j]), int(take[j]))
        else:
            c = min(c, int(skip[j]))
    return chosen


def _binary_arrays(groups: Groups) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Two-option groups ``(0, 0, skip), (w, v, take)`` as the 0/1 kernels' items."""
    return groups.weights[1::2], groups.values[1::2], groups.caps[1::2], groups.caps[0::2]


def _options(groups: Groups, g: int) -> list[tuple[int, float, int]]:
    first, end = int(groups.starts[g]), int(groups.starts[g + 1])
    items = zip(groups.weights[first:end].tolist(), groups.values[first:end].tolist(), strict=True)
    return [(w, v, c) for (w, v), c in zip(items, groups.caps[first:end].tolist(), strict=True)]


def forward_groups(groups: Groups, f: np.ndarray, stop: np.ndarray | None = None) -> None:
    """Add the groups, in order, to the forward profile ``f`` (start from zeros): per group
    ``f'[c] = max_o f[min(c - w_o, cap_o)] + v_o``. Two-option groups run the 0/1 kernels."""
    if groups.binary:
        forward(*_binary_arrays(groups), f, stop)
        return
    stop = _flag(stop)
    for g in range(groups.count):
        if stop[0]:
            return
        best = np.full(len(f), NEG)
        for w, v, cap in _options(groups, g):
            np.maximum(best, _take_candidates(f, w, v, cap), out=best)
        f[:] = best


def backward_groups(groups: Groups, h: np.ndarray, stop: np.ndarray | None = None) -> None:
    """Add the groups, last first, to the backward profile ``h`` (start from zeros): per group
    ``h'[x] = max_o (h[x + w_o] + v_o if x <= cap_o)``. Two-option groups run the 0/1 kernels."""
    if groups.binary:
        backward(*_binary_arrays(groups), h, stop)
        return
    size, stop = len(h), _flag(stop)
    for g in range(groups.count - 1, -1, -1):
        if stop[0]:
            return
        best = np.full(size, NEG)
        for w, v, cap in _options(groups, g):
            upto = min(cap, size - 1 - w)
            if upto >= 0:
                np.maximum(best[: upto + 1], h[w : w + upto + 1] + v, out=best[: upto + 1])
        h[:] = best


def solve_leaf_groups(groups: Groups, f: np.ndarray, stop: np.ndarray | None = None) -> np.ndarray:
    """The best choice (an option index per group) of a small segment at capacity ``len(f) - 1``: a
    forward pass recording each cell's option (the first of the best), then a backtrack.

    Example:
        >>> from lightning_ckpt.solver.capped.groups import from_options
        >>> g = from_options(np.array([0, 2, 3, 0, 2]), np.array([0.0, 2.0, 2.5, 0.0, 1.0]),
        ...                  np.array([9, 9, 9, 9, 1]), np.array([0, 3, 5]))
        >>> solve_leaf_groups(g, np.zeros(6)).tolist()  # group 1's option 1 only with at most 1 before
        [2, 0]
    """
    if groups.binary:
        return solve_leaf(*_binary_arrays(groups), f, stop).astype(np.int64)
    n, size, stop = groups.count, len(f), _flag(stop)
    picks = np.zeros((n, size), dtype=np.int16)
    f[:] = 0.0
    for g in range(n):
        if stop[0]:
            break
        best = np.full(size, NEG)
        for k, (w, v, cap) in enumerate(_options(groups, g)):
            candidates = _take_candidates(f, w, v, cap)
            better = candidates > best
            best[better] = candidates[better]
            picks[g][better] = k
        f[:] = best
    choice, c = np.zeros(n, dtype=np.int64), size - 1
    for g in range(n - 1, -1, -1):
        k = int(picks[g][c])
        w, _, cap = _options(groups, g)[k]
        choice[g], c = k, min(c - w, cap)
    return choice
