"""The numba decorator of every kernel: cached on disk where numba can write a cache, else in memory.

``numba.njit(cache=True)`` needs a writable cache directory even to load a cached kernel: the
user's ``NUMBA_CACHE_DIR`` first, then ``__pycache__`` beside the source, then the user-wide
cache (``$XDG_CACHE_HOME`` or ``~/.cache``). A read-only install with a read-only HOME has none,
and numba raises ``RuntimeError`` when the kernel module is imported. ``kernel_jit()`` decorates
each kernel in the order numba's own locators allow:

1. ``cache=True`` when any cache directory works (``NUMBA_CACHE_DIR`` honoured, as numba does);
2. else ``cache=False``: compiled in memory, once per process, with one ``RuntimeWarning`` per
   process that says so and how to fix it (``NUMBA_CACHE_DIR``);
3. where numba cannot even build the decorator, ``ImportError``: the engine's kernel module then
   fails to import and ``backend.compiled`` runs the bit-identical numpy kernels (with one warning).

Example:
    >>> decorate = kernel_jit()  # then ``@decorate`` on each kernel of a file of kernels
    >>> callable(decorate)
    True
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable

__all__ = ["IN_MEMORY_WARNING", "kernel_jit"]

IN_MEMORY_WARNING = "numba cannot cache the knapsack solver's compiled kernels"
"""The start of the one warning issued when the kernels are compiled in memory (workers filter it)."""

_WARNED = threading.Event()  # one warning per process


def kernel_jit() -> Callable[[Callable], Callable]:
    """A decorator that compiles a kernel with ``numba.njit(nogil=True)``, cached on disk if possible.

    Raises:
        ImportError: when numba is missing or cannot build the decorator (the engine then runs numpy).
    """
    try:
        import numba
    except Exception as exc:  # a broken numba counts as a missing one
        raise ImportError(f"numba cannot be imported: {exc}") from exc

    def decorate(func: Callable) -> Callable:
        try:
            return numba.njit(cache=True, nogil=True)(func)
        except RuntimeError as exc:  # "cannot cache function ...: no locator available for file ..."
            if "cannot cache" not in str(exc):
                raise ImportError(f"numba cannot compile {func.__qualname__}: {exc}") from exc
            _warn_in_memory(func)
        try:
            return numba.njit(cache=False, nogil=True)(func)
        except Exception as exc:
            raise ImportError(f"numba cannot compile {func.__qualname__}: {exc}") from exc

    return decorate


def _warn_in_memory(func: Callable) -> None:
    if _WARNED.is_set():
        return
    _WARNED.set()
    source = getattr(func.__code__, "co_filename", "?")
    warnings.warn(
        f"{IN_MEMORY_WARNING} (no writable cache directory for {source}: not NUMBA_CACHE_DIR, its "
        "__pycache__, nor the user cache); compiling them in memory in each process instead (a few "
        "seconds per process; results unchanged). Set NUMBA_CACHE_DIR to a writable directory to cache them",
        RuntimeWarning,
        stacklevel=3,
    )
