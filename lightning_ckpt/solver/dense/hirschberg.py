"""Hirschberg's divide and conquer over value profiles: the optimal set in O(W) memory.

A segment (a contiguous range of items with a capacity) is either solved directly as a *leaf*
(one profile pass that records a decision bit per item and capacity, then a backtrack) when
its bit table is small, or *split*: the profiles of its left and right halves are computed
at the segment's capacity, ``c* = argmax_c left[c] + right[cap - c]`` (first maximum), and the
halves become segments with capacities ``c*`` and ``cap - c*``. The two shares sum to the
segment's capacity, so no capacity leaks (PyTorch's version gives away one unit per split).

Two things make it cheaper than the textbook version, without changing any number:

- **Balanced halves.** The split point is the item index that balances the cell updates of the
  two halves' passes (items are sorted by weight, so light halves are cheap), not the middle
  index. Two processes then finish a level together, and the total work drops too.
- **Checkpoints on the way.** A pass over items ``lo:hi`` also saves the profile of
  ``lo:mid'``, ``mid'`` being where that range will itself be split at the next level. There,
  the left half's profile is a copy (a profile computed at a larger capacity, truncated, is the
  same profile), and only the right half is computed.

Segments are processed level by level (an explicit work list: no recursion limit). All the
tasks of a level are independent: an executor (``runtime.pool``) runs them in this process or on
several (the *parallel halves*: the two passes of a split, and independent segments, at once).

Memory: one float64 arena of ``3 * (W + n)`` entries holds every profile and checkpoint (24
bytes per capacity unit with the default ``SolverOptions.checkpoint_share``; checkpoints that do
not fit are skipped); a leaf's bit table is at most ``SolverOptions.leaf_max_cells`` bits (512
KiB by default). Peak extra memory: 24 bytes per capacity unit + 512 KiB per process + O(n) (32
bytes per unit with the numpy fallback's temporary copy).

Example:
    >>> from lightning_ckpt.solver.runtime.pool import LocalExecutor
    >>> w, v = np.array([1, 1, 1]), np.array([1.0, 1.0, 1.0])
    >>> chosen, cells = solve_segments(w, v, 1, LocalExecutor(w, v, np.empty(arena_size(1, 3))))
    >>> chosen.tolist()
    [True, False, False]
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from lightning_ckpt.solver.dense.profile import best_split, cell_updates, profile, solve_leaf
from lightning_ckpt.solver.options import DEFAULT_OPTIONS, SolverOptions
from lightning_ckpt.solver.runtime.pool import Executor, RangeTask

__all__ = ["Task", "arena_size", "is_leaf", "solve_segments", "split_point"]


@dataclass(frozen=True)
class Task(RangeTask):
    """One unit of work on items ``lo:hi`` at ``capacity``, using ``arena[offset:]``.

    A profile task with ``save_at >= 0`` also saves the profile of items ``lo:save_at`` into
    ``arena[save_offset:save_offset + save_len]`` on the way (a checkpoint).
    """

    kind: str  # "profile" or "leaf"
    lo: int
    hi: int
    capacity: int
    offset: int
    save_at: int = -1
    save_offset: int = 0
    save_len: int = 0

    def run(
        self,
        weights: np.ndarray,
        values: np.ndarray,
        arena: np.ndarray,
        stop: np.ndarray | None = None,
        grouping: tuple[int, int, int] = DEFAULT_OPTIONS.grouping,
    ) -> np.ndarray | None:
        """Run in this process: fill the profile (returns None) or solve the leaf (returns its mask).

        ``grouping`` is ``SolverOptions.grouping``, for the profile kernel; ``stop`` a flag from
        ``interrupt.new_stop_flag`` (``SolveStopped`` is raised once it is set).
        """
        out = arena[self.offset : self.offset + self.capacity + 1]
        items = slice(self.lo, self.hi)
        if self.kind == "leaf":
            return solve_leaf(weights[items], values[items], self.capacity, out, stop)
        saved, save_at = None, None
        if self.save_at >= 0:
            saved = arena[self.save_offset : self.save_offset + self.save_len]
            save_at = self.save_at - self.lo
        profile(
            weights[items],
            values[items],
            self.capacity,
            out,
            save_at=save_at,
            saved=saved,
            grouping=grouping,
            stop=stop,
        )
        return None


class Segment(NamedTuple):
    """Items ``lo:hi`` sharing ``capacity``; profiles go to ``arena[offset:]``. A *warm* segment
    (``saved_len > 0``) splits at ``mid``, its left half's profile saved at ``saved_offset``."""

    lo: int
    hi: int
    capacity: int
    offset: int
    mid: int = -1
    saved_offset: int = 0
    saved_len: int = 0


