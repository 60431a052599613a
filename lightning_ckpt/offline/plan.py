"""``lightning-ckpt plan``: plan a run from its LightningCLI YAML on fake tensors, without the hardware.

The training step is profiled on fake tensors exactly as :class:`~lightning_ckpt.AutoCheckpoint` profiles
it (:mod:`lightning_ckpt.lightning.fake_run`), with the recompute cost counted in FLOPs, and planned with the same
``make_plan``. The static memory (parameters, gradients, optimizer state, strategy buffers) is the
per-device figure of the configured strategy (:mod:`lightning_ckpt.lightning.fake_static`).

FSDP2 (``ModelParallelStrategy``) is planned as the callback plans it in a fit: the model's own
``configure_model`` shards it with ``fully_shard``, and FSDP2 runs its step on fake tensors. The device
mesh it shards over is made in this process on torch's fake process group, as rank 0 of the config's
world size (collectives move no data; rank 0 holds the largest shards where they do not divide evenly).

``granularity: op`` (one device, DDP, FSDP2 on an unsharded twin): each distinct block's options are
recorded and sized on the fake model and priced in FLOPs (:mod:`lightning_ckpt.lightning.fake_options`),
then planned by the fit's ``make_op_plan``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_ckpt._compat import init_fake_process_group
from lightning_ckpt.config import AutoCheckpointConfig
from lightning_ckpt.core.fsdp2 import post_forward_meshes
from lightning_ckpt.core.memory.static import StaticMemory
from lightning_ckpt.core.profile_types import StepProfile
from lightning_ckpt.lightning.fake_run import profile_run_on_fake_tensors
from lightning_ckpt.lightning.run_spec import RunConfig
from lightning_ckpt.offline.data import first_batch
from lightning_ckpt.offline.run_config import load_run_config
from lightning_ckpt.planning import make_plan
from lightning_ckpt.planning.op_plan import make_op_plan
from lightning_ckpt.planning.plan import CheckpointPlan
from lightning_ckpt.units import BYTES_PER_GB

__all__ = ["OfflinePlan", "plan_offline"]


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
        data["predicted_peak_gb"] = self.plan.predicted_peak_bytes / BYTES_PER_GB
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
        tflop = self.recompute_flops / 1e12
        flops = f"recompute per step: {tflop:.2f} TFLOP (forward FLOPs the checkpointed modules recompute)"
        if self.tflops is None:
            return f"{flops}; pass --tflops for time"
        return (
            f"{flops} = {self.recompute_flops / (self.tflops * 1e12) * 1e3:.2f} ms at {self.tflops:g} TFLOP/s"
        )

    def _static_lines(self) -> list[str]:
        s = self.static
        parts = [
            ("params", s.param_bytes),
            ("grads", s.grad_bytes),
            ("optimizer", s.optimizer_bytes),
            ("buffers", s.buffer_bytes),
            ("strategy", s.strategy_bytes),
        ]
        breakdown = " + ".join(f"{name} {value / BYTES_PER_GB:.3f}" for name, value in parts)
        verdict = "fits" if self.plan.fits else "does NOT fit"
        return [
            self._recompute_line(),
            f"static per device (GB): {breakdown} = {s.total_bytes / BYTES_PER_GB:.3f}",
            f"modelled: {'; '.join(s.modelled)}",
            f"not modelled (leave headroom in budget_gb): {'; '.join(s.not_modelled)}",
            f"predicted peak per device: {self.plan.predicted_peak_bytes / BYTES_PER_GB:.3f} GB"
            f" of budget {self.plan.budget_bytes / BYTES_PER_GB:.3f} GB ({verdict})",
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
        ValueError: bad arguments, no budget anywhere, no data module, ``granularity: op`` with FSDP
            or DeepSpeed (or FSDP2 casting parameters), a strategy it cannot model (FSDP2 with tensor
            parallelism), or FSDP2 in a process that has a process group already.

    Example:
        >>> result = plan_offline("configs/gpt-cpu.yaml", overrides=["--model.init_args.n_layer", "2"])
        >>> result.plan.fits, result.world_size, len(result.plan.items)
        (True, 1, 2)
    """
    run = load_run_config(config_path, _overrides(overrides, devices, num_nodes))
    settings = _callback_settings(run, budget_gb)
    _check_granularity(settings, run)
    if tflops is not None and not _positive(tflops):
        raise ValueError(f"`tflops` must be a positive finite number, got {tflops!r}")
    if run.data is None:
        raise ValueError(
            f"the config {str(config_path)!r} must name a `data` module (the batch shape comes from it)"
        )
    batch = first_batch(run.data)
    op_level = settings.granularity == "op"
    with _offline_device_mesh(run) as mesh, post_forward_meshes(None):  # reshard_after_forward=N
        profiled = profile_run_on_fake_tensors(
            run, settings.targets, batch, device_mesh=mesh, op_level=op_level
        )
    profile = _with_seconds(profiled.profile, tflops)
    settings = dataclasses.replace(settings, cost="flops")  # nothing to time offline
    if op_level:
        plan = make_op_plan(profile, profiled.options, settings.budget_bytes, settings, notes=_notes(run))
    else:
        plan = make_plan(profile, settings.budget_bytes, settings, notes=_notes(run))
    return OfflinePlan(
        plan=plan,
        model_class=run.model.class_path,
        num_parameters=profiled.num_parameters,
        strategy=run.strategy_name,
        world_size=run.world_size,
        precision=run.precision,
        batch_shapes=profiled.batch_shapes,
        static=profiled.static,
        recompute_flops=plan.recompute_flops,
        tflops=tflops,
    )


