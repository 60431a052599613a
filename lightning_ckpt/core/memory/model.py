"""Peak-memory model of a training step for any set of checkpointed candidates.

The prediction replays the backward of the profiled step. For each measured phase (a point of the
backward, see :class:`lightning_ckpt.core.profile_types.BackwardPhase`) it adds the saved storages alive there
under the checkpointing choice and the phase's measured extra (gradients, temporaries); a checkpointed
candidate being recomputed at that point counts as kept. The optimizer step is one more phase, with no
activations left and its own temporaries. The peak is the largest phase plus the static bytes
(parameters, gradients, optimizer state, buffers).

Knapsack form: for every set ``S`` of checkpointed candidates,
``predict_peak_bytes(p, S) <= fixed_peak_bytes(p) + sum(keep_cost_bytes(p)[m] for m not in S)``,
with equality when ``S`` holds every candidate (``fixed_peak_bytes`` *is* that prediction).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from lightning_ckpt.core.memory.timeline import AliveStarts, held_at
from lightning_ckpt.core.profile_types import ZERO_GRADS

if TYPE_CHECKING:
    from lightning_ckpt.core.profile_types import BackwardPhase, SavedStorage, StepProfile, ZeroGrad

__all__ = ["fixed_peak_bytes", "keep_cost_bytes", "predict_peak_bytes"]


def predict_peak_bytes(
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
    when = _checked_zero_grad(profile.zero_grad if zero_grad is None else zero_grad)
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
        held = held_at(starts.without(candidate), starts.nbytes, [phase.time for phase in phases])
        recomputed = recompute.get(candidate, 0)  # only in the backward: its forward phase has it already
        extra = np.array(
            [
                p.extra_bytes + _last_step_held(p, profile, when) + (0 if p.forward else recomputed)
                for p in phases
            ],
            dtype=np.int64,
        )
        peak = max(peak, int((held + extra).max()))
    own = [p for p in profile.phases if p.if_checkpointed and p.candidate in chosen]
    if own:  # a checkpointed candidate's own forward: its inputs kept, its saves never made
        held = held_at(starts.base, starts.nbytes, [phase.time for phase in own])
        extra = np.array([p.extra_bytes + _last_step_held(p, profile, when) for p in own], dtype=np.int64)
        peak = max(peak, int((held + extra).max()))
    return profile.static_bytes - grads + profile.batch_bytes + peak


def _last_step_held(phase: BackwardPhase, profile: StepProfile, when: ZeroGrad) -> int:
    """Bytes of parameter gradients alive at ``phase`` and, in a Lightning loop's forward, what the last
    step still holds (its loss and the loop's copy of it)."""
    grads = profile.static.grad_bytes
    if when == "never":
        return grads + (profile.after_backward_bytes if phase.forward else 0)
    if phase.forward:
        return grads + profile.after_backward_bytes if when == "after_forward" else 0
    return min(phase.grad_bytes, grads)


def _checked_zero_grad(when: str) -> ZeroGrad:
    if when not in ZERO_GRADS:
        raise ValueError(f"`zero_grad` must be one of {ZERO_GRADS}, got {when!r}")
    return when


def fixed_peak_bytes(profile: StepProfile) -> int:
    """The knapsack's fixed part: the predicted peak with every candidate checkpointed.

    It holds the static bytes, the activations saved outside candidates, the inputs that the checkpoints
    keep, the backward's extra and the recomputation of a checkpointed candidate during its backward.
    """
    return predict_peak_bytes(profile, [module.name for module in profile.modules])


def keep_cost_bytes(profile: StepProfile) -> dict[str, int]:
    """Per candidate, the bytes that keeping its activations adds over checkpointing it (>= 0).

    That is the storages it saves that nothing else holds from the same point on (not an input the
    candidate's own checkpoint would keep, not saved earlier outside the candidates).
    """
    names = [module.name for module in profile.modules]
    if not profile.storages:
        return {m.name: max(m.activation_bytes - m.input_bytes, 0) for m in profile.modules}
    costs = dict.fromkeys(names, 0)
    for storage in profile.storages:
        for owner in {
            owner for owner, seq in storage.saves if owner is not None and not _covered(storage, owner, seq)
        }:
            if owner in costs:
                costs[owner] += storage.nbytes
    return costs


def _covered(storage: SavedStorage, owner: str, seq: int) -> bool:
    """Whether the storage is held from ``seq`` on even when ``owner`` is checkpointed: saved before
    outside the candidates, or an input of an earlier call of ``owner`` (kept by its checkpoint)."""
    by_other = any(o is None and s <= seq for o, s in storage.saves)
    return by_other or any(name == owner and s <= seq for name, s in storage.inputs)


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
