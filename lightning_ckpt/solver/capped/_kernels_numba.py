"""Numba twins of ``profile.py``'s item updates: compiled loops, bit-identical results.

Each cell takes the larger of the same two sums as the numpy version (``-inf`` where a cap or the
capacity forbids a choice). Forward profiles update cells downward, backward ones upward, so every
read sees the profile before the item. Each kernel returns early, its profile unfinished, once
``stop[0]`` is set (checked before each item). Imported only for large problems (``runtime.backend``
decides).
"""

from __future__ import annotations

import numpy as np

from lightning_ckpt.solver.runtime.jit import kernel_jit

_jit = kernel_jit()


@_jit
def _forward(weights, values, take, skip, f, took, record, stop):  # pragma: no cover - compiled
    top = len(f) - 1
    for j in range(len(weights)):
        if stop[0] != 0:
            return
        w, v, t, s = weights[j], values[j], take[j], skip[j]
        for c in range(top, -1, -1):
            best = f[min(c, s)] if s >= 0 else -np.inf
            if t >= 0 and c >= w:
                candidate = f[min(c - w, t)] + v
                if candidate > best:
                    best = candidate
                    if record:
                        took[j, c] = True
            f[c] = best


@_jit
def forward(weights, values, take, skip, f, stop):  # pragma: no cover - compiled
    _forward(weights, values, take, skip, f, np.zeros((0, 0), dtype=np.bool_), False, stop)


@_jit
def backward(weights, values, take, skip, h, stop):  # pragma: no cover - compiled
    top = len(h) - 1
    for j in range(len(weights) - 1, -1, -1):
        if stop[0] != 0:
            return
        w, v, t, s = weights[j], values[j], take[j], skip[j]
        for x in range(top + 1):
            best = h[x] if x <= s else -np.inf
            if x <= t and x + w <= top:
                candidate = h[x + w] + v
                if candidate > best:
                    best = candidate
            h[x] = best


@_jit
def fill_leaf(weights, values, take, skip, f, took, stop):  # pragma: no cover - compiled
    f[:] = 0.0
    _forward(weights, values, take, skip, f, took, True, stop)
