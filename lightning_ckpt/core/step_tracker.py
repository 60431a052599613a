"""The live-storage counter of a profiled step: phases, windows, landed gradients (see :class:`StepTracker`)."""

from __future__ import annotations

from typing import Any

from lightning_ckpt.core.storage import LiveStorageTracker, storage_key, storage_of

__all__ = ["StepTracker"]


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
