"""Hirschberg's divide and conquer over value profiles: the optimal set in O(W) memory.

A segment (a contiguous range of items with a capacity) is either solved directly as a *leaf*
(one profile pass that records a decision bit per item and capacity, then a backtrack) when
its bit table is small, or *split*: the profiles of its left and right halves are computed
at the segment's capacity, ``c* = argmax_c left[c] + right[cap - c]`` (first maximum), and the
halves become segments with capacities ``c*`` and ``cap - c*``. The two shares sum to the
segment's capacity, so no capacity leaks (PyTorch's version gives away one unit per split).

Segments are processed level by level (an explicit work list: no recursion limit). All the
tasks of a level are independent, which is what ``parallel.py`` runs on several processes.

Memory: one float64 arena of ``2 * (W + n)`` entries holds every profile (16 bytes per
capacity unit); a leaf's bit table is at most ``LEAF_MAX_CELLS`` bits (512 KiB). Peak extra
memory: 16 bytes per capacity unit + 512 KiB per process + O(n) (24 bytes per unit with the
numpy fallback's temporaries), within the 32 bytes per unit budget.

Example:
    >>> w, v = np.array([1, 1, 1]), np.array([1.0, 1.0, 1.0])
    >>> chosen, cells = solve_segments(w, v, 1, LocalExecutor(w, v, np.empty(arena_size(1, 3))))
    >>> chosen.tolist()
    [True, False, False]
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from lightning_ckpt.solver.profile import best_split, cell_updates, profile, solve_leaf

__all__ = ["Task", "LocalExecutor", "arena_size", "solve_segments", "run_task"]

# A segment is a leaf when its decision-bit table (items x capacities) has at most this many
# cells (512 KiB). Larger segments are split: the recording pass of a leaf is several times
# slower than the grouped profile kernel, so splitting down to small leaves is faster (measured).
LEAF_MAX_CELLS = 1 << 22


@dataclass(frozen=True)
class Task:
    """One unit of work on items ``lo:hi`` at ``capacity``, using ``arena[offset:]``."""

    kind: str  # "profile" or "leaf"
    lo: int
    hi: int
    capacity: int
    offset: int

    @property
    def cells(self) -> int:
        """Upper bound on DP cell updates (for scheduling)."""
        return (self.hi - self.lo) * (self.capacity + 1)


class Executor(Protocol):
    arena: np.ndarray

    def run(self, tasks: list[Task]) -> list[np.ndarray | None]: ...


def run_task(weights: np.ndarray, values: np.ndarray, arena: np.ndarray, task: Task) -> np.ndarray | None:
    """Run one task in this process: fill a profile (returns None) or solve a leaf (a mask)."""
    out = arena[task.offset : task.offset + task.capacity + 1]
    items = slice(task.lo, task.hi)
    if task.kind == "profile":
        profile(weights[items], values[items], task.capacity, out)
        return None
    return solve_leaf(weights[items], values[items], task.capacity, out)


class LocalExecutor:
    """Runs tasks one after another in this process."""

    def __init__(self, weights: np.ndarray, values: np.ndarray, arena: np.ndarray) -> None:
        self.weights, self.values, self.arena = weights, values, arena

    def run(self, tasks: list[Task]) -> list[np.ndarray | None]:
        return [run_task(self.weights, self.values, self.arena, task) for task in tasks]


def arena_size(capacity: int, n_items: int) -> int:
    """Float64 entries the arena needs.

    A segment of ``n`` items at capacity ``c`` owns ``2 * (c + n)`` entries (room for its two
    profiles of ``c + 1``); its halves own ``2 * (c* + n_left)`` and ``2 * (c - c* + n_right)``,
    which exactly tile the parent's region, so regions of one level never overlap.
    """
    return 2 * (capacity + n_items)


def _is_leaf(n_items: int, capacity: int) -> bool:
    """The rule depends only on the segment (never on ``workers``), so every run splits the
    instance the same way and returns the same set."""
    return n_items * (capacity + 1) <= LEAF_MAX_CELLS


def _plan_level(segments, prefix, chosen):
    """Turn a level's segments into tasks; settle trivial segments in ``chosen``."""
    tasks, splits = [], []
    for lo, hi, cap, offset in segments:
        if hi - lo == 0 or cap == 0:
            continue
        if prefix[hi] - prefix[lo] <= cap:
            chosen[lo:hi] = True
        elif hi - lo == 1:  # a single item heavier than the capacity
            continue
        elif _is_leaf(hi - lo, cap):
            tasks.append(Task("leaf", lo, hi, cap, offset))
        else:
            mid = (lo + hi) // 2
            tasks.append(Task("profile", lo, mid, cap, offset))
            tasks.append(Task("profile", mid, hi, cap, offset + cap + 1))
            splits.append((lo, mid, hi, cap, offset))
    return tasks, splits


def solve_segments(
    weights: np.ndarray,
    values: np.ndarray,
    capacity: int,
    executor: Executor,
) -> tuple[np.ndarray, int]:
    """Solve the instance exactly with Hirschberg splits; items must have weights > 0.

    Args:
        weights: int64 weights, all > 0.
        values: float64 values >= 0.
        capacity: The capacity.
        executor: Runs each level's tasks (in this process, or on worker processes).

    Returns:
        ``(chosen mask, DP cell updates performed)``.
    """
    prefix = list(itertools.accumulate(weights.tolist(), initial=0))
    chosen = np.zeros(len(weights), dtype=np.bool_)
    segments, cells = [(0, len(weights), capacity, 0)], 0
    while segments:
        tasks, splits = _plan_level(segments, prefix, chosen)
        for task, mask in zip(tasks, executor.run(tasks), strict=True):
            cells += cell_updates(weights[task.lo : task.hi], task.capacity)
            if mask is not None:
                chosen[task.lo : task.hi] = mask
        segments = []
        for lo, mid, hi, cap, offset in splits:
            arena = executor.arena
            split = best_split(arena[offset:], arena[offset + cap + 1 :], cap)
            segments.append((lo, mid, split, offset))
            segments.append((mid, hi, cap - split, offset + 2 * (split + mid - lo)))
    return chosen, cells
