"""The benchmark's instances (the seeded families of ``generators``) and the row each method gives on one."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from benchmarks.bench import generators

DEFAULT_N = (100, 500, 1000, 2000)
DEFAULT_W = (10**5, 10**6, 10**7)
PAPER_W = (140_000_000, 380_000_000)
FAMILIES = generators.FAMILIES
KNOWN_FAMILIES = generators.KNOWN_FAMILIES


@dataclass(frozen=True, eq=False)
class KnapsackInstance:
    """One seeded instance: integer ``weights``, float ``values`` and the ``capacity`` W."""

    family: str
    n: int
    capacity: int
    seed: int
    weights: np.ndarray
    values: np.ndarray

    @property
    def cells(self) -> int:
        """Cells of the dense DP, ``n * W``: the work unit of Gcell/s."""
        return self.n * self.capacity


def make_instance(family: str, n: int, capacity: int, seed: int = 0) -> KnapsackInstance:
    """The instance of ``family`` from ``benchmarks.bench.generators``.

    Example:
        >>> instance = make_instance("B", 4, 100, seed=1)
        >>> instance.weights.dtype, instance.cells
        (dtype('int64'), 400)
    """
    weights, values, _ = generators.make_instance(family, n_items=n, capacity=capacity, seed=seed)
    return KnapsackInstance(
        family, n, capacity, seed, np.asarray(weights, np.int64), np.asarray(values, float)
    )


@dataclass
class BenchRow:
    """One method on one instance. ``status`` is ok, skipped, refused, n/a, timeout or error."""

    family: str
    n: int
    capacity: int
    method: str
    status: str
    note: str = ""
    time_s: float | None = None
    cpu_s: float | None = None
    estimated_time_s: float | None = None
    repeats: int = 0
    peak_bytes: int | None = None
    value: float | None = None
    weight: int | None = None
    feasible: bool | None = None
    gap: float | None = None
    speedup_vs_torch: float | None = None
    speedup_is_estimate: bool = False
    gcells_per_s: float | None = None


def _short(number: int) -> str:
    """``4000000`` -> ``"4e6"``, ``140000000`` -> ``"1.4e8"``, ``300`` -> ``"300"``.

    Example:
        >>> _short(4_000_000), _short(140_000_000), _short(300), _short(123_456)
        ('4e6', '1.4e8', '300', '123456')
    """
    if number < 1000:
        return str(number)
    exponent = int(math.floor(math.log10(number)))
    mantissa = number / 10**exponent
    text = f"{mantissa:g}e{exponent}"
    return text if len(text) <= 6 and float(text) == number else str(number)
