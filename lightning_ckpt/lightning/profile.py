"""Profile a training step inside a Lightning fit without going over the budget.

- **Memory** comes from the step run on fake tensors (:func:`lightning_ckpt.core.fake_tensors.fake_model`):
  the live model's shapes, dtypes and devices, the batch's shapes, Lightning's precision context, no byte
  allocated. It is the real profile byte for byte (tested), plus the optimizer step's temporaries measured
  the same way.
- **Time** comes from forwards under ``torch.no_grad()``: nothing is kept for backward, so the timing run
  needs less memory than any checkpointed step. One forward, except the first time a model on CUDA is
  timed: the best of two there (the first CUDA calls of a process load kernels and grow the allocator).
  Blocks alike (a decoder's layers: same structure, parameters and input shapes) are timed on the
  kind's first two calls and share the faster time; the others do not run
  (:mod:`lightning_ckpt.core.timing`; FSDP and FSDP2 time every block).
- **The optimizer step's temporaries** depend on the parameters, the optimizer's settings and its
  state, not on the batch. Torch's own Adam, AdamW and SGD in their plain settings: from the parameters'
  layouts (:func:`lightning_ckpt.core.memory.optimizer.known_step_bytes`, tested equal to a fake step).
  Any other optimizer: a step of its fake twin, measured once within a fit and again only when one of
  those changes (:func:`lightning_ckpt.core.fake_tensors.optimizer_step_extra_bytes` with ``reuse=True``).
- **FSDP**: the sharded flat parameters have no full-size fake twin, so the memory half runs on a fake
  twin built from the module's class and saved hyperparameters (:mod:`lightning_ckpt.lightning.fsdp_twin`),
  with the strategy's sharded static memory.
- **FSDP2** (``fully_shard``, ``ModelParallelStrategy``): the twin is sharded by the model's own
  ``configure_model`` on the live device mesh, and FSDP2 runs its step on fake tensors
  (:mod:`lightning_ckpt.lightning.fsdp2_twin`). The timing forwards run the live model, FSDP2's hooks and
  all; its per-iteration state is reset after them (:func:`lightning_ckpt.core.fsdp2.iteration_state_reset`).
- **Fallback**: a step that cannot run on fake tensors (a ``.item()`` or data-dependent branch in
  ``training_step`` or the model), and an FSDP module that cannot be rebuilt from its hyperparameters,
  are profiled on real tensors as one unchecked step, with a warning on every rank that does it: that
  step is not held to the budget (the optimizer step is still measured on fake twins).
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_ckpt._compat import collect_rng_states, set_rng_states
from lightning_ckpt.core.fake_tensors import fake_model, optimizer_step_extra_bytes
from lightning_ckpt.core.fsdp2 import is_fsdp2, iteration_state_reset
from lightning_ckpt.core.hf_models import unpacked_positions_on_fake_tensors
from lightning_ckpt.core.memory.static import ModelSizes, strategy_static
from lightning_ckpt.core.profile_types import Cost, StepProfile
from lightning_ckpt.core.profiler import profile_step, time_forwards
from lightning_ckpt.core.wrapping import checkpointing_removed
from lightning_ckpt.lightning.fsdp2_twin import fsdp2_twin_profile
from lightning_ckpt.lightning.fsdp_twin import fsdp_twin_profile
from lightning_ckpt.lightning.shapes import BatchShapes, batch_shapes, pad_batch
from lightning_ckpt.lightning.step import (
    PrecisionOnlyTrainer,
    no_gradient_sync,
    training_loss_fn,
    untouched_training_state,
)

__all__ = ["BatchShapes", "FamilyProfileError", "batch_shapes", "profile_in_fit", "profiles_collectively"]


class FamilyProfileError(RuntimeError):
    """The step does not run on fake tensors at a family's top shapes (e.g. past the model's positions):
    plan the batch's own shapes instead."""


