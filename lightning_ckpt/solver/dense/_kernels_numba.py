"""Numba DP kernels: fused, in-place, GIL-free, compiled once and cached on disk.

Importing this module raises ``ImportError`` when numba is missing; ``profile.py`` then falls
back to ``_kernels_numpy`` (``runtime.backend`` decides). Results are bit-identical to the numpy twins.

The per-item update ``dp[j] = max(dp[j], dp[j - w] + v)`` must read the profile *before* the
item. Scanning ``j`` downward guarantees that; equivalently, blocks of at most ``w`` entries
can be processed upward (their sources lie entirely below them), which lets LLVM vectorize.
"""

from __future__ import annotations

import sys

import numpy as np

from lightning_ckpt.solver.dense import _kernels_numpy
from lightning_ckpt.solver.runtime.jit import kernel_jit

if sys.byteorder != "little":  # the leaf's bit packing reads bytes as a little-endian word
    raise ImportError("the numba kernels pack decision bits for little-endian machines only")

_jit = kernel_jit()


@_jit
def _apply(out, w, v, hi):  # pragma: no cover - compiled
    """One item on ``out[:hi + 1]``."""
    if w == 0:
        for j in range(hi + 1):
            c = out[j] + v
            if c > out[j]:
                out[j] = c
    else:
        _apply_range(out, w, v, w, hi + 1)


_PACK = np.uint64(0x0102040810204080)
"""Times eight bytes of 0 or 1 read as a little-endian uint64: byte ``k`` lands on bit ``56 + k``
(the other products fall on distinct lower bits, so nothing carries into the top byte)."""


@_jit
def _apply_recording(out, w, v, hi, bits, keep):  # pragma: no cover - compiled
    """One item on ``out[:hi + 1]``, setting bit ``j`` of ``bits`` (zeros) where it improved
    ``out[j]``: blocks of <= w entries, top block first, as ``_apply_range`` (the loop vectorizes),
    each decision a byte of ``keep`` (the scratch row, a multiple of 8 bytes), then packed eight
    at a time. A zero weight takes the scalar loop."""
    if w == 0:
        for j in range(hi + 1):
            c = out[j] + v
            if c > out[j]:
                out[j] = c
                bits[j >> 3] |= np.uint8(1 << (j & 7))
        return
    top = hi + 1
    while top > w:
        bottom = max(w, top - w)
        src = out[bottom - w : top - w]
        dst = out[bottom:top]
        kept = keep[bottom:top]
        for t in range(top - bottom):
            c = src[t] + v
            old = dst[t]
            kept[t] = c > old
            dst[t] = c if c > old else old
        top = bottom
    first, last = w >> 3, hi >> 3
    keep[first * 8 : w] = 0
    keep[hi + 1 : last * 8 + 8] = 0
    words = keep.view(np.uint64)
    for b in range(first, last + 1):
        bits[b] = np.uint8((words[b] * _PACK) >> np.uint64(56))


@_jit
def _apply_range(out, w, v, lo, up):  # pragma: no cover - compiled
    """One item (weight ``w`` >= 1) on ``out[lo:up]``, blocks of <= w entries, top block first."""
    top = up
    while top > lo:
        bottom = max(lo, top - w)
        src = out[bottom - w : top - w]
        dst = out[bottom:top]
        for t in range(top - bottom):
            c = src[t] + v
            if c > dst[t]:
                dst[t] = c
        top = bottom


@_jit
def _apply_group(out, group_w, group_v, k_items, hi, tile):  # pragma: no cover - compiled
    """Items of one group (weights >= 1) on ``out[:hi + 1]`` in one sweep over memory.

    Item ``k`` works on a tile ``offsets[k] = w_1 + ... + w_k`` above item ``k - 1``'s: it
    then reads only cells item ``k - 1`` has finished, and writes only cells item ``k - 1``
    no longer reads. When the active window (``sum(w) + tile`` cells) fits in cache, each sweep
    moves the profile through memory once for ``k_items`` items; when it does not, each item
    still reads its sources from the tile item ``k - 1`` just wrote (16 bytes per cell moved
    instead of 24).
    """
    offsets = np.empty(k_items, dtype=np.int64)
    offsets[0] = 0
    lag = -group_w[0]
    for k in range(1, k_items):
        offsets[k] = offsets[k - 1] + group_w[k]
        lag = max(lag, offsets[k] - group_w[k])
    top = hi + 1
    while True:
        for k in range(k_items):
            lo = max(group_w[k], top - tile + offsets[k])
            up = min(hi + 1, top + offsets[k])
            if up > lo:
                _apply_range(out, group_w[k], group_v[k], lo, up)
        if top - tile + lag <= 0:
            return
        top -= tile


@_jit
def extend(weights, values, capacity, out, reach, window, k_max, tile, stop):  # pragma: no cover - compiled
    """Apply the items to ``out``, whose entries ``0..reach`` hold a profile; return the new
    reach (entries above it are left unfilled). Returns early, the profile unfinished, once
    ``stop[0]`` is set (checked before each group of items)."""
    group_w = np.empty(k_max, dtype=np.int64)
    group_v = np.empty(k_max, dtype=np.float64)
    i, n = 0, len(weights)
    while i < n and stop[0] == 0:
        k, total = 0, 0
        while i < n and k < k_max:
            w = weights[i]
            if w > capacity:
                i += 1
                continue
            # Close a group that fits the window (cache) and would overflow it; a single item
            # gains nothing from fitting, so it and heavier items stream together instead.
            if k > 0 and (w == 0 or group_w[0] == 0 or (k > 1 and total <= window < total + w)):
                break
            group_w[k], group_v[k] = w, values[i]
            total += w
            k += 1
            i += 1
        if k == 0:
            break
        new_reach = min(capacity, reach + total)
        out[reach + 1 : new_reach + 1] = out[reach]
        if k == 1:
            _apply(out, group_w[0], group_v[0], new_reach)
        else:
            _apply_group(out, group_w, group_v, k, new_reach, tile)
        reach = new_reach
    return reach


@_jit
def fill_leaf(weights, values, capacity, out, keep_bits, stop):  # pragma: no cover - compiled
    out[0] = 0.0
    reach = 0
    keep = np.zeros(8 * keep_bits.shape[1], dtype=np.uint8)
    for i in range(len(weights)):
        w = weights[i]
        if stop[0] != 0:
            return
        if w > capacity:
            continue
        new_reach = min(capacity, reach + w)
        out[reach + 1 : new_reach + 1] = out[reach]
        _apply_recording(out, w, values[i], new_reach, keep_bits[i], keep)
        reach = new_reach
    out[reach + 1 : capacity + 1] = out[reach]


@_jit
def best_split(left, right, capacity):  # pragma: no cover - compiled
    best_value = -np.inf
    best_c = 0
    for c in range(capacity + 1):
        s = left[c] + right[capacity - c]
        if s > best_value:
            best_value = s
            best_c = c
    return best_c


backtrack = _jit(_kernels_numpy.backtrack_loops)
