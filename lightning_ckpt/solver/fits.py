"""Refuse allocations that would not fit, with a message that says what to do instead.

Example:
    >>> check_fits(1024, limit_bytes=2**30, what="a test buffer", advice="use a smaller one")
    >>> check_fits(2**31, limit_bytes=2**30, what="a test buffer", advice="use a smaller one")
    Traceback (most recent call last):
    ...
    MemoryError: a test buffer needs 2 GiB, above the limit of 1 GiB (documented limit or available memory); use a smaller one
"""

from __future__ import annotations

import os

from lightning_ckpt.solver.runtime.limits import mappable_bytes

__all__ = ["UNCHECKED_BYTES", "check_fits"]


def _physical_bytes() -> int | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


UNCHECKED_BYTES = 64 << 10
"""Allocations up to this size are not checked against the available memory: a process that cannot
find 64 KiB cannot go on anyway, and the four system calls that read the limits (about 4 us) are a
tenth of the DP of a ``torch.compile``-sized solve."""


def check_fits(needed_bytes: int, limit_bytes: int | None, what: str, advice: str) -> None:
    """Raise ``MemoryError`` if ``needed_bytes`` exceeds the limit or the memory this process may still
    allocate: the physical memory available, or less where its ``ulimit -v``/``-d`` leaves less room
    (``runtime.limits``), each read once and only above ``UNCHECKED_BYTES``.

    Raises:
        MemoryError: naming the size needed, the limit, and ``advice`` (what to do instead).
    """
    physical, room = (_physical_bytes(), mappable_bytes()) if needed_bytes > UNCHECKED_BYTES else (None, None)
    limits = [x for x in (limit_bytes, physical, room) if x is not None]  # each read once
    if limits and needed_bytes > min(limits):
        if room is not None and room == min(limits):
            source, advice = (
                "the room left under this process's `ulimit -v`/`-d`",
                f"{advice}, or raise the limit",
            )
        else:
            source = "documented limit or available memory"
        raise MemoryError(
            f"{what} needs {needed_bytes / 2**30:.3g} GiB, above the limit of {min(limits) / 2**30:.3g} GiB "
            f"({source}); {advice}"
        )
