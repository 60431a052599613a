"""The solver's worker processes: started on demand, reset on any failure, released when idle.

Each worker is a plain ``python -c`` subprocess importing only numpy, numba and this package's
solver modules (no torch, no lightning, no re-import of the caller's ``__main__``). It reads
pickled requests on stdin and answers on stdout; a Unix socket beside the pipes carries the
shared arena's file descriptor (``SCM_RIGHTS``), so the arena needs no name in ``/dev/shm``.

Workers ignore SIGINT: a Ctrl-C sent to the whole process group reaches only the calling
process, which then kills its workers (``reset``). They stay in the caller's process group,
so a SIGKILL of the group takes them too, and they exit when the caller's end of their pipe
closes. A caller killed alone takes them with it: on Linux each worker asks the kernel for a
SIGKILL when its parent dies (``PR_SET_PDEATHSIG``; a stopped worker dies too), and every
worker also watches its parent's pid. The death signal follows the *thread* that started the
process, so workers are started by one long-lived thread (``_spawned``), never by a solve's
helper thread. A pool left idle for ``IDLE_RELEASE_S`` seconds is stopped.

Example:
    >>> with borrowed(1) as workers:
    ...     workers[0].call(("ping",))
    'pong'
"""

from __future__ import annotations

import atexit
import contextlib
import mmap
import os
import pickle
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator

import numpy as np

from lightning_ckpt.solver.runtime.guard import is_stopped
from lightning_ckpt.solver.runtime.jit import IN_MEMORY_WARNING

__all__ = ["IDLE_RELEASE_S", "WorkerDied", "borrowed", "kill_workers", "live_worker_pids", "shutdown_workers"]

IDLE_RELEASE_S = 10.0
"""Seconds an unused pool waits before its worker processes are stopped."""

_WORKER_CODE = (
    "import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "from lightning_ckpt.solver.runtime.workers import worker_main; worker_main({fd}, {parent})"
)
_PACKAGE_PARENT = os.path.normpath(os.path.join(os.path.abspath(__file__), *[os.pardir] * 4))


class WorkerDied(RuntimeError):
    """A worker process exited or broke its pipe in the middle of a solve."""


