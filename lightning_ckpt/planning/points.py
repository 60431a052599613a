"""The peak of a step as a maximum over points, each an affine function of the kept candidates.

The step's phases (the backward's points and the candidates' forwards, see
:class:`~lightning_ckpt.core.profile_types.BackwardPhase`) are written once each, for every
checkpointing choice at the same time: at a point, a saved storage is held when any of its *literals* holds (a save by a kept candidate, or an
input of a checkpointed one, at or before the point's time; a save outside the candidates makes it
held always; at the forward's points, an autocast cast that ``torch.autocast``'s cache holds is held
from its first save, checkpointed or not). A storage with one literal adds its bytes to that candidate's coefficient (or, for an
input, to the base less the coefficient); a storage with several is an *either* term (an OR), which
no single coefficient expresses. The recompute of a checkpointed candidate in its own backward
splits its points in two, one for each choice; its own checkpointed forward counts only when it is
checkpointed. The predicted peak of a kept set ``K`` is

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

import math
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
]

Literal = tuple[int, bool]
"""(candidate index, kept): a save of a kept candidate (True) or an input of a checkpointed one (False)."""


_Spec = tuple[float, Literal | None, int, Literal | None, bool]
"""A point to write: (time, fixed candidate, base bytes, when, a point of the forward)."""


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
        totals = self.base + self.keep @ kept.astype(np.int64)
        for row, (literals, nbytes) in self.either:
            totals[row] += nbytes if any(kept[m] == k for m, k in literals) else 0
        conditional = self.when_index >= 0
        applies = ~conditional
        applies[conditional] = kept[self.when_index[conditional]] == self.when_kept[conditional]
        return int(totals[applies].max())


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
    for phase in profile.phases:
        index = names.get(phase.candidate) if phase.candidate is not None else None
        extra = outer + phase.extra_bytes + last_step_held_bytes(phase, profile, when)
        if phase.if_checkpointed:
            if index is not None:  # counted only when checkpointed, its own saves not made
                specs.append((phase.time, (index, False), extra, (index, False), phase.forward))
            continue
        fixed = None if index is None else (index, True)  # being recomputed: its saves are alive
        recompute = 0 if phase.forward or index is None else profile.modules[index].recompute_extra_bytes
        if recompute:
            specs.append((phase.time, fixed, extra, (index, True), phase.forward))
            specs.append((phase.time, fixed, extra + recompute, (index, False), phase.forward))
        else:
            specs.append((phase.time, fixed, extra, None, phase.forward))
    return (PeakPoint(optimizer_step, _zeros(len(names))), *_StorageTable(profile, names).points(specs))


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
        """The points of ``(time, fixed candidate, base, when, forward)`` specs, all at once (rows x
        storages)."""
        times = np.array([spec[0] for spec in specs], dtype=np.float64)[:, None]
        forward = np.array([spec[4] for spec in specs], dtype=bool)[:, None]
        fixed = np.array([-3 if spec[1] is None else spec[1][0] for spec in specs])[:, None]
        fixed_kept = np.array([spec[1] is not None and spec[1][1] for spec in specs])[:, None]
        with np.errstate(invalid="ignore"):
            saved, taken, always = self.saved <= times, self.taken <= times, self.always <= times
            always |= forward & (self.cached <= times)
        owned = self.owner >= 0
        is_fixed = self.owner == fixed
        fixed_held = np.where(fixed_kept, saved, taken) & is_fixed
        held = always | fixed_held | (saved & taken & owned)
        free = ~held & ~is_fixed & owned
        plus, minus = free & saved & ~taken, free & taken & ~saved
        signed = np.where(plus, self.nbytes, 0) - np.where(minus, self.nbytes, 0)
        keep = _sum_by_owner(signed, self.owner, self.n)
        bases = np.where(held | minus, self.nbytes, 0).sum(axis=1)
        points = []
        for row, (time, fixed_one, base, when, _) in enumerate(specs):
            base += int(bases[row])
            either: list[tuple[tuple[Literal, ...], int]] = []
            for k, earliest in self.several:
                if not always[row, k]:  # else counted in ``held`` already
                    base, term = _either(earliest, time, fixed_one, int(self.nbytes[k]), base, keep[row])
                    either += [term] if term else []
            points.append(PeakPoint(base, keep[row], tuple(either), when, time))
        return points


def _sum_by_owner(signed: np.ndarray, owner: np.ndarray, n: int) -> np.ndarray:
    """Per row, the sum of ``signed`` over the storages of each candidate (rows x candidates, int64)."""
    keep = np.zeros((len(signed), n), dtype=np.int64)
    owned = np.flatnonzero(owner >= 0)
    if len(owned):
        order = owned[np.argsort(owner[owned], kind="stable")]
        groups, starts = np.unique(owner[order], return_index=True)
        keep[:, groups] = np.add.reduceat(signed[:, order], starts, axis=1)
    return keep


def _either(earliest, time, fixed, nbytes, base, keep) -> tuple[int, tuple | None]:
    """A storage involving several candidates at ``time``: into the base, a coefficient, or an OR."""
    literals = {lit for lit, seq in earliest.items() if seq <= time}
    if fixed is not None and fixed in literals:
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
