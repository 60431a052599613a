"""Run a call on a thread with a deep C stack: tearing down a deep model's autograd graph recurses.

When a step's autograd graph is freed, each node whose Python wrapper exists (``register_hook`` on a
non-leaf tensor makes one, as ``FlopCounterMode``'s module tracking does) frees the next node from its
own destructor, one C stack frame set per node. A fake-tensor profile of a model thousands of blocks
deep then overflows the main thread's stack (8 MiB by default, about 2.7 KiB per block: ``lightning-ckpt
plan`` died of SIGSEGV at 3000 blocks). A thread's stack is set when the thread starts, so the planner
runs on one with :data:`STACK_BYTES` (address space reserved, committed only as it is used).

Example:
    >>> call_with_deep_stack(sum, [1, 2, 3])
    6
    >>> call_with_deep_stack(int, "x")
    Traceback (most recent call last):
    ...
    ValueError: invalid literal for int() with base 10: 'x'
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["STACK_BYTES", "call_with_deep_stack"]

STACK_BYTES = 1 << 30
"""1 GiB: about 380,000 blocks at the 2.7 KiB per block measured on a GPT block."""

T = TypeVar("T")


def call_with_deep_stack(
    fn: Callable[..., T], *args: Any, stack_bytes: int = STACK_BYTES, **kwargs: Any
) -> T:
    """``fn(*args, **kwargs)`` on a new thread with a ``stack_bytes`` stack: its result, or its exception.

    The thread is a daemon and the caller waits in short slices, so Ctrl-C still ends the command.
    """
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = fn(*args, **kwargs)
        except BaseException as error:  # handed to the caller, which raises it
            outcome["error"] = error

    previous = threading.stack_size(stack_bytes)
    try:
        thread = threading.Thread(target=target, name="lightning-ckpt-plan", daemon=True)
        thread.start()
    finally:
        threading.stack_size(previous)
    while thread.is_alive():
        thread.join(0.1)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]