def profile_in_fit(
    trainer: pl.Trainer,
    pl_module: pl.LightningModule,
    batch: Any,
    batch_idx: int,
    candidates: Sequence[str],
    cost: Cost,
    pad_to: BatchShapes | None = None,
) -> StepProfile:
    """The step's profile for ``batch``: memory on fake tensors, time from no-grad forwards (see above).

    With ``pad_to`` (shapes covering the batch's, see :mod:`lightning_ckpt.lightning.shapes`) the memory
    half runs on the batch grown to those shapes (fake: nothing allocated); the times are the batch's own.
    Leaves no trace on training: gradients, buffers, RNG streams and logged metrics are as before.

    Raises:
        FamilyProfileError: when the step does not run on fake tensors at ``pad_to`` (no real fallback
            there: the caller profiles the batch's own shapes).
    """
    optimizer = trainer.optimizers[0] if trainer.optimizers else None
    padded = pad_to is not None and pad_to != batch_shapes(batch)
    with checkpointing_removed(pl_module), iteration_state_reset(pl_module):
        if is_fsdp2(pl_module) or _is_fsdp(trainer):
            twin = fsdp2_twin_profile if is_fsdp2(pl_module) else fsdp_twin_profile
            twin_batch = pad_batch(batch, pad_to) if padded else batch
            profile = _twin_profile(twin(trainer, pl_module, twin_batch, candidates), pl_module, optimizer)
        else:
            profile = _fake_profile(
                trainer, pl_module, batch, candidates, optimizer, pad_to if padded else None
            )
        if profile is None and padded:
            raise FamilyProfileError(f"the step does not run on fake tensors at {pad_to}")
        if profile is None:
            return _with_strategy_memory(
                _real_profile(trainer, pl_module, batch, batch_idx, candidates, cost, optimizer), trainer
            )
        if cost == "time":
            alike = not (is_fsdp2(pl_module) or _is_fsdp(trainer))  # their hooks run around every call
            seconds = _timed(trainer, pl_module, batch, batch_idx, candidates, alike)
            profile = _with_seconds(profile, seconds)
    return _with_strategy_memory(profile, trainer)


def _fake_profile(
    trainer: pl.Trainer,
    pl_module: pl.LightningModule,
    batch: Any,
    candidates: Sequence[str],
    optimizer: Any,
    pad_to: BatchShapes | None = None,
) -> StepProfile | None:
    """The memory profile on fake tensors (the batch grown to ``pad_to`` if given), or None when the
    step cannot run on them (with a warning, unless it is the padded profile of a family)."""
    plugin = trainer.precision_plugin
    try:
        with _rng_untouched(), fake_model(pl_module) as fake, unpacked_positions_on_fake_tensors(batch):
            fake_batch = fake.fake(batch)
            if pad_to is not None:
                fake_batch = pad_batch(fake_batch, pad_to)
            step_fn = training_loss_fn(PrecisionOnlyTrainer(plugin), pl_module, fake_batch, 0)
            profile = profile_step(
                pl_module, step_fn, candidates, "flops", optimizer=optimizer, batch=fake_batch
            )
            optimizer_bytes = optimizer_step_extra_bytes(optimizer, fake, reuse=True)  # the twins made
    except Exception as error:  # data-dependent ops, .item(), kernels without a fake implementation
        if pad_to is not None:
            return None  # the caller plans the batch's own shapes, which may still run on fake tensors
        warnings.warn(  # on every rank: the ranks that fall back are the ones that may go over
            f"AutoCheckpoint: the training step does not run on fake tensors ({type(error).__name__}: {error});"
            " profiling it on real tensors instead, so this profiling step is not held to `budget_gb`",
            stacklevel=2,
        )
        return None
    return dataclasses.replace(profile, optimizer_step_bytes=optimizer_bytes)


def _twin_profile(
    profile: StepProfile | None, pl_module: pl.LightningModule, optimizer: Any
) -> StepProfile | None:
    """FSDP and FSDP2: the memory profile of a fake twin (FSDP: full-size, static memory sharded; FSDP2:
    sharded as the live model is), with the optimizer step's temporaries measured on fake twins of the
    live shards; ``None`` when the twin could not be profiled."""
    return None if profile is None else _with_optimizer_step(profile, pl_module, optimizer)


