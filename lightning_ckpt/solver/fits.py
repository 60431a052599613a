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

__all__ = ["available_bytes", "check_fits"]


def available_bytes() -> int | None:
    """Physical memory currently available, or None where the OS does not say."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(needed_bytes: int, limit_bytes: int | None, what: str, advice: str) -> None:
    """Raise ``MemoryError`` if ``needed_bytes`` exceeds the limit or the available memory.

    Raises:
        MemoryError: naming the size needed, the limit, and ``advice`` (what to do instead).
    """
    available = available_bytes()
    limits = [x for x in (limit_bytes, available) if x is not None]
    if limits and needed_bytes > min(limits):
        raise MemoryError(
            f"{what} needs {needed_bytes / 2**30:.3g} GiB, above the limit of {min(limits) / 2**30:.3g} GiB "
            f"(documented limit or available memory); {advice}"
        )