@contextlib.contextmanager
def _offline_device_mesh(run: RunConfig) -> Iterator[Any]:
    """For an FSDP2 run, the ``ModelParallelStrategy`` device mesh (``data_parallel`` x ``tensor_parallel``)
    on a fake process group of the run's world size, this process its rank 0, until the block ends;
    ``None`` for any other strategy."""
    if run.strategy_name != "fsdp2":
        yield None
        return
    shape = _fsdp2_mesh_shape(run)
    import torch.distributed as dist

    if dist.is_initialized():
        raise ValueError(
            "`strategy` ModelParallelStrategy (FSDP2) is planned offline on a fake process group of its own,"
            f" but this process has a process group already (world size {dist.get_world_size()}); plan"
            " from a fresh process (`lightning-ckpt plan`)"
        )
    from torch.distributed.device_mesh import init_device_mesh

    init_fake_process_group(run.world_size)
    try:
        yield init_device_mesh("cpu", shape, mesh_dim_names=("data_parallel", "tensor_parallel"))
    finally:
        dist.destroy_process_group()


def _fsdp2_mesh_shape(run: RunConfig) -> tuple[int, int]:
    """(data-parallel, tensor-parallel) sizes as ``ModelParallelStrategy`` resolves them ("auto": the
    number of nodes and the devices per node); only data parallelism is planned for."""
    args = run.strategy_args
    auto = {
        "data_parallel_size": int(run.trainer.get("num_nodes") or 1),
        "tensor_parallel_size": run.devices_per_node,
    }
    data, tensor = (auto[key] if args.get(key, "auto") == "auto" else int(args[key]) for key in auto)
    if tensor != 1:
        raise ValueError(
            "`tensor_parallel_size` must be 1 to plan ModelParallelStrategy (FSDP2 data parallelism only;"
            f" tensor parallelism is not planned for yet; 'auto' is the devices per node), got {tensor}:"
            " set trainer.strategy.init_args.tensor_parallel_size to 1 and data_parallel_size to the world size"
        )
    if data != run.world_size:
        raise ValueError(
            f"`data_parallel_size` must be the world size {run.world_size} (devices x num_nodes) with"
            f" tensor_parallel_size 1, got {data}: set trainer.strategy.init_args.data_parallel_size"
        )
    return data, tensor


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


def _callback_settings(run: RunConfig, budget_gb: float | None) -> AutoCheckpointConfig:
    """The settings the config's callback would have (the same checks), with ``budget_gb`` replaced if given."""
    arguments = dict(run.autocheckpoint or {})
    if budget_gb is not None:
        arguments["budget_gb"] = budget_gb
    if "budget_gb" not in arguments:
        raise ValueError(
            "`budget_gb` is needed: pass it (--budget-gb) or add lightning_ckpt.AutoCheckpoint with a"
            " budget_gb to the config's trainer.callbacks, got neither"
        )
    return AutoCheckpointConfig(**arguments)


def _check_granularity(settings: AutoCheckpointConfig, run: RunConfig) -> None:
    """Refuse op level where a fit refuses it: FSDP and DeepSpeed shard the model into flat parameters."""
    strategy = run.trainer.get("strategy") or "auto"
    name = str(getattr(strategy, "class_path", strategy)).lower()
    if settings.granularity == "op" and (run.strategy_name == "fsdp" or "deepspeed" in name):
        raise ValueError(
            "`granularity` must be 'block' to plan offline with a flat-parameter sharding strategy (op level"
            " runs on one device, with DDP or with ModelParallelStrategy): set granularity: block for"
            f" strategy {name!r}, got {settings.granularity!r}"
        )


def _notes(run: RunConfig) -> tuple[str, ...]:
    notes = ["planned offline on fake tensors; recompute cost = forward FLOPs"]
    if run.strategy_name == "fsdp2":
        notes.append(
            f"FSDP2 sharded by the model's configure_model as rank 0 of {run.world_size} (fake process group)"
        )
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
