"""``lightning-ckpt plan``: plan a run from its LightningCLI YAML on fake tensors, without the hardware.

The model is built under ``FakeTensorMode`` (shapes and dtypes only: no weight memory, no device), one
real batch of the configured shape is taken from the data module and turned fake, and the step is
profiled exactly as :class:`~lightning_ckpt.AutoCheckpoint` profiles it (the same ``training_loss_fn``
under Lightning's precision plugin, the same ``profile_step`` and ``make_plan``), with the recompute
cost counted in FLOPs. The static memory (parameters, gradients, optimizer state, strategy buffers) is
then replaced by the per-device figure of the configured strategy (:mod:`lightning_ckpt.static_memory`).

Why a real batch: it works for any data module (any batch structure, dtypes and shapes) without knowing
its arguments; reading one batch costs far less than the profile. ``setup("fit")`` is called, not
``prepare_data()`` (nothing is downloaded), and no DataLoader workers are started.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import math
import sys
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.plugins.precision import DoublePrecision, HalfPrecision, MixedPrecision, Precision
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_leaves, tree_map_only
from torch.utils.data import IterableDataset

from lightning_ckpt.callback import AutoCheckpoint
from lightning_ckpt.candidates import find_candidates
from lightning_ckpt.lightning_step import training_loss_fn
from lightning_ckpt.memory import estimate_optimizer_bytes
from lightning_ckpt.plan import CheckpointPlan
from lightning_ckpt.planner import make_plan
from lightning_ckpt.profiler import StepProfile, profile_step
from lightning_ckpt.run_config import ClassSpec, RunConfig, load_run_config
from lightning_ckpt.static_memory import (
    ModelSizes,
    StaticMemory,
    ddp_static,
    fsdp_static,
    fsdp_units,
    single_device_static,
    wrap_classes_of,
)

__all__ = ["OfflinePlan", "first_batch", "main", "plan_offline", "precision_plugin", "profile_training_step"]

log = logging.getLogger(__name__)

_GB = 1e9
_HALF = {"bf16": torch.bfloat16, "16": torch.float16}


@dataclass(frozen=True)
class OfflinePlan:
    """A plan made from a config on fake tensors, with what it was made for."""

    plan: CheckpointPlan
    model_class: str
    num_parameters: int
    strategy: str
    world_size: int
    precision: str
    batch_shapes: tuple[tuple[int, ...], ...]
    """Shapes of the tensors in one per-device batch."""
    static: StaticMemory
    """Per-device static memory by part, with what is modelled and what is not."""
    recompute_flops: int
    """Forward FLOPs recomputed per step by the checkpointed modules."""
    tflops: float | None = None
    """Device throughput used to turn FLOPs into seconds (``None``: seconds are left at 0)."""

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON."""
        data = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        data["plan"] = self.plan.to_dict()
        data["static"] = self.static.to_dict()
        data["batch_shapes"] = [list(shape) for shape in self.batch_shapes]
        data["predicted_peak_gb"] = self.plan.predicted_peak_bytes / _GB
        return data

    def __str__(self) -> str:
        return "\n".join([*self._header_lines(), "", str(self.plan), "", *self._static_lines()])

    def _header_lines(self) -> list[str]:
        shapes = ", ".join(str(tuple(shape)) for shape in self.batch_shapes)
        return [
            f"model      {self.model_class}: {self.num_parameters:,} parameters",
            f"strategy   {self.static.strategy} | world size {self.world_size} | precision {self.precision}",
            f"batch      per device: {shapes}",
        ]

    def _recompute_line(self) -> str:
        flops = f"recompute per step: {self.recompute_flops / 1e12:.2f} TFLOP (forward of the checkpointed modules)"
        if self.tflops is None:
            return f"{flops}; pass --tflops for time"
        return f"{flops} = {self.plan.recompute_seconds * 1e3:.2f} ms at {self.tflops:g} TFLOP/s"

    def _static_lines(self) -> list[str]:
        s = self.static
        parts = [
            ("params", s.param_bytes),
            ("grads", s.grad_bytes),
            ("optimizer", s.optimizer_bytes),
            ("buffers", s.buffer_bytes),
            ("strategy", s.strategy_bytes),
        ]
        breakdown = " + ".join(f"{name} {value / _GB:.3f}" for name, value in parts)
        verdict = "fits" if self.plan.fits else "does NOT fit"
        return [
            self._recompute_line(),
            f"static per device (GB): {breakdown} = {s.total_bytes / _GB:.3f}",
            f"modelled: {'; '.join(s.modelled)}",
            f"not modelled (leave headroom in budget_gb): {'; '.join(s.not_modelled)}",
            f"predicted peak per device: {self.plan.predicted_peak_bytes / _GB:.3f} GB"
            f" of budget {self.plan.budget_bytes / _GB:.3f} GB ({verdict})",
        ]


