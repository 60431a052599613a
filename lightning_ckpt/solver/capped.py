"""Exact knapsack with prefix capacities in O(W) memory: Hirschberg over capped value profiles.

Item ``j`` may be chosen only while the chosen items before it weigh at most ``take[j]``; when it is
not chosen they must weigh at most ``skip[j]``; all chosen items at most the capacity W. (A plan's
peak constraints have this form when the backward frees modules in reverse forward order.)

A *segment* is items ``lo:hi`` when the chosen items before ``lo`` weigh at most ``P`` and those
through ``hi - 1`` at most ``E``: a capped knapsack of capacity ``C = E - P`` whose caps are the
items' caps less ``P``. A large segment splits at ``mid``: the forward profile ``F`` of ``lo:mid``
and the backward profile ``B`` of ``mid:hi`` (``capped_profile``), both over ``0..C``, give
``x* = argmax_x F[x] + B[x]`` (first maximum); the halves become ``(lo, mid, P, P + x*)`` and
``(mid, hi, P + x*, E)``. The left half may end lighter than ``x*``; the right half's caps only
loosen then, so the pair stays feasible and optimal. The halves' capacities sum to C (no unit
leaks), and their profiles are independent: ``workers`` computes them in parallel, with the same
split rule for any ``workers`` (the same answer).

Before that: caps are clipped to W, weights, caps and W are divided (floor) by the weights' common
divisor, and (for ``method="auto"``) a sparse frontier DP (``frontier``) solves instances whose Pareto
frontiers stay small.

Example:
    >>> w, v = np.array([3, 3, 3]), np.array([1.5, 2.0, 3.0])
    >>> mask, _, _, _ = solve_capped(w, v, 6, np.array([6, 6, 0]), np.array([6, 6, 6]), 1)
    >>> mask.tolist()  # item 2 only with nothing before it: items 0 and 1 (3.5) beat it alone
    [True, True, False]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from lightning_ckpt.solver import capped_profile, hirschberg, parallel, workers
from lightning_ckpt.solver.fits import check_fits
from lightning_ckpt.solver.frontier import solve_sparse
from lightning_ckpt.solver.options import DEFAULT_OPTIONS, SolverOptions
from lightning_ckpt.solver.value_profile import new_stop_flag, raise_if_stopped

__all__ = ["CappedTask", "cap_violation", "solve_capped"]

SPARSE_MAX_ENTRIES = 1 << 22
"""The sparse path gives up past this many frontier entries (all passes together; its history holds
at most ~32 MB). With its bounds it stays far below on plan-like instances: 0.24M entries for 2000
heterogeneous items at W = 1.4e8, 0.9M for 500 profiled blocks of mixed widths."""


@dataclass(frozen=True)
class CappedTask:
    """A forward or backward profile of items ``lo:hi`` over ``0..capacity``, or a leaf to solve,
    in ``arena[offset:offset + capacity + 1]``; ``take`` and ``skip`` are the items' caps there."""

    kind: str  # "forward", "backward" or "leaf"
    lo: int
    hi: int
    capacity: int
    offset: int
    take: np.ndarray
    skip: np.ndarray

    @property
    def cells(self) -> int:
        """DP cells the task updates (for scheduling)."""
        return (self.hi - self.lo) * (self.capacity + 1)

    def run(
        self, weights: np.ndarray, values: np.ndarray, arena: np.ndarray, stop: np.ndarray | None = None
    ) -> np.ndarray | None:
        """Fill the profile (returns None) or solve the leaf (returns its mask), in this process;
        ``stop`` (``value_profile.new_stop_flag``) is checked before every item (``SolveStopped``)."""
        out = arena[self.offset : self.offset + self.capacity + 1]
        items = (weights[self.lo : self.hi], values[self.lo : self.hi], self.take, self.skip)
        if self.kind == "leaf":
            mask = capped_profile.solve_leaf(*items, out, stop)
        else:
            out[:] = 0.0
            (capped_profile.forward if self.kind == "forward" else capped_profile.backward)(*items, out, stop)
            mask = None
        if stop is not None:
            raise_if_stopped(stop)
        return mask


class _Segment(NamedTuple):
    lo: int
    hi: int
    before: int  # P: the chosen items before ``lo`` weigh at most this
    through: int  # E: those through ``hi - 1`` at most this
    offset: int


def cap_violation(
    weights: np.ndarray, chosen: np.ndarray, capacity: int, take: np.ndarray, skip: np.ndarray
) -> str | None:
    """What the chosen mask breaks (a sentence), or None when it meets every cap.

    Example:
        >>> cap_violation(np.array([2, 2]), np.array([True, True]), 4, np.array([4, 1]), np.array([4, 4]))
        'item 1 chosen after 2 of chosen weight, over its cap 1'
    """
    before = 0
    for j, (w, keep) in enumerate(zip(weights.tolist(), chosen.tolist(), strict=True)):
        cap = int(take[j] if keep else skip[j])
        if before > cap:
            return f"item {j} {'chosen' if keep else 'left out'} after {before} of chosen weight, over its cap {cap}"
        before += w if keep else 0
    return None if before <= capacity else f"chosen weight {before} over the capacity {capacity}"


