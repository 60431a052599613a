"""The test oracle of the peak: the profiled step replayed phase by phase, for one checkpointing choice.

The library predicts the peak from its points (``lightning_ckpt.planning.points``), all choices at
once; this replays the same step for one choice, the way the memory model reads, and
``tests/test_peak_points.py`` checks that the two agree. For each measured phase (a point of the
backward, see :class:`lightning_ckpt.core.profile_types.BackwardPhase`) it adds the saved storages alive there
under the checkpointing choice and the phase's measured extra (gradients, temporaries); a checkpointed
candidate in its own backward holds its saves, made again, and its inputs, and its recomputation adds
one more point at its first phase: the bytes live as that phase starts plus what the recomputation
allocates (``recompute_extra_bytes``). A storage that the phase's measured extra holds already (given to
a candidate, saved by nothing yet, alive anyway: ``BackwardPhase.alive_anyway``) is live there once,
whoever keeps it. The optimizer step is one more phase, with no activations left and its own
temporaries. The peak is the largest phase plus the static bytes
(parameters, gradients, optimizer state, buffers).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from lightning_ckpt.core.memory.timeline import alive_from, held_at
from lightning_ckpt.planning.points import checked_zero_grad, last_step_held_bytes, peak_of_points

if TYPE_CHECKING:
    from lightning_ckpt.core.profile_types import SavedStorage, StepProfile, ZeroGrad

__all__ = ["check_points", "replay_peak_bytes"]


def replay_peak_bytes(
    profile: StepProfile, checkpointed: Iterable[str], *, zero_grad: ZeroGrad | None = None
) -> int:
    """Predicted peak bytes of a training step with the candidates ``checkpointed`` checkpointed.

    Args:
        profile: the step's profile.
        checkpointed: names of candidates of ``profile``.
        zero_grad: when the loop frees the last step's gradients (default ``profile.zero_grad``): they
            are held through the forward (``"after_forward"``, Lightning), not (``"before_forward"``), or
            through the whole step (``"never"``, gradient accumulation); in the backward the new ones count
            as they are made.

    Raises:
        ValueError: if a name in ``checkpointed`` is not a candidate of ``profile``, or ``zero_grad`` is
            not one of its values.
    """
    chosen = _checked(profile, checkpointed)
    when = checked_zero_grad(profile.zero_grad if zero_grad is None else zero_grad)
    if not profile.storages:
        return _predict_from_totals(profile, chosen)
    grads = profile.static.grad_bytes
    recompute = {m.name: m.recompute_extra_bytes for m in profile.modules if m.name in chosen}
    peak = grads + profile.after_backward_bytes + profile.optimizer_step_bytes  # the optimizer step
    starts = AliveStarts(profile.storages, chosen)
    for candidate in {phase.candidate for phase in profile.phases}:
        phases = [p for p in profile.phases if p.candidate == candidate and not p.if_checkpointed]
        if not phases:
            continue
        # in its backward a checkpointed candidate holds its recomputed saves and the inputs it keeps
        recomputed, kept = starts.recomputed(candidate), starts.without(candidate)
        held = np.array(
            [
                held_at(starts.at(p, kept if p.forward else recomputed), starts.held_bytes(p), [p.time])[0]
                for p in phases
            ]
        )
        extra = np.array(
            [p.extra_bytes + last_step_held_bytes(p, profile, when) for p in phases], dtype=np.int64
        )
        peak = max(peak, int((held + extra).max()))
        backward = [p for p in phases if not p.forward]
        if candidate in chosen and backward:  # its recomputation runs as the backward enters its first phase
            first = backward[0]
            entry = first.extra_bytes if first.entry_extra_bytes is None else first.entry_extra_bytes
            held_before = held_at(starts.base, starts.held_bytes(first), [first.time])[0]
            peak = max(
                peak,
                int(held_before + entry + last_step_held_bytes(first, profile, when) + recompute[candidate]),
            )
    own = [p for p in profile.phases if p.if_checkpointed and p.candidate in chosen]
    if own:  # a checkpointed candidate's own forward: its inputs kept, its saves never made
        held = np.array([held_at(starts.at(p, starts.base), starts.held_bytes(p), [p.time])[0] for p in own])
        extra = np.array(
            [p.extra_bytes + last_step_held_bytes(p, profile, when) for p in own], dtype=np.int64
        )
        peak = max(peak, int((held + extra).max()))
    return profile.static_bytes - grads + profile.batch_bytes + peak


def _checked(profile: StepProfile, checkpointed: Iterable[str]) -> frozenset[str]:
    if isinstance(checkpointed, str):
        raise TypeError(
            f"`checkpointed` must be a collection of candidate names, got the string {checkpointed!r}"
        )
    names = {module.name for module in profile.modules}
    chosen = frozenset(checkpointed)
    unknown = sorted(chosen - names)
    if unknown:
        raise ValueError(
            f"`checkpointed` must hold candidates of the profile {sorted(names)[:6]}, got {unknown[:6]}"
        )
    return chosen


def _predict_from_totals(profile: StepProfile, chosen: frozenset[str]) -> int:
    """For hand-made profiles without a storage timeline: every candidate's saved bytes held at once."""
    held = profile.other_activation_bytes
    recompute = 0
    for module in profile.modules:
        if module.name in chosen:
            held += module.input_bytes
            recompute = max(recompute, module.activation_bytes - module.input_bytes)
        else:
            held += module.activation_bytes
    step_bytes = held + profile.backward_extra_bytes + recompute
    return profile.static_bytes + profile.batch_bytes + max(step_bytes, profile.optimizer_step_bytes)


