"""Hooks that record, during one forward+backward, which storages each candidate saves and keeps.

Module pre/post hooks keep a stack of the active candidates (the innermost wins); saved-tensor hooks
record every saved storage with its owner and a forward sequence number; during the backward, unpacking
a saved tensor tells which forward point the backward has reached (its "phase"), so that the live-memory
peak of each phase can be measured. At each phase's peak it also notes the storages alive there whatever
is checkpointed, because the model's own code holds them: those given to a candidate that nothing has
saved yet (as a decoder holds its mask), and those a candidate returned that its caller still holds,
saved or not (as Bloom's loop holds a block's attention weights through the next block's call). They
count once there, in the phase's measured extra: a checkpoint that keeps or drops them changes nothing.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

from lightning_ckpt._compat import autocast_enabled, tree_leaves
from lightning_ckpt.core.step_tracker import StepTracker
from lightning_ckpt.core.storage import storage_key, storage_of
from lightning_ckpt.core.wrapping import running_stat_buffers

FORWARD_END = "forward end"
"""The phase of the forward after every candidate has returned (the model's head and the loss): measured
apart from the candidates' part of the forward, since what is alive anyway there differs (a mask every
block takes is freed once the last block returns, unless a checkpoint keeps it)."""


@dataclass
class StorageRow:
    """What happened to one storage: its size, who saved it (and when), whose input it was (and when)."""

    nbytes: int
    key: int | None
    """The storage's :func:`~lightning_ckpt.core.storage.storage_key` while it lives, then None."""
    saves: list[tuple[str | None, int]] = field(default_factory=list)
    inputs: list[tuple[str, int]] = field(default_factory=list)
    forward_cached: bool = False
    """An autocast cast of a trainable parameter (see ``SavedStorage.forward_cached``)."""


class _Packed:
    """What the saved-tensor pack hook returns: the tensor and where it was saved. A saved view is kept as
    an alias of its storage that is not a view, and a tensor a candidate returns becomes one once it
    returns it (:meth:`Recorder._watch_returned`): so a returned object (a view's base included) lives
    only as long as the model's code holds it."""

    __slots__ = ("__weakref__", "owner", "seq", "tensor")

    def __init__(self, seq: int | None, owner: str | None, tensor: torch.Tensor) -> None:
        self.seq, self.owner, self.tensor = seq, owner, tensor


Watched = tuple[tuple[StorageRow, ...], tuple[StorageRow, ...]]
"""What a point notes as alive anyway: (inputs nothing has saved yet, returned storages the caller holds)."""


@dataclass
class _Call:
    """A candidate's call in the recorded forward, while it runs."""

    name: str
    flops_at_entry: int
    autocast_caches: bool
    live_at_entry: int
    peak_at_last_save: int | None = None
    """The peak live bytes from the call's start to its last save so far (None: no save yet)."""

    def recompute_bytes(self, module: nn.Module) -> int:
        """What recomputing the call in backward allocates at its peak above what is live when it starts:
        torch's early stop ends it at its last save, and it holds copies of the running statistics that
        :func:`~lightning_ckpt.core.wrapping.running_stats_frozen` restores after it (0 with no save:
        nothing unpacks it, so it never runs)."""
        if self.peak_at_last_save is None:
            return 0
        return max(self.peak_at_last_save - self.live_at_entry, 0) + running_stats_bytes(module)


