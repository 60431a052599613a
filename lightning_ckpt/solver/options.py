"""``SolverOptions``: the solver's tunables, passed to ``solve_knapsack(..., options=...)``.

None of them changes an answer: they decide where work runs (worker processes or not), how the
exact O(W) method splits its work, how much memory it may use for shortcuts, and how the numba
kernel sweeps memory. The defaults are the measured best choices; tests use small values to
reach every code path on tiny instances.

Example:
    >>> options = SolverOptions(leaf_max_cells=0)  # one-item leaves: the deepest Hirschberg splits
    >>> options.leaf_max_cells, options.grouping
    (0, (524288, 8, 2048))
    >>> SolverOptions(tile=0)
    Traceback (most recent call last):
    ...
    ValueError: `SolverOptions.tile` must be an integer in [1, 2**48], got 0
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

__all__ = ["DEFAULT_OPTIONS", "SolverOptions", "resolve_options"]

_MAX_INTEGER = 2**48

# field name: (lowest allowed, highest allowed or None)
_INTEGER_RANGES: dict[str, tuple[int, int | None]] = {
    "parallel_min_solve_cells": (0, None),
    "parallel_min_task_cells": (0, None),
    "leaf_max_cells": (0, None),
    "dp_table_limit_bytes": (0, None),
    "group_window": (1, _MAX_INTEGER),
    "group_items": (1, 1024),
    "tile": (1, _MAX_INTEGER),
    "sparse_max_states": (0, None),
}


@dataclass(frozen=True)
class SolverOptions:
    """Tunables of ``solve_knapsack``; the answer never depends on them (only time and memory)."""

    parallel_min_solve_cells: int = 1 << 29
    """Below this many DP cells (core items x (core capacity + 1); capped: option passes x
    (capacity + 1)) a solve never starts worker processes, whatever ``workers`` says (~537M cells).
    Measured on 2 idle CPUs (``python -m benchmarks.bench.workers``, numba), two processes forced
    against one: 0.49-0.60x at 2e7 cells, 0.55-0.59x at 2e8, 0.89x at 4e8, 1.11x at 5.6e8, 1.21x at
    8e8, 1.16-1.32x at 1e9, 1.61x at 5e9. Above it ``runtime.cpus.processes_for`` still looks at the
    idle CPUs (a busy machine solves in one process). ``0`` forces the workers on every solve."""

    parallel_min_task_cells: int = 1 << 24
    """A task with fewer cells (~17M, a few ms) stays in the calling process: not worth shipping
    to a worker process."""

    leaf_max_cells: int = 1 << 22
    """A Hirschberg segment whose decision-bit table (items x capacities) has at most this many
    cells (512 KiB) is solved directly as a leaf; larger ones split. The recording pass of a leaf
    is several times slower than the grouped profile kernel, so small leaves are faster. ``0``
    forces splits down to single items."""

    checkpoint_share: float = 1.0
    """Room for checkpoints (saved half profiles that spare a pass at the next level), in float64
    entries per capacity unit and per item of the reduced instance; ``0`` disables them."""

    dp_table_limit_bytes: int = 2 * 2**30
    """``method="dp"`` refuses (``MemoryError``) full tables above this many bytes (2 GiB), or
    above the available memory."""

    group_window: int = 1 << 19
    """The numba kernel sweeps memory once per group of consecutive items. A group whose weights
    sum to at most this many cells (4 MiB of profile) stays in cache, so memory traffic per item
    drops by up to ``group_items``. Heavier items (large W) are grouped anyway ("streaming"
    groups): each item then moves 16 bytes per cell instead of 24."""

    group_items: int = 8
    """Most items in one group of the numba kernel's sweep (at most 1024)."""

    tile: int = 2048
    """Cells each item of a group updates before the next item follows, in the numba kernel."""

    sparse_max_states: int = 1 << 22
    """Without caps, ``"auto"`` first tries sparse states around the break item (``sparse/``); past
    this many states made (4M, 32 MB of history), or one per capacity unit and item of the core,
    Hirschberg takes over. ``0``: no sparse try (the dense path alone, as before)."""

    ilp_time_limit_s: float = 60.0
    """``method="ilp"`` raises ``TimeoutError`` when scipy's MILP has not proven an optimum within
    this many seconds (never a non-optimal answer); a finite number > 0."""

    def __post_init__(self) -> None:
        for name, (low, high) in _INTEGER_RANGES.items():
            object.__setattr__(self, name, _checked_integer(name, getattr(self, name), low, high))
        object.__setattr__(self, "checkpoint_share", _checked_share(self.checkpoint_share))
        object.__setattr__(self, "ilp_time_limit_s", _checked_seconds(self.ilp_time_limit_s))

    @property
    def grouping(self) -> tuple[int, int, int]:
        """``(group_window, group_items, tile)``, as the kernels take them."""
        return self.group_window, self.group_items, self.tile


def _checked_integer(name: str, value: object, low: int, high: int | None) -> int:
    ok = isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))
    if not ok or value < low or (high is not None and value > high):
        allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {_text(high)}]"
        raise ValueError(f"`SolverOptions.{name}` must be {allowed}, got {value!r}")
    return int(value)


def _checked_share(value: object) -> float:
    ok = isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
    if not ok or not math.isfinite(value) or value < 0:
        raise ValueError(f"`SolverOptions.checkpoint_share` must be a finite number >= 0, got {value!r}")
    return float(value)


def _checked_seconds(value: object) -> float:
    ok = isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
    if not ok or not math.isfinite(value) or value <= 0:
        raise ValueError(f"`SolverOptions.ilp_time_limit_s` must be a finite number > 0, got {value!r}")
    return float(value)


def _text(number: int) -> str:
    return "2**48" if number == _MAX_INTEGER else str(number)


DEFAULT_OPTIONS = SolverOptions()


def resolve_options(options: object) -> SolverOptions:
    """``options`` itself, or ``DEFAULT_OPTIONS`` for None.

    Raises:
        ValueError: when ``options`` is neither None nor a ``SolverOptions``.

    Example:
        >>> resolve_options(None) is DEFAULT_OPTIONS
        True
    """
    if options is None:
        return DEFAULT_OPTIONS
    if not isinstance(options, SolverOptions):
        raise ValueError(f"`options` must be a SolverOptions or None, got {type(options).__name__}")
    return options
