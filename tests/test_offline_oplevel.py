"""``lightning-ckpt plan`` with ``granularity: op`` (issue 24): each distinct block's options recorded and
sized on the fake model (an unsharded twin under FSDP2), priced in FLOPs, planned by the same
multiple-choice planner as a fit; refused for FSDP and DeepSpeed (flat parameters), as a fit refuses them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_ckpt import plan_offline
from lightning_ckpt.core.fsdp2 import post_forward_meshes
from lightning_ckpt.core.selective.costs import option_costs
from lightning_ckpt.core.selective.options import profile_block
from lightning_ckpt.lightning.fake_run import profile_run_on_fake_tensors
from lightning_ckpt.offline.data import first_batch
from lightning_ckpt.offline.plan import _offline_device_mesh
from lightning_ckpt.offline.run_config import load_run_config
from lightning_ckpt.planning import BudgetTooSmallError
from lightning_ckpt.planning.plan import CheckpointPlan
from lightning_ckpt.planning.plan_checks import check_plan_data

ROOT = Path(__file__).resolve().parents[1]
MODEL_ARGS = {"block_size": 32, "n_layer": 3, "n_head": 2, "n_embd": 32}
DATA_ARGS = {"block_size": 32, "batch_size": 4, "max_chars": 5000, "train_samples": 8, "val_samples": 4}


def _yaml(tmp_path: Path, *, granularity: str = "op", strategy: str = "auto", devices: int = 1) -> Path:
    text = (
        f"trainer:\n  accelerator: cpu\n  devices: {devices}\n  strategy: {strategy}\n"
        "  callbacks:\n    - class_path: lightning_ckpt.AutoCheckpoint\n"
        f"      init_args: {{budget_gb: 1, cost: flops, granularity: {granularity}}}\n"
        f"model:\n  class_path: examples.gpt.GPT\n  init_args: {json.dumps(MODEL_ARGS)}\n"
        f"data:\n  class_path: examples.data.CharDataModule\n  init_args: {json.dumps(DATA_ARGS)}\n"
    )
    path = tmp_path / f"{granularity}-{devices}.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def op_config(tmp_path_factory) -> Path:
    return _yaml(tmp_path_factory.mktemp("op"))


@pytest.fixture(scope="module")
def budget_gb(op_config: Path) -> float:
    """Midway between the least any plan reaches and keeping every block."""
    with pytest.raises(BudgetTooSmallError) as info:
        plan_offline(op_config, budget_gb=1e-6)
    keep_all = plan_offline(op_config, budget_gb=100).plan.predicted_peak_bytes
    return (info.value.minimum_bytes + keep_all) / 2 / 1e9


def test_an_offline_op_plan_chooses_selective_options_within_the_budget_for_fewer_flops(op_config, budget_gb):
    offline = plan_offline(op_config, budget_gb=budget_gb)
    block = plan_offline(_yaml(op_config.parent, granularity="block"), budget_gb=budget_gb)
    plan = offline.plan
    assert plan.selective and plan.predicted_peak_bytes <= plan.budget_bytes
    assert offline.recompute_flops < block.recompute_flops  # block-level choices are among op level's
    option_flops = [item.option_flops for item in plan.items if item.name in plan.checkpointed]
    assert offline.recompute_flops == sum(option_flops)
    assert "option GFLOP" in str(offline) and "selective" in str(offline)
    assert not check_plan_data(plan.to_dict()) and CheckpointPlan.from_dict(plan.to_dict()) == plan


def test_a_tie_at_zero_flops_goes_to_keep(op_config, budget_gb):
    """SDPA + all matmuls recomputes 0 FLOPs, as keep does: with room for most blocks kept, they are kept
    (eager SAC has its own cost, which FLOPs do not count)."""
    keep_all = plan_offline(op_config, budget_gb=100).plan.predicted_peak_bytes
    plan = plan_offline(op_config, budget_gb=(keep_all * 0.99) / 1e9).plan
    options = [item.option for item in plan.items]
    assert "keep" in options and options != ["keep"] * len(options), options
    assert all(item.option_flops == 0 for item in plan.items if item.option != "keep")


def test_the_fake_models_options_are_sized_as_a_real_blocks(op_config):
    """The named rules' bytes and FLOPs on the fake model equal a real block's (the prefixes differ: offline
    they are taken by FLOPs per byte, in a fit by measured seconds per byte)."""
    run = load_run_config(op_config)
    profiled = profile_run_on_fake_tensors(run, None, first_batch(run.data), op_level=True)
    assert sorted(profiled.options) == [m.name for m in profiled.profile.modules]
    fake = {c.name: c for c in profiled.options["transformer.h.1"]}
    torch.manual_seed(0)
    block = run.model.instantiate().transformer.h[1]
    x = torch.randn(
        DATA_ARGS["batch_size"], MODEL_ARGS["block_size"], MODEL_ARGS["n_embd"], requires_grad=True
    )
    real = {c.name: c for c in option_costs(block, (x,), profile_block(block, x, repeats=1))}
    named = ["keep", "sdpa", "sdpa+matmuls", "sdpa+every other matmul", "checkpoint"]
    fields = (
        "held_bytes",
        "transient_bytes",
        "forward_extra_bytes",
        "backward_extra_bytes",
        "recompute_flops",
    )
    for name in named:
        assert [getattr(fake[name], f) for f in fields] == [getattr(real[name], f) for f in fields], name
        assert fake[name].policy == real[name].policy


FSDP2 = (
    "\n    class_path: lightning.pytorch.strategies.ModelParallelStrategy\n"
    "    init_args: {data_parallel_size: 2, tensor_parallel_size: 1}"
)


def test_an_fsdp2_run_is_planned_on_an_unsharded_twin_with_the_same_options(tmp_path, op_config, budget_gb):
    """A sharded block cannot run alone (its hooks gather and reduce-scatter): its options are those of
    the same block unsharded, the plan made on the sharded step's profile."""
    sharded = plan_offline(_yaml(tmp_path, strategy=FSDP2, devices=2), budget_gb=budget_gb)
    assert sharded.strategy == "fsdp2" and sharded.world_size == 2
    plan = sharded.plan
    assert plan.selective and plan.predicted_peak_bytes <= plan.budget_bytes
    run = load_run_config(op_config)
    single = profile_run_on_fake_tensors(run, None, first_batch(run.data), op_level=True).options
    fsdp2_run = load_run_config(_yaml(tmp_path, strategy=FSDP2, devices=2))
    with _offline_device_mesh(fsdp2_run) as mesh, post_forward_meshes(None):
        twin = profile_run_on_fake_tensors(
            fsdp2_run, None, first_batch(fsdp2_run.data), device_mesh=mesh, op_level=True
        )
    assert twin.options == single


@pytest.mark.parametrize("strategy", ["fsdp", "lightning.pytorch.strategies.DeepSpeedStrategy"])
def test_op_level_is_refused_offline_for_flat_parameter_sharding_with_the_argument_named(tmp_path, strategy):
    config = _yaml(tmp_path, strategy=strategy, devices=2)
    with pytest.raises(
        ValueError, match=r"`granularity` must be 'block' to plan offline with a flat-parameter .* got 'op'$"
    ):
        plan_offline(config)


def test_the_cli_prints_each_blocks_option(op_config, budget_gb):
    cmd = [sys.executable, "-m", "lightning_ckpt.cli", "plan", "--config", str(op_config)]
    result = subprocess.run(
        [*cmd, "--budget-gb", str(budget_gb)], capture_output=True, text=True, cwd=ROOT, timeout=180
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ops saved)" in result.stdout and "option GFLOP" in result.stdout