def arena_size(capacity: int, n_items: int, options: SolverOptions = DEFAULT_OPTIONS) -> int:
    """Float64 entries the arena needs: profiles, then checkpoints.

    A segment of ``n`` items at capacity ``c`` owns ``2 * (c + n)`` entries (room for its two
    profiles of ``c + 1``); its halves own ``2 * (c* + n_left)`` and ``2 * (c - c* + n_right)``,
    which exactly tile the parent's region, so regions of one level never overlap. The last
    ``options.checkpoint_share * (capacity + n_items)`` entries hold one level's checkpoints.

    Example:
        >>> arena_size(100, 10), arena_size(100, 10, SolverOptions(checkpoint_share=0.0))
        (330, 220)
    """
    return 2 * (capacity + n_items) + int(options.checkpoint_share * (capacity + n_items))


def split_point(weights: np.ndarray, lo: int, hi: int, capacity: int) -> int:
    """The index ``mid`` in ``lo + 1 .. hi - 1`` that best balances the cell updates of the
    passes over ``lo:mid`` and ``mid:hi`` (the smallest such index on ties).

    Example:
        >>> split_point(np.array([1, 1, 1, 1, 8, 8]), 0, 6, 100)  # 10 cells each side; middle: 3
        4
    """
    a, b = lo + 1, hi - 1
    while a < b:  # the first mid whose left pass costs at least its right pass
        m = (a + b) // 2
        if cell_updates(weights[lo:m], capacity) < cell_updates(weights[m:hi], capacity):
            a = m + 1
        else:
            b = m
    costs = {
        m: max(cell_updates(weights[lo:m], capacity), cell_updates(weights[m:hi], capacity))
        for m in (a - 1, a)
        if lo < m < hi
    }
    return min(costs, key=lambda m: (costs[m], m))


def is_leaf(n_items: int, capacity: int, leaf_max_cells: int) -> bool:
    """The rule depends only on the segment (never on ``workers``), so every run splits the
    instance the same way and returns the same set."""
    return n_items * (capacity + 1) <= leaf_max_cells


def _plan_level(
    segments: list[Segment], weights, prefix, chosen, leaf_max_cells: int
) -> tuple[list[Task], list[Segment]]:
    """Turn a level's segments into tasks; settle trivial segments in ``chosen``. Returns the
    tasks and the segments that split (with their ``mid``)."""
    tasks, splits = [], []
    for seg in segments:
        lo, hi, cap, offset = seg.lo, seg.hi, seg.capacity, seg.offset
        if hi - lo == 0 or cap == 0:
            continue
        if prefix[hi] - prefix[lo] <= cap:
            chosen[lo:hi] = True
        elif hi - lo == 1:  # a single item heavier than the capacity
            continue
        elif is_leaf(hi - lo, cap, leaf_max_cells):
            tasks.append(Task("leaf", lo, hi, cap, offset))
        else:
            mid = seg.mid if seg.saved_len else split_point(weights, lo, hi, cap)
            if not seg.saved_len:
                tasks.append(Task("profile", lo, mid, cap, offset))
            tasks.append(Task("profile", mid, hi, cap, offset + cap + 1))
            splits.append(seg._replace(mid=mid))
    return tasks, splits


