"""Where an engine's tasks run: this process alone, or worker processes sharing one arena.

Both dense engines (uncapped and capped Hirschberg) cut a solve into levels of independent tasks,
each a profile pass (or a small leaf) over a range of items in a slice of one float64 *arena*.
A task is any object with ``cells`` (its size, for scheduling; ``RangeTask``) and ``run(weights,
values, arena, stop=None, grouping=...)``. An executor runs a level's tasks and returns their results in order:

- ``LocalExecutor``: one after another in this process, in ordinary memory;
- ``PoolExecutor``: on ``N - 1`` worker processes (``workers.py``) plus this one, biggest first,
  the arena in shared memory, watched by a ``guard.WorkerGuard``: a worker that dies, stays
  stopped for a second or misses a task's deadline ends the solve at once with ``WorkerDied``
  saying which and why. Tasks smaller than ``SolverOptions.parallel_min_task_cells`` stay in the
  calling process. Results do not depend on which process ran a task (same kernel, same
  arithmetic).

Both engines ask ``cpus.processes_for`` before ``solve_on_workers``: where the solve is small or the
CPUs are busy, a second process only costs or competes, so the solve runs in one process (its
caller's ``LocalExecutor``).

The shared arena is a ``memfd`` (``os.memfd_create``): anonymous shared memory with no name in
``/dev/shm``, handed to each worker as a file descriptor and freed by the kernel when the last
process holding it exits, however it exits (SIGKILL included). Its pages are reserved up front
(``posix_fallocate``), so a machine without room refuses at once (the solve then runs in one
process, with one warning) instead of dying of SIGBUS when a page is first touched. Tasks carry
only item ranges, capacities, offsets and caps, never W-sized arrays; the options travel to the
workers with each solve (for the kernel's grouping).

Example:
    >>> class Double:
    ...     cells = 1
    ...     def run(self, weights, values, arena, stop=None, grouping=None):
    ...         return 2 * weights
    >>> LocalExecutor(np.arange(3), np.ones(3), np.empty(0)).run([Double()])[0].tolist()
    [0, 2, 4]
"""

from __future__ import annotations

import mmap
import os
import select
import warnings
from collections import deque
from collections.abc import Callable
from typing import Protocol, TypeVar

import numpy as np

from lightning_ckpt.solver.options import DEFAULT_OPTIONS, SolverOptions
from lightning_ckpt.solver.runtime import workers
from lightning_ckpt.solver.runtime.guard import WorkerGuard
from lightning_ckpt.solver.runtime.interrupt import SolveStopped, raise_if_stopped

__all__ = [
    "Executor",
    "LocalExecutor",
    "PoolExecutor",
    "RangeTask",
    "SharedArena",
    "shared_arena",
    "solve_on_workers",
]

_POLL_S = 0.05  # seconds between checks of the stop flag while waiting for workers

T = TypeVar("T")


class RangeTask:
    """What a task over items ``lo:hi`` at ``capacity`` shares (mixed into each engine's task class):
    its size, for scheduling. The engine's class adds ``run(weights, values, arena, stop=None,
    grouping=...)``."""

    lo: int
    hi: int
    capacity: int

    @property
    def cells(self) -> int:
        """DP cells one pass over the range updates at most (for scheduling)."""
        return (self.hi - self.lo) * (self.capacity + 1)


class Executor(Protocol):
    arena: np.ndarray

    def run(self, tasks: list) -> list[np.ndarray | None]: ...


class SharedArena:
    """A float64 array in anonymous shared memory (a memfd), its pages reserved at creation.

    Raises:
        OSError: where the memory cannot be reserved (no room) or memfd is missing.
    """

    def __init__(self, n_floats: int) -> None:
        size = max(8 * n_floats, 8)
        self.fd = os.memfd_create("lightning-ckpt-arena", os.MFD_CLOEXEC)
        try:
            os.posix_fallocate(self.fd, 0, size)  # every page now: no SIGBUS on first touch
            self.mapping = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise
        self.n_floats = n_floats
        self.array = np.frombuffer(self.mapping, dtype=np.float64, count=n_floats)

    def close(self) -> None:
        """Unmap and free the block (once the last view of it is gone, if views remain)."""
        del self.array
        try:
            self.mapping.close()
        except BufferError:  # a view still lives (say in a traceback): unmapped when it dies
            pass
        os.close(self.fd)


