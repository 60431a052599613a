"""The peak of a step as a maximum over points, each an affine function of the kept candidates.

The step's phases (the backward's points and the candidates' forwards, see
:class:`~lightning_ckpt.core.profile_types.BackwardPhase`) are written once each, for every
checkpointing choice at the same time: at a point, a saved storage is held when any of its *literals* holds (a save by a kept candidate, or an
input of a checkpointed one, at or before the point's time; a save outside the candidates makes it
held always; at the forward's points, an autocast cast that ``torch.autocast``'s cache holds is held
from its first save, checkpointed or not). A storage with one literal adds its bytes to that candidate's coefficient (or, for an
input, to the base less the coefficient); a storage with several is an *either* term (an OR), which
no single coefficient expresses. A candidate's own backward splits its points in two, one for each
choice: kept, it holds its saves; checkpointed, its recomputed saves and the inputs its checkpoint keeps
to the end of its backward. Where its recomputation runs (the first of its phases the backward enters:
the first unpack remakes every save at once) one more point counts when it is checkpointed: the bytes
live as that phase starts, its saves not yet remade, plus what its forward allocates up to its last
save (torch's early stop ends the recomputation there), in place of the phase's own peak, which comes
after. Its own checkpointed forward counts only when it is checkpointed. A storage in a point's measured
extra (an unsaved input the model keeps alive anyway, as a decoder its mask) counts once, there. The predicted peak of a kept set ``K`` is

    max(point.bytes(K) for the points that apply to K)

(:func:`~lightning_ckpt.planning.peak.predict_peak_bytes`), and the planner solves it exactly.
``tests/peak_replay.py`` replays the step phase by phase as an independent oracle, and
``tests/test_peak_points.py`` checks that the two agree on random sets.

Example:
    >>> from lightning_ckpt.core.profile_types import ModuleProfile, StaticMemory, StepProfile
    >>> modules = (ModuleProfile("a", 30, 10, 0.1, 0), ModuleProfile("b", 50, 10, 0.1, 0))
    >>> profile = StepProfile(modules, StaticMemory("cpu", 100, 0, 0, 0), 5, 2)
    >>> peak_of_points(peak_points(profile), [True, False])  # b checkpointed: a kept, b's input, recompute
    187
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from lightning_ckpt.core.profile_types import ZERO_GRADS, StepProfile

if TYPE_CHECKING:
    from lightning_ckpt.core.profile_types import BackwardPhase, ZeroGrad

__all__ = [
    "PeakPoint",
    "PointMatrix",
    "checked_zero_grad",
    "last_step_held_bytes",
    "peak_of_points",
    "peak_points",
    "recompute_phases",
]

Literal = tuple[int, bool]
"""(candidate index, kept): a save of a kept candidate (True) or an input of a checkpointed one (False)."""


Fixed = tuple[int, tuple[bool, ...]]
"""A candidate whose own storages a point holds by rule: (candidate index, the kinds of its literals that
hold at the point's time): ``KEPT`` (its saves), ``CHECKPOINTED`` (its inputs) or ``RECOMPUTED`` (both)."""
KEPT, CHECKPOINTED, RECOMPUTED = (True,), (False,), (True, False)

_Spec = tuple[float, Fixed | None, int, Literal | None, bool, tuple[int, ...]]
"""A point to write: (time, fixed candidate, base bytes, when, a point of the forward, alive anyway)."""


@dataclass(frozen=True, eq=False)
class PeakPoint:
    """One point where the peak can fall: ``base_bytes + keep_bytes @ kept + either terms``."""

    base_bytes: int
    keep_bytes: np.ndarray
    """Per candidate (profile order), the bytes it adds when kept (int64; may be negative)."""
    either_bytes: tuple[tuple[tuple[Literal, ...], int], ...] = ()
    """Storages held when any of their literals holds: (literals, bytes)."""
    when: Literal | None = None
    """The point counts only when this candidate is kept (True) or checkpointed (False)."""
    time: float = field(default=math.inf, compare=False)

    def bytes(self, kept: np.ndarray) -> int:
        """Bytes at this point for the kept mask (whether or not the point applies)."""
        either = sum(
            nbytes for literals, nbytes in self.either_bytes if any(kept[m] == k for m, k in literals)
        )
        return int(self.base_bytes + int(self.keep_bytes @ kept.astype(np.int64)) + either)

    def applies(self, kept: np.ndarray) -> bool:
        """Whether the point counts for the kept mask."""
        return self.when is None or bool(kept[self.when[0]]) == self.when[1]


def peak_of_points(points: tuple[PeakPoint, ...], kept) -> int:
    """The peak the points give for a kept mask (a sequence of bools in profile order)."""
    mask = np.asarray(kept, dtype=bool)
    return max(point.bytes(mask) for point in points if point.applies(mask))


class PointMatrix:
    """The points stacked as arrays, to evaluate many kept masks fast (same numbers as the points).

    Example:
        >>> points = (PeakPoint(10, np.array([4, 4])), PeakPoint(12, np.array([0, 6]), when=(0, False)))
        >>> PointMatrix(points).peak(np.array([False, True]))
        18
    """

    def __init__(self, points: tuple[PeakPoint, ...]) -> None:
        self.base = np.array([point.base_bytes for point in points], dtype=np.int64)
        self.keep = np.array([point.keep_bytes for point in points], dtype=np.int64).reshape(len(points), -1)
        self.when_index = np.array([-1 if p.when is None else p.when[0] for p in points], dtype=np.int64)
        self.when_kept = np.array([p.when is not None and p.when[1] for p in points])
        self.either = [(row, term) for row, point in enumerate(points) for term in point.either_bytes]

    def peak(self, kept: np.ndarray) -> int:
        """The peak for one kept mask (profile order)."""
        return int(self.totals(kept)[self.applies(kept)].max())

    def totals(self, kept: np.ndarray) -> np.ndarray:
        """Each point's bytes for the kept mask (whether or not it applies)."""
        totals = self.base + self.keep @ kept.astype(np.int64)
        for row, (literals, nbytes) in self.either:
            totals[row] += nbytes if any(kept[m] == k for m, k in literals) else 0
        return totals

    def applies(self, kept: np.ndarray) -> np.ndarray:
        """Whether each point counts for the kept mask."""
        conditional = self.when_index >= 0
        applies = ~conditional
        applies[conditional] = kept[self.when_index[conditional]] == self.when_kept[conditional]
        return applies


def peak_points(profile: StepProfile, *, zero_grad: ZeroGrad | None = None) -> tuple[PeakPoint, ...]:
    """The points of ``profile``'s step (see the module docstring); ``zero_grad`` as in ``predict_peak_bytes``.

    Raises:
        ValueError: if ``zero_grad`` is not one of its values.
    """
    when = checked_zero_grad(profile.zero_grad if zero_grad is None else zero_grad)
    if not profile.storages:
        return _points_from_totals(profile)
    names = {module.name: i for i, module in enumerate(profile.modules)}
    grads = profile.static.grad_bytes
    outer = profile.static_bytes - grads + profile.batch_bytes
    optimizer_step = outer + grads + profile.after_backward_bytes + profile.optimizer_step_bytes
    specs: list[_Spec] = []
    recomputing = recompute_phases(profile)
    for k, phase in enumerate(profile.phases):
        index = names.get(phase.candidate) if phase.candidate is not None else None
        extra = outer + phase.extra_bytes + last_step_held_bytes(phase, profile, when)
        time, forward, anyway = phase.time, phase.forward, phase.alive_anyway
        if phase.if_checkpointed:
            if index is not None:  # counted only when checkpointed, its own saves not made
                specs.append((time, (index, CHECKPOINTED), extra, (index, False), forward, anyway))
        elif phase.forward or index is None:
            specs.append((time, None if index is None else (index, KEPT), extra, None, forward, anyway))
        else:  # kept: its saves are alive; checkpointed: its recomputed saves and the inputs it keeps
            specs.append((time, (index, KEPT), extra, (index, True), False, anyway))
            specs.append((time, (index, RECOMPUTED), extra, (index, False), False, anyway))
            if recomputing.get(index) == k:  # its recomputation, from what is live as the phase starts
                recompute = extra + _recompute_bytes(phase, profile, index)
                specs.append((time, (index, CHECKPOINTED), recompute, (index, False), False, anyway))
    return (PeakPoint(optimizer_step, _zeros(len(names))), *_StorageTable(profile, names).points(specs))


def recompute_phases(profile: StepProfile) -> dict[int, int]:
    """Per candidate (profile index), the index in ``profile.phases`` of the phase where its recomputation
    runs when it is checkpointed: the first of its backward phases that the backward enters (the profile
    lists them in that order), whose first unpack of a saved tensor recomputes all of them at once.

    Example:
        >>> from lightning_ckpt.core.profile_types import BackwardPhase, ModuleProfile, StaticMemory, StepProfile
        >>> phases = (BackwardPhase(9, "b", 0), BackwardPhase(8, "b", 0), BackwardPhase(4, "a", 0))
        >>> modules = (ModuleProfile("a", 30, 10, 0.1, 0), ModuleProfile("b", 50, 10, 0.1, 0))
        >>> recompute_phases(StepProfile(modules, StaticMemory("cpu", 100, 0, 0, 0), 5, 2, phases=phases))
        {1: 0, 0: 2}
    """
    names = {module.name: i for i, module in enumerate(profile.modules)}
    first: dict[int, int] = {}
    for k, phase in enumerate(profile.phases):
        if phase.candidate in names and not (phase.forward or phase.if_checkpointed):
            first.setdefault(names[phase.candidate], k)
    return first


def _recompute_bytes(phase: BackwardPhase, profile: StepProfile, index: int) -> int:
    """At the phase where candidate ``index`` is recomputed, what its recomputation's peak adds to the
    phase's extra: the bytes live beyond the saved ones when the phase starts, in place of the phase's
    peak, plus what the candidate's forward allocates at its peak (its saves among them)."""
    entry = phase.extra_bytes if phase.entry_extra_bytes is None else phase.entry_extra_bytes
    return entry - phase.extra_bytes + profile.modules[index].recompute_extra_bytes


def _zeros(n: int) -> np.ndarray:
    return np.zeros(n, dtype=np.int64)


class _StorageTable:
    """The storages as arrays: for each, its bytes and the earliest time of each kind of literal."""

    def __init__(self, profile: StepProfile, names: dict[str, int]) -> None:
        self.n = len(names)
        self.nbytes = np.array([s.nbytes for s in profile.storages], dtype=np.int64)
        # NaN: no such event (never <= any time, ``inf`` included)
        self.always = np.full(len(self.nbytes), np.nan)  # the earliest save outside the candidates
        self.owner = np.full(len(self.nbytes), -1)  # the one candidate it involves (-1: none)
        self.saved = np.full(len(self.nbytes), np.nan)  # its earliest save by that candidate
        self.taken = np.full(len(self.nbytes), np.nan)  # its earliest call of that candidate
        self.cached = np.full(len(self.nbytes), np.nan)  # an autocast cast: its first save (forward only)
        self.several: list[tuple[int, dict[Literal, float]]] = []  # storages involving 2+ candidates
        for k, storage in enumerate(profile.storages):
            self._add(k, storage, names)

    def _add(self, k: int, storage, names: dict[str, int]) -> None:
        earliest: dict[Literal, float] = {}
        outside = [seq for owner, seq in storage.saves if owner not in names]
        self.always[k] = min(outside, default=np.nan)  # held whatever is checkpointed
        if storage.forward_cached:  # held to the end of the forward whatever is checkpointed
            self.cached[k] = min((seq for _, seq in storage.saves), default=np.nan)
        for owner, seq in storage.saves:
            if owner in names:
                earliest[(names[owner], True)] = min(earliest.get((names[owner], True), math.inf), seq)
        for name, seq in storage.inputs:
            if name in names:
                earliest[(names[name], False)] = min(earliest.get((names[name], False), math.inf), seq)
        involved = {m for m, _ in earliest}
        if len(involved) > 1:
            self.several.append((k, earliest))
            self.owner[k] = -2
        elif involved:
            (m,) = involved
            self.owner[k] = m
            self.saved[k] = earliest.get((m, True), np.nan)
            self.taken[k] = earliest.get((m, False), np.nan)

    def points(self, specs: list) -> list[PeakPoint]:
        """The points of the specs (:data:`_Spec`), identical ones merged (:func:`merged_points`).

        One sweep in time order: the base and the coefficients that the storages give a point with no
        fixed candidate change only at the storages' own events (a save outside the candidates, a save by
        its candidate, its candidate's call), so they are updated event by event; a point then corrects
        for its fixed candidate's storages and those its extra holds already. The work is the events plus,
        per point, those storages and one copy of the coefficients: no points x storages. The forward's
        points sweep apart, as there an autocast cast that ``torch.autocast``'s cache holds is held from
        its first save (:attr:`cached`)."""
        own: dict[int, list[int]] = {}
        for k in np.flatnonzero(self.owner >= 0).tolist():
            own.setdefault(int(self.owner[k]), []).append(k)
        with np.errstate(invalid="ignore"):
            forward_always = np.fmin(self.always, self.cached)
        swept = []
        for forward, always in ((True, forward_always), (False, self.always)):
            chosen = [spec for spec in specs if bool(spec[4]) == forward]
            swept += list(self._swept(chosen, own, always))
        return merged_points(swept)

    def _swept(self, specs: list, own: dict[int, list[int]], always: np.ndarray) -> Iterator[PeakPoint]:
        """The points, one at a time in time order, a storage ``k`` held whatever is checkpointed from
        ``always[k]`` on."""
        events = self._events(always)
        base_now, keep_now, next_event = 0, _zeros(self.n), 0
        for time, fixed, base, when, _, anyway in sorted(specs, key=lambda spec: spec[0]):
            while next_event < len(events) and events[next_event][0] <= time:
                _, d_base, m, d_keep = events[next_event]
                base_now += d_base
                if d_keep:
                    keep_now[m] += d_keep
                next_event += 1
            keep = keep_now.copy()
            base += base_now - self._anyway_correction(anyway, time, always, keep)
            if fixed is not None:
                base += self._fixed_correction(own.get(fixed[0], ()), time, fixed[1], always, anyway)
                keep[fixed[0]] = 0
            either: list[tuple[tuple[Literal, ...], int]] = []
            for k, earliest in self.several:
                if not always[k] <= time and k not in anyway:  # else in the base already, or in the extra
                    base, term = _either(earliest, time, fixed, int(self.nbytes[k]), base, keep)
                    either += [term] if term else []
            yield PeakPoint(base, keep, tuple(either), when, time)

    def _state(self, k: int, time: float, always: np.ndarray) -> tuple[int, int]:
        """What storage ``k`` adds at ``time`` to a point without a fixed candidate: (base, coefficient)."""
        nbytes = int(self.nbytes[k])
        if always[k] <= time:
            return nbytes, 0
        if self.owner[k] < 0:
            return 0, 0
        saved, taken = bool(self.saved[k] <= time), bool(self.taken[k] <= time)
        return nbytes * taken, nbytes * (saved - taken)  # kept: saved; checkpointed: its inputs kept

    def _events(self, always: np.ndarray) -> list[tuple[float, int, int, int]]:
        """(time, base change, candidate, coefficient change) at each event of each storage, in time order."""
        events = []
        for k in range(len(self.nbytes)):
            times = sorted({t for t in (always[k], self.saved[k], self.taken[k]) if not math.isnan(t)})
            before = (0, 0)
            for time in times:
                now = self._state(k, time, always)
                events.append((time, now[0] - before[0], max(int(self.owner[k]), 0), now[1] - before[1]))
                before = now
        events.sort(key=lambda event: event[0])
        return events

    def _anyway_correction(self, anyway: tuple[int, ...], time: float, always: np.ndarray, keep) -> int:
        """What the storages in the point's extra (``anyway``) add to its base (out of ``keep`` here)."""
        correction = 0
        for k in anyway:
            base, coefficient = self._state(k, time, always)  # coefficient 0 unless it has one owner
            keep[max(int(self.owner[k]), 0)] -= coefficient
            correction += base
        return correction

    def _fixed_correction(self, storages, time: float, kinds: tuple[bool, ...], always, anyway) -> int:
        """The base change when the fixed candidate's own storages are held as the point's rule holds them
        (``kinds``: its saves, its inputs, or both) rather than as in :meth:`_state` (those in ``anyway``
        left to :meth:`_anyway_correction`)."""
        correction = 0
        for k in (k for k in storages if k not in anyway):
            held = always[k] <= time or any((self.saved if kind else self.taken)[k] <= time for kind in kinds)
            correction += int(self.nbytes[k]) * bool(held) - self._state(k, time, always)[0]
        return correction


def merged_points(points: Iterable[PeakPoint]) -> list[PeakPoint]:
    """The points with those of the same coefficients, either terms and condition merged into the one of
    largest base (the same affine function: the others never set the peak), in order of first appearance.

    A deep model's backward has a few points per block with one set of coefficients (the blocks before
    it), so this keeps the points, and the matrix of their coefficients, a few rows per candidate.

    Example:
        >>> merged = merged_points([PeakPoint(5, np.array([1])), PeakPoint(9, np.array([1])), PeakPoint(7, np.array([2]))])
        >>> [(p.base_bytes, p.keep_bytes.tolist()) for p in merged]
        [(9, [1]), (7, [2])]
    """
    merged: dict[tuple, PeakPoint] = {}
    for point in points:
        key = (point.keep_bytes.tobytes(), point.either_bytes, point.when)
        best = merged.get(key)
        if best is None or point.base_bytes > best.base_bytes:
            merged[key] = point if best is None else dataclasses.replace(best, base_bytes=point.base_bytes)
    return list(merged.values())


def _either(earliest, time, fixed, nbytes, base, keep) -> tuple[int, tuple | None]:
    """A storage involving several candidates at ``time``: into the base, a coefficient, or an OR."""
    literals = {lit for lit, seq in earliest.items() if seq <= time}
    if fixed is not None and any((fixed[0], kind) in literals for kind in fixed[1]):
        return base + nbytes, None
    literals = {lit for lit in literals if fixed is None or lit[0] != fixed[0]}
    if any((m, not k) in literals for m, k in literals) or not literals:
        return base + (nbytes if literals else 0), None
    if len(literals) == 1:
        ((m, k),) = literals
        keep[m] += nbytes if k else -nbytes
        return base + (0 if k else nbytes), None
    return base, (tuple(sorted(literals)), nbytes)


def _points_from_totals(profile: StepProfile) -> tuple[PeakPoint, ...]:
    """Hand-made profiles (no timeline): every candidate's saved bytes at once, one recompute at a time."""
    outer = profile.static_bytes + profile.batch_bytes
    activation = np.array([m.activation_bytes for m in profile.modules], dtype=np.int64)
    inputs = np.array([m.input_bytes for m in profile.modules], dtype=np.int64)
    base = outer + profile.other_activation_bytes + profile.backward_extra_bytes + int(inputs.sum())
    points = [
        PeakPoint(outer + profile.optimizer_step_bytes, _zeros(len(inputs))),
        PeakPoint(base, activation - inputs),
    ]
    for i in range(len(inputs)):
        keep = activation - inputs
        keep[i] = 0  # checkpointed: its inputs are in the base
        points.append(PeakPoint(base + int(activation[i] - inputs[i]), keep, when=(i, False)))
    return tuple(points)


def last_step_held_bytes(phase: BackwardPhase, profile: StepProfile, when: ZeroGrad) -> int:
    """Bytes of parameter gradients alive at ``phase`` and, in a Lightning loop's forward, what the last
    step still holds (its loss and the loop's copy of it)."""
    grads = profile.static.grad_bytes
    if when == "never":
        return grads + (profile.after_backward_bytes if phase.forward else 0)
    if phase.forward:
        return grads + profile.after_backward_bytes if when == "after_forward" else 0
    return min(phase.grad_bytes, grads)


def checked_zero_grad(when: str) -> ZeroGrad:
    """``when`` if it is one of ``ZERO_GRADS``.

    Raises:
        ValueError: naming the allowed values and what was given.
    """
    if when not in ZERO_GRADS:
        raise ValueError(f"`zero_grad` must be one of {ZERO_GRADS}, got {when!r}")
    return when