class Recorder:
    """Collects storage rows, forward flops and backward phase peaks; see :meth:`recording`."""

    def __init__(
        self,
        modules: dict[str, nn.Module],
        excluded: set[int],
        flop_counter: FlopCounterMode,
        params: list[torch.Tensor] = (),
    ) -> None:
        self.modules = modules
        self.excluded = excluded  # storage keys of parameters and buffers
        self.flop_counter = flop_counter
        self.params = [p for p in params if p.requires_grad]
        self.tracker = StepTracker(cast_sources=_storage_keys(self.params))  # autocast caches their casts
        self.recompute_extra: dict[str, int] = dict.fromkeys(modules, 0)  # see `_Call.recompute_bytes`
        self.call_starts: list[tuple[int, str, int]] = []  # (sequence, candidate, live bytes) at each call
        self.call_unsaved: list[Watched] = []  # per call: `watched` then, less its own inputs
        self.seq = 0
        self.stack: list[_Call] = []  # the active candidates' calls, innermost last
        self.rows: list[StorageRow] = []
        self.flops: dict[str, int] = dict.fromkeys(modules, 0)
        self.in_backward = False  # set by `start_backward` when the forward has returned the loss
        self._counting_flops = contextlib.ExitStack()
        self.recomputed: set[str] = set()  # candidates called again in the backward (checkpointed already)
        self._called: set[str] = set()  # candidates called in the forward so far
        self._live_rows: dict[int, StorageRow] = {}
        self._unsaved: dict[int, StorageRow] = {}  # live rows given to a candidate, not saved yet (by key)
        self._held: dict[int, list] = {}  # returned rows the caller holds: id(row) -> [row, objects alive]
        self._packs: dict[int, list[weakref.ref[_Packed]]] = {}  # id(tensor) -> the packs holding it
        self._watched_now: Watched | None = ((), ())  # `watched`'s answer (None: to make again)
        self._saved_index: dict[int, int] | None = None  # see `alive_anyway`
        self.tracker.watched = self.watched

    def watched(self) -> Watched:
        """What the model's code holds alive now of the storages the memory model follows: the storages
        given to a candidate as inputs that nothing has saved yet, and those a candidate returned that the
        caller still holds."""
        if self._watched_now is None:
            held = tuple(row for row, _ in self._held.values() if row.key is not None)
            self._watched_now = (tuple(self._unsaved.values()), held)
        return self._watched_now

    def alive_anyway(self, watched: Watched, time: float) -> tuple[int, ...]:
        """Of the rows ``watched`` (noted at a point of forward time ``time``), the indices in
        :meth:`saved_rows` of those the point's extra counts (see :meth:`held_saved_bytes`): a checkpoint
        that keeps or drops them changes nothing there. Called once the recording is over."""
        index = self._index()
        unsaved, held = watched
        rows = [row for row in unsaved if not any(seq <= time for _, seq in row.saves)] + list(held)
        return tuple(sorted({index[id(row)] for row in rows if id(row) in index}))

    def held_saved_bytes(self, watched: Watched, time: float) -> int:
        """The bytes of the rows ``watched`` holds as returned storages that are also saved by ``time``:
        a point's measured peak less the saved bytes alive there leaves them out, and its extra counts them."""
        index = self._index()
        _, held = watched
        return sum(
            row.nbytes for row in held if id(row) in index and any(seq <= time for _, seq in row.saves)
        )

    def _index(self) -> dict[int, int]:
        if self._saved_index is None:
            self._saved_index = {id(row): i for i, row in enumerate(self.saved_rows())}
        return self._saved_index

    def _set_unsaved(self, row: StorageRow, unsaved: bool) -> None:
        if unsaved and row.key is not None and row.key not in self._unsaved:
            self._unsaved[row.key] = row
        elif not unsaved and self._unsaved.get(row.key) is row:
            del self._unsaved[row.key]
        else:
            return
        self._watched_now = None

    def _watch_returned(self, output: Any) -> None:
        """Follow each tensor a candidate returns whose storage is followed: from now on it is alive anyway
        for as long as the model's code holds the returned object (or a view of it). The packs holding that
        object get an alias of its storage instead, so that only the code's references keep it."""
        for tensor in {id(t): t for t in tree_leaves(output) if isinstance(t, torch.Tensor)}.values():
            storage = storage_of(tensor)
            row = None if storage is None else self._live_rows.get(storage_key(storage))
            if row is None:
                continue
            packs = [ref() for ref in self._packs.pop(id(tensor), ())]
            packs = [pack for pack in packs if pack is not None and pack.tensor is tensor]
            if packs:
                alias = tensor.detach()
                for pack in packs:
                    pack.tensor = alias
            entry = self._held.setdefault(id(row), [row, 0])
            entry[1] += 1
            weakref.finalize(tensor, self._dropped_by_caller, row).atexit = False
            self._watched_now = None

    def _dropped_by_caller(self, row: StorageRow) -> None:
        entry = self._held.get(id(row))
        if entry is not None and entry[0] is row:
            entry[1] -= 1
            if entry[1] == 0:
                del self._held[id(row)]
            self._watched_now = None

    def saved_rows(self) -> list[StorageRow]:
        """The rows of storages saved for backward or given to a candidate, less those resized in place:
        their memory is managed by their owner, not by autograd (FSDP2's unsharded parameters, freed
        after the forward and gathered again for the backward), and counts where it is live."""
        return [row for row in self.rows if row.key not in self.tracker.resized]

    def start_backward(self) -> None:
        """The forward has returned the loss: stop counting flops (the flop counter's module tracker would
        keep a recomputation's tensors alive to the end of the backward) and recording forward calls."""
        self.in_backward = True
        self._packs.clear()
        self._counting_flops.close()
        if _autocast_caches():  # the backward runs inside autocast: its cache holds the casts to the end
            for row in self.rows:
                if row.forward_cached:
                    row.saves = [(None, seq) for _, seq in row.saves]
                    row.forward_cached = False

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def _row(self, tensor: Any) -> StorageRow | None:
        storage = storage_of(tensor)
        if storage is None or storage_key(storage) in self.excluded:
            return None
        key = storage_key(storage)
        row = self._live_rows.get(key)
        if row is None:  # new storage (or a dead one's address reused: the finalizer dropped the old row)
            row = self._live_rows[key] = StorageRow(storage.nbytes(), key)
            self.rows.append(row)
            weakref.finalize(storage, self._forget, key).atexit = False
        return row

    def _forget(self, key: int) -> None:
        """The row's storage is freed: its key may name another storage from now on. Freed before the
        backward, its saves were made by a part of the graph that died in the forward (an output nothing
        used, as Qwen3-Next's chunked delta rule makes): nothing unpacks them, so they hold nothing past
        the storage's life, which the phases' measured peaks already count. Its inputs stay: a checkpoint
        of a candidate it was given to keeps it."""
        row = self._live_rows.pop(key, None)
        if row is not None:
            self._set_unsaved(row, False)
            row.key = None
            if not self.in_backward:
                row.saves.clear()

    def _pre_hook(self, name: str):
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if self.in_backward:  # a recomputation (the user's own checkpoint): a transient of the backward
                self.recomputed.add(name)
                return
            seq = self._next()
            self._called.add(name)
            if self.tracker.phase == FORWARD_END:  # not after all: a candidate runs again
                self.tracker.enter_phase(None)
            taken = [row for row in map(self._row, tree_leaves((args, kwargs))) if row is not None]
            own = {id(row) for row in taken}
            self.call_unsaved.append(
                tuple(tuple(row for row in rows if id(row) not in own) for rows in self.watched())
            )
            for row in taken:
                row.inputs.append((name, seq))
                self._set_unsaved(row, not row.saves)
            live = self.tracker.live_bytes
            self.stack.append(_Call(name, self.flop_counter.get_total_flops(), _autocast_caches(), live))
            self.call_starts.append((seq, name, self.tracker.live_bytes))
            self.tracker.open_window()

        return hook

    def _post_hook(self, name: str):
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            if self.in_backward:
                return
            self._next()
            self._watch_returned(output)
            while self.stack:  # always_call: also runs when the forward raised
                call = self.stack.pop()
                self.tracker.close_window()
                if call.name == name:
                    recompute = call.recompute_bytes(self.modules[name])
                    self.recompute_extra[name] = max(self.recompute_extra[name], recompute)
                    self.flops[name] += self.flop_counter.get_total_flops() - call.flops_at_entry
                    break
            if not self.stack and len(self._called) == len(self.modules):
                self.tracker.enter_phase(FORWARD_END)  # the forward's end (the head, the loss), apart

        return hook

    def _pack(self, tensor: torch.Tensor) -> _Packed:
        if self.in_backward:  # saved by a recomputation in the backward: not a forward save
            return _Packed(None, None, tensor)
        seq = self._next()
        call = self.stack[-1] if self.stack else None
        owner, caching = (None, False) if call is None else (call.name, call.autocast_caches)
        if call is not None:  # a recomputation stops at its last save (torch's early stop)
            call.peak_at_last_save = self.tracker.window_peak_bytes()
        storage = storage_of(tensor)
        row = self._row(tensor)
        if row is not None:
            row.saves.append((owner, seq))
            self._set_unsaved(row, False)
            if caching and storage is not None and storage_key(storage) in self.tracker.casts:
                row.forward_cached = True  # autocast's cache holds it to the end of the forward
        if row is not None and tensor._base is not None:  # a view holds its base: keep the storage only
            return _Packed(seq, owner, tensor.detach())
        packed = _Packed(seq, owner, tensor)
        if row is not None:
            self._packs.setdefault(id(tensor), []).append(weakref.ref(packed))
        return packed

    def _unpack(self, packed: _Packed) -> torch.Tensor:
        if packed.seq is not None and self.tracker.phase != (packed.seq, packed.owner):
            self.tracker.enter_phase((packed.seq, packed.owner))
        return packed.tensor

    @contextlib.contextmanager
    def recording(self) -> Iterator[Recorder]:
        """Install every hook and mode; all are removed on exit, also when the body raises."""
        handles = []
        try:
            for param in self.params:
                handles.append(param.register_post_accumulate_grad_hook(lambda p: self.tracker.land(p.grad)))
            for name, module in self.modules.items():
                handles.append(module.register_forward_pre_hook(self._pre_hook(name), with_kwargs=True))
                handles.append(  # first: the module's own forward, not what other hooks do after it
                    module.register_forward_hook(
                        self._post_hook(name), with_kwargs=True, always_call=True, prepend=True
                    )
                )
            with (
                self.tracker,
                torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack),
                self._counting_flops,
            ):
                self._counting_flops.enter_context(self.flop_counter)
                yield self
        finally:
            for handle in handles:
                handle.remove()


def running_stats_bytes(module: nn.Module) -> int:
    """Bytes of the copies of running statistics that a recomputation of ``module`` holds while it runs
    (:func:`~lightning_ckpt.core.wrapping.running_stats_frozen`: its norms in training that track them).

    Example:
        >>> running_stats_bytes(nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(16)))  # mean, var, count
        136
    """
    return sum(b.numel() * b.element_size() for b in running_stat_buffers(module))


def _storage_keys(tensors: list[torch.Tensor]) -> frozenset[int]:
    return frozenset(storage_key(s) for s in map(storage_of, tensors) if s is not None)


def _autocast_caches() -> bool:
    """Whether autocast is on with its cast cache (``torch.autocast(cache_enabled=True)``, the default;
    Lightning's mixed precision turns the cache off, so its casts live as their saves do)."""
    return autocast_enabled() and torch.is_autocast_cache_enabled()