def check_points(profile: StepProfile, points, kept) -> int:
    """The replayed peak for a kept mask, asserting the points agree."""
    checkpointed = [m.name for m, keep in zip(profile.modules, kept, strict=True) if not keep]
    expected = replay_peak_bytes(profile, checkpointed)
    got = peak_of_points(points, kept)
    if got != expected:
        raise AssertionError(f"points give {got} bytes, the replay {expected} for kept {list(kept)}")
    return expected


class AliveStarts:
    """``alive_from`` of every storage for a checkpointed set, and for that set less one candidate
    (only the storages that candidate saves or takes as input change), without recomputing the rest.

    Example:
        >>> from lightning_ckpt.core.profile_types import SavedStorage
        >>> storages = [SavedStorage(8, (("a", 1),), ()), SavedStorage(4, ((None, 2),), (("a", 0),))]
        >>> starts = AliveStarts(storages, {"a"})
        >>> starts.base.tolist(), starts.without("a").tolist()
        ([inf, 0.0], [1.0, 2.0])
    """

    def __init__(self, storages: Sequence[SavedStorage], checkpointed: Collection[str]) -> None:
        self.storages, self.checkpointed = storages, frozenset(checkpointed)
        self.base = np.array([alive_from(s, self.checkpointed) for s in storages], dtype=np.float64)
        self.nbytes = np.array([s.nbytes for s in storages], dtype=np.int64)
        self.cached = np.array(  # an autocast cast held by the cache through the forward: its first save
            [min(seq for _, seq in s.saves) if s.forward_cached else np.inf for s in storages],
            dtype=np.float64,
        )
        self._touching: dict[str, list[int]] = {}
        for i, storage in enumerate(storages):
            names = {owner for owner, _ in storage.saves if owner is not None}
            for name in names | {name for name, _ in storage.inputs}:
                self._touching.setdefault(name, []).append(i)

    def held_bytes(self, phase) -> np.ndarray:
        """The storages' bytes as ``phase`` holds them for the backward: none for those its measured extra
        holds already (alive anyway there), which are live once whoever keeps them."""
        if not phase.alive_anyway:
            return self.nbytes
        nbytes = self.nbytes.copy()
        nbytes[list(phase.alive_anyway)] = 0
        return nbytes

    def at(self, phase, starts: np.ndarray) -> np.ndarray:
        """``starts`` at ``phase``: in the forward, autocast's cache holds its casts from their first save."""
        return np.minimum(starts, self.cached) if phase.forward else starts

    def recomputed(self, candidate: str) -> np.ndarray:
        """The starts while ``candidate`` is in its backward: kept, as :meth:`without`; checkpointed, its
        saves are made again and the inputs it keeps stay held (its checkpoint releases them at its end)."""
        if candidate not in self.checkpointed:
            return self.base
        starts, rest = self.base.copy(), self.checkpointed - {candidate}
        for i in self._touching.get(candidate, ()):
            taken = [seq for name, seq in self.storages[i].inputs if name == candidate]
            starts[i] = min([alive_from(self.storages[i], rest), *taken])
        return starts

    def without(self, candidate: str) -> np.ndarray:
        """The starts with ``candidate`` not checkpointed."""
        if candidate not in self.checkpointed:
            return self.base
        starts, rest = self.base.copy(), self.checkpointed - {candidate}
        for i in self._touching.get(candidate, ()):
            starts[i] = alive_from(self.storages[i], rest)
        return starts