def _with_checkpoints(
    tasks: list[Task], weights, prefix, start: int, room: int, leaf_max_cells: int
) -> list[Task]:
    """Let profile passes save the left half of their range's next split, most cells saved
    first, while the checkpoints fit in ``arena[start:start + room]``."""
    offers = []
    for index, task in enumerate(tasks):
        lo, hi, cap = task.lo, task.hi, task.capacity
        # worth it only if the range can still split at the next level (capacity <= cap)
        reachable = min(cap, prefix[hi] - prefix[lo] - 1)
        if task.kind != "profile" or hi - lo < 2 or is_leaf(hi - lo, reachable, leaf_max_cells):
            continue
        mid = split_point(weights, lo, hi, cap)
        offers.append(
            (-cell_updates(weights[lo:mid], cap), index, mid, min(cap, prefix[mid] - prefix[lo]) + 1)
        )
    tasks = list(tasks)
    for _, index, mid, length in sorted(offers):
        if length <= room:
            tasks[index] = dataclasses.replace(tasks[index], save_at=mid, save_offset=start, save_len=length)
            start, room = start + length, room - length
    return tasks


def _children(seg: Segment, split: int, saved: dict) -> tuple[Segment, Segment]:
    """The two halves of a split segment, warm where their pass saved a checkpoint."""
    lo, mid, hi, cap, offset = seg.lo, seg.mid, seg.hi, seg.capacity, seg.offset
    left = Segment(lo, mid, split, offset, *saved.get((lo, mid), (-1, 0, 0)))
    right = Segment(mid, hi, cap - split, offset + 2 * (split + mid - lo), *saved.get((mid, hi), (-1, 0, 0)))
    return left, right


def _restore(arena: np.ndarray, seg: Segment) -> None:
    """Copy a warm segment's saved left-half profile into place (flat beyond the saved part)."""
    out = arena[seg.offset : seg.offset + seg.capacity + 1]
    used = min(len(out), seg.saved_len)
    out[:used] = arena[seg.saved_offset : seg.saved_offset + used]
    out[used:] = out[used - 1]


def solve_segments(
    weights: np.ndarray,
    values: np.ndarray,
    capacity: int,
    executor: Executor,
    options: SolverOptions = DEFAULT_OPTIONS,
) -> tuple[np.ndarray, int]:
    """Solve the instance exactly with Hirschberg splits; items must have weights > 0.

    Args:
        weights: int64 weights, all > 0.
        values: float64 values >= 0.
        capacity: The capacity.
        executor: Runs each level's tasks (in this process, or on worker processes); its
            arena has ``arena_size(capacity, len(weights), options)`` entries.
        options: ``leaf_max_cells`` and ``checkpoint_share`` are read here.

    Returns:
        ``(chosen mask, DP cell updates performed)``.
    """
    prefix = list(itertools.accumulate(weights.tolist(), initial=0))
    start = 2 * (capacity + len(weights))
    room = arena_size(capacity, len(weights), options) - start
    chosen = np.zeros(len(weights), dtype=np.bool_)
    segments, cells = [Segment(0, len(weights), capacity, 0)], 0
    while segments:
        tasks, splits = _plan_level(segments, weights, prefix, chosen, options.leaf_max_cells)
        for seg in splits:
            if seg.saved_len:
                _restore(executor.arena, seg)
        tasks = _with_checkpoints(tasks, weights, prefix, start, room, options.leaf_max_cells)
        for task, mask in zip(tasks, executor.run(tasks), strict=True):
            cells += cell_updates(weights[task.lo : task.hi], task.capacity)
            if mask is not None:
                chosen[task.lo : task.hi] = mask
        saved = {(t.lo, t.hi): (t.save_at, t.save_offset, t.save_len) for t in tasks if t.save_at >= 0}
        segments = []
        for seg in splits:
            arena, cap, offset = executor.arena, seg.capacity, seg.offset
            split = best_split(arena[offset:], arena[offset + cap + 1 :], cap)
            segments.extend(_children(seg, split, saved))
    return chosen, cells
