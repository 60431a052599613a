"""Worker processes that compute Hirschberg tasks on a shared-memory arena.

The arena (every W-sized profile) lives in one ``multiprocessing.shared_memory`` block: tasks
carry only item ranges, capacities and offsets, never W-sized arrays. Workers are plain
``python -c`` subprocesses importing only numpy, numba and this package's solver modules (no
torch, no lightning, and no re-import of the caller's ``__main__``, unlike ``spawn``); they
load the cached compiled kernel. They are started on first need, kept for later solves, and
stopped at interpreter exit.

With ``workers=N`` there are ``N - 1`` worker processes; the calling process is the N-th and
runs tasks too. Tasks smaller than ``SolverOptions.parallel_min_task_cells`` stay in the calling
process. The options travel to the workers with each solve (for the kernel's grouping).
Results do not depend on which process ran a task (same kernel, same arithmetic).
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import subprocess
import sys
from collections import deque
from multiprocessing import resource_tracker, shared_memory

import numpy as np

from lightning_ckpt.solver.hirschberg import Task, run_task
from lightning_ckpt.solver.options import DEFAULT_OPTIONS, SolverOptions

__all__ = ["SharedArena", "PoolExecutor", "get_workers", "shutdown_workers"]

_WORKER_CODE = "from lightning_ckpt.solver.parallel import worker_main; worker_main()"
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class SharedArena:
    """A float64 array in shared memory, unlinked on ``close``."""

    def __init__(self, n_floats: int) -> None:
        self.shm = shared_memory.SharedMemory(create=True, size=max(8 * n_floats, 8))
        self.array = np.ndarray((n_floats,), dtype=np.float64, buffer=self.shm.buf)

    def close(self) -> None:
        del self.array
        self.shm.close()
        self.shm.unlink()


class _Worker:
    """One ``python -c`` subprocess speaking pickled messages over its stdin/stdout."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_PARENT, env.get("PYTHONPATH")]))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_CODE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )

    def send(self, message: tuple) -> None:
        pickle.dump(message, self.proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        self.proc.stdin.flush()

    def receive(self):
        try:
            status, payload = pickle.load(self.proc.stdout)
        except EOFError:
            raise RuntimeError("a knapsack solver worker process exited unexpectedly") from None
        if status == "error":
            raise RuntimeError(f"a knapsack solver worker failed:\n{payload}")
        return payload

    def call(self, message: tuple):
        self.send(message)
        return self.receive()

    def stop(self) -> None:
        try:
            self.send(("stop",))
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            self.proc.kill()


_POOL: list[_Worker] = []


def get_workers(count: int) -> list[_Worker]:
    """Return ``count`` live worker processes, starting any that are missing."""
    _POOL[:] = [w for w in _POOL if w.proc.poll() is None]
    while len(_POOL) < count:
        _POOL.append(_Worker())
    return _POOL[:count]


@atexit.register
def shutdown_workers() -> None:
    """Stop every worker process (also run at interpreter exit)."""
    while _POOL:
        _POOL.pop().stop()


class PoolExecutor:
    """Runs a level's tasks on worker processes plus this one, biggest first.

    Use as a context manager: it attaches the workers to the shared arena (and hands them the
    items and ``options``) on entry, and detaches them (and frees the arena) on exit. Tasks below
    ``options.parallel_min_task_cells`` cells run in this process.
    """

    def __init__(
        self,
        weights: np.ndarray,
        values: np.ndarray,
        arena_floats: int,
        workers: int,
        options: SolverOptions = DEFAULT_OPTIONS,
    ) -> None:
        self.weights, self.values, self.options = weights, values, options
        self._shared = SharedArena(arena_floats)
        self.arena = self._shared.array
        self._workers = get_workers(workers - 1)
        self.min_cells, self.grouping = options.parallel_min_task_cells, options.grouping

    def __enter__(self) -> PoolExecutor:
        attach = ("attach", self._shared.shm.name, len(self.arena), self.weights, self.values, self.options)
        for worker in self._workers:
            worker.send(attach)
        for worker in self._workers:
            worker.receive()
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            for worker in self._workers:
                worker.call(("detach",))
        finally:
            del self.arena
            self._shared.close()

    def run(self, tasks: list[Task]) -> list[np.ndarray | None]:
        order = sorted(range(len(tasks)), key=lambda i: -tasks[i].cells)
        pending = deque(i for i in order if tasks[i].cells >= self.min_cells)
        local = [i for i in order if tasks[i].cells < self.min_cells]
        results: list[np.ndarray | None] = [None] * len(tasks)
        idle, busy = list(self._workers), {}
        while pending or local or busy:
            while idle and pending:
                worker, index = idle.pop(), pending.popleft()
                worker.send(("task", tasks[index]))
                busy[worker.proc.stdout.fileno()] = (worker, index)
            if pending or local:
                index = local.pop(0) if local else pending.popleft()
                results[index] = run_task(self.weights, self.values, self.arena, tasks[index], self.grouping)
            for fd in _ready(busy, block=not (pending or local)):
                worker, index = busy.pop(fd)
                results[index] = worker.receive()
                idle.append(worker)
        return results


def _ready(busy: dict, block: bool) -> list[int]:
    if not busy:
        return []
    ready, _, _ = select.select(list(busy), [], [], None if block else 0)
    return ready


def _attach(name: str, n_floats: int) -> tuple[shared_memory.SharedMemory, np.ndarray]:
    shm = shared_memory.SharedMemory(name=name)
    # The creating process owns (and unlinks) the block; this process's tracker must not.
    resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
    return shm, np.ndarray((n_floats,), dtype=np.float64, buffer=shm.buf)


def _handle(message: tuple, state: dict) -> np.ndarray | None:
    """Serve one ``attach``, ``detach`` or ``task`` request; ``state`` keeps what ``attach`` brought."""
    kind = message[0]
    if kind == "attach":
        _, name, n_floats, weights, values, options = message
        state["shm"], state["arena"] = _attach(name, n_floats)
        state.update(weights=weights, values=values, grouping=options.grouping)
        return None
    if kind == "detach":
        shm = state.pop("shm")
        state.clear()  # drop the arena view before closing its buffer
        shm.close()
        return None
    return run_task(state["weights"], state["values"], state["arena"], message[1], state["grouping"])


def worker_main() -> None:
    """Serve tasks from stdin until told to stop (runs in the worker subprocess)."""
    reply = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints must not corrupt the message stream
    requests = sys.stdin.buffer
    state: dict = {}
    while True:
        message = pickle.load(requests)
        if message[0] == "stop":
            return
        try:
            answer = ("ok", _handle(message, state))
        except Exception:  # report, keep serving
            import traceback

            answer = ("error", traceback.format_exc())
        pickle.dump(answer, reply, protocol=pickle.HIGHEST_PROTOCOL)
        reply.flush()