def plan_offline(
    config_path: str | Path,
    *,
    overrides: Sequence[str] | None = None,
    budget_gb: float | None = None,
    devices: int | None = None,
    num_nodes: int | None = None,
    tflops: float | None = None,
) -> OfflinePlan:
    """Plan a training run from its LightningCLI YAML without its hardware (fake tensors, CPU only).

    Args:
        config_path: the YAML given to ``python -m examples.train fit --config ...``.
        overrides: more LightningCLI arguments, e.g. ``["--data.init_args.batch_size", "16"]``.
        budget_gb: per-device budget in GB (1e9 bytes); default: the config's AutoCheckpoint ``budget_gb``.
        devices: devices per node, replacing ``trainer.devices``.
        num_nodes: nodes, replacing ``trainer.num_nodes``.
        tflops: sustained TFLOP/s of the target device, to turn recompute FLOPs into seconds.

    Raises:
        BudgetTooSmallError: the budget is below the smallest that works (the message names it).
        ValueError: bad arguments, no budget anywhere, no data module, or a strategy it cannot model.

    Example:
        >>> result = plan_offline("configs/gpt-cpu.yaml", overrides=["--model.init_args.n_layer", "2"])
        >>> result.plan.fits, result.world_size, len(result.plan.items)
        (True, 1, 2)
    """
    run = load_run_config(config_path, _overrides(overrides, devices, num_nodes))
    settings = _callback_settings(run, budget_gb)
    if tflops is not None and not _positive(tflops):
        raise ValueError(f"`tflops` must be a positive finite number, got {tflops!r}")
    if run.data is None:
        raise ValueError(
            f"the config {str(config_path)!r} must name a `data` module (the batch shape comes from it)"
        )
    profiled = _fake_profile(run, settings.targets, first_batch(run.data))
    profile = _with_seconds(profiled.profile, tflops)
    plan = make_plan(
        profile,
        settings.budget_bytes,
        cost="flops",
        quantum_bytes=settings.quantum_bytes,
        solver=settings.solver,
        workers=settings.workers,
        notes=_notes(run),
    )
    checkpointed = set(plan.checkpointed)
    return OfflinePlan(
        plan=plan,
        model_class=run.model.class_path,
        num_parameters=profiled.num_parameters,
        strategy=run.strategy_name,
        world_size=run.world_size,
        precision=run.precision,
        batch_shapes=profiled.batch_shapes,
        static=profiled.static,
        recompute_flops=sum(m.flops for m in profile.modules if m.name in checkpointed),
        tflops=tflops,
    )


def _overrides(overrides: Sequence[str] | None, devices: int | None, num_nodes: int | None) -> list[str]:
    result = list(overrides or [])
    for name, value in (("devices", devices), ("num_nodes", num_nodes)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"`{name}` must be a positive integer, got {value!r}")
        result += [f"--trainer.{name}", str(value)]
    return result


def _positive(value: Any) -> bool:
    return (
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    )


def _callback_settings(run: RunConfig, budget_gb: float | None) -> AutoCheckpoint:
    """The callback the config would build (its own argument checks), with ``budget_gb`` replaced if given."""
    arguments = dict(run.autocheckpoint or {})
    if budget_gb is not None:
        arguments["budget_gb"] = budget_gb
    if "budget_gb" not in arguments:
        raise ValueError(
            "`budget_gb` is needed: pass it (--budget-gb) or add lightning_ckpt.AutoCheckpoint with a"
            " budget_gb to the config's trainer.callbacks, got neither"
        )
    return AutoCheckpoint(**arguments)


def _notes(run: RunConfig) -> tuple[str, ...]:
    notes = ["planned offline on fake tensors; recompute cost = forward FLOPs"]
    if not str(run.trainer.get("devices", 1)).strip().isdigit() and run.world_size == 1:
        notes.append(
            f"trainer.devices={run.trainer.get('devices')!r} counted as 1 device per node (pass --devices)"
        )
    return tuple(notes)


def _with_seconds(profile: StepProfile, tflops: float | None) -> StepProfile:
    if tflops is None:
        return profile
    modules = tuple(
        dataclasses.replace(m, recompute_seconds=m.flops / (tflops * 1e12)) for m in profile.modules
    )
    return dataclasses.replace(profile, modules=modules)


