"""The training step on fake tensors: a real batch, the model built fake, profiled as the callback does.

The model is built under ``FakeTensorMode`` (shapes and dtypes only: no weight memory, no device) in the
dtype the precision and strategy give its parameters, one real batch of the configured shape is taken
from the data module and turned fake, and the step is profiled exactly as
:class:`~lightning_ckpt.AutoCheckpoint` profiles it (the same ``training_loss_fn`` under Lightning's
precision plugin, the same ``profile_step``), with the recompute cost counted in FLOPs.

Why a real batch: it works for any data module (any batch structure, dtypes and shapes) without knowing
its arguments; reading one batch costs far less than the profile. ``setup("fit")`` is called, not
``prepare_data()`` (nothing is downloaded), and no DataLoader workers are started.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from lightning.pytorch.plugins.precision import DoublePrecision, HalfPrecision, MixedPrecision, Precision

from lightning_ckpt._compat import (
    FakeTensorMode,
    fake_module_conversions,
    give_device_mesh,
    grouped_mm_on_fake_tensors,
    tree_leaves,
    tree_map_only,
)
from lightning_ckpt.core.candidates import find_candidates
from lightning_ckpt.core.fake_mode import CpuKernelFakeTensorMode
from lightning_ckpt.core.fake_tensors import FakeModel as FakeTwins
from lightning_ckpt.core.fake_tensors import made_fake, optimizer_step_extra_bytes
from lightning_ckpt.core.hf_models import training_without_cache, unpacked_positions_on_fake_tensors
from lightning_ckpt.core.memory.static import StaticMemory
from lightning_ckpt.core.profile_types import StepProfile
from lightning_ckpt.core.profiler import profile_step
from lightning_ckpt.core.selective.costs import OptionCost
from lightning_ckpt.lightning.fake_options import fake_options, unsharded_twin
from lightning_ckpt.lightning.fake_static import FakeModel, param_dtypes, static_memory_of
from lightning_ckpt.lightning.run_spec import RunConfig
from lightning_ckpt.lightning.step import PrecisionOnlyTrainer, training_loss_fn

__all__ = [
    "RunProfile",
    "precision_plugin",
    "profile_run_on_fake_tensors",
    "profile_training_step",
]

log = logging.getLogger(__name__)


def precision_plugin(precision: str) -> Precision:
    """Lightning's precision plugin for ``precision`` on CPU (autocast on CPU for the mixed ones).

    Raises:
        ValueError: for a precision the offline planner does not model (e.g. transformer-engine).

    Example:
        >>> type(precision_plugin("bf16-mixed")).__name__, type(precision_plugin("32-true")).__name__
        ('MixedPrecision', 'Precision')
    """
    if precision in ("bf16-mixed", "16-mixed"):
        return MixedPrecision(precision, device="cpu")
    if precision in ("bf16-true", "16-true"):
        return HalfPrecision(precision)
    if precision == "64-true":
        return DoublePrecision()
    if precision == "32-true":
        return Precision()
    allowed = ("32-true", "64-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true")
    raise ValueError(f"`precision` must be one of {allowed} to plan offline, got {precision!r}")


def profile_training_step(
    model: L.LightningModule,
    batch: Any,
    precision: str,
    targets: Sequence[str] | None = None,
    optimizer: Any = None,
    plugin: Precision | None = None,
) -> StepProfile:
    """Profile ``training_step`` on ``batch`` as AutoCheckpoint does (real or fake tensors; cost in FLOPs),
    a transformers model without its KV cache and with its own position ids unpacked, as in the fit
    (:mod:`lightning_ckpt.core.hf_models`).

    The model must already be in the precision's parameter dtype (see :func:`plan_offline`). ``plugin``
    is the precision plugin of a live Trainer (default: :func:`precision_plugin` of ``precision``).

    Example:
        >>> from examples.gpt import GPT
        >>> model = GPT(block_size=8, n_layer=2, n_head=2, n_embd=16)
        >>> batch = (torch.zeros(2, 8, dtype=torch.long),) * 2
        >>> [m.name for m in profile_training_step(model, batch, "bf16-mixed").modules]
        ['transformer.h.0', 'transformer.h.1']
    """
    plugin = plugin or precision_plugin(precision)
    candidates = find_candidates(model, targets)
    batch = plugin.convert_input(batch)
    step_fn = training_loss_fn(PrecisionOnlyTrainer(plugin), model, batch, 0)
    with training_without_cache(model), unpacked_positions_on_fake_tensors(batch):  # as the fit runs
        return profile_step(model, step_fn, candidates, cost="flops", optimizer=optimizer, batch=batch)


@dataclass(frozen=True)
class RunProfile:
    """A run config's step profiled on fake tensors, with what the plan report needs besides."""

    profile: StepProfile
    """With the strategy's per-device static memory in place of the single-replica one."""
    num_parameters: int
    batch_shapes: tuple[tuple[int, ...], ...]
    static: StaticMemory
    options: dict[str, list[OptionCost]] = dataclasses.field(default_factory=dict)
    """Op level (``op_level=True``): each candidate's options, priced in FLOPs."""


