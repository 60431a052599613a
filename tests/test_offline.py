"""Offline planning on fake tensors: the same profile and plan as the callback's real CPU run, the CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from callback_helpers import fast_trainer
from torch._subclasses.fake_tensor import FakeTensorMode

from examples.gpt import GPT
from lightning_ckpt.callback import AutoCheckpoint
from lightning_ckpt.core.memory.static import FsdpUnits, ModelSizes, fsdp_static, fsdp_units, wrap_classes_of
from lightning_ckpt.lightning.fake_run import profile_training_step
from lightning_ckpt.lightning.run_spec import ClassSpec
from lightning_ckpt.offline.cli import main
from lightning_ckpt.offline.data import first_batch
from lightning_ckpt.offline.plan import plan_offline
from lightning_ckpt.offline.run_config import load_run_config
from lightning_ckpt.planning import BudgetTooSmallError

ROOT = Path(__file__).resolve().parents[1]
MODEL_ARGS = {"block_size": 64, "n_layer": 4, "n_head": 4, "n_embd": 64}
DATA_ARGS = {"block_size": 64, "batch_size": 8, "max_chars": 20_000, "train_samples": 16, "val_samples": 8}


def _yaml(
    tmp_path: Path, *, precision: str = "32-true", strategy: str = "auto", budget_gb: float | None = 1.0
) -> Path:
    """A tiny GPT run config, written as a user would."""
    callbacks = ""
    if budget_gb is not None:
        callbacks = (
            "  callbacks:\n    - class_path: lightning_ckpt.AutoCheckpoint\n"
            f"      init_args: {{budget_gb: {budget_gb}, cost: flops}}\n"
        )
    text = (
        f"trainer:\n  accelerator: cpu\n  devices: 1\n  precision: {precision}\n  strategy: {strategy}\n"
        f"{callbacks}"
        f"model:\n  class_path: examples.gpt.GPT\n  init_args: {json.dumps(MODEL_ARGS)}\n"
        f"data:\n  class_path: examples.data.CharDataModule\n  init_args: {json.dumps(DATA_ARGS)}\n"
    )
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def _budget_between_all_and_none(path: Path) -> float:
    """A budget that needs some, not all, blocks checkpointed: midway between the minimum and keeping all."""
    with pytest.raises(BudgetTooSmallError) as info:
        plan_offline(path, budget_gb=1e-6)
    keep_all = plan_offline(path, budget_gb=100).plan.predicted_peak_bytes
    return (info.value.minimum_bytes + keep_all) / 2 / 1e9


def test_fake_plan_matches_the_callbacks_plan_on_a_real_cpu_run(tmp_path: Path) -> None:
    path = _yaml(tmp_path)
    budget_gb = _budget_between_all_and_none(path)
    offline = plan_offline(path, budget_gb=budget_gb).plan

    run = load_run_config(path)
    callback = AutoCheckpoint(budget_gb=budget_gb, cost="flops", measure=False)
    fast_trainer([callback], max_steps=1).fit(run.model.instantiate(), datamodule=run.data.instantiate())

    real = callback.plan
    assert [item.activation_bytes for item in offline.items] == [item.activation_bytes for item in real.items]
    assert [item.input_bytes for item in offline.items] == [item.input_bytes for item in real.items]
    assert [item.flops for item in offline.items] == [item.flops for item in real.items]
    assert 0 < len(real.checkpointed) < len(real.items)
    assert offline.checkpointed == real.checkpointed
    assert offline.static_bytes == real.static_bytes
    assert offline.predicted_peak_bytes == pytest.approx(real.predicted_peak_bytes, rel=0.01)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_one_profiling_path_gives_exact_bytes_on_fake_tensors(precision: str) -> None:
    torch.manual_seed(0)
    batch = first_batch(ClassSpec("examples.data.CharDataModule", DATA_ARGS))
    real_model = GPT(**MODEL_ARGS)
    real = profile_training_step(real_model, batch, precision, optimizer="adamw")
    mode = FakeTensorMode()
    with mode:
        fake_model = GPT(**MODEL_ARGS)
        fake_batch = tuple(mode.from_tensor(t) for t in batch)
        fake = profile_training_step(fake_model, fake_batch, precision, optimizer="adamw")
    assert fake.modules == real.modules
    assert (fake.other_activation_bytes, fake.backward_extra_bytes) == (
        real.other_activation_bytes,
        real.backward_extra_bytes,
    )
    assert fake.static_bytes == real.static_bytes


def test_fsdp_shards_static_memory_and_keeps_activations_per_device(tmp_path: Path) -> None:
    fsdp = (
        "{class_path: lightning.pytorch.strategies.FSDPStrategy,"
        " init_args: {auto_wrap_policy: [examples.gpt.Block], sharding_strategy: FULL_SHARD}}"
    )
    ddp = plan_offline(_yaml(tmp_path, precision="bf16-mixed", strategy="ddp"), devices=4, num_nodes=2)
    sharded = plan_offline(_yaml(tmp_path, precision="bf16-mixed", strategy=fsdp), devices=4, num_nodes=2)
    zero2 = plan_offline(
        _yaml(tmp_path, precision="bf16-mixed", strategy=fsdp.replace("FULL_SHARD", "SHARD_GRAD_OP")),
        devices=4,
        num_nodes=2,
    )
    assert (ddp.world_size, sharded.world_size, sharded.static.strategy) == (8, 8, "fsdp FULL_SHARD over 8")
    assert sharded.static.param_bytes == math.ceil(ddp.static.param_bytes / 8)  # fp32 master shards
    assert sharded.static.optimizer_bytes == math.ceil(ddp.static.optimizer_bytes / 8)
    assert ddp.static.strategy_bytes == ddp.static.grad_bytes  # DDP buckets
    assert 0 < sharded.static.strategy_bytes < zero2.static.strategy_bytes
    # FSDP gathers bf16 parameters, so autocast makes no weight copies inside the blocks.
    for fsdp_item, ddp_item in zip(sharded.plan.items, ddp.plan.items, strict=True):
        assert 0 < fsdp_item.activation_bytes < ddp_item.activation_bytes


def test_main_prints_header_table_and_peak_and_writes_json(tmp_path: Path, capsys) -> None:
    out = tmp_path / "plan.json"
    assert main(["--config", str(_yaml(tmp_path)), "--tflops", "100", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    for expected in (
        "examples.gpt.GPT",
        "precision 32-true",
        "(8, 64)",
        "transformer.h.3",
        "predicted peak per device",
    ):
        assert expected in text
    data = json.loads(out.read_text())
    assert [item["name"] for item in data["plan"]["items"]] == [f"transformer.h.{i}" for i in range(4)]
    assert data["static"]["total_bytes"] == data["plan"]["static_bytes"]
    assert data["static"]["not_modelled"] and data["batch_shapes"] == [[8, 64], [8, 64]]
    assert all(item["recompute_seconds"] == item["flops"] / 100e12 for item in data["plan"]["items"])


def test_main_budget_too_small_exits_1_with_the_callbacks_message(tmp_path: Path, capsys) -> None:
    assert main(["--config", str(_yaml(tmp_path)), "--budget-gb", "0.000001"]) == 1
    err = capsys.readouterr().err
    assert "`budget_gb`=1e-06 is too small" in err and "The smallest budget that works is budget_gb=" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--budget-gb", "-1"], "argument --budget-gb: must be a positive finite number, got '-1'"),
        (["--devices", "0"], "argument --devices: must be a positive integer, got '0'"),
        (["--tflops", "fast"], "argument --tflops: must be a positive finite number, got 'fast'"),
        (["--set", "novalue"], "argument --set: must be KEY=VALUE, got 'novalue'"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_main_bad_flags_are_argparse_errors_naming_the_flag(tmp_path: Path, capsys, flags, message) -> None:
    with pytest.raises(SystemExit):
        main(["--config", str(_yaml(tmp_path)), *flags])
    assert message in capsys.readouterr().err


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="`budget_gb` is needed: pass it"):
        plan_offline(_yaml(tmp_path, budget_gb=None))
    with pytest.raises(
        ValueError, match=r"`budget_gb` must be a positive finite number of GB up to 1e\+09, got -2"
    ):
        plan_offline(_yaml(tmp_path), budget_gb=-2)
    with pytest.raises(ValueError, match="`devices` must be a positive integer, got 0"):
        plan_offline(_yaml(tmp_path), devices=0)
    with pytest.raises(ValueError, match="`tflops` must be a positive finite number, got -5"):
        plan_offline(_yaml(tmp_path), tflops=-5)
    with pytest.raises(ValueError, match="`config` must name an existing YAML file"):
        plan_offline(tmp_path / "missing.yaml")


def test_main_can_change_the_batch_with_set(tmp_path: Path, capsys) -> None:
    assert main(["--config", str(_yaml(tmp_path)), "--set", "data.init_args.batch_size=2"]) == 0
    assert "per device: (2, 64), (2, 64)" in capsys.readouterr().out


def test_gpt2_xl_fsdp_config_plans_on_cpu_without_allocating_weights(tmp_path: Path) -> None:
    out = tmp_path / "xl.json"
    script = (
        "import resource, sys; from lightning_ckpt.cli import main;"
        f" rc = main(['plan', '--config', 'configs/gpt2-xl-fsdp.yaml', '--json', {str(out)!r}]);"
        " print('MAXRSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(rc)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    fp32_weight_bytes = 4 * data["num_parameters"]
    assert data["num_parameters"] > 1.5e9 and data["world_size"] == 32
    assert data["plan"]["predicted_peak_bytes"] <= data["plan"]["budget_bytes"]  # the config's budget fits
    peak_rss_bytes = int(done.stdout.rsplit("MAXRSS_KB", 1)[1]) * 1024
    assert peak_rss_bytes < fp32_weight_bytes / 3


def test_fsdp_units_count_each_parameter_once_in_its_innermost_unit() -> None:
    model = GPT(block_size=8, n_layer=3, n_head=2, n_embd=16)
    blocks = list(model.transformer.h)
    block_numel = sum(p.numel() for p in blocks[0].parameters())
    by_block = fsdp_units(model, {type(blocks[0])})
    assert by_block.unit_numels == (block_numel,) * 3
    assert by_block.total_numel == model.num_parameters()  # the tied embedding / head counted once
    nested = fsdp_units(model, {type(blocks[0]), torch.nn.Linear})
    assert len(nested.unit_numels) == 3 * (1 + 4) + 1  # each block and its 4 Linears, and lm_head
    assert nested.total_numel == model.num_parameters()
    assert fsdp_units(model, None) == FsdpUnits(model.num_parameters(), ())


def test_static_memory_bad_arguments() -> None:
    sizes, units = ModelSizes(8, 8, 16), FsdpUnits(1, (1,))
    with pytest.raises(ValueError, match=r"`sharding` must be one of \('FULL_SHARD'.*got 'HALF'"):
        fsdp_static(sizes, units, shard_size=2, gather_bytes_per_param=2, sharding="HALF")
    with pytest.raises(ValueError, match="`shard_size` must be a positive integer, got 0"):
        fsdp_static(sizes, units, shard_size=0, gather_bytes_per_param=2)
    with pytest.raises(
        ValueError, match="`auto_wrap_policy` must be a set of module classes .* got function"
    ):
        wrap_classes_of(lambda module: True)
