"""Hooks that record, during one forward+backward, which storages each candidate saves and keeps.

Module pre/post hooks keep a stack of the active candidates (the innermost wins); saved-tensor hooks
record every saved storage with its owner and a forward sequence number; during the backward, unpacking
a saved tensor tells which forward point the backward has reached (its "phase"), so that the live-memory
peak of each phase can be measured. At each phase's peak it also notes the storages given to a candidate
that nothing has saved yet and that are alive anyway (the model's own code holds them, as a decoder
holds its mask): they are in the phase's measured peak already, and a checkpoint that keeps them adds
nothing there.
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
from lightning_ckpt.core.storage import LiveStorageTracker, storage_key, storage_of
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


class StepTracker(LiveStorageTracker):
    """The live-storage counter of a profiled step, which also keeps apart:

    - gradients that have landed in ``param.grad`` (:meth:`land`): they leave ``live_bytes`` for
      ``grad_bytes``; ``phase_total_peak_bytes[phase]`` is the most of both together while that phase
      was current (``phase_peak_bytes`` is the most of ``live_bytes`` alone), and
      ``phase_entry_bytes[phase]`` the ``live_bytes`` when the phase was first entered;
    - windows (:meth:`open_window`, :meth:`close_window`): the peak live bytes since a window opened, to
      measure what a module's forward holds only while it runs;
    - what ``watched`` (a callable, if set) returns at each phase's peak: ``phase_watched[phase]``.
    """

    def __init__(self, cast_sources: frozenset[int]) -> None:
        super().__init__(cast_sources)
        self.watched: Any = None
        self.phase_watched: dict[Any, Any] = {}
        self.grad_bytes = 0
        self.phase_total_peak_bytes: dict[Any, int] = {}
        self.phase_entry_bytes: dict[Any, int] = {}
        self._grads: dict[int, int] = {}
        self._windows: list[int] = []

    def land(self, grad: Any) -> None:
        storage = storage_of(grad)
        key = None if storage is None else storage_key(storage)
        with self._lock:
            nbytes = self._tracked.pop(key, None)
            if nbytes is None:  # accumulated in place into an earlier gradient, or not made in the mode
                return
            self._grads[key] = nbytes
            self.live_bytes -= nbytes
            self.grad_bytes += nbytes

    def enter_phase(self, phase: Any) -> None:
        """Make ``phase`` current (a point of the backward)."""
        with self._lock:
            self.phase = phase
            self.phase_entry_bytes.setdefault(phase, self.live_bytes)
            self._note_total()

    def open_window(self) -> None:
        self._windows.append(self.live_bytes)

    def window_peak_bytes(self) -> int:
        """The peak live bytes since the innermost open window opened."""
        return self._windows[-1]

    def close_window(self) -> int:
        """The peak live bytes since the window opened."""
        return self._windows.pop()

    def _grow(self, nbytes: int) -> None:
        before = self.phase_peak_bytes.get(self.phase)
        super()._grow(nbytes)
        if self.watched is not None and (before is None or self.live_bytes > before):
            self.phase_watched[self.phase] = self.watched()
        self._windows[:] = [max(peak, self.live_bytes) for peak in self._windows]
        self._note_total()

    def _note_total(self) -> None:
        total = self.phase_total_peak_bytes.get(self.phase, 0)
        self.phase_total_peak_bytes[self.phase] = max(total, self.live_bytes + self.grad_bytes)

    def _release(self, key: int) -> None:
        with self._lock:
            self.grad_bytes -= self._grads.pop(key, 0)
        super()._release(key)


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
        self.call_unsaved: list[tuple[StorageRow, ...]] = []  # per call: `unsaved_inputs` then, less its own
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
        self._unsaved_now: tuple[StorageRow, ...] | None = ()  # `_unsaved`'s rows (None: to make again)
        self._saved_index: dict[int, int] | None = None  # see `alive_anyway`
        self.tracker.watched = self.unsaved_inputs

    def unsaved_inputs(self) -> tuple[StorageRow, ...]:
        """The live storages given to a candidate as inputs that nothing has saved yet (alive anyway)."""
        if self._unsaved_now is None:
            self._unsaved_now = tuple(self._unsaved.values())
        return self._unsaved_now

    def alive_anyway(self, rows: tuple[StorageRow, ...], time: float) -> tuple[int, ...]:
        """Of ``rows`` (noted at a point of forward time ``time``), the indices in :meth:`saved_rows` of
        those not saved by then, so counted in the point's extra: a checkpoint that keeps them holds
        nothing more there. Called once the recording is over."""
        if self._saved_index is None:
            self._saved_index = {id(row): i for i, row in enumerate(self.saved_rows())}
        index = self._saved_index
        return tuple(
            sorted(
                index[id(row)]
                for row in rows
                if id(row) in index and not any(seq <= time for _, seq in row.saves)
            )
        )

    def _set_unsaved(self, row: StorageRow, unsaved: bool) -> None:
        if unsaved and row.key is not None and row.key not in self._unsaved:
            self._unsaved[row.key] = row
        elif not unsaved and self._unsaved.get(row.key) is row:
            del self._unsaved[row.key]
        else:
            return
        self._unsaved_now = None

    def saved_rows(self) -> list[StorageRow]:
        """The rows of storages saved for backward or given to a candidate, less those resized in place:
        their memory is managed by their owner, not by autograd (FSDP2's unsharded parameters, freed
        after the forward and gathered again for the backward), and counts where it is live."""
        return [row for row in self.rows if row.key not in self.tracker.resized]

    def start_backward(self) -> None:
        """The forward has returned the loss: stop counting flops (the flop counter's module tracker would
        keep a recomputation's tensors alive to the end of the backward) and recording forward calls."""
        self.in_backward = True
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
            self.call_unsaved.append(tuple(row for row in self.unsaved_inputs() if id(row) not in own))
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

    def _pack(self, tensor: torch.Tensor) -> tuple[int | None, str | None, torch.Tensor]:
        if self.in_backward:  # saved by a recomputation in the backward: not a forward save
            return None, None, tensor
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
        return seq, owner, tensor

    def _unpack(self, packed: tuple[int | None, str | None, torch.Tensor]) -> torch.Tensor:
        seq, owner, tensor = packed
        if seq is not None and self.tracker.phase != (seq, owner):
            self.tracker.enter_phase((seq, owner))
        return tensor

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
