"""Hirschberg tasks on worker processes sharing one anonymous-memory arena.

The arena (every W-sized profile) is a ``memfd`` (``os.memfd_create``): anonymous shared
memory with no name in ``/dev/shm``, handed to each worker as a file descriptor (see
``workers.py``) and freed by the kernel when the last process holding it exits, however it
exits (SIGKILL included). Its pages are reserved up front (``posix_fallocate``), so a machine
without room refuses at once (the solve then runs in one process, with one warning) instead of
dying of SIGBUS when a page is first touched. Tasks carry only item ranges, capacities and
offsets, never W-sized arrays.

With ``workers=N`` there are ``N - 1`` worker processes; the calling process is the N-th and
runs tasks too. Tasks smaller than ``SolverOptions.parallel_min_task_cells`` stay in the calling
process. The options travel to the workers with each solve (for the kernel's grouping).
Results do not depend on which process ran a task (same kernel, same arithmetic).
"""

from __future__ import annotations

import mmap
import os
import select
import warnings
from collections import deque

import numpy as np

from lightning_ckpt.solver import hirschberg, workers
from lightning_ckpt.solver.hirschberg import Task, run_task
from lightning_ckpt.solver.options import SolverOptions
from lightning_ckpt.solver.value_profile import raise_if_stopped

__all__ = ["SharedArena", "PoolExecutor", "shared_arena", "solve_on_workers"]

_POLL_S = 0.05  # seconds between checks of the stop flag while waiting for workers


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


class PoolExecutor:
    """Runs a level's tasks on worker processes plus this one, biggest first.

    Use as a context manager: it attaches the workers to the shared arena (and hands them the
    items and ``options``) on entry, and detaches them on a clean exit (after a failure the
    pool kills them anyway). Tasks below ``options.parallel_min_task_cells`` cells run in this
    process, polling ``stop`` (a flag from ``value_profile.new_stop_flag``).
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
        attach = ("attach", self._shared.n_floats, self.weights, self.values, self.options)
        for worker in self._workers:
            worker.send(attach, fd=self._shared.fd)
        for worker in self._workers:
            worker.receive()
        return self

    def __exit__(self, exc_type, *_exc_info) -> None:
        del self.arena  # the arena's owner closes it next
        if exc_type is None:
            for worker in self._workers:
                worker.call(("detach",))

    def run(self, tasks: list[Task]) -> list[np.ndarray | None]:
        order = sorted(range(len(tasks)), key=lambda i: -tasks[i].cells)
        pending = deque(i for i in order if tasks[i].cells >= self.min_cells)
        local = [i for i in order if tasks[i].cells < self.min_cells]
        results: list[np.ndarray | None] = [None] * len(tasks)
        idle, busy = list(self._workers), {}
        while pending or local or busy:
            raise_if_stopped(self.stop)
            while idle and pending:
                worker, index = idle.pop(), pending.popleft()
                worker.send(("task", tasks[index]))
                busy[worker.proc.stdout.fileno()] = (worker, index)
            if pending or local:
                index = local.pop(0) if local else pending.popleft()
                task = tasks[index]
                results[index] = run_task(
                    self.weights, self.values, self.arena, task, self.grouping, self.stop
                )
            for fd in _ready(busy, block=not (pending or local)):
                worker, index = busy.pop(fd)
                results[index] = worker.receive()
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
    capacity: int,
    n_floats: int,
    count: int,
    options: SolverOptions,
    stop: np.ndarray,
) -> tuple[np.ndarray, int] | None:
    """``hirschberg.solve_segments`` on ``count`` processes (this one included), or None (one
    warning) where the shared arena has no room."""
    arena = shared_arena(n_floats)
    if arena is None:
        return None
    try:
        with (
            workers.borrowed(count - 1) as pool,
            PoolExecutor(weights, values, arena, pool, options, stop) as ex,
        ):
            return hirschberg.solve_segments(weights, values, capacity, ex, options)
    finally:
        arena.close()
