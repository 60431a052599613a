"""Storage identity and a live-storage allocation counter (a dispatch mode), for real and fake tensors.

Memory is counted per storage, once: views and tensors saved twice share one. A storage's Python object
is preserved by PyTorch for as long as the storage lives, so ``weakref.finalize`` on it fires exactly
when the memory is released. This works for CPU, CUDA and fake (meta) tensors alike.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Hashable, Iterable
from typing import Any

import torch

from lightning_ckpt import _compat
from lightning_ckpt._compat import FakeTensor, TorchDispatchMode, tree_leaves


def storage_of(tensor: Any) -> torch.UntypedStorage | None:
    """The untyped storage of a tensor, or ``None`` (not a tensor, or one without a storage)."""
    if not isinstance(tensor, torch.Tensor):
        return None
    try:
        return tensor.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):  # sparse, nested, some subclasses
        return None


def storage_key(storage: torch.UntypedStorage) -> int:
    """An id for the storage, stable while it is alive (the address of its C++ ``StorageImpl``)."""
    return _compat.storage_key(storage)


def unique_storage_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (non-tensors are ignored).

    Example:
        >>> x = torch.zeros(4)
        >>> unique_storage_bytes([x, x[1:], x.view(2, 2), torch.zeros(2, dtype=torch.float64)])
        32
    """
    seen: dict[int, int] = {}
    for tensor in tensors:
        storage = storage_of(tensor)
        if storage is not None:
            seen[storage_key(storage)] = storage.nbytes()
    return sum(seen.values())


class LiveStorageTracker(TorchDispatchMode):
    """Counts the bytes of storages created by ops inside the mode that are still alive.

    Storages that existed before (an op's output aliasing one of its inputs, views, in-place ops) are not
    counted, except the storages of ``existing`` tensors, counted from entry until they are freed (a
    model's parameters and gradients, an optimizer's state). ``count_fake=False`` leaves fake and meta
    tensors out (they take no memory). ``phase`` may be set from outside; ``phase_peak_bytes[phase]`` is the highest live count seen
    while that phase was current. Storages made by casting one of ``cast_sources`` (``aten._to_copy``, as
    autocast does to parameters) are listed in ``casts`` while they live.

    Example:
        >>> with LiveStorageTracker() as tracker:
        ...     a = torch.ones(256)       # 1 KiB
        ...     b = a * 2                 # 1 KiB more
        ...     del a                     # freed
        ...     c = b.view(16, 16)        # a view: no new storage
        >>> tracker.peak_bytes, tracker.live_bytes
        (2048, 1024)
    """

    def __init__(
        self,
        cast_sources: frozenset[int] = frozenset(),
        *,
        existing: Iterable[Any] = (),
        count_fake: bool = True,
    ) -> None:
        super().__init__()
        self.cast_sources = cast_sources
        self.count_fake = count_fake
        self._existing = list(existing)
        self.casts: set[int] = set()
        self.live_bytes = 0
        self.peak_bytes = 0
        self.phase: Hashable = None
        self.phase_peak_bytes: dict[Hashable, int] = {}
        self._tracked: dict[int, int] = {}
        self._lock = threading.RLock()  # a finalizer may run (garbage collection) while this thread holds it

    def __enter__(self) -> LiveStorageTracker:
        for storage in map(self._storage, self._existing):
            if storage is not None:
                self._track(storage, "entry")
        self._existing = []
        return super().__enter__()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = {storage_key(s) for s in map(self._storage, tree_leaves((args, kwargs))) if s is not None}
        for storage in map(self._storage, tree_leaves(out)):
            if storage is not None and storage_key(storage) not in inputs:
                self._track(storage, func)
                if func is torch.ops.aten._to_copy.default and self._casts_a_source(args):
                    self.casts.add(storage_key(storage))
        return out

    def _storage(self, tensor: Any) -> torch.UntypedStorage | None:
        if not self.count_fake and isinstance(tensor, torch.Tensor):
            if isinstance(tensor, FakeTensor) or tensor.device.type == "meta":
                return None
        return storage_of(tensor)

    def _admit(self, nbytes: int, where: Any) -> None:
        """Called before ``nbytes`` more become live (a subclass may refuse them)."""

    def _casts_a_source(self, args: tuple) -> bool:
        source = storage_of(args[0]) if args else None
        return source is not None and storage_key(source) in self.cast_sources

    def _track(self, storage: torch.UntypedStorage, where: Any) -> None:
        key, nbytes = storage_key(storage), storage.nbytes()
        with self._lock:
            if key in self._tracked:
                return
            self._admit(nbytes, where)
            self._tracked[key] = nbytes
            self.live_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            peak = self.phase_peak_bytes.get(self.phase, 0)
            self.phase_peak_bytes[self.phase] = max(peak, self.live_bytes)
        weakref.finalize(storage, self._release, key).atexit = False

    def _release(self, key: int) -> None:
        with self._lock:
            self.live_bytes -= self._tracked.pop(key, 0)
            self.casts.discard(key)