def shared_arena(n_floats: int) -> SharedArena | None:
    """A ``SharedArena``, or None with one warning where there is no room for it."""
    try:
        return SharedArena(n_floats)
    except (OSError, AttributeError) as exc:  # AttributeError: no os.memfd_create on this OS
        reason = getattr(exc, "strerror", None) or "memfd is not available on this system"
        warnings.warn(
            f"cannot reserve {8 * n_floats / 2**30:.3g} GiB of shared memory for the knapsack solver's "
            f"workers ({reason}); solving in one process in ordinary memory instead",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


class LocalExecutor:
    """Runs tasks one after another in this process (with ``options.grouping``; ``stop``: a flag
    from ``interrupt.new_stop_flag``, or None)."""

    def __init__(
        self,
        weights: np.ndarray,
        values: np.ndarray,
        arena: np.ndarray,
        options: SolverOptions = DEFAULT_OPTIONS,
        stop: np.ndarray | None = None,
    ) -> None:
        self.weights, self.values, self.arena = weights, values, arena
        self.grouping, self.stop = options.grouping, stop

    def run(self, tasks: list) -> list[np.ndarray | None]:
        return [t.run(self.weights, self.values, self.arena, self.stop, self.grouping) for t in tasks]


class PoolExecutor:
    """Runs a level's tasks on worker processes plus this one, biggest first.

    Use as a context manager: it attaches the workers to the shared arena (and hands them the
    items and ``options``) on entry, and detaches them on a clean exit (after a failure the
    pool kills them anyway). Tasks below ``options.parallel_min_task_cells`` cells run in this
    process, polling ``stop`` (a flag from ``interrupt.new_stop_flag``).
    """

    def __init__(
        self,
        weights: np.ndarray,
        values: np.ndarray,
        arena: SharedArena,
        pool: list,
        options: SolverOptions,
        stop: np.ndarray,
    ) -> None:
        self.weights, self.values, self.options, self.stop = weights, values, options, stop
        self._shared, self.arena, self._workers = arena, arena.array, pool
        self.min_cells, self.grouping = options.parallel_min_task_cells, options.grouping

    def __enter__(self) -> PoolExecutor:
        raise_if_stopped(self.stop)
        self._guard = WorkerGuard(self._workers, self.stop)
        try:
            attach = ("attach", self._shared.n_floats, self.weights, self.values, self.options)
            for worker in self._workers:
                self._guard.expect(worker, 0)
                worker.send(attach, fd=self._shared.fd)
            for worker in self._workers:
                worker.receive()
                self._guard.answered(worker)
        except BaseException:
            self._guard.close()
            raise
        return self

    def __exit__(self, exc_type, *_exc_info) -> None:
        del self.arena  # the arena's owner closes it next
        try:
            if exc_type is None:
                for worker in self._workers:
                    self._guard.expect(worker, 0)
                    worker.call(("detach",))
                    self._guard.answered(worker)
        finally:
            self._guard.close()

    def _raise_if_stopped(self) -> None:
        """``WorkerDied`` once the guard has given a worker up (it also set the stop flag), else
        ``SolveStopped`` once the stop flag is set."""
        if self._guard.fault is not None:
            raise self._guard.fault.died()
        raise_if_stopped(self.stop)

    def run(self, tasks: list) -> list[np.ndarray | None]:
        try:
            return self._run(tasks)
        except SolveStopped:
            self._raise_if_stopped()  # a worker's fault stopped this process's kernel: say why
            raise

    def _run(self, tasks: list) -> list[np.ndarray | None]:
        order = sorted(range(len(tasks)), key=lambda i: -tasks[i].cells)
        pending = deque(i for i in order if tasks[i].cells >= self.min_cells)
        local = [i for i in order if tasks[i].cells < self.min_cells]
        results: list[np.ndarray | None] = [None] * len(tasks)
        idle, busy = list(self._workers), {}
        while pending or local or busy:
            self._raise_if_stopped()
            while idle and pending:
                worker, index = idle.pop(), pending.popleft()
                self._guard.expect(worker, tasks[index].cells)
                worker.send(("task", tasks[index]))
                busy[worker.proc.stdout.fileno()] = (worker, index)
            if pending or local:
                index = local.pop(0) if local else pending.popleft()
                results[index] = tasks[index].run(
                    self.weights, self.values, self.arena, self.stop, self.grouping
                )
            for fd in _ready(busy, block=not (pending or local)):
                worker, index = busy.pop(fd)
                results[index] = worker.receive()
                self._guard.answered(worker)
                idle.append(worker)
        return results


def _ready(busy: dict, block: bool) -> list[int]:
    if not busy:
        return []
    ready, _, _ = select.select(list(busy), [], [], _POLL_S if block else 0)
    return ready


def solve_on_workers(
    weights: np.ndarray,
    values: np.ndarray,
    n_floats: int,
    count: int,
    options: SolverOptions,
    stop: np.ndarray,
    solve: Callable[[PoolExecutor], T],
) -> T | None:
    """``solve(executor)`` on ``count`` processes (this one included) sharing an arena of ``n_floats``
    entries; None, with one warning, where the shared arena has no room. The caller has decided
    ``count`` (``cpus.processes_for``: the solve's size and the idle CPUs)."""
    arena = shared_arena(n_floats)
    if arena is None:
        return None
    try:
        with (
            workers.borrowed(count - 1) as pool,
            PoolExecutor(weights, values, arena, pool, options, stop) as executor,
        ):
            return solve(executor)
    finally:
        arena.close()
