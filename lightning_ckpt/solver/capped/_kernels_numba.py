"""Numba twins of ``profile.py``'s item updates: compiled loops, bit-identical results.

Each cell takes the larger of the same two sums as the numpy version (``-inf`` where a cap or the
capacity forbids a choice), reading the profile before the item: forward profiles with decision
bits update cells downward; ``forward`` goes down in blocks of at most ``w`` cells (a block's
sources lie below it) with branch-free loops between the caps' bounds (3-5x faster, measured);
backward profiles update upward. Each kernel returns early, its profile unfinished, once
``stop[0]`` is set (checked before each item, and by ``forward`` before each block). Imported only
for large problems (``runtime.backend`` decides).
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
    """The forward profile without decision bits: per item, cells ``c >= w`` in blocks of at most
    ``w`` from the top (a block's sources lie below it, unwritten yet), then the cells below ``w``.
    The caps' constant reads (``f[skip]``, ``f[take] + v``) are taken before the item; ``stop`` is
    checked before each block."""
    top = len(f) - 1
    for j in range(len(weights)):
        w, v, t, s = weights[j], values[j], take[j], skip[j]
        skipped = f[min(s, top)] if s >= 0 else -np.inf  # f[min(c, s)] for every c > s
        taken = f[min(t, top)] + v if t >= 0 else -np.inf  # f[min(c - w, t)] + v for c - w > t
        hi = top + 1
        if t >= 0:
            while hi > w or (w == 0 and hi > 0):
                if stop[0] != 0:
                    return
                lo = max(w, hi - w) if w > 0 else 0
                _forward_cells(f, w, v, t, s, skipped, taken, lo, hi)
                hi = lo
        if stop[0] != 0:
            return
        for c in range(max(s + 1, 0), min(hi, top + 1)):  # no room for the item: the skip cap only
            f[c] = skipped


@_jit
def _forward_cells(f, w, v, t, s, skipped, taken, lo, hi):  # pragma: no cover - compiled
    """One item on cells ``lo..hi - 1`` (``hi - lo <= w``, or every cell when ``w == 0``): the
    better of skipping (``f[c]``, or ``skipped`` above the cap) and taking (``f[c - w] + v``, or
    ``taken`` above the cap); taking only where strictly better, as in ``_forward``. The range is
    cut where the caps start to bind, so that each piece is a branch-free loop."""
    skip_end = min(max(s + 1, lo), hi)  # cells below it read f[c] when skipping
    take_end = min(max(t + w + 1, lo), hi)  # cells below it read f[c - w] when taking
    first, second = min(skip_end, take_end), max(skip_end, take_end)
    for c in range(lo, first):
        candidate, best = f[c - w] + v, f[c]
        f[c] = candidate if candidate > best else best  # a store on every cell: vectorized
    if skip_end < take_end:  # above the skip cap, below the take cap
        for c in range(first, second):
            candidate = f[c - w] + v
            f[c] = candidate if candidate > skipped else skipped
    else:  # below the skip cap, above the take cap
        for c in range(first, second):
            best = f[c]
            f[c] = taken if taken > best else best
    best = skipped if taken <= skipped else taken
    for c in range(second, hi):
        f[c] = best


@_jit
def backward(weights, values, take, skip, h, stop):  # pragma: no cover - compiled
    """The backward profile, last item first, each in one upward sweep (a cell's source ``h[x + w]``
    lies above it, unwritten yet) cut where the caps start to bind, so each piece is branch-free."""
    top = len(h) - 1
    for j in range(len(weights) - 1, -1, -1):
        if stop[0] != 0:
            return
        w, v, t, s = weights[j], values[j], take[j], skip[j]
        skip_end = min(max(s + 1, 0), top + 1)  # cells below it may skip the item
        take_end = min(max(min(t, top - w) + 1, 0), top + 1)  # cells below it may take it
        first, second = min(skip_end, take_end), max(skip_end, take_end)
        for x in range(first):
            candidate, best = h[x + w] + v, h[x]
            h[x] = candidate if candidate > best else best
        if skip_end < take_end:  # must take it
            for x in range(first, second):
                h[x] = h[x + w] + v
        # else: cells first..second - 1 may only skip it, and keep their value
        for x in range(second, top + 1):
            h[x] = -np.inf


@_jit
def fill_leaf(weights, values, take, skip, f, took, stop):  # pragma: no cover - compiled
    f[:] = 0.0
    _forward(weights, values, take, skip, f, took, True, stop)
