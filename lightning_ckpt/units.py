"""Byte units. GB means 10^9 bytes throughout (as ``budget_gb`` and GPU spec sheets do), MB 10^6.

Example:
    >>> gb_to_bytes(1.5), bytes_to_gb(250_000_000)
    (1500000000, 0.25)
"""

from __future__ import annotations

BYTES_PER_GB = 1e9
BYTES_PER_MB = 1e6


def gb_to_bytes(gb: float) -> int:
    """Whole bytes in ``gb`` GB (rounded down)."""
    return int(gb * BYTES_PER_GB)


def bytes_to_gb(nbytes: float) -> float:
    """``nbytes`` in GB."""
    return nbytes / BYTES_PER_GB
