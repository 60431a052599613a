"""The dense capped engine: Hirschberg over capped value profiles, exact in O(W) memory.

A *segment* is items ``lo:hi`` when the chosen items before ``lo`` weigh at most ``P`` and those
through ``hi - 1`` at most ``E``: a capped knapsack of capacity ``C = E - P`` whose caps are the
items' caps less ``P``. A large segment splits at ``mid``: the forward profile ``F`` of ``lo:mid``
and the backward profile ``B`` of ``mid:hi`` (``profile.py``), both over ``0..C``, give
``x* = argmax_x F[x] + B[x]`` (first maximum); the halves become ``(lo, mid, P, P + x*)`` and
``(mid, hi, P + x*, E)``. The left half may end lighter than ``x*``; the right half's caps only
loosen then, so the pair stays feasible and optimal. The halves' capacities sum to C (no unit
leaks), and their profiles are independent: ``workers`` computes them in parallel (``runtime.pool``),
with the same split rule for any ``workers`` (the same answer). A segment of at most
``SolverOptions.leaf_max_cells`` cells (or one item) is a *leaf*: a forward pass recording a decision
bit per item and capacity, then a backtrack.

When it runs: for ``method="hirschberg"`` with prefix capacities, always; for ``"auto"``, only when the
sparse frontier (``frontier.py``) gives up past ``solve.SPARSE_MAX_ENTRIES`` (4,194,304) entries. It is
the guarantee that a capped solve needs O(W) memory (two profiles of ``C + 1`` floats, 16 bytes per
capacity unit) however large the frontier would grow. Measured on 2026-12-01 (``python -m
benchmarks.bench.frontier_sizes``, 2-core VM, shared): no plan reached it. Over 38 capped solves (the
offline planner on every config in ``configs/`` at five budgets from the minimum to the unchecked
peak; the ``benchmarks.bench.fresh`` instances at n = 200 to 2000, among them the profiled mixed-width
stacks of ``benchmarks.bench.plan_instance`` at three budgets) the largest frontier held 234,042
entries (synthetic family P, n = 2000; 5.6% of the handover), the largest of a profiled plan 62,118
(1,000 blocks; 1.5%), of a config 1,218 (GPT-2 XL, 48 blocks). It stays for the memory guarantee.

Example:
    >>> from lightning_ckpt.solver.capped.groups import from_items
    >>> w, v = np.array([1, 1, 1]), np.array([1.5, 2.0, 3.0])
    >>> groups = from_items(w, v, np.array([2, 2, 0]), np.array([2, 2, 2]))
    >>> choice, cells, used = solve_dense(groups, 2, 1)
    >>> choice.tolist()  # item 2 only with nothing before it: items 0 and 1 (3.5) beat it alone
    [1, 1, 0]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from lightning_ckpt.solver.capped import profile
from lightning_ckpt.solver.capped.groups import Groups
from lightning_ckpt.solver.fits import check_fits
from lightning_ckpt.solver.options import DEFAULT_OPTIONS, SolverOptions
from lightning_ckpt.solver.runtime import cpus, pool
from lightning_ckpt.solver.runtime.interrupt import new_stop_flag, raise_if_stopped
from lightning_ckpt.solver.runtime.pool import RangeTask

__all__ = ["CappedTask", "solve_dense"]


@dataclass(frozen=True)
class CappedTask(RangeTask):
    """A forward or backward profile of groups ``lo:hi`` over ``0..capacity``, or a leaf to solve,
    in ``arena[offset:offset + capacity + 1]``; ``starts`` are the groups' option starts in the flat
    option arrays (``hi - lo + 1`` of them), ``caps`` their options' caps there, and ``binary`` says
    every group is a 0/1 item (the 0/1 kernels run)."""

    kind: str  # "forward", "backward" or "leaf"
    lo: int
    hi: int
    capacity: int
    offset: int
    starts: np.ndarray
    caps: np.ndarray
    binary: bool

    def run(
        self,
        weights: np.ndarray,
        values: np.ndarray,
        arena: np.ndarray,
        stop: np.ndarray | None = None,
        grouping: tuple[int, int, int] | None = None,
    ) -> np.ndarray | None:
        """Fill the profile (returns None) or solve the leaf (returns its choice), in this process;
        ``weights`` and ``values`` are the flat option arrays; ``stop`` (``interrupt.new_stop_flag``)
        is checked before every group (``SolveStopped``). ``grouping`` (the uncapped kernel's) is
        not used."""
        out = arena[self.offset : self.offset + self.capacity + 1]
        first, end = int(self.starts[0]), int(self.starts[-1])
        groups = Groups(weights[first:end], values[first:end], self.caps, self.starts - first, self.binary)
        if self.kind == "leaf":
            choice = profile.solve_leaf_groups(groups, out, stop)
        else:
            out[:] = 0.0
            (profile.forward_groups if self.kind == "forward" else profile.backward_groups)(groups, out, stop)
            choice = None
        if stop is not None:
            raise_if_stopped(stop)
        return choice


class _Segment(NamedTuple):
    lo: int
    hi: int
    before: int  # P: the chosen items before ``lo`` weigh at most this
    through: int  # E: those through ``hi - 1`` at most this
    offset: int


def solve_dense(
    groups: Groups,
    capacity: int,
    count: int,
    options: SolverOptions = DEFAULT_OPTIONS,
    stop: np.ndarray | None = None,
) -> tuple[np.ndarray, int, int]:
    """The best choice of a feasible capped instance (caps clipped to ``capacity``): ``(option index
    per group, DP cells, processes)``. ``count`` processes (this one included) compute the profiles when
    ``runtime.cpus.processes_for`` says so (at least ``options.parallel_min_solve_cells`` cells, and
    idle CPUs); ``stop`` is checked before every item.

    Raises:
        MemoryError: when the two profiles do not fit in the available memory.
    """
    stop = new_stop_flag() if stop is None else stop
    weights, values = groups.weights, groups.values
    floats = 2 * (capacity + groups.count)
    advice = "lower the capacity (a coarser weight unit, such as a larger `quantum_bytes`) or free memory"
    needed = 8 * floats + 16 * (capacity + 1)  # + the numpy forward pass's two W-sized temporaries
    check_fits(needed, None, f"the capped O(W) solver's profiles (capacity {capacity})", advice)
    solve = lambda executor: _solve_segments(groups, capacity, executor, options)  # noqa: E731
    count = cpus.processes_for(count, groups.work_items * (capacity + 1), options.parallel_min_solve_cells)
    if count > 1:
        shared = pool.solve_on_workers(weights, values, floats, count, options, stop, solve)
        if shared is not None:
            return *shared, count
    return *solve(pool.LocalExecutor(weights, values, np.empty(floats), options, stop)), 1


def _tasks(seg: _Segment, groups: Groups, leaf_max_cells: int) -> list[CappedTask]:
    """A leaf, or the two profiles of a split at the middle group."""
    lo, hi, cap = seg.lo, seg.hi, seg.through - seg.before
    starts, binary = groups.starts, groups.binary
    caps = groups.caps[starts[lo] : starts[hi]] - seg.before
    if hi - lo == 1 or (hi - lo) * (cap + 1) <= leaf_max_cells:
        return [CappedTask("leaf", lo, hi, cap, seg.offset, starts[lo : hi + 1], caps, binary)]
    mid = (lo + hi) // 2
    cut = int(starts[mid] - starts[lo])
    left = CappedTask("forward", lo, mid, cap, seg.offset, starts[lo : mid + 1], caps[:cut], binary)
    right_offset = seg.offset + cap + 1
    right = CappedTask("backward", mid, hi, cap, right_offset, starts[mid : hi + 1], caps[cut:], binary)
    return [left, right]


def _children(seg: _Segment, arena: np.ndarray) -> tuple[_Segment, _Segment]:
    """Split ``seg`` where its halves' profiles (in the arena) sum highest."""
    cap, mid = seg.through - seg.before, (seg.lo + seg.hi) // 2
    total = arena[seg.offset : seg.offset + cap + 1] + arena[seg.offset + cap + 1 : seg.offset + 2 * cap + 2]
    split = int(np.argmax(total))
    left = _Segment(seg.lo, mid, seg.before, seg.before + split, seg.offset)
    right = _Segment(mid, seg.hi, seg.before + split, seg.through, seg.offset + 2 * (split + mid - seg.lo))
    return left, right


def _solve_segments(groups: Groups, capacity: int, executor, options) -> tuple[np.ndarray, int]:
    """Level by level: run every segment's tasks, then split the segments that were not leaves."""
    choice = np.zeros(groups.count, dtype=np.int64)
    segments, cells = [_Segment(0, groups.count, 0, capacity, 0)], 0
    while segments:
        planned = [(seg, _tasks(seg, groups, options.leaf_max_cells)) for seg in segments]
        tasks = [task for _, seg_tasks in planned for task in seg_tasks]
        results = iter(executor.run(tasks))
        segments = []
        for seg, seg_tasks in planned:
            picks = [next(results) for _ in seg_tasks]
            cells += sum(task.cells for task in seg_tasks)
            if seg_tasks[0].kind == "leaf":
                choice[seg.lo : seg.hi] = picks[0]
            else:
                segments.extend(_children(seg, executor.arena))
    return choice, cells
