"""Reference and baseline methods: full DP table, ratio greedy, and MILP (scipy).

Each returns a boolean mask of the chosen items for validated inputs (see ``validate.py``).

Example:
    >>> w, v = np.array([1, 3, 3]), np.array([2.0, 4.0, 4.0])
    >>> dp_table(w, v, 6).tolist(), greedy(w, v, 6).tolist()
    ([False, True, True], [True, True, False])
"""

from __future__ import annotations

import logging

import numpy as np

from lightning_ckpt.solver.fits import check_fits
from lightning_ckpt.solver.options import DEFAULT_OPTIONS

__all__ = ["dp_table", "greedy", "ilp"]

log = logging.getLogger(__name__)


def dp_table(
    weights: np.ndarray,
    values: np.ndarray,
    capacity: int,
    limit_bytes: int = DEFAULT_OPTIONS.dp_table_limit_bytes,
) -> np.ndarray:
    """Exact: the full (n + 1) x (W + 1) float64 table and a backtrack (the textbook reference).

    Raises:
        MemoryError: when the table exceeds ``limit_bytes`` (``SolverOptions.dp_table_limit_bytes``)
            or the available memory.
    """
    n = len(weights)
    what, advice = (
        f"method='dp' ({n + 1} x {capacity + 1} table)",
        "use method='auto', which needs O(W) memory",
    )
    check_fits(8 * (n + 1) * (capacity + 1), limit_bytes, what, advice)
    table = np.zeros((n + 1, capacity + 1))
    for i, (w, v) in enumerate(zip(weights.tolist(), values.tolist(), strict=True), start=1):
        table[i] = table[i - 1]
        if w <= capacity:
            np.maximum(table[i - 1, w:], table[i - 1, : capacity + 1 - w] + v, out=table[i, w:])
    chosen = np.zeros(n, dtype=np.bool_)
    c = capacity
    for i in range(n, 0, -1):
        if table[i, c] != table[i - 1, c]:
            chosen[i - 1] = True
            c -= int(weights[i - 1])
    return chosen


def greedy(weights: np.ndarray, values: np.ndarray, capacity: int) -> np.ndarray:
    """Heuristic: items by value/weight ratio (best first, ties by index), kept while they fit."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(weights == 0, np.inf, values / weights)
    chosen = np.zeros(len(weights), dtype=np.bool_)
    room = capacity
    for i in np.lexsort((np.arange(len(weights)), -ratio)).tolist():
        if weights[i] <= room:
            chosen[i] = True
            room -= int(weights[i])
    return chosen


def ilp(
    weights: np.ndarray,
    values: np.ndarray,
    capacity: int,
    time_limit_s: float = DEFAULT_OPTIONS.ilp_time_limit_s,
) -> np.ndarray:
    """Exact up to solver tolerance: ``scipy.optimize.milp`` with ``mip_rel_gap=0``.

    The rounded solution is checked with integer arithmetic; if tolerance made it exceed the
    capacity, the lowest-ratio chosen items are dropped until it fits (and a warning logged).

    Raises:
        ImportError: when scipy is not installed.
        TimeoutError: when no optimum was proven within ``time_limit_s`` seconds
            (``SolverOptions.ilp_time_limit_s``): a non-optimal answer is never returned.
        RuntimeError: when the MILP solver fails otherwise.
    """
    try:
        from scipy.optimize import Bounds, LinearConstraint, milp
    except ImportError:
        raise ImportError("method='ilp' needs scipy: pip install 'lightning-ckpt[ilp]'") from None
    if len(weights) == 0:
        return np.zeros(0, dtype=np.bool_)
    result = milp(
        c=-values,
        constraints=[LinearConstraint(weights.astype(np.float64)[None, :], ub=float(capacity))],
        integrality=np.ones(len(weights)),
        bounds=Bounds(0, 1),
        options={"mip_rel_gap": 0.0, "time_limit": float(time_limit_s)},
    )
    if result.status == 1:  # the time (or iteration) limit: the incumbent may not be optimal
        raise TimeoutError(
            f"method='ilp' found no proven optimum within its time limit of {time_limit_s:g} s "
            "(SolverOptions.ilp_time_limit_s); use method='auto' (exact, O(W) memory) or raise the limit"
        )
    if not result.success:
        raise RuntimeError(f"scipy.optimize.milp failed: {result.message}")
    return _repair(weights, values, capacity, result.x > 0.5)


def _repair(weights: np.ndarray, values: np.ndarray, capacity: int, chosen: np.ndarray) -> np.ndarray:
    """Drop lowest-ratio chosen items until the integer weight fits."""
    excess = sum(weights[chosen].tolist()) - capacity
    if excess <= 0:
        return chosen
    log.warning("milp solution exceeds the capacity by %d after rounding; repairing", excess)
    with np.errstate(divide="ignore"):
        ratio = np.where(weights == 0, np.inf, values / weights)
    for i in np.lexsort((np.arange(len(weights)), ratio)).tolist():
        if excess <= 0:
            break
        if chosen[i] and weights[i] > 0:
            chosen[i] = False
            excess -= int(weights[i])
    return chosen