def _real_profile(
    trainer: pl.Trainer,
    pl_module: pl.LightningModule,
    batch: Any,
    batch_idx: int,
    candidates: Sequence[str],
    cost: Cost,
    optimizer: Any,
) -> StepProfile:
    step_fn = training_loss_fn(trainer, pl_module, batch, batch_idx)
    with untouched_training_state(pl_module), no_gradient_sync(trainer):
        profile = profile_step(pl_module, step_fn, candidates, cost=cost, optimizer=optimizer, batch=batch)
    return _with_optimizer_step(profile, pl_module, optimizer)


def _with_optimizer_step(profile: StepProfile, pl_module: pl.LightningModule, optimizer: Any) -> StepProfile:
    """The optimizer step's temporaries, measured on fake twins of the live parameters (no step runs)."""
    with fake_model(pl_module) as fake:
        optimizer_bytes = optimizer_step_extra_bytes(optimizer, fake, reuse=True)
    return dataclasses.replace(profile, optimizer_step_bytes=optimizer_bytes)


def _timed(
    trainer: pl.Trainer,
    pl_module: pl.LightningModule,
    batch: Any,
    batch_idx: int,
    candidates: Sequence[str],
    alike: bool,
) -> dict[str, float]:
    step_fn = training_loss_fn(trainer, pl_module, batch, batch_idx)
    on_cuda = trainer.strategy.root_device.type == "cuda"
    repeats = 2 if on_cuda and pl_module not in _timed_on_cuda else 1
    with untouched_training_state(pl_module), no_gradient_sync(trainer):
        seconds = time_forwards(pl_module, candidates, step_fn, repeats=repeats, alike=alike)
    if on_cuda:
        _timed_on_cuda.add(pl_module)
    return seconds


_timed_on_cuda: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
"""Models timed on CUDA in this process: their kernels are loaded, one timing forward is enough."""


def _with_seconds(profile: StepProfile, seconds: dict[str, float]) -> StepProfile:
    modules = tuple(dataclasses.replace(m, recompute_seconds=seconds[m.name]) for m in profile.modules)
    return dataclasses.replace(profile, modules=modules)


def _with_strategy_memory(profile: StepProfile, trainer: pl.Trainer) -> StepProfile:
    """Lightning's loop: gradients freed after the forward, or kept while they accumulate; and DDP's
    gradient buckets (1x the gradients unless ``gradient_as_bucket_view``) in the static memory."""
    accumulating = getattr(trainer, "accumulate_grad_batches", 1) > 1
    profile = dataclasses.replace(profile, zero_grad="never" if accumulating else "after_forward")
    model = getattr(trainer.strategy, "model", None)
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return profile
    single = profile.static
    sizes = ModelSizes(single.param_bytes, single.grad_bytes, single.optimizer_bytes, single.buffer_bytes)
    static = strategy_static("ddp", sizes, gradient_as_bucket_view=bool(model.gradient_as_bucket_view))
    return dataclasses.replace(profile, static=static)


def profiles_collectively(trainer: pl.Trainer) -> bool:
    """Whether a profile runs collectives, so that every rank must profile at the same step or none may:
    FSDP and FSDP2 on several devices (their twins shard on the live mesh, their timing forwards gather
    the live parameters). Elsewhere a rank profiles on its own."""
    return trainer.world_size > 1 and (is_fsdp2(trainer.lightning_module) or _is_fsdp(trainer))


def _is_fsdp(trainer: pl.Trainer) -> bool:
    return "fsdp" in type(trainer.strategy).__name__.lower()


@contextlib.contextmanager
def _rng_untouched() -> Iterator[None]:
    states = collect_rng_states()
    try:
        yield
    finally:
        set_rng_states(states)
