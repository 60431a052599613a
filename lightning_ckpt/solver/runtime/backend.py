"""The one choice of DP back end, numba or numpy, that every engine's kernels follow.

Each engine keeps two interchangeable kernel modules that compute bit-identical results: a pure
numpy one, always importable, and a numba one (compiled once, cached on disk, releasing the GIL).
This module decides, per call, which of the two runs:

- ``KERNEL`` is ``"numba"`` when numba is installed and ``LIGHTNING_CKPT_NO_NUMBA`` is unset (or
  ``0``), else ``"numpy"``; it names the back end of large problems (``SolveStats.kernel``);
- numba is imported (and its cached kernels loaded) only when a call of at least ``NUMPY_MAX_CELLS``
  DP cells comes; once it is loaded, every call of every engine uses it, small ones too;
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

__all__ = ["CAPPED_NUMBA", "DENSE_NUMBA", "KERNEL", "NUMPY_MAX_CELLS", "compiled", "load_numba"]

DENSE_NUMBA = "lightning_ckpt.solver.dense._kernels_numba"
"""The uncapped dense engine's numba kernels (twins of ``dense._kernels_numpy``)."""
CAPPED_NUMBA = "lightning_ckpt.solver.capped._kernels_numba"
"""The capped dense engine's numba kernels (twins of the numpy code in ``capped.profile``)."""


def _numba_wanted() -> bool:
    if os.environ.get("LIGHTNING_CKPT_NO_NUMBA", "") not in ("", "0"):
        return False
    return importlib.util.find_spec("numba") is not None


KERNEL: str = "numba" if _numba_wanted() else "numpy"

NUMPY_MAX_CELLS = 1 << 22
"""Until numba is loaded, calls below this many DP cells (~20 ms in numpy) run the numpy kernels
(bit-identical) rather than pay numba's import and cache load (~0.5 s) in a fresh process."""

_LOADED: dict[str, ModuleType | None] = {}  # numba kernel module name -> module, None if broken


def compiled(cells: int, module: str) -> ModuleType | None:
    """The numba kernel module ``module`` (a dotted name) for a call of ``cells`` DP cells, or None
    where numpy runs: numba is off, the call is small and numba not loaded yet, or ``module``
    fails to import."""
    if KERNEL == "numpy" or (cells < NUMPY_MAX_CELLS and not _LOADED):
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
