"""Every YAML in configs/ parses through LightningCLI; the GPU configs are parsed, never run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from examples.data import CharDataModule
from examples.gpt import GPT, Block, GPTConfig
from lightning_ckpt.offline.plan import plan_offline
from lightning_ckpt.offline.run_config import load_run_config

ALL_CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
CONFIGS = [path for path in ALL_CONFIGS if not path.name.startswith("llama-hf")]  # the GPT example's
HF_CONFIG = ALL_CONFIGS[0].parent / "llama-hf-cpu.yaml"
MIXED_CONFIG = ALL_CONFIGS[0].parent / "gpt-mixed-cpu.yaml"
_CALLBACK_ARGS = {"budget_gb", "targets", "cost", "solver", "quantum_bytes", "workers"}
_KEY = re.compile(r"^\s*(- )?[\w.]+:")  # a YAML key, with or without a value on its line


def test_the_three_configs_exist() -> None:
    assert {path.name for path in CONFIGS} >= {"gpt-cpu.yaml", "gpt2-124m-ddp.yaml", "gpt2-xl-fsdp.yaml"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda path: path.name)
def test_config_parses_and_its_cheap_parts_build(path: Path) -> None:
    run = load_run_config(path)
    assert run.model.load_class() is GPT
    assert run.data is not None and run.data.load_class() is CharDataModule
    model_args = run.model.init_args
    sizes = {key: model_args[key] for key in GPTConfig.__dataclass_fields__ if key in model_args}
    GPTConfig(**sizes)  # validates sizes (n_embd divisible by n_head, ...) without building weights
    data = run.data.instantiate()  # cheap: reads no text until setup()
    assert data.hparams.block_size == model_args["block_size"]
    assert set(run.autocheckpoint) >= _CALLBACK_ARGS
    callback_spec = next(cb for cb in run.trainer["callbacks"] if cb.class_path.endswith("AutoCheckpoint"))
    assert callback_spec.instantiate().budget_gb == run.autocheckpoint["budget_gb"]


@pytest.mark.parametrize("path", ALL_CONFIGS, ids=lambda path: path.name)
def test_every_key_is_commented(path: Path) -> None:
    lines = path.read_text().splitlines()
    uncommented = [
        line
        for line, previous in zip(lines, ["", *lines[:-1]], strict=True)
        if _KEY.match(line)
        and " #" not in line
        and not previous.strip().startswith("#")  # " #": YAML comment
    ]
    assert uncommented == []


def test_fsdp_config_wraps_blocks_and_shards_fully() -> None:
    from torch.distributed.fsdp import ShardingStrategy

    run = load_run_config(Path(CONFIGS[0]).parent / "gpt2-xl-fsdp.yaml")
    assert run.strategy_name == "fsdp" and run.world_size > 8
    assert run.trainer["precision"].startswith("bf16")
    strategy = run.trainer["strategy"].instantiate()  # builds no process group
    assert strategy.sharding_strategy == ShardingStrategy.FULL_SHARD
    assert strategy.kwargs["auto_wrap_policy"]._module_classes == {Block}
    assert strategy._activation_checkpointing_kwargs == {}  # AutoCheckpoint decides, not FSDP


def test_fsdp2_config_shards_gpt2_xl_over_every_gpu_and_plans_offline() -> None:
    """The FSDP2 config: ModelParallelStrategy, data parallel over all 32 GPUs, no tensor parallelism, the
    FSDP config's model and batch. Planned here on fake tensors at 4 blocks and 2 rows (the full size
    takes about a minute, see the README)."""
    fsdp2 = load_run_config(CONFIGS[0].parent / "gpt2-xl-fsdp2.yaml")
    fsdp = load_run_config(CONFIGS[0].parent / "gpt2-xl-fsdp.yaml")
    assert (fsdp2.strategy_name, fsdp2.world_size, fsdp2.trainer["precision"]) == ("fsdp2", 32, "bf16-mixed")
    assert (
        fsdp2.strategy_args["data_parallel_size"] == 32 and fsdp2.strategy_args["tensor_parallel_size"] == 1
    )
    assert fsdp2.model == fsdp.model and fsdp2.data == fsdp.data
    small = ["--model.init_args.n_layer", "4", "--data.init_args.batch_size", "2"]
    small += ["--data.init_args.max_chars", "20000", "--data.init_args.val_fraction", "0.5"]
    result = plan_offline(CONFIGS[0].parent / "gpt2-xl-fsdp2.yaml", overrides=small)
    assert (result.strategy, result.world_size, len(result.plan.items)) == ("fsdp2", 32, 4)
    assert result.static.param_bytes < 4 * result.num_parameters / 31  # this rank's fp32 shards


def test_ddp_config_is_one_node_bf16_gpt2_small() -> None:
    run = load_run_config(Path(CONFIGS[0]).parent / "gpt2-124m-ddp.yaml")
    assert run.strategy_name == "ddp" and run.trainer["num_nodes"] == 1
    assert run.trainer["precision"] == "bf16-mixed"
    args = run.model.init_args
    assert (args["n_layer"], args["n_head"], args["n_embd"], args["block_size"]) == (12, 12, 768, 1024)


def test_the_mixed_config_has_blocks_of_different_sizes_and_a_budget_that_checkpoints_some() -> None:
    ratios = load_run_config(MIXED_CONFIG).model.init_args["mlp_ratios"]
    small_text = ["--data.init_args.max_chars", "20000"]  # the batch shape is the config's
    plan = plan_offline(MIXED_CONFIG, overrides=small_text).plan  # fake tensors: profiled without compute
    activations = [item.activation_bytes for item in plan.items]
    assert len(activations) == len(ratios) == 8 and len(set(ratios)) > 2
    by_ratio = sorted(range(8), key=lambda i: (ratios[i], i))
    assert by_ratio == sorted(range(8), key=lambda i: (activations[i], i))  # wider MLP, more activations
    assert max(activations) > 3 * min(activations)
    assert 0 < len(plan.checkpointed) < 8 and plan.fits  # the config's budget checkpoints some blocks


def test_the_llama_config_trains_a_padded_transformers_llama_with_autocheckpoint(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from examples.train import main as train_main

    cli = train_main(
        ["fit", "--config", str(HF_CONFIG), "--trainer.max_steps", "3", "--trainer.limit_val_batches", "1",
         "--trainer.default_root_dir", str(tmp_path),
         "--data.max_chars", "200000"]
    )  # fmt: skip
    callback = next(c for c in cli.trainer.callbacks if type(c).__name__ == "AutoCheckpoint")
    assert type(cli.model.model).__name__ == "LlamaForCausalLM"
    assert cli.model.model.config.use_cache  # left on: AutoCheckpoint turns it off in training itself
    assert callback.plan.checkpointed and len(callback.profile.modules) == 6
    assert callback.plan.predicted_peak_bytes <= callback.budget_bytes
    assert cli.trainer.global_step == 3