def solve_capped(
    weights: np.ndarray,
    values: np.ndarray,
    capacity: int,
    take: np.ndarray,
    skip: np.ndarray,
    count: int,
    options: SolverOptions = DEFAULT_OPTIONS,
    *,
    sparse_first: bool = True,
    dense: bool = True,
    stop: np.ndarray | None = None,
) -> tuple[np.ndarray, int, int, int] | None:
    """Solve exactly; caps >= 0. Returns ``(chosen mask, DP cells or frontier entries, processes,
    capacity after dividing by the weights' common divisor)``.

    ``count`` processes (this one included) compute the dense path's profiles; ``sparse_first``
    tries the frontier DP before the dense one (it counts frontier entries as cells); without
    ``dense``, None when the frontier gives up; ``stop`` (a flag from
    ``value_profile.new_stop_flag``) is checked between tasks.
    """
    stop = new_stop_flag() if stop is None else stop
    divisor = math.gcd(*weights.tolist()) or 1  # chosen weights are multiples: floor every bound
    weights, capacity = weights // divisor, capacity // divisor
    take = np.minimum(take // divisor, capacity)
    skip = np.minimum(skip // divisor, capacity)
    sparse = solve_sparse(weights, values, capacity, take, skip, SPARSE_MAX_ENTRIES) if sparse_first else None
    if sparse is not None or not dense:
        return None if sparse is None else (*sparse, 1, capacity)
    raise_if_stopped(stop)
    floats = 2 * (capacity + len(weights))
    advice = "lower the capacity (a coarser weight unit, such as a larger `quantum_bytes`) or free memory"
    check_fits(8 * floats, None, f"the capped O(W) solver's profiles (capacity {capacity})", advice)
    if count > 1 and len(weights) * (capacity + 1) >= options.parallel_min_solve_cells:
        arena = parallel.shared_arena(floats)
        if arena is not None:
            try:
                with (
                    workers.borrowed(count - 1) as pool,
                    parallel.PoolExecutor(weights, values, arena, pool, options, stop) as executor,
                ):
                    return (
                        *_solve_segments(weights, capacity, take, skip, executor, options),
                        count,
                        capacity,
                    )
            finally:
                arena.close()
    executor = hirschberg.LocalExecutor(weights, values, np.empty(floats), options, stop)
    return (*_solve_segments(weights, capacity, take, skip, executor, options), 1, capacity)


def _tasks(seg: _Segment, take: np.ndarray, skip: np.ndarray, leaf_max_cells: int) -> list[CappedTask]:
    """A leaf, or the two profiles of a split at the middle item."""
    lo, hi, cap = seg.lo, seg.hi, seg.through - seg.before
    caps = (take[lo:hi] - seg.before, skip[lo:hi] - seg.before)
    if hi - lo == 1 or (hi - lo) * (cap + 1) <= leaf_max_cells:
        return [CappedTask("leaf", lo, hi, cap, seg.offset, *caps)]
    mid = (lo + hi) // 2
    left = CappedTask("forward", lo, mid, cap, seg.offset, caps[0][: mid - lo], caps[1][: mid - lo])
    right = CappedTask(
        "backward", mid, hi, cap, seg.offset + cap + 1, caps[0][mid - lo :], caps[1][mid - lo :]
    )
    return [left, right]


def _children(seg: _Segment, arena: np.ndarray) -> tuple[_Segment, _Segment]:
    """Split ``seg`` where its halves' profiles (in the arena) sum highest."""
    cap, mid = seg.through - seg.before, (seg.lo + seg.hi) // 2
    total = arena[seg.offset : seg.offset + cap + 1] + arena[seg.offset + cap + 1 : seg.offset + 2 * cap + 2]
    split = int(np.argmax(total))
    left = _Segment(seg.lo, mid, seg.before, seg.before + split, seg.offset)
    right = _Segment(mid, seg.hi, seg.before + split, seg.through, seg.offset + 2 * (split + mid - seg.lo))
    return left, right


def _solve_segments(weights, capacity, take, skip, executor, options) -> tuple[np.ndarray, int]:
    """Level by level: run every segment's tasks, then split the segments that were not leaves."""
    chosen = np.zeros(len(weights), dtype=np.bool_)
    segments, cells = [_Segment(0, len(weights), 0, capacity, 0)], 0
    while segments:
        planned = [(seg, _tasks(seg, take, skip, options.leaf_max_cells)) for seg in segments]
        tasks = [task for _, seg_tasks in planned for task in seg_tasks]
        results = iter(executor.run(tasks))
        segments = []
        for seg, seg_tasks in planned:
            masks = [next(results) for _ in seg_tasks]
            cells += sum(task.cells for task in seg_tasks)
            if seg_tasks[0].kind == "leaf":
                chosen[seg.lo : seg.hi] = masks[0]
            else:
                segments.extend(_children(seg, executor.arena))
    return chosen, cells