def first_batch(data: ClassSpec) -> Any:
    """One training batch of the data module: ``setup("fit")``, then the first batch, without workers.

    Example:
        >>> spec = ClassSpec("examples.data.CharDataModule", {"block_size": 8, "batch_size": 2, "max_chars": 1000})
        >>> [tuple(t.shape) for t in first_batch(spec)]
        [(2, 8), (2, 8)]
    """
    datamodule = data.instantiate()
    datamodule.setup("fit")
    with warnings.catch_warnings():  # a config's num_workers may exceed this machine's cores: none start
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        loader = datamodule.train_dataloader()
        sampler = getattr(loader, "batch_sampler", None)
        if sampler is None or isinstance(loader.dataset, IterableDataset):
            return next(iter(loader))
        return loader.collate_fn([loader.dataset[i] for i in next(iter(sampler))])


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


@dataclass(frozen=True)
class _PrecisionOnlyTrainer:
    """What :func:`training_loss_fn` reads from a Trainer: its precision plugin (no Trainer offline)."""

    precision_plugin: Precision


def profile_training_step(
    model: L.LightningModule,
    batch: Any,
    precision: str,
    targets: Sequence[str] | None = None,
    optimizer: Any = None,
) -> StepProfile:
    """Profile ``training_step`` on ``batch`` as AutoCheckpoint does (real or fake tensors; cost in FLOPs).

    The model must already be in the precision's parameter dtype (see :func:`plan_offline`).

    Example:
        >>> from examples.gpt import GPT
        >>> model = GPT(block_size=8, n_layer=2, n_head=2, n_embd=16)
        >>> batch = (torch.zeros(2, 8, dtype=torch.long),) * 2
        >>> [m.name for m in profile_training_step(model, batch, "bf16-mixed").modules]
        ['transformer.h.0', 'transformer.h.1']
    """
    plugin = precision_plugin(precision)
    candidates = find_candidates(model, targets)
    step_fn = training_loss_fn(_PrecisionOnlyTrainer(plugin), model, plugin.convert_input(batch), 0)
    return profile_step(model, step_fn, candidates, cost="flops", optimizer=optimizer)


@dataclass(frozen=True)
class _Profiled:
    profile: StepProfile
    """With the strategy's per-device static memory in place of the single-replica one."""
    num_parameters: int
    batch_shapes: tuple[tuple[int, ...], ...]
    static: StaticMemory


def _fake_profile(run: RunConfig, targets: Sequence[str] | None, batch: Any) -> _Profiled:
    master_dtype, compute_dtype = _param_dtypes(run)
    mode = FakeTensorMode()
    with mode:
        with _default_dtype(compute_dtype):
            model = run.model.instantiate()
        fake_batch = tree_map_only(torch.Tensor, mode.from_tensor, batch)
        optimizer = _configured_optimizer(model)
        profile = profile_training_step(model, fake_batch, run.precision, targets, optimizer)
    static = _static_memory(run, _FakeModel(model, profile, optimizer, master_dtype, compute_dtype))
    fields = ("param_bytes", "grad_bytes", "optimizer_bytes", "buffer_bytes", "strategy_bytes")
    return _Profiled(
        profile=dataclasses.replace(profile, **{name: getattr(static, name) for name in fields}),
        num_parameters=sum(p.numel() for p in model.parameters()),
        batch_shapes=tuple(tuple(t.shape) for t in tree_leaves(batch) if isinstance(t, torch.Tensor)),
        static=static,
    )


def _param_dtypes(run: RunConfig) -> tuple[torch.dtype, torch.dtype]:
    """(dtype the optimizer's parameters are kept in, dtype the forward sees the parameters in).

    They differ only under FSDP mixed precision, which gathers parameters in the compute dtype.
    """
    precision = run.precision
    prefix, _, kind = precision.partition("-")
    if precision == "64-true":
        master = torch.float64
    elif kind == "true" and prefix in _HALF:
        master = _HALF[prefix]
    else:
        master = torch.float32
    if run.strategy_name == "fsdp":
        return master, _fsdp_param_dtype(run, _HALF.get(prefix, master))
    return master, master


def _fsdp_param_dtype(run: RunConfig, default: torch.dtype) -> torch.dtype:
    mixed = run.strategy_args.get("mixed_precision")
    return getattr(mixed, "param_dtype", None) or default


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


@dataclass(frozen=True)
class _FakeModel:
    """The fake model with its profile and what static memory needs to know about its dtypes."""

    model: torch.nn.Module
    profile: StepProfile
    optimizer: Any
    master_dtype: torch.dtype
    """Dtype the optimizer's (sharded) parameters are kept in."""
    compute_dtype: torch.dtype
    """Dtype the forward sees parameters in (FSDP's gather dtype)."""