def profile_run_on_fake_tensors(
    run: RunConfig,
    targets: Sequence[str] | None,
    batch: Any,
    *,
    device_mesh: Any = None,
    plugin: Precision | None = None,
    op_level: bool = False,
) -> RunProfile:
    """The run's model built fake (its ``configure_model`` too) in the strategy's dtypes, its step on
    ``batch`` made fake, and the strategy's per-device static memory (``lightning-ckpt plan``, and the
    callback's FSDP twins).

    ``device_mesh`` is given to the model before ``configure_model``, as ``ModelParallelStrategy`` gives
    it, so that a model sharding itself with ``fully_shard`` there is sharded (FSDP2 on fake tensors: its
    collectives move no data). ``plugin`` as in :func:`profile_training_step`. With ``op_level`` each
    candidate's op-level options too (:func:`~lightning_ckpt.lightning.fake_options.fake_options`).

    Raises:
        ValueError: for a ``ModelParallelStrategy`` run without ``device_mesh`` (``plan_offline`` makes
            one on a fake process group), and what :meth:`ClassSpec.instantiate` raises.
    """
    if run.strategy_name == "fsdp2" and device_mesh is None:
        raise ValueError(
            "`device_mesh` is needed for `strategy` ModelParallelStrategy (FSDP2), got None: the twin is"
            " sharded over it (plan_offline makes one on a fake process group)"
        )
    master_dtype, compute_dtype = param_dtypes(run)
    # the CPU kernels' norm outputs; views, other ops on ATen's and meta kernels
    mode = CpuKernelFakeTensorMode()

    def build() -> Any:  # weights a constructor reads from disk come out real: made fake
        return made_fake(run.model.instantiate(), mode)

    with mode, fake_module_conversions(), grouped_mm_on_fake_tensors():  # peft calls `.to()`; MoE in fp32
        with _default_dtype(compute_dtype):
            model = build()
            if device_mesh is not None:
                give_device_mesh(model, device_mesh)
            model.configure_model()  # models that build their layers there (as FSDP runs do)
        fake_batch = tree_map_only(torch.Tensor, mode.from_tensor, batch)
        optimizer = _configured_optimizer(model)
        profile = profile_training_step(model, fake_batch, run.precision, targets, optimizer, plugin)
        step_bytes = _optimizer_step_bytes(optimizer, model, mode)
        options = (
            _op_options(run, build, model, fake_batch, plugin, profile, compute_dtype) if op_level else {}
        )
    static = static_memory_of(run, FakeModel(model, profile, optimizer, master_dtype, compute_dtype))
    return RunProfile(
        profile=dataclasses.replace(profile, static=static, optimizer_step_bytes=step_bytes),
        num_parameters=sum(p.numel() for p in model.parameters()),
        batch_shapes=tuple(tuple(t.shape) for t in tree_leaves(batch) if isinstance(t, torch.Tensor)),
        static=static,
        options=options,
    )


def _op_options(
    run: RunConfig,
    build: Callable[[], Any],
    model: L.LightningModule,
    batch: Any,
    plugin: Precision | None,
    profile: StepProfile,
    dtype: torch.dtype,
) -> dict[str, list[OptionCost]]:
    """Each candidate's op-level options, on an unsharded twin where FSDP2 shards the model."""
    with _default_dtype(dtype):
        twin = unsharded_twin(model, build)
    names = [m.name for m in profile.modules]
    return fake_options(twin, batch, plugin or precision_plugin(run.precision), names)


def _optimizer_step_bytes(optimizer: Any, model: torch.nn.Module, mode: FakeTensorMode) -> int:
    """The optimizer step's temporaries on the fake model (its parameters are their own fake twins)."""
    params = list(model.parameters())
    step_bytes = optimizer_step_extra_bytes(optimizer, FakeTwins(mode, {id(p): p for p in params}))
    for param in params:  # the twin optimizer gave them fake gradients
        param.grad = None
    return step_bytes


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _configured_optimizer(model: L.LightningModule) -> Any:
    """The (first) optimizer of ``configure_optimizers``, or ``"adamw"`` (with a warning) if it cannot run."""
    try:
        optimizer = _first_optimizer(model.configure_optimizers())
    except Exception as error:  # e.g. it needs a Trainer (estimated_stepping_batches)
        log.warning("configure_optimizers() failed offline (%s); assuming AdamW state", error)
        return "adamw"
    return optimizer if optimizer is not None else "adamw"


def _first_optimizer(configured: Any) -> torch.optim.Optimizer | None:
    if isinstance(configured, torch.optim.Optimizer):
        return configured
    if isinstance(configured, dict):
        return _first_optimizer(configured.get("optimizer"))
    if isinstance(configured, (list, tuple)):
        return next(filter(None, map(_first_optimizer, configured)), None)
    return None
