"""Profile one training step: what each candidate module saves for backward and what recomputing it costs.

``profile_step`` runs one real forward+backward with saved-tensor hooks, module hooks, a live-storage
counter and ``FlopCounterMode``, and returns a :class:`StepProfile` that :mod:`lightning_ckpt.planning.peak`
turns into a peak-memory prediction for any set of checkpointed candidates.

Side effects, by design: the step consumes random numbers (dropout), so the caller restores RNG state if
it matters; parameter gradients are saved before and restored after (the profile runs without them:
each gradient is counted from the moment the backward makes it, and :func:`predict_peak_bytes` adds
them as the training loop holds them, see ``StepProfile.zero_grad``). It only measures:
a model with modules checkpointed by :func:`lightning_ckpt.core.wrapping.apply_checkpointing` is refused
(profile it inside :func:`lightning_ckpt.core.wrapping.checkpointing_removed`). Memory is counted per
storage, on real or fake tensors.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from lightning_ckpt._compat import FakeTensor, tree_leaves
from lightning_ckpt.core.flops import TotalFlopCounter
from lightning_ckpt.core.fsdp2 import is_fsdp2, iteration_state_reset
from lightning_ckpt.core.memory.optimizer import estimate_optimizer_bytes
from lightning_ckpt.core.memory.static import ModelSizes, single_device_static
from lightning_ckpt.core.memory.timeline import alive_bytes, alive_from, held_at
from lightning_ckpt.core.names import resolve_modules
from lightning_ckpt.core.profile_types import (
    COSTS,
    BackwardPhase,
    Cost,
    ModuleProfile,
    SavedStorage,
    StepProfile,
)
from lightning_ckpt.core.recorder import FORWARD_END, Recorder
from lightning_ckpt.core.storage import local_bytes, storage_key, storage_of, unique_storage_bytes
from lightning_ckpt.core.timing import timed_forwards
from lightning_ckpt.core.working_sets import forward_working_sets
from lightning_ckpt.core.wrapping import checkpointed_names

__all__ = ["profile_step", "time_forwards"]


def profile_step(
    model: nn.Module,
    step_fn: Callable[[], Any],
    candidates: Sequence[str],
    cost: Cost = "time",
    *,
    optimizer: Any = None,
    batch: Any = None,
) -> StepProfile:
    """Run one forward+backward of ``model`` and measure, per candidate, memory saved and recompute cost.

    Args:
        model: the model (real or fake parameters; wrapper prefixes in names are stripped).
        step_fn: runs the forward and returns the loss; ``profile_step`` calls ``backward()`` on it.
        candidates: qualified names of the candidate modules (see :func:`lightning_ckpt.find_candidates`).
        cost: ``"time"`` also times one more forward per step to get ``recompute_seconds`` (CUDA events
            on CUDA, ``perf_counter`` on CPU); ``"flops"`` skips it (required for fake tensors).
        batch: the tensors ``step_fn`` feeds the model (any nesting): they stay on the device for the whole
            step, so they count in every phase (``StepProfile.batch_bytes``), never as saved activations.
        optimizer: an optimizer instance, class or name, for the optimizer-state bytes (see
            :func:`lightning_ckpt.core.memory.optimizer.estimate_optimizer_bytes`).

    Raises:
        ValueError: bad ``cost``, unknown candidate names, two names of one (shared) module, ``cost="time"``
            on fake tensors, checkpointed modules, or a ``step_fn`` that does not return a loss that requires grad.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> model = nn.Module()
        >>> model.h = nn.ModuleList(
        ...     nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8)) for _ in range(2)
        ... )
        >>> x = torch.randn(4, 8)
        >>> profile = profile_step(model, lambda: model.h[1](model.h[0](x)).square().mean(), ["h.0", "h.1"])
        >>> # float32 saved for backward: the input 4x8 (128 B), GELU's and the last Linear's inputs 4x32
        >>> [(m.name, m.activation_bytes, m.input_bytes, m.flops) for m in profile.modules]
        [('h.0', 1152, 128, 4096), ('h.1', 1152, 128, 4096)]
    """
    if cost not in COSTS:
        raise ValueError(f"`cost` must be one of {COSTS}, got {cost!r}")
    modules = resolve_modules(model, candidates, argument="candidates")
    _refuse_aliases(modules)
    if cost == "time" and any(isinstance(p, FakeTensor) for p in model.parameters()):
        raise ValueError(
            '`cost` must be "flops" when the model has fake tensors (nothing to time), got "time"'
        )
    _refuse_checkpointed(model)
    with _no_grads(model), iteration_state_reset(model):  # FSDP2: the no-grad forwards leave no trace
        params = list(model.parameters())  # FSDP2: the shards (the unsharded ones are swapped in as it runs)
        sizes = _model_sizes(params, list(model.buffers()), optimizer)
        excluded = _storage_keys([*params, *model.buffers(), *tree_leaves(batch)])
        recorder = Recorder(modules, excluded, TotalFlopCounter(display=False), params)
        with recorder.recording():
            loss = step_fn()
            recorder.start_backward()
            recorder.tracker.enter_phase(_HEAD)
            _backward(loss)
            held_after_backward = recorder.tracker.live_bytes  # the loss (and copies) the loop still holds
        left_out = _left_out(recorder)
        if left_out:
            kept = [c for c in candidates if c not in left_out]
            return profile_step(model, step_fn, kept, cost, optimizer=optimizer, batch=batch)
        working = forward_working_sets(modules, step_fn, alike=not is_fsdp2(model))
        seconds = timed_forwards(modules, step_fn, 2) if cost == "time" else dict.fromkeys(modules, 0.0)
    profile = _build_profile(sizes, recorder, seconds)
    return dataclasses.replace(
        profile,
        phases=profile.phases + _checkpointed_forwards(profile.storages, recorder, working),
        after_backward_bytes=int(held_after_backward),
        batch_bytes=unique_storage_bytes(tree_leaves(batch)),
    )


def _left_out(recorder: Recorder) -> list[str]:
    """Candidates to leave out, with a warning: those called more than once in the forward (shared
    blocks: the memory model has one forward span per candidate), and those the backward calls again
    (checkpointed already, e.g. by ``torch.utils.checkpoint`` in the user's code)."""
    calls = collections.Counter(name for _, name, _ in recorder.call_starts)
    repeated = [name for name in recorder.modules if calls[name] > 1]
    if repeated:
        warnings.warn(
            f"candidate module(s) {repeated} run more than once per forward (shared weights): they are left"
            " out of the plan and never checkpointed (a checkpoint per call is not modelled)",
            stacklevel=3,
        )
    recomputed = [name for name in recorder.modules if name in recorder.recomputed and name not in repeated]
    if recomputed:
        warnings.warn(
            f"candidate module(s) {recomputed} are recomputed in the backward, so something checkpoints them"
            " already (torch.utils.checkpoint in the model's code?): they are left out of the plan",
            stacklevel=3,
        )
    return repeated + recomputed


def _refuse_aliases(modules: dict[str, nn.Module]) -> None:
    first: dict[int, str] = {}
    for name, module in modules.items():
        same = first.setdefault(id(module), name)
        if same != name:
            raise ValueError(
                "`candidates` must name distinct modules (a shared module is one candidate, see"
                f" `find_candidates`), got {same!r} and {name!r} for one module"
            )


def _refuse_checkpointed(model: nn.Module) -> None:
    names = checkpointed_names(model)
    if names:
        raise ValueError(
            "`model` must have no checkpointed modules while it is profiled (a checkpoint hides what they"
            f" save), got {names[:4]} checkpointed; profile inside `checkpointing_removed(model)`"
        )


def _backward(loss: Any) -> None:
    if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
        raise ValueError(
            f"`step_fn` must return the loss, a tensor that requires grad, got {type(loss).__name__}"
        )
    loss.backward()


def _storage_keys(tensors: Sequence[Any]) -> set[int]:
    return {storage_key(s) for s in map(storage_of, tensors) if s is not None}


@contextlib.contextmanager
def _no_grads(model: nn.Module) -> Iterator[None]:
    """No gradients for the duration (the backward makes them); put the caller's gradients back after."""
    params = [p for p in model.parameters() if p.requires_grad]
    saved = [p.grad for p in params]
    try:
        for p in params:
            p.grad = None
        yield
    finally:
        for p, grad in zip(params, saved, strict=True):
            p.grad = grad


def time_forwards(
    model: nn.Module,
    candidates: Sequence[str],
    step_fn: Callable[[], Any],
    repeats: int = 2,
    *,
    alike: bool = True,
) -> dict[str, float]:
    """Seconds of each candidate's forward in ``step_fn`` run under ``torch.no_grad()`` (nothing is kept
    for backward), the fastest of ``repeats`` runs (CUDA events on CUDA, ``perf_counter`` on CPU); with
    ``alike``, blocks alike (a decoder's layers) are timed once per kind and share its time
    (:mod:`lightning_ckpt.core.timing`).

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
        >>> seconds = time_forwards(model, ["0", "1"], lambda: model(torch.randn(2, 4)).sum())
        >>> sorted(seconds), all(s > 0 for s in seconds.values())
        (['0', '1'], True)
    """
    modules = resolve_modules(model, candidates, argument="candidates")
    return timed_forwards(modules, step_fn, repeats, alike=alike)


def _model_sizes(params: list[torch.Tensor], buffers: list[torch.Tensor], optimizer: Any) -> ModelSizes:
    """This rank's parameters, gradients, optimizer state and buffers (a ``DTensor``: its local shard)."""
    trainable = [p for p in params if p.requires_grad]
    return ModelSizes(
        param_bytes=unique_storage_bytes(params),
        grad_bytes=sum(local_bytes(p) for p in trainable),
        optimizer_bytes=estimate_optimizer_bytes(trainable, optimizer),
        buffer_bytes=unique_storage_bytes(buffers),
    )


def _build_profile(sizes: ModelSizes, recorder: Recorder, seconds: dict[str, float]) -> StepProfile:
    storages = tuple(
        SavedStorage(row.nbytes, tuple(row.saves), tuple(row.inputs), row.forward_cached)
        for row in recorder.saved_rows()
    )
    saved, taken, other = _bytes_by_candidate(storages)
    modules = tuple(
        ModuleProfile(
            name=name,
            activation_bytes=saved.get(name, 0),
            input_bytes=taken.get(name, 0),
            recompute_seconds=seconds[name],
            flops=int(recorder.flops[name]),
            recompute_extra_bytes=int(recorder.recompute_extra[name]),
        )
        for name in recorder.modules
    )
    phases = _phases(storages, recorder)
    return StepProfile(
        modules=modules,
        static=single_device_static(sizes),
        other_activation_bytes=other,
        backward_extra_bytes=max((phase.extra_bytes for phase in phases), default=0),
        storages=storages,
        phases=phases,
    )


def _bytes_by_candidate(storages: tuple[SavedStorage, ...]) -> tuple[dict[str, int], dict[str, int], int]:
    """In one pass over the storages: per candidate, the bytes of the storages it saves and of those it
    takes as inputs (each storage once per candidate), and the bytes saved outside every candidate."""
    saved: collections.Counter[str] = collections.Counter()
    taken: collections.Counter[str] = collections.Counter()
    other = 0
    for storage in storages:
        owners = {owner for owner, _ in storage.saves}
        other += storage.nbytes if None in owners else 0
        for owner in owners - {None}:
            saved[owner] += storage.nbytes
        for name in {name for name, _ in storage.inputs}:
            taken[name] += storage.nbytes
    return dict(saved), dict(taken), other


def _checkpointed_forwards(
    storages: tuple[SavedStorage, ...], recorder: Recorder, working: dict[str, int]
) -> tuple[BackwardPhase, ...]:
    """One phase per candidate call, counted only when the candidate is checkpointed: what is live when
    the call starts (its inputs kept, nothing of it saved) plus its forward's working set (keeping nothing)."""
    starts = recorder.call_starts
    saved = _saved_at_calls(storages, starts)
    return tuple(
        BackwardPhase(
            seq,
            name,
            live - held + working[name] + recorder.held_saved_bytes(watched, seq),
            forward=True,
            if_checkpointed=True,
            alive_anyway=recorder.alive_anyway(watched, seq),
        )
        for (seq, name, live), held, watched in zip(starts, saved, recorder.call_unsaved, strict=True)
    )


def _saved_at_calls(storages: tuple[SavedStorage, ...], starts: list[tuple[int, str, int]]) -> list[int]:
    """For each call ``(seq, name, _)``, the saved bytes alive at ``seq`` with ``name`` alone checkpointed
    (``alive_bytes(storages, [seq], checkpointed={name})``): the bytes alive with nothing checkpointed,
    corrected on the storages ``name`` saves or takes only, so the whole is near-linear in the storages
    (one sort), not calls x storages."""
    nbytes = np.array([storage.nbytes for storage in storages], dtype=np.int64)
    plain = np.array([alive_from(storage, ()) for storage in storages], dtype=np.float64)
    held = held_at(plain, nbytes, [seq for seq, _, _ in starts]).tolist()
    involving: dict[str, list[int]] = collections.defaultdict(list)
    for k, storage in enumerate(storages):
        names = {owner for owner, _ in storage.saves} | {name for name, _ in storage.inputs}
        for name in names - {None}:
            involving[name].append(k)
    alone: dict[str, list[tuple[float, float, int]]] = {}  # (start plain, start with it checkpointed, bytes)
    for index, (seq, name, _) in enumerate(starts):
        if name not in alone:
            alone[name] = [
                (plain[k], alive_from(storages[k], (name,)), int(nbytes[k])) for k in involving[name]
            ]
        held[index] += sum(size * (int(new <= seq) - int(old <= seq)) for old, new, size in alone[name])
    return [int(value) for value in held]


_HEAD = "head"  # the phase from the call of backward() to its first unpack of a saved tensor


def _phases(storages: tuple[SavedStorage, ...], recorder: Recorder) -> tuple[BackwardPhase, ...]:
    """Turn the tracker's per-phase peaks into extras over the saved bytes alive in each phase."""
    tracker = recorder.tracker
    peaks = tracker.phase_peak_bytes
    keys = list(peaks)
    times = [key[0] if isinstance(key, tuple) else math.inf for key in keys]
    saved = alive_bytes(storages, times, checkpointed=())
    watched = [tracker.phase_watched.get(key, ((), ())) for key in keys]
    held = [recorder.held_saved_bytes(rows, time) for rows, time in zip(watched, times, strict=True)]
    return tuple(
        BackwardPhase(
            time,
            key[1] if isinstance(key, tuple) else None,
            int(peaks[key] - alive + held_saved),
            forward=key is None or key == FORWARD_END,
            grad_bytes=int(tracker.phase_total_peak_bytes.get(key, 0) - peaks[key]),
            entry_extra_bytes=int(tracker.phase_entry_bytes.get(key, peaks[key]) - alive + held_saved),
            alive_anyway=recorder.alive_anyway(rows, time),
        )
        for key, time, alive, rows, held_saved in zip(keys, times, saved, watched, held, strict=True)
    )
