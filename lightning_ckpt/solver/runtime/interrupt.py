"""The stop flag and the helper thread: a long solve that Ctrl-C stops at once.

Every kernel of every engine takes a *stop flag* (``new_stop_flag``: a one-entry uint8 array, shared
with no other solve) and checks it between items; once ``flag[0]`` is set it returns early, its
work unfinished, and its caller raises ``SolveStopped`` (``raise_if_stopped``).

A numba kernel releases the GIL and does not return to Python for seconds, so a SIGINT would
wait for it. The work runs in a helper thread instead; this (the main) thread only waits, in
short interruptible joins. On any exception here (``KeyboardInterrupt`` first of all), the
stop flag is raised, which the kernels poll between items, the worker processes are killed,
the helper thread is joined (it ends within one item's pass) and the exception is re-raised.
The helper thread owns every resource of the solve (arena, pool) and frees them on its way out.
The wait is on an event the helper sets last, not on ``Thread.join``: on Python 3.11 a join that
Ctrl-C interrupts marks the thread as ended while it still runs, so the interrupt would leave first.

Example:
    >>> run_interruptibly(lambda: 6 * 7, new_stop_flag())
    42
    >>> stop = new_stop_flag()
    >>> stop[0] = 1
    >>> raise_if_stopped(stop)
    Traceback (most recent call last):
    ...
    lightning_ckpt.solver.runtime.interrupt.SolveStopped: the solve was stopped
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from lightning_ckpt.solver.runtime import workers

__all__ = ["JOIN_POLL_S", "SolveStopped", "new_stop_flag", "raise_if_stopped", "run_interruptibly"]

JOIN_POLL_S = 0.05
"""Seconds between the waiting thread's checks for a pending signal."""

T = TypeVar("T")


class SolveStopped(Exception):
    """A kernel returned early, its work unfinished, because its stop flag was set."""


def new_stop_flag() -> np.ndarray:
    """A one-entry array the kernels poll between items: set ``flag[0] = 1`` to stop them."""
    return np.zeros(1, dtype=np.uint8)


def raise_if_stopped(stop: np.ndarray) -> None:
    """Raise ``SolveStopped`` once ``stop[0]`` is set."""
    if stop[0]:
        raise SolveStopped("the solve was stopped")


def run_interruptibly(work: Callable[[], T], stop: np.ndarray | None, *, uses_workers: bool = False) -> T:
    """Return ``work()``, computed in a helper thread that polls ``stop``; ``uses_workers``: it
    runs on the worker pool, whose processes are killed on an interrupt.

    With ``stop=None`` (work that cannot be stopped, such as scipy's MILP, which releases the GIL
    and ends at its own time limit) an interrupt is re-raised at once, without waiting for the
    helper thread: it finishes in the background and its result is dropped.

    Raises:
        BaseException: whatever ``work`` raised, or what interrupted the wait (after the
            helper thread has stopped and the worker processes are gone).
    """
    outcome: dict = {}
    done = threading.Event()  # not Thread.join: on 3.11 an interrupted join marks a live thread ended

    def target() -> None:
        try:
            outcome["result"] = work()
        except BaseException as exc:  # handed to the waiting thread
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=target, name="lightning-ckpt-solve", daemon=True).start()
    try:
        while not done.wait(JOIN_POLL_S):
            pass
    except BaseException:
        if stop is not None:
            stop[0] = 1
            if uses_workers:
                workers.kill_workers()
            _wait_through_interrupts(done)
        raise
    if "error" in outcome:
        raise outcome.pop("error")
    return outcome["result"]


def _wait_through_interrupts(done: threading.Event) -> None:
    """Wait for ``done``; a second Ctrl-C while the stopped helper finishes its item is swallowed (the
    first is being raised), so no exception leaves while the helper still computes."""
    while True:
        try:
            if done.wait(JOIN_POLL_S):
                return
        except KeyboardInterrupt:
            continue
