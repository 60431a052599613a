"""Numba DP kernels: fused, in-place, GIL-free, compiled once and cached on disk.

Importing this module raises ``ImportError`` when numba is missing; ``profile.py`` then falls
back to ``_kernels_numpy``. Results are bit-identical to the numpy twins.

The per-item update ``dp[j] = max(dp[j], dp[j - w] + v)`` must read the profile *before* the
item. Scanning ``j`` downward guarantees that; equivalently, blocks of at most ``w`` entries
can be processed upward (their sources lie entirely below them), which lets LLVM vectorize.
"""

from __future__ import annotations

import numba
import numpy as np

from lightning_ckpt.solver import _kernels_numpy

_jit = numba.njit(cache=True, nogil=True)


@_jit
def _apply(out, w, v, hi):  # pragma: no cover - compiled
    if w == 0:
        for j in range(hi + 1):
            c = out[j] + v
            if c > out[j]:
                out[j] = c
        return
    top = hi + 1
    while top > w:
        lo = max(w, top - w)
        src = out[lo - w : top - w]
        dst = out[lo:top]
        for t in range(top - lo):
            c = src[t] + v
            if c > dst[t]:
                dst[t] = c
        top = lo


@_jit
def _apply_recording(out, w, v, hi, bits):  # pragma: no cover - compiled
    for j in range(hi, w - 1, -1):
        c = out[j - w] + v
        if c > out[j]:
            out[j] = c
            bits[j >> 3] |= np.uint8(1 << (j & 7))


@_jit
def profile(weights, values, capacity, out):  # pragma: no cover - compiled
    out[0] = 0.0
    reach = 0
    for i in range(len(weights)):
        w = weights[i]
        if w > capacity:
            continue
        new_reach = min(capacity, reach + w)
        out[reach + 1 : new_reach + 1] = out[reach]
        _apply(out, w, values[i], new_reach)
        reach = new_reach
    out[reach + 1 : capacity + 1] = out[reach]


@_jit
def fill_leaf(weights, values, capacity, out, keep_bits):  # pragma: no cover - compiled
    out[0] = 0.0
    reach = 0
    for i in range(len(weights)):
        w = weights[i]
        if w > capacity:
            continue
        new_reach = min(capacity, reach + w)
        out[reach + 1 : new_reach + 1] = out[reach]
        _apply_recording(out, w, values[i], new_reach, keep_bits[i])
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


backtrack = _jit(_kernels_numpy.backtrack)
