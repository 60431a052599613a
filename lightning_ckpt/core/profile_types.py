"""The profile of one training step: plain, frozen data (no torch), made by :mod:`.profiler`.

:func:`lightning_ckpt.planning.peak.predict_peak_bytes` turns a :class:`StepProfile` into the peak
memory of a step for any set of checkpointed candidates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from lightning_ckpt.core.memory.static import StaticMemory

__all__ = [
    "COSTS",
    "ZERO_GRADS",
    "BackwardPhase",
    "Cost",
    "ZeroGrad",
    "ModuleProfile",
    "SavedStorage",
    "StaticMemory",
    "StepProfile",
]

ZeroGrad = Literal["after_forward", "before_forward", "never"]
"""When the training loop frees the gradients of the last step: Lightning's loop after the forward and
before the backward (``"after_forward"``), a plain loop that calls ``zero_grad()`` first
(``"before_forward"``), or not within the step (``"never"``: gradient accumulation)."""
ZERO_GRADS: tuple[str, ...] = get_args(ZeroGrad)
Cost = Literal["time", "flops"]
"""What keeping a module saves per step: its measured recompute time, or its forward FLOPs."""
COSTS: tuple[str, ...] = get_args(Cost)


@dataclass(frozen=True)
class ModuleProfile:
    """What one candidate costs: memory it saves for backward, memory a checkpoint keeps, recompute cost."""

    name: str
    """Qualified name as in ``model.named_modules()``, wrapper prefixes stripped."""
    activation_bytes: int
    """Bytes of the distinct storages saved for backward inside this module (innermost candidate wins);
    includes saved inputs. Checkpointing frees the part that is not an input (see ``keep_cost_bytes``)."""
    input_bytes: int
    """Bytes of the distinct storages of the module's tensor inputs, which a checkpoint keeps instead."""
    recompute_seconds: float
    """Time of one forward of the module (summed over calls; 0.0 when ``cost="flops"``)."""
    flops: int
    """Forward flops of the module (``FlopCounterMode``), summed over calls."""
    recompute_extra_bytes: int = 0
    """The most its forward allocates above what was live when it started (its saves, outputs and
    temporaries at their peak together): what recomputing it in backward adds, at the peak of the
    recomputation, to what is live when the recomputation starts."""


@dataclass(frozen=True)
class SavedStorage:
    """One storage saved for backward or given to a candidate: the timeline the memory model needs."""

    nbytes: int
    saves: tuple[tuple[str | None, int], ...]
    """(innermost candidate or ``None``, forward sequence number) of each save."""
    inputs: tuple[tuple[str, int], ...]
    """(candidate, forward sequence number of the call) for each call that took it as a tensor input."""
    forward_cached: bool = False
    """An autocast copy of a trainable parameter: autocast's cache holds it from its first save to the
    end of the forward, whoever saved it (checkpointed or not); in the backward it lives as its saves do."""


@dataclass(frozen=True)
class BackwardPhase:
    """The measured peak of one point of the backward, beyond the saved storages alive there."""

    time: float
    """Forward sequence number the backward has reached (``inf``: forward, loss and head of the backward)."""
    candidate: str | None
    """Candidate whose forward holds ``time`` (it is being recomputed there if checkpointed), or None."""
    extra_bytes: int
    """Peak live bytes in this phase minus the saved bytes alive there (activation gradients and
    temporaries; parameter gradients that have landed are in ``grad_bytes``)."""
    forward: bool = False
    """A point of the forward: the end of the forward and the loss (``time`` is ``inf``), or the peak
    inside one call of ``candidate`` (``time``: the call's end)."""
    if_checkpointed: bool = False
    """A checkpointed ``candidate``'s own forward (``time``: the call's start): counted only when it is
    checkpointed, with its inputs kept and its working set (its forward keeping nothing) as the extra."""
    grad_bytes: int = 0
    """When gradients start from none: what the parameter gradients made so far add to the phase's peak
    (``extra_bytes + grad_bytes`` is the peak of everything beyond the saved bytes)."""
    entry_extra_bytes: int | None = None
    """Live bytes beyond the saved bytes alive there when the backward first enters this phase (where a
    checkpointed candidate's recomputation runs, before it); None: not measured (``extra_bytes`` bounds it)."""
    alive_anyway: tuple[int, ...] = ()
    """Indices in ``StepProfile.storages`` of the storages given to a candidate that are live at this
    phase's peak with nothing saving them by ``time`` (the model's own code holds them, as a decoder holds
    its mask): ``extra_bytes`` counts them, so a checkpoint that keeps them adds nothing here."""


@dataclass(frozen=True)
class StepProfile:
    """Memory and compute of one training step, per candidate and overall (bytes, seconds, flops)."""

    modules: tuple[ModuleProfile, ...]
    static: StaticMemory
    """Parameters, gradients, optimizer state, buffers and the strategy's own memory, per device."""
    other_activation_bytes: int
    """Bytes saved for backward outside every candidate."""
    backward_extra_bytes: int
    """The most the backward needs beyond the saved activations alive at that moment: activation
    gradients and op temporaries (the largest ``BackwardPhase.extra_bytes``)."""
    storages: tuple[SavedStorage, ...] = ()
    """Storage-level timeline; empty in hand-made profiles (the memory model then uses the totals)."""
    phases: tuple[BackwardPhase, ...] = ()
    zero_grad: ZeroGrad = "after_forward"
    """When the training loop frees the last step's gradients: an input of the prediction."""
    batch_bytes: int = 0
    """The batch's tensors, on the device for the whole step."""
    after_backward_bytes: int = 0
    """What the step still holds once its backward is done (the loss, the loop's copy of it): alive
    through the optimizer step."""
    optimizer_step_bytes: int = 0
    """The most ``optimizer.step()`` allocates beyond the static memory (its temporaries; activations are
    freed by then). 0 when not measured."""

    @property
    def static_bytes(self) -> int:
        """Parameters, gradients, optimizer state, buffers and the strategy's own memory."""
        return self.static.total_bytes

    def module(self, name: str) -> ModuleProfile:
        """The profile of candidate ``name``."""
        return next(module for module in self.modules if module.name == name)
