"""Storage identity and a live-storage allocation counter (a dispatch mode), for real and fake tensors.

Memory is counted per storage, once: views and tensors saved twice share one. A storage's Python object
is preserved by PyTorch for as long as the storage lives, so ``weakref.finalize`` on it fires exactly
when the memory is released. This works for CPU, CUDA and fake (meta) tensors alike.

A wrapper tensor subclass holds no memory of its own: a ``DTensor`` is its local shard on this rank.
Its storages are those of its inner tensors (:func:`storages_of`), and the counter lets the subclass
turn each of its ops into ops on those inner tensors before it counts them. Storages whose size changes
in place (``UntypedStorage.resize_``: FSDP2 frees an unsharded parameter that way after the forward and
allocates it again before the backward) are counted at their current size.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Hashable, Iterable, Iterator
from typing import Any

import torch

from lightning_ckpt import _compat
from lightning_ckpt._compat import (
    FakeTensor,
    TorchDispatchMode,
    inner_tensors,
    is_traceable_wrapper_subclass,
    is_traceable_wrapper_subclass_type,
)


def storages_of(tensor: Any) -> list[torch.UntypedStorage]:
    """The untyped storages holding a tensor's memory: its own, or its inner tensors' for a wrapper
    subclass (a ``DTensor``'s local shard); ``[]`` for a non-tensor or a tensor without a storage."""
    if not isinstance(tensor, torch.Tensor):
        return []
    if is_traceable_wrapper_subclass(tensor):
        return [storage for inner in inner_tensors(tensor) for storage in storages_of(inner)]
    try:
        return [tensor.untyped_storage()]
    except (RuntimeError, NotImplementedError, TypeError):  # sparse, nested, some subclasses
        return []


def storage_of(tensor: Any) -> torch.UntypedStorage | None:
    """The one untyped storage of a tensor (a ``DTensor``'s: its local shard's), or ``None`` (not a
    tensor, one without a storage, or a subclass holding several)."""
    storages = storages_of(tensor)
    return storages[0] if len(storages) == 1 else None


def local_bytes(tensor: torch.Tensor) -> int:
    """Bytes of a tensor's elements on this rank: a ``DTensor``'s local shard, any other tensor whole.

    Example:
        >>> local_bytes(torch.zeros(3, 4))
        48
    """
    if is_traceable_wrapper_subclass(tensor):
        return sum(local_bytes(inner) for inner in inner_tensors(tensor))
    return tensor.numel() * tensor.element_size()


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
        for storage in storages_of(tensor):
            seen[storage_key(storage)] = storage.nbytes()
    return sum(seen.values())


class LiveStorageTracker(TorchDispatchMode):
    """Counts the bytes of storages created by ops inside the mode that are still alive.

    Storages that existed before (an op's output aliasing one of its inputs, views, in-place ops) are not
    counted, except the storages of ``existing`` tensors, counted from entry until they are freed (a
    model's parameters and gradients, an optimizer's state). ``count_fake=False`` leaves fake and meta
    tensors out (they take no memory). A storage resized inside the mode counts at its new size from then
    on (one that grows from nothing is new memory); ``resized`` lists the live storages that were. ``phase``
    may be set from outside; ``phase_peak_bytes[phase]`` is the highest live count seen while that phase
    was current. Storages made by casting one of ``cast_sources`` (``aten._to_copy``, as
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
        self.resized: set[int] = set()
        self._tracked: dict[int, int] = {}
        self._lock = threading.RLock()  # a finalizer may run (garbage collection) while this thread holds it

    def __enter__(self) -> LiveStorageTracker:
        self.count_existing(self._existing)
        self._existing = []
        _watch_resizes(self)
        try:
            return super().__enter__()
        except BaseException:
            _unwatch_resizes(self)
            raise

    def __exit__(self, *exc_info: Any) -> None:
        try:
            super().__exit__(*exc_info)
        finally:
            _unwatch_resizes(self)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if _has_wrapper_subclass(types):
            return NotImplemented  # a DTensor op: its ops on local tensors come back through this mode
        if func is _PRIM_DEVICE and type(args[0]) is FakeTensor:
            return fake_device(args[0])  # C++ asking a fake tensor its device: thousands a step
        out = func(*args, **(kwargs or {}))
        if _makes_no_storage(func):  # a view, an in-place op, or no tensor out (`tensor.device`)
            return out
        inputs = {storage_key(s) for t in _leaves((args, kwargs)) for s in self._storages(t)}
        for storage in (s for t in _leaves(out) for s in self._storages(t)):
            if storage_key(storage) not in inputs:
                self._track(storage, func)
                if func is torch.ops.aten._to_copy.default and self._casts_a_source(args):
                    self.casts.add(storage_key(storage))
        return out

    def count_existing(self, tensors: Iterable[Any]) -> None:
        """Count the storages of ``tensors`` from now on until they are freed (ones made where no op ran,
        e.g. optimizer state loaded from a checkpoint); storages counted already are left as they are."""
        for tensor in tensors:
            for storage in self._storages(tensor):
                self._track(storage, "existing")

    def _storages(self, tensor: Any) -> list[torch.UntypedStorage]:
        if not isinstance(tensor, torch.Tensor):
            return []
        if is_traceable_wrapper_subclass(tensor):
            return [storage for inner in inner_tensors(tensor) for storage in self._storages(inner)]
        if not self.count_fake and (isinstance(tensor, FakeTensor) or tensor.device.type == "meta"):
            return []
        return storages_of(tensor)

    def admit_resize(self, storage: torch.UntypedStorage, nbytes: int) -> None:
        """Called before ``storage`` is resized to ``nbytes``: what it would add is admitted (a subclass may
        refuse it, and then no tracker counts the resize and it does not happen)."""
        if self._counts(storage):
            growth = nbytes - self._tracked.get(storage_key(storage), 0)
            if growth > 0:
                self._admit(growth, "UntypedStorage.resize_")

    def resized_to(self, storage: torch.UntypedStorage, nbytes: int) -> None:
        """Called once ``storage`` is admitted at ``nbytes``: it counts at that size from now on."""
        if not self._counts(storage):
            return
        key = storage_key(storage)
        with self._lock:
            old = self._tracked.get(key)
            if old is None and nbytes > 0:  # not counted yet: new memory, from now on at its new size
                self._tracked[key] = nbytes
                self._grow(nbytes)
                weakref.finalize(storage, self._release, key).atexit = False
            elif old is not None:
                self._tracked[key] = nbytes
                self._grow(nbytes - old)
            if key in self._tracked:
                self.resized.add(key)

    def _counts(self, storage: torch.UntypedStorage) -> bool:
        return self.count_fake or storage.device.type != "meta"

    def _admit(self, nbytes: int, where: Any) -> None:
        """Called before ``nbytes`` more become live (a subclass may refuse them)."""

    def _casts_a_source(self, args: tuple) -> bool:
        """Whether ``args[0]`` is a cast source: one of ``cast_sources``, or a storage resized in the mode
        (an unsharded parameter FSDP2 gathered: autocast caches its casts as it does a parameter's)."""
        source = storage_of(args[0]) if args else None
        key = None if source is None else storage_key(source)
        return key is not None and (key in self.cast_sources or key in self.resized)

    def _track(self, storage: torch.UntypedStorage, where: Any, nbytes: int | None = None) -> None:
        key = storage_key(storage)
        nbytes = storage.nbytes() if nbytes is None else nbytes
        with self._lock:
            if key in self._tracked:
                return
            self._admit(nbytes, where)
            self._tracked[key] = nbytes
            self._grow(nbytes)
        weakref.finalize(storage, self._release, key).atexit = False

    def _grow(self, nbytes: int) -> None:
        """``nbytes`` more are live (fewer if negative); the peaks follow (called under the lock)."""
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        peak = self.phase_peak_bytes.get(self.phase, 0)
        self.phase_peak_bytes[self.phase] = max(peak, self.live_bytes)

    def _release(self, key: int) -> None:
        with self._lock:
            self.live_bytes -= self._tracked.pop(key, 0)
            self.casts.discard(key)
            self.resized.discard(key)  # the key may name another storage from now on


_PRIM_DEVICE = torch.ops.prim.device.default


def fake_device(tensor: FakeTensor) -> torch.device:
    """The device a fake tensor answers, as FakeTensorMode's own handler of ``prim.device`` gives it
    (meta while its mode runs a kernel), without the dispatch through the modes below this one.

    Example:
        >>> from lightning_ckpt._compat import FakeTensorMode
        >>> with FakeTensorMode() as mode:
        ...     fake = mode.from_tensor(torch.ones(2))
        >>> fake_device(fake)
        device(type='cpu')
    """
    return torch.device("meta") if tensor.fake_mode.in_kernel_invocation else tensor.fake_device


_makes_no_storage_of: dict[Any, bool] = {}
_MAKES_STORAGE = frozenset({"aten::lift_fresh"})
"""Ops whose output aliases an input by their schema but may hold a new storage (a constant made fake)."""


def _makes_no_storage(func: Any) -> bool:
    """Whether no output of ``func`` can hold a new storage, by its schema, once per op: every output is
    (a view of) one of its tensor inputs (alias annotations ``Tensor(a)``, ``Tensor(a!)``: views and
    in-place ops), or none is a tensor (``prim.device``, which a fake forward asks on nearly every op)."""
    known = _makes_no_storage_of.get(func)
    if known is None:
        schema = getattr(func, "_schema", None)
        known = _makes_no_storage_of[func] = (
            schema is not None
            and schema.name not in _MAKES_STORAGE
            and all(ret.alias_info is not None or not _may_be_tensor(ret.type) for ret in schema.returns)
        )
    return known


def _may_be_tensor(schema_type: Any) -> bool:
    """Whether a schema return type can hold a tensor: any but those built of plain values only (``Device``,
    ``int``, ``List[int]``, ``Optional[str]``...; a type variable ``t`` or a class may hold one)."""
    return not set(re.findall(r"[A-Za-z_][\w.]*", str(schema_type))) <= _PLAIN_TYPES


_PLAIN_TYPES = frozenset(
    "bool int float complex number str Device NoneType Generator QScheme Layout ScalarType MemoryFormat"
    " Scalar SymInt SymFloat SymBool List Optional Tuple".split()
)


_wrapper_types_of: dict[tuple, bool] = {}


def _has_wrapper_subclass(types: Any) -> bool:
    """Whether one of an op's ``types`` is a wrapper tensor subclass (a ``DTensor``), once per ``types``."""
    known = _wrapper_types_of.get(types)
    if known is None:
        known = any(is_traceable_wrapper_subclass_type(cls) for cls in types)
        if isinstance(types, tuple):
            _wrapper_types_of[types] = known
    return known


def _leaves(tree: Any) -> Iterator[Any]:
    """The leaves of an op's arguments or outputs (tuples, lists and dicts of them, as ``tree_leaves``
    flattens them), without ``pytree``'s per-node dispatch: the counter runs on every op."""
    if isinstance(tree, (tuple, list)):
        for item in tree:
            yield from _leaves(item)
    elif isinstance(tree, dict):
        for item in tree.values():
            yield from _leaves(item)
    else:
        yield tree


_watchers: list[LiveStorageTracker] = []  # the trackers counting now, outermost first
_watchers_lock = threading.Lock()


def _watch_resizes(tracker: LiveStorageTracker) -> None:
    """While any tracker counts, ``UntypedStorage.resize_`` tells each one before it resizes."""
    with _watchers_lock:
        if not _watchers:
            torch.UntypedStorage.resize_ = _resize_watched
        _watchers.append(tracker)


def _unwatch_resizes(tracker: LiveStorageTracker) -> None:
    with _watchers_lock:
        if tracker in _watchers:
            _watchers.remove(tracker)
        if not _watchers:
            torch.UntypedStorage.resize_ = _compat.original_storage_resize


def _resize_watched(storage: torch.UntypedStorage, size: int) -> Any:
    nbytes, watchers = int(size), list(_watchers)
    if nbytes != storage.nbytes():
        for tracker in watchers:  # every one admits it before any counts it
            tracker.admit_resize(storage, nbytes)
        for tracker in watchers:
            tracker.resized_to(storage, nbytes)
    return _compat.original_storage_resize(storage, size)
