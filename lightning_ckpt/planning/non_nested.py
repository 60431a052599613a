"""The exact route when the peak points are not nested (parallel branches, skips, hand-made profiles).

The module-level instance is solved exactly: by enumerating every kept set in bytes (numpy, exact
integers: the optimum at the budget itself) up to ``ENUMERATE_MAX_ITEMS`` candidates, above that by
``scipy.optimize.milp`` with a zero gap on the points quantized (coefficients and either terms
rounded up, each point's room ``budget - base`` down, to whole quanta: a set that fits in quanta
fits in bytes, and at most one quantum per term is lost), its answer checked in integers.

Example:
    >>> from lightning_ckpt.planning.points import PeakPoint
    >>> points = (PeakPoint(10, np.array([4, 4])), PeakPoint(10, np.array([0, 6]), when=(0, False)))
    >>> solve_points(points, [1.0, 3.0], budget_bytes=16, quantum_bytes=1)
    (array([False,  True]), 'enumeration')
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightning_ckpt.planning.points import PeakPoint

__all__ = ["ENUMERATE_MAX_ITEMS", "QuantizedPoint", "quantize_points", "solve_points"]

ENUMERATE_MAX_ITEMS = 14


@dataclass(frozen=True, eq=False)
class QuantizedPoint:
    """A point in quanta: ``keep @ kept + either terms <= room`` when it applies."""

    keep: np.ndarray
    either: tuple[tuple[tuple[tuple[int, bool], ...], int], ...]
    room: int
    when: tuple[int, bool] | None


def _ceil_div(numerator, quantum: int):
    return -((-numerator) // quantum)


def quantize_points(
    points: tuple[PeakPoint, ...], budget_bytes: int, quantum_bytes: int
) -> list[QuantizedPoint]:
    """The points in quanta at the budget, duplicates merged (the tightest room kept)."""
    merged: dict[tuple, QuantizedPoint] = {}
    for point in points:
        keep = _ceil_div(point.keep_bytes.astype(np.int64), quantum_bytes)
        either = tuple(
            (literals, int(_ceil_div(nbytes, quantum_bytes))) for literals, nbytes in point.either_bytes
        )
        room = (int(budget_bytes) - int(point.base_bytes)) // quantum_bytes
        key = (keep.tobytes(), either, point.when)
        if key not in merged or merged[key].room > room:
            merged[key] = QuantizedPoint(keep, either, room, point.when)
    return list(merged.values())


def solve_points(
    points: tuple[PeakPoint, ...], values, budget_bytes: int, quantum_bytes: int
) -> tuple[np.ndarray, str]:
    """The kept mask of most value whose quantized points all fit, and how it was found.

    Raises:
        ValueError: when no kept set fits (not even keeping nothing).
        ImportError: above ``ENUMERATE_MAX_ITEMS`` candidates without scipy.
    """
    values = np.asarray(values, dtype=np.float64)
    if len(values) <= ENUMERATE_MAX_ITEMS:  # in bytes: exact at the budget, nothing lost to rounding
        return _enumerate(quantize_points(points, budget_bytes, 1), values), "enumeration"
    quantized = quantize_points(points, budget_bytes, quantum_bytes)
    kept = _milp(quantized, values)
    if not _fits(quantized, kept[None, :])[0]:
        raise RuntimeError("scipy.optimize.milp returned a plan over a quantized peak point (tolerance)")
    return kept, "milp"


def _fits(points: list[QuantizedPoint], masks: np.ndarray) -> np.ndarray:
    """Per kept mask (rows), whether every point that applies fits its room."""
    fits = np.ones(len(masks), dtype=np.bool_)
    as_int = masks.astype(np.int64)
    for point in points:
        total = as_int @ point.keep
        for literals, quanta in point.either:
            total += quanta * np.any([masks[:, m] == kept for m, kept in literals], axis=0)
        if point.when is None:
            fits &= total <= point.room
        else:
            fits &= (masks[:, point.when[0]] != point.when[1]) | (total <= point.room)
    return fits


def _enumerate(points: list[QuantizedPoint], values: np.ndarray) -> np.ndarray:
    n = len(values)
    masks = ((np.arange(2**n)[:, None] >> np.arange(n)) & 1).astype(np.bool_)
    fits = _fits(points, masks)
    if not fits.any():
        raise ValueError("no set of kept candidates fits the budget, not even checkpointing every one")
    totals = np.where(fits, masks @ values, -np.inf)
    return masks[int(np.argmax(totals))]


def _milp(points: list[QuantizedPoint], values: np.ndarray) -> np.ndarray:
    """x (kept) then z (one per either term's literal set): ``z >= each literal`` makes z their OR."""
    try:
        from scipy.optimize import Bounds, LinearConstraint, milp
    except ImportError:
        raise ImportError("planning a non-nested step above 14 candidates needs scipy") from None
    n = len(values)
    clauses = sorted({literals for point in points for literals, _ in point.either})
    column = {literals: n + k for k, literals in enumerate(clauses)}
    rows, upper = [], []
    for point in points:
        row = np.zeros(n + len(clauses))
        row[:n] = point.keep
        for literals, quanta in point.either:
            row[column[literals]] += quanta
        room = float(point.room)
        if point.when is not None:  # big M: the row binds only when the condition holds
            m, kept = point.when
            big = max(float(np.clip(row, 0, None).sum()) - room, 0.0)
            row[m] += big if kept else -big
            room += big if kept else 0.0
        rows.append(row)
        upper.append(room + 0.5)  # integer sums: <= room + 0.5 is <= room, safe from tolerance
    for literals in clauses:
        for m, kept in literals:  # z >= x_m, or z >= 1 - x_m
            row = np.zeros(n + len(clauses))
            row[column[literals]], row[m] = -1.0, 1.0 if kept else -1.0
            rows.append(row)
            upper.append(0.0 if kept else -1.0)
    result = milp(
        c=np.concatenate([-values, np.zeros(len(clauses))]),
        constraints=[LinearConstraint(np.array(rows), ub=np.array(upper))] if rows else [],
        integrality=np.ones(n + len(clauses)),
        bounds=Bounds(0, 1),
        options={"mip_rel_gap": 0.0},
    )
    if not result.success:
        raise RuntimeError(f"scipy.optimize.milp failed: {result.message}")
    return result.x[:n] > 0.5