def _static_memory(run: RunConfig, built: _FakeModel) -> StaticMemory:
    _check_strategy(run)
    if run.strategy_name == "fsdp":
        return _fsdp_memory(run, built)
    profile = built.profile
    sizes = ModelSizes(profile.param_bytes, profile.grad_bytes, profile.optimizer_bytes, profile.buffer_bytes)
    if run.strategy_name == "ddp":
        bucket_view = bool(run.strategy_args.get("gradient_as_bucket_view"))
        return ddp_static(sizes, gradient_as_bucket_view=bucket_view)
    return single_device_static(sizes)


def _check_strategy(run: RunConfig) -> None:
    strategy = run.trainer.get("strategy") or "auto"
    text = (strategy.class_path if isinstance(strategy, ClassSpec) else str(strategy)).lower()
    if any(word in text for word in ("deepspeed", "xla", "modelparallel")):
        raise ValueError(
            f"`strategy` must be single-device, DDP or FSDP to plan offline (static memory is modelled for"
            f" those only), got {text!r}"
        )


def _fsdp_memory(run: RunConfig, built: _FakeModel) -> StaticMemory:
    """Sizes in the sharded (master) dtype, built from the fake model's shapes on the meta device."""
    args = run.strategy_args
    params = list(built.model.parameters())
    master = [
        torch.empty(p.shape, dtype=built.master_dtype, device="meta", requires_grad=p.requires_grad)
        for p in params
    ]
    element_bytes = master[0].element_size() if master else 0
    sizes = ModelSizes(
        param_bytes=sum(p.numel() for p in params) * element_bytes,
        grad_bytes=sum(p.numel() for p in params if p.requires_grad) * element_bytes,
        optimizer_bytes=estimate_optimizer_bytes(master, built.optimizer),
        buffer_bytes=built.profile.buffer_bytes,
    )
    given = args.get("sharding_strategy") or "FULL_SHARD"
    sharding = str(getattr(given, "name", given)).upper()  # a ShardingStrategy member or its name
    shard_size = {
        "NO_SHARD": 1,
        "HYBRID_SHARD": run.devices_per_node,
        "_HYBRID_SHARD_ZERO2": run.devices_per_node,
    }
    return fsdp_static(
        sizes,
        fsdp_units(built.model, wrap_classes_of(args.get("auto_wrap_policy"))),
        shard_size=shard_size.get(sharding, run.world_size),
        gather_bytes_per_param=torch.empty((), dtype=built.compute_dtype, device="meta").element_size(),
        sharding=sharding,
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightning-ckpt plan",
        description="Plan a run's activation checkpointing from its LightningCLI YAML on fake tensors"
        " (no GPU, no weight memory): the plan table and the predicted peak per device.",
    )
    parser.add_argument("--config", required=True, help="the training YAML (as for `fit --config`)")
    parser.add_argument(
        "--budget-gb", type=_positive_float, help="per-device budget in GB (default: the config's)"
    )
    parser.add_argument("--devices", type=_positive_int, help="devices per node (replaces trainer.devices)")
    parser.add_argument("--num-nodes", type=_positive_int, help="nodes (replaces trainer.num_nodes)")
    parser.add_argument("--tflops", type=_positive_float, help="device TFLOP/s, to show recompute time")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        type=_override,
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set data.init_args.batch_size=16 (repeatable)",
    )
    parser.add_argument("--json", type=Path, help="also write the plan and its context to this JSON file")
    return parser


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text!r}")
    return value


def _override(text: str) -> list[str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"must be KEY=VALUE, got {text!r}")
    return [f"--{key.strip().removeprefix('--')}", value]


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    """``lightning-ckpt plan``: print the offline plan (and write JSON); exit status 1 if it cannot plan."""
    args = _parser().parse_args(argv)
    logging.getLogger("lightning.fabric.utilities.seed").setLevel(logging.WARNING)  # "Seed set to ..."
    try:
        result = plan_offline(
            args.config,
            overrides=[part for pair in args.set for part in pair],
            budget_gb=args.budget_gb,
            devices=args.devices,
            num_nodes=args.num_nodes,
            tflops=args.tflops,
        )
    except ValueError as error:  # BudgetTooSmallError included: its message names the smallest budget
        sys.stderr.write(f"lightning-ckpt plan: {error}\n")
        return 1
    sys.stdout.write(f"{result}\n")
    if args.json is not None:
        args.json.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
        sys.stdout.write(f"wrote {args.json}\n")
    return 0
