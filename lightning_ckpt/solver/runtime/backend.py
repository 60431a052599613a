"""The one choice of DP back end, numba or numpy, that every engine's kernels follow.

Each engine keeps two interchangeable kernel modules that compute bit-identical results: a pure
numpy one, always importable, and a numba one (compiled once, cached on disk, releasing the GIL).
This module decides, per call, which of the two runs:

- ``KERNEL`` is ``"numba"`` when numba is installed and ``LIGHTNING_CKPT_NO_NUMBA`` is unset (or
  ``0``), else ``"numpy"``; it names the back end of large problems (``SolveStats.kernel``);
- numba is imported (and its cached kernels loaded) once the numpy kernels' work in this process,
  the call at hand included, would pass what loading numba costs (``NUMBA_LOAD_S``, estimated
  from the calls' DP cells at ``NUMPY_S_PER_CELL``; the uncapped engine also counts each item's
  fixed numpy cost as cells, ``dense.profile.NUMPY_CELLS_PER_ITEM``): the ski-rental rule, never
  more than about twice the better of "numpy throughout" and "numba from the start" whatever calls
  come next. Small solves (callback-sized, ``torch.compile``-sized) thus never pay numba's load in a
  fresh process (a few thousand of them do, once their numpy time would have); a large one loads it
  at once. Once it is loaded, every call of every engine uses it;
- a numba kernel module that fails to import (numba present but broken, or unable to compile:
  ``jit.py``) counts as absent: its engine stays on numpy, with one warning that says why.

``compiled(cells, module)`` answers for an engine (``DENSE_NUMBA`` or ``CAPPED_NUMBA``): the numba
module to call, or None for numpy; ``load_numba()`` loads both now (benchmarks: steady-state times).

Example:
    >>> KERNEL in ("numba", "numpy")
    True
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import warnings
from types import ModuleType

__all__ = [
    "CAPPED_NUMBA",
    "DENSE_NUMBA",
    "KERNEL",
    "NUMBA_LOAD_S",
    "NUMPY_S_PER_CELL",
    "compiled",
    "load_numba",
]

DENSE_NUMBA = "lightning_ckpt.solver.dense._kernels_numba"
"""The uncapped dense engine's numba kernels (twins of ``dense._kernels_numpy``)."""
CAPPED_NUMBA = "lightning_ckpt.solver.capped._kernels_numba"
"""The capped dense engine's numba kernels (twins of the numpy code in ``capped.profile``)."""


def _numba_wanted() -> bool:
    if os.environ.get("LIGHTNING_CKPT_NO_NUMBA", "") not in ("", "0"):
        return False
    return importlib.util.find_spec("numba") is not None


KERNEL: str = "numba" if _numba_wanted() else "numpy"

NUMBA_LOAD_S = 1.2
"""Seconds a fresh process pays to load numba and the kernels from the on-disk cache: measured on
the 2-core VM, 0.55-0.6 s ``import numba``, 0.17 s the kernel modules, 0.4-0.85 s the first calls'
cache loads (a cold cache compiles for ~2.6 s more)."""
NUMPY_S_PER_CELL = {DENSE_NUMBA: 1.5e-9, CAPPED_NUMBA: 6e-9}
"""Seconds per DP cell of each engine's numpy kernels (measured: uncapped 1.2-1.8 ns against numba's
0.4-0.55 ns; capped 6-8 ns against 2.3 ns)."""

_LOADED: dict[str, ModuleType | None] = {}  # numba kernel module name -> module, None if broken
_NUMPY_S = [0.0]  # estimated seconds the numpy kernels have run in this process


def compiled(cells: int, module: str) -> ModuleType | None:
    """The numba kernel module ``module`` (a dotted name) for a call of ``cells`` DP cells, or None
    where numpy runs: numba is off, not loaded yet and the numpy work so far with this call's
    stays under ``NUMBA_LOAD_S``, or ``module`` fails to import."""
    if KERNEL == "numpy":
        return None
    if not _LOADED:
        numpy_s = _NUMPY_S[0] + cells * NUMPY_S_PER_CELL[module]
        if numpy_s < NUMBA_LOAD_S:
            _NUMPY_S[0] = numpy_s
            return None
    if module not in _LOADED:
        try:
            _LOADED[module] = importlib.import_module(module)
        except Exception as exc:  # numba present but broken: numpy computes the same bits
            _LOADED[module] = None
            _warn_numpy(module, exc)
    return _LOADED[module]


def _warn_numpy(module: str, exc: Exception) -> None:
    if any(loaded is None for name, loaded in _LOADED.items() if name != module):
        return  # one warning per process
    warnings.warn(
        f"the knapsack solver's numba kernels cannot be loaded ({type(exc).__name__}: {exc}); "
        "using its numpy kernels instead (same results, slower on large problems)",
        RuntimeWarning,
        stacklevel=4,
    )


def load_numba() -> None:
    """Load every engine's numba kernels now, whatever the size of the next call (when ``KERNEL`` is
    ``"numba"``; a no-op otherwise)."""
    for module in (DENSE_NUMBA, CAPPED_NUMBA):
        compiled(1 << 62, module)
