"""Pareto lists of knapsack states: ``(weights ascending, values strictly ascending)``.

A state beaten by another (as heavy or heavier, and worth no more) can never become the better one
when every later constraint only bounds the chosen weight from above, so dropping it is exact. Both
sparse engines (``minknap.py`` and ``capped/frontier.py``) keep their states so, and recover the
chosen set from a history of where each state came from.

Example:
    >>> w, v, source = merge(np.array([0, 3]), np.array([0.0, 4.0]), np.array([2, 5]), np.array([3.0, 3.5]))
    >>> w.tolist(), v.tolist(), source.tolist()  # (5, 3.5) is beaten by (3, 4.0)
    ([0, 2, 3], [0.0, 3.0, 4.0], [0, 2, 1])
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["merge", "merge_runs"]


def merge(
    old_w: np.ndarray, old_v: np.ndarray, new_w: np.ndarray, new_v: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The undominated states of two sorted lists: their weights, values, and where each came from
    (an index into ``old`` then ``new``, concatenated). At equal weight the most valuable is kept;
    at equal weight and value, the one of ``old``."""
    return merge_runs((old_w, new_w), (old_v, new_v))


def merge_runs(
    weight_runs: Sequence[np.ndarray], value_runs: Sequence[np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The undominated states of several sorted lists (one per option of a group), and where each
    came from (an index into the lists concatenated in order). At equal weight the most valuable is
    kept; at equal weight and value, the one of the earliest list.

    Example:
        >>> w, v, source = merge_runs([np.array([0, 4])] * 3, [np.array([0.0, 1.0]), np.array([2.0, 3.0]), np.array([2.0, 9.0])])
        >>> w.tolist(), v.tolist(), source.tolist()
        ([0, 4], [2.0, 9.0], [2, 5])
    """
    weights = np.concatenate(weight_runs)
    values = np.concatenate(value_runs)
    if not len(weights):
        return weights, values, np.zeros(0, dtype=np.int64)
    order = weights.argsort(kind="stable")  # sorted runs: a merge
    weights, values = weights[order], values[order]
    keep = np.empty(len(values), dtype=np.bool_)
    keep[0] = True
    np.greater(values[1:], np.maximum.accumulate(values)[:-1], out=keep[1:])
    kept = keep.nonzero()[0]
    last = np.ones(len(kept), dtype=np.bool_)  # equal weights: the most valuable only
    np.not_equal(weights[kept[1:]], weights[kept[:-1]], out=last[:-1])
    kept = kept[last]
    return weights[kept], values[kept], order[kept]
