"""RunConfig: a LightningCLI YAML parsed (never instantiated) into what planning needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_ckpt.lightning.run_spec import ClassSpec, RunConfig
from lightning_ckpt.offline.run_config import load_run_config

MODEL = (
    "model:\n  class_path: examples.gpt.GPT\n  init_args: {n_layer: 2}\n"
    "data:\n  class_path: examples.data.CharDataModule\n"
)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("trainer", "world_size", "per_node", "strategy"),
    [
        ({}, 1, 1, "single"),
        ({"devices": 8}, 8, 8, "ddp"),
        ({"devices": [0, 1], "num_nodes": 3}, 6, 2, "ddp"),
        ({"devices": "auto", "strategy": "ddp"}, 1, 1, "ddp"),
        ({"devices": 4, "strategy": "fsdp"}, 4, 4, "fsdp"),
        ({"strategy": ClassSpec("lightning.pytorch.strategies.FSDPStrategy")}, 1, 1, "fsdp"),
    ],
)
def test_world_size_and_strategy_from_trainer_settings(trainer, world_size, per_node, strategy) -> None:
    run = RunConfig(ClassSpec("m.M"), None, trainer, None)
    assert (run.world_size, run.devices_per_node, run.strategy_name) == (world_size, per_node, strategy)


@pytest.mark.parametrize(
    ("given", "unified"),
    [(None, "32-true"), ("bf16-mixed", "bf16-mixed"), (16, "16-mixed"), ("64", "64-true")],
)
def test_precision_in_lightnings_unified_form(given, unified) -> None:
    assert RunConfig(ClassSpec("m.M"), None, {"precision": given}, None).precision == unified


def test_strategy_args_and_callback_args_are_read_without_instantiating(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "trainer:\n  devices: 2\n  strategy:\n    class_path: lightning.pytorch.strategies.DDPStrategy\n"
        "    init_args: {gradient_as_bucket_view: true}\n"
        "  callbacks:\n    - class_path: lightning_ckpt.AutoCheckpoint\n      init_args: {budget_gb: 3}\n"
        + MODEL,
    )
    run = load_run_config(path)
    assert run.strategy_args["gradient_as_bucket_view"] is True
    assert run.strategy_name == "ddp" and run.world_size == 2
    assert run.autocheckpoint["budget_gb"] == 3.0 and run.data.class_path == "examples.data.CharDataModule"
    assert RunConfig(ClassSpec("m.M"), None, {"strategy": "ddp"}, None).strategy_args == {}


def test_overrides_mean_what_they_mean_on_the_training_command_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "trainer:\n  devices: 1\n" + MODEL)
    run = load_run_config(path, ["--trainer.devices", "4", "--model.init_args.n_layer", "6"])
    assert run.world_size == 4 and run.model.init_args["n_layer"] == 6
    assert run.autocheckpoint is None


def test_bad_config_paths_and_contents(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="`config` must name an existing YAML file, got '.*missing.yaml'"):
        load_run_config(tmp_path / "missing.yaml")
    with pytest.raises(ValueError, match="does not parse: .*required: data, model"):
        load_run_config(_write(tmp_path, "trainer:\n  devices: 1\n"))
    with pytest.raises(ValueError, match="does not parse: .*no_such_flag"):
        load_run_config(_write(tmp_path, MODEL), ["--trainer.no_such_flag", "1"])
