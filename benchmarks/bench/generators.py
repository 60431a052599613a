"""Seeded random knapsack instances: the three families used by the tests and the benchmark.

- ``"A"``, paper-like: weights uniform in [1, 4W/n], values = weight x U(0.5, 1.5);
- ``"B"``, strongly correlated: same weights, values = weight + W/(10n);
- ``"C"``, transformer-like: ~10 item types per layer repeated over n/10 layers; weights repeat
  exactly (activation memory is deterministic), values carry small relative noise
  (``noise``, default 1%; 0 gives exact repeats);
- ``"U"`` and ``"W"``, Pisinger's uncorrelated and weakly correlated families on the same weights
  (``R = 4W/n``): values uniform in [1, R], and weight + U(-R/10, R/10) (at least 1). Not in the
  default grid (``FAMILIES``); ``KNOWN_FAMILIES`` lists every one.

Example:
    >>> weights, values, capacity = make_instance("B", n_items=3, capacity=30, seed=0)
    >>> len(weights), capacity, bool(values[0] == weights[0] + 1.0)
    (3, 30, True)
"""

from __future__ import annotations

import numpy as np

__all__ = ["FAMILIES", "KNOWN_FAMILIES", "make_instance"]

FAMILIES = ("A", "B", "C")
KNOWN_FAMILIES = (*FAMILIES, "U", "W")
_TYPES_PER_LAYER = 10


def make_instance(
    family: str, n_items: int, capacity: int, seed: int = 0, noise: float = 0.01
) -> tuple[np.ndarray, np.ndarray, int]:
    """Return ``(weights int64, values float64, capacity)`` of the given family.

    Args:
        family: ``"A"``, ``"B"`` or ``"C"`` (see the module docstring).
        n_items: Number of items.
        capacity: Knapsack capacity ``W``.
        seed: Random seed.
        noise: Family C's relative value noise.

    Raises:
        ValueError: for an unknown family.
    """
    if family not in KNOWN_FAMILIES:
        raise ValueError(f"`family` must be one of {KNOWN_FAMILIES}, got {family!r}")
    rng = np.random.default_rng(seed)
    top = max(1, 4 * capacity // max(n_items, 1))
    if family == "C":
        types = min(_TYPES_PER_LAYER, max(n_items, 1))
        base_w = rng.integers(1, top + 1, types)
        base_v = base_w * rng.uniform(0.5, 1.5, types)
        kind = np.arange(n_items) % types
        values = base_v[kind] * (1 + rng.uniform(-noise, noise, n_items))
        return base_w[kind].astype(np.int64), values, capacity
    weights = rng.integers(1, top + 1, n_items).astype(np.int64)
    if family == "A":
        return weights, weights * rng.uniform(0.5, 1.5, n_items), capacity
    if family == "U":
        return weights, rng.uniform(1, top, n_items), capacity
    if family == "W":
        return weights, np.maximum(1.0, weights + rng.uniform(-top / 10, top / 10, n_items)), capacity
    return weights, weights + capacity / (10 * max(n_items, 1)), capacity
