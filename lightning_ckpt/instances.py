"""Seeded 0/1 knapsack instances for benchmarks and tests (families A, B and C).

Every family has integer weights, float values and an integer capacity ``W``; the weights add up to
about ``2 W``, so roughly half the items fit and the capacity binds.

- ``"A"``, paper-like: weights uniform in ``[1, 4W/n]``, values ``= weight x U(0.5, 1.5)``.
- ``"B"``, strongly correlated: the same weights, values ``= weight + W / (10 n)``; value-to-weight
  ratios are nearly equal, so bounds and reductions prune little.
- ``"C"``, transformer-like: 10 item types per layer repeated over ``ceil(n / 10)`` layers. A type's
  weight (activation memory) is identical in every layer, as it is for identical layers; its value
  (recompute time) carries 1% multiplicative noise per layer, as measured times do.

An instance depends only on ``(family, n, capacity, seed)``: adding instances to a grid never changes
the others.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np

FAMILIES = ("A", "B", "C")
TYPES_PER_LAYER = 10
VALUE_NOISE = 0.01


@dataclass(frozen=True, eq=False)
class KnapsackInstance:
    """One seeded instance: ``weights`` (int64), ``values`` (float64) and ``capacity``.

    Attributes:
        family: ``"A"``, ``"B"`` or ``"C"`` (see the module docstring).
        n: number of items.
        capacity: the knapsack capacity ``W`` in weight units.
        seed: the seed the instance was drawn with.
        weights: integer item weights, shape ``(n,)``.
        values: float item values, shape ``(n,)``.
    """

    family: str
    n: int
    capacity: int
    seed: int
    weights: np.ndarray
    values: np.ndarray

    @property
    def cells(self) -> int:
        """Cells of the dense DP, ``n * W``: the work unit of the benchmark's Gcell/s."""
        return self.n * self.capacity


def make_instance(family: str, n: int, capacity: int, seed: int = 0) -> KnapsackInstance:
    """Draw the instance of ``family`` with ``n`` items and capacity ``capacity``.

    Args:
        family: one of ``FAMILIES``.
        n: number of items, >= 1.
        capacity: the capacity ``W``, an integer >= 1.
        seed: any integer >= 0; the same arguments always give the same instance.

    Returns:
        The instance.

    Raises:
        ValueError: for an unknown family or a non-positive ``n`` or ``capacity``.

    Example:
        >>> inst = make_instance("A", 5, 100, seed=1)
        >>> inst.weights.dtype, len(inst.values), inst.capacity
        (dtype('int64'), 5, 100)
        >>> bool((inst.weights >= 1).all() and (inst.weights <= 80).all())
        True
        >>> make_instance("A", 5, 100, seed=1).weights.tolist() == inst.weights.tolist()
        True
    """
    _check_arguments(family, n, capacity, seed)
    rng = np.random.default_rng([seed, zlib.crc32(family.encode()), n, capacity])
    if family == "C":
        weights, values = _transformer_like(rng, n, capacity)
    else:
        weights = _uniform_weights(rng, n, capacity)
        if family == "A":
            values = weights * rng.uniform(0.5, 1.5, size=n)
        else:
            values = weights + capacity / (10.0 * n)
    return KnapsackInstance(family, n, capacity, seed, weights, values.astype(np.float64))


def _check_arguments(family: str, n: int, capacity: int, seed: int) -> None:
    if family not in FAMILIES:
        raise ValueError(f"`family` must be one of {', '.join(FAMILIES)}, got {family!r}")
    for name, number, low in (("n", n, 1), ("capacity", capacity, 1), ("seed", seed, 0)):
        if isinstance(number, bool) or not isinstance(number, (int, np.integer)) or number < low:
            raise ValueError(f"`{name}` must be an integer >= {low}, got {number!r}")


def _uniform_weights(rng: np.random.Generator, n: int, capacity: int) -> np.ndarray:
    """Integers uniform in ``[1, 4W/n]`` (at least ``[1, 1]``): they add up to about ``2 W``."""
    high = max(1, (4 * capacity) // n)
    return rng.integers(1, high, size=n, endpoint=True, dtype=np.int64)


def _transformer_like(rng: np.random.Generator, n: int, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """10 types per layer, repeated over layers; weights exact per type, values with 1% noise.

    Type weights span two decades (a layer norm's output to attention scores); their value-to-weight
    ratios span 0.2 to 2 (cheap element-wise ops to matmuls). Weights are scaled to add up to ``2 W``.
    """
    layers = math.ceil(n / TYPES_PER_LAYER)
    relative_weights = np.exp(rng.uniform(0.0, math.log(100.0), size=TYPES_PER_LAYER))
    type_weights = np.maximum(
        1, np.round(relative_weights * 2 * capacity / (layers * relative_weights.sum()))
    )
    type_values = type_weights * rng.uniform(0.2, 2.0, size=TYPES_PER_LAYER)
    weights = np.tile(type_weights.astype(np.int64), layers)[:n]
    noise = 1.0 + VALUE_NOISE * rng.standard_normal(size=layers * TYPES_PER_LAYER)
    values = np.clip(np.tile(type_values, layers) * noise, 0.0, None)[:n]
    return weights, values
