"""The watch over a parallel solve's workers: a dead, stopped or hung worker ends the solve at once.

While a ``PoolExecutor`` runs, a ``WorkerGuard`` thread looks at every worker each ``POLL_S``
seconds. A worker that has exited, has been stopped (``SIGSTOP``, a debugger: state ``T``/``t``
in ``/proc``) for ``STOPPED_GRACE_S``, or has held one task past its deadline is a *fault*: the
guard notes why on the worker, kills it (which wakes any read or write of its pipes in the calling
process) and sets the solve's stop flag (which stops the caller's own kernel within one item).
The executor then raises ``WorkerDied`` with the worker's reason, and the pool is reset.

A task's deadline grows with its size: ``task_deadline_s(cells)`` is at least ``DEADLINE_FLOOR_S``
(room for a worker compiling its kernels in memory on a busy machine), plus one second per
``DEADLINE_CELLS_PER_S`` cells (a rate ~500x below numba's kernels and 50-100x below numpy's, so
that even a worker on numpy kernels on a machine loaded 10x over is not taken for a hung one).
The clock advances only while the guard itself runs, at most ``2 * POLL_S`` per look, so a whole
process group stopped and continued (Ctrl-Z, then ``fg``) does not expire the deadlines.

Example:
    >>> task_deadline_s(0), task_deadline_s(10**10)
    (30.0, 5030.0)
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

__all__ = [
    "DEADLINE_CELLS_PER_S",
    "DEADLINE_FLOOR_S",
    "POLL_S",
    "STOPPED_GRACE_S",
    "WorkerGuard",
    "is_stopped",
    "task_deadline_s",
]

POLL_S = 0.05
"""Seconds between the guard's looks at the workers."""
STOPPED_GRACE_S = 1.0
"""Seconds a worker may stay stopped (``SIGSTOP``) before the solve gives it up."""
DEADLINE_FLOOR_S = 30.0
"""The shortest deadline of any request to a worker, in seconds."""
DEADLINE_CELLS_PER_S = 2e6
"""The slowest rate of DP cell updates a live worker is allowed before it counts as hung."""


def task_deadline_s(cells: int) -> float:
    """Seconds a worker may take to answer a request of ``cells`` DP cells."""
    return DEADLINE_FLOOR_S + cells / DEADLINE_CELLS_PER_S


def is_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped by a signal or a tracer (False where ``/proc`` is missing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][:1]
    except (OSError, IndexError):
        return False
    return state in ("T", "t")


class WorkerGuard:
    """Watch ``workers`` (objects with ``proc``, a ``Popen``, and a writable ``fault``) until
    ``close()``; on a fault, kill the worker and set ``stop[0]``. ``expect(worker, cells)`` starts
    a request's deadline, ``answered(worker)`` ends it."""

    def __init__(self, workers: list, stop: np.ndarray) -> None:
        self.workers, self.stop = list(workers), stop
        self.fault: object | None = None  # the first faulty worker
        self._deadline_s: dict[
            int, tuple[float, float]
        ] = {}  # id(worker) -> (due on the guard clock, allowed)
        self._stopped_since_s: dict[int, float] = {}
        self._clock_s, self._closed = 0.0, threading.Event()
        self._thread = threading.Thread(target=self._watch, name="lightning-ckpt-worker-guard", daemon=True)
        self._thread.start()

    def expect(self, worker: object, cells: int) -> None:
        allowed_s = task_deadline_s(cells)
        self._deadline_s[id(worker)] = (self._clock_s + allowed_s, allowed_s)

    def answered(self, worker: object) -> None:
        self._deadline_s.pop(id(worker), None)

    def close(self) -> None:
        self._closed.set()
        self._thread.join()

    def _watch(self) -> None:
        last = time.monotonic()
        while not self._closed.wait(POLL_S) and self.fault is None:
            now = time.monotonic()
            self._clock_s += min(now - last, 2 * POLL_S)  # a stopped caller does not age the deadlines
            last = now
            for worker in self.workers:
                reason = self._reason(worker)
                if reason is not None:
                    self._give_up(worker, reason)
                    return

    def _reason(self, worker) -> str | None:
        code = worker.proc.poll()
        if code is not None:
            return f"exited with code {code}"
        key = id(worker)
        if is_stopped(worker.proc.pid):
            since = self._stopped_since_s.setdefault(key, self._clock_s)
            if self._clock_s - since >= STOPPED_GRACE_S:
                return f"was stopped (SIGSTOP or a debugger) for {STOPPED_GRACE_S:g} s"
        else:
            self._stopped_since_s.pop(key, None)
        due_s, allowed_s = self._deadline_s.get(key, (float("inf"), 0.0))
        if self._clock_s > due_s:
            return f"did not answer within its deadline of {allowed_s:.0f} s (hung, or far too slow)"
        return None

    def _give_up(self, worker, reason: str) -> None:
        worker.fault = reason
        self.fault = worker
        self.stop[0] = 1
        worker.kill()