class _Worker:
    """One ``python -c`` subprocess speaking pickled messages over its stdin/stdout."""

    fault: str | None = None
    """Why the pool gave this worker up (``guard.py``), or None."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PACKAGE_PARENT, env.get("PYTHONPATH")]))
        self.fd_socket, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with theirs:
            code = _WORKER_CODE.format(fd=theirs.fileno(), parent=os.getpid())
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                pass_fds=(theirs.fileno(),),
            )

    def died(self) -> WorkerDied:
        """The error to raise for this worker: why the guard gave it up, or how it ended."""
        try:  # its pipe closed before it could be reaped (its other threads were still exiting)
            code = self.proc.wait(timeout=1)
        except subprocess.TimeoutExpired:
            code = None
        how = "is still running but broke its pipe" if code is None else f"exited with code {code}"
        how = self.fault or how
        return WorkerDied(
            f"a knapsack solver worker process (pid {self.proc.pid}) {how}; its pool was reset, "
            "so the next solve starts fresh worker processes"
        )

    def send(self, message: tuple, fd: int | None = None) -> None:
        try:
            pickle.dump(message, self.proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self.proc.stdin.flush()
            if fd is not None:
                socket.send_fds(self.fd_socket, [b"f"], [fd])
        except OSError:
            raise self.died() from None

    def receive(self):
        try:
            status, payload = pickle.load(self.proc.stdout)
        except (EOFError, OSError, pickle.UnpicklingError):
            raise self.died() from None
        if status == "error":
            raise RuntimeError(f"a knapsack solver worker failed:\n{payload}")
        return payload

    def call(self, message: tuple, fd: int | None = None):
        self.send(message, fd)
        return self.receive()

    def kill(self) -> None:
        """End the process at once (safe from any thread, also on a dead one)."""
        with contextlib.suppress(OSError):
            self.proc.kill()

    def stop(self) -> None:
        """Ask the process to exit, kill it if it does not, and reap it."""
        try:
            self.send(("stop",))
            self.proc.wait(timeout=5)
        except (WorkerDied, subprocess.TimeoutExpired):
            self.kill()
            self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.fd_socket):
            with contextlib.suppress(OSError):
                stream.close()


_POOL: list[_Worker] = []
_POOL_LOCK = threading.Lock()  # one parallel solve at a time owns the pool
_TIMER: list[threading.Timer] = []
_LAST_USED_S = [0.0]  # time.monotonic() at the end of the last solve on the pool


def _forget_the_parents_pool() -> None:
    """In a forked child: the parent's workers, timer and lock (held or not) are not this process's."""
    global _POOL_LOCK
    _POOL.clear()
    _TIMER.clear()
    _POOL_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_the_parents_pool)


@contextlib.contextmanager
def borrowed(count: int) -> Iterator[list[_Worker]]:
    """Hold ``count`` live worker processes for one solve.

    On any exception (a worker's death, an interrupt) every worker is killed, so no answer
    meant for this solve can reach a later one. Afterwards, an idle timer is armed.
    """
    with _POOL_LOCK:
        _cancel_timer()
        try:
            _drop_unusable_locked()
            while len(_POOL) < count:
                _POOL.append(_spawned())
            yield _POOL[:count]
        except BaseException:
            _reset_locked()
            raise
        finally:
            _LAST_USED_S[0] = time.monotonic()
            _arm_timer()


_SPAWNERS: dict[int, queue.SimpleQueue] = {}  # pid -> the requests of that process's spawner thread


def _spawned() -> _Worker:
    """A new worker, started by the spawner thread, which lives as long as this process: the
    worker's death signal fires when the thread that started it ends, not a solve's helper.
    (Keyed by pid: a forked child has no thread of its parent's, so it starts its own.)"""
    requests = _SPAWNERS.get(os.getpid())
    if requests is None:
        requests = _SPAWNERS[os.getpid()] = queue.SimpleQueue()
        name = "lightning-ckpt-worker-spawner"
        threading.Thread(target=_serve_spawns, args=(requests,), name=name, daemon=True).start()
    answer: queue.SimpleQueue = queue.SimpleQueue()
    requests.put(answer)
    worker = answer.get()
    if isinstance(worker, BaseException):
        raise worker
    return worker


def _serve_spawns(requests: queue.SimpleQueue) -> None:
    while True:
        answer = requests.get()
        try:
            answer.put(_Worker())
        except BaseException as exc:  # handed to the caller
            answer.put(exc)


def kill_workers() -> None:
    """Kill every worker process now, without waiting for the pool (used on an interrupt)."""
    for worker in list(_POOL):
        worker.kill()


def live_worker_pids() -> list[int]:
    """Process ids of the pool's live workers (for tests and diagnostics)."""
    return [w.proc.pid for w in list(_POOL) if w.proc.poll() is None]


def _drop_unusable_locked() -> None:
    """Forget the pool's dead workers, and kill those stopped while idle (``SIGSTOP``): a solve
    should not start on a worker that cannot answer."""
    usable = []
    for worker in _POOL:
        if worker.proc.poll() is not None:
            worker.stop()  # reap it, close its pipes
        elif is_stopped(worker.proc.pid):
            worker.kill()
            worker.stop()
        else:
            usable.append(worker)
    _POOL[:] = usable


def _reset_locked() -> None:
    for worker in _POOL:
        worker.kill()
    _stop_all_locked()


def _stop_all_locked() -> None:
    """Stop and reap the workers, then forget them (so no live pid is ever unlisted)."""
    for worker in _POOL:
        worker.stop()
    _POOL.clear()


@atexit.register
def shutdown_workers() -> None:
    """Stop every worker process (also run at interpreter exit)."""
    if not _POOL_LOCK.acquire(timeout=10):  # a solve still holds the pool: end its workers anyway
        kill_workers()
        return
    try:
        _cancel_timer()
        _stop_all_locked()
    finally:
        _POOL_LOCK.release()


def _release_if_idle() -> None:
    if _POOL_LOCK.acquire(blocking=False):  # a solve holding the pool re-arms the timer itself
        try:
            if time.monotonic() - _LAST_USED_S[0] >= IDLE_RELEASE_S:  # not a timer outrun by a solve
                _stop_all_locked()
        finally:
            _POOL_LOCK.release()


def _cancel_timer() -> None:
    while _TIMER:
        _TIMER.pop().cancel()


def _arm_timer() -> None:
    _cancel_timer()
    if _POOL:
        timer = threading.Timer(IDLE_RELEASE_S, _release_if_idle)
        timer.daemon = True
        timer.start()
        _TIMER.append(timer)


def _attach(fd_socket: socket.socket, n_floats: int) -> tuple[mmap.mmap, np.ndarray]:
    _, (fd,), _, _ = socket.recv_fds(fd_socket, 1, 1)
    try:
        mapping = mmap.mmap(fd, max(8 * n_floats, 8))
    finally:
        os.close(fd)  # the mapping keeps the memory alive
    return mapping, np.frombuffer(mapping, dtype=np.float64, count=n_floats)


def _handle(message: tuple, state: dict) -> object:
    """Serve one ``attach``, ``detach``, ``task`` or ``ping`` request; ``state`` keeps what
    ``attach`` brought (and the socket its descriptor arrives on). A task is any engine's task
    object: its ``run(weights, values, arena, grouping=...)`` computes it (unpickling it imports
    its engine's module)."""
    kind = message[0]
    if kind == "ping":
        return "pong"
    if kind == "attach":
        _, n_floats, weights, values, options = message
        state["mapping"], state["arena"] = _attach(state["fd_socket"], n_floats)
        state.update(weights=weights, values=values, grouping=options.grouping)
        return None
    if kind == "detach":
        mapping = state.pop("mapping")
        for key in ("arena", "weights", "values", "grouping"):  # drop the views before closing
            state.pop(key)
        mapping.close()
        return None
    return message[1].run(state["weights"], state["values"], state["arena"], grouping=state["grouping"])


PARENT_POLL_S = 0.2
"""Seconds between a worker's checks that the process that started it is alive."""


def exit_with_parent(parent_pid: int) -> None:
    """End this worker when its parent dies, even in the middle of a kernel (which releases the GIL)
    and even while stopped: the kernel's SIGKILL on the parent's death (Linux), and a watch of the
    parent's pid every ``PARENT_POLL_S`` seconds (everywhere; it needs the worker to run).

    A parent killed alone (``kill -9 PID``, the OOM killer) never sends "stop" nor closes stdin while
    a kernel runs: without this the orphan would compute on for minutes, holding its memory.
    """
    _die_with_parent()
    if os.getppid() != parent_pid:  # the parent died before the death signal was armed
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, name="lightning-ckpt-parent-watch", daemon=True).start()


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent thread ends (a no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def worker_main(fd_socket: int, parent_pid: int) -> None:
    """Serve requests from stdin until told to stop or stdin closes (runs in the worker)."""
    exit_with_parent(parent_pid)
    warnings.filterwarnings("ignore", message=IN_MEMORY_WARNING)  # the calling process warns once
    reply = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints must not corrupt the message stream
    requests = sys.stdin.buffer
    state: dict = {"fd_socket": socket.socket(fileno=fd_socket)}
    while True:
        try:
            message = pickle.load(requests)
        except EOFError:  # the calling process is gone
            return
        if message[0] == "stop":
            return
        try:
            answer = ("ok", _handle(message, state))
        except Exception:  # report, keep serving
            import traceback

            answer = ("error", traceback.format_exc())
        pickle.dump(answer, reply, protocol=pickle.HIGHEST_PROTOCOL)
        reply.flush()
