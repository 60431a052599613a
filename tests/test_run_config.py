"""RunConfig: a LightningCLI YAML parsed (never instantiated) into what planning needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_ckpt.lightning.run_spec import ClassSpec, RunConfig
from lightning_ckpt.offline import run_config
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


def _laughs(levels: int = 9) -> str:
    """A "billion laughs" YAML: each level an anchor of 9 aliases of the one before (9**levels strings)."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return MODEL + "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_before_anything_expands_it(tmp_path: Path) -> None:
    path = _write(tmp_path, _laughs())
    with pytest.raises(ValueError, match=r"must expand to at most 100000 YAML nodes .*, got 4\d{8}$"):
        load_run_config(path)
    recursive = _write(tmp_path, MODEL + "loop: &loop [1, *loop]\n")
    with pytest.raises(ValueError, match=r"must expand to at most 100000 YAML nodes"):
        load_run_config(recursive)


def test_a_too_large_or_too_deep_config_is_refused(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(ValueError, match=r"is nested too deeply to be a training config$"):
        load_run_config(_write(tmp_path, MODEL + "deep: " + "[" * 5000 + "]" * 5000 + "\n"))
    monkeypatch.setattr(run_config, "MAX_CONFIG_BYTES", 64)
    with pytest.raises(ValueError, match=r"must be at most 64 bytes, got \d+$"):
        load_run_config(_write(tmp_path, MODEL))


def test_the_plan_command_refuses_an_alias_bomb_in_one_line(tmp_path: Path, capsys) -> None:
    from lightning_ckpt.offline.cli import main

    assert main(["--config", str(_write(tmp_path, _laughs()))]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("lightning-ckpt plan: `config` ") and "YAML nodes" in err


def _callback_config(tmp_path: Path, init_args: str) -> Path:
    return _write(
        tmp_path,
        "trainer:\n  callbacks:\n    - class_path: lightning_ckpt.AutoCheckpoint\n"
        f"      init_args: {{{init_args}}}\n" + MODEL,
    )


@pytest.mark.parametrize(
    ("written", "read_as"),
    [("0x10", 16), ('"0x10"', 16), ("020", 16), ("1:30", 90), ("1_0", 10), ("0b10", 2)],
)
def test_an_autocheckpoint_number_not_in_decimal_is_refused(tmp_path: Path, written, read_as) -> None:
    """YAML 1.1 (and jsonargparse, quoted or not) reads these as other numbers than they seem."""
    text = written.strip('"')
    with pytest.raises(
        ValueError,
        match=rf"trainer.callbacks\[0\] \(lightning_ckpt.AutoCheckpoint\): `budget_gb` must be written as a"
        rf" decimal number \(e.g. 16 or 0.12\), got '{text}', which YAML reads as {read_as}$",
    ):
        load_run_config(_callback_config(tmp_path, f"budget_gb: {written}"))
    with pytest.raises(ValueError, match=r"`quantum_bytes` must be written as a decimal number"):
        load_run_config(_callback_config(tmp_path, f"budget_gb: 1, quantum_bytes: {written}"))


@pytest.mark.parametrize(("written", "value"), [("16", 16.0), ('"16"', 16.0), ("0.12", 0.12), ("1e-1", 0.1)])
def test_decimal_numbers_are_read_as_written(tmp_path: Path, written, value) -> None:
    run = load_run_config(_callback_config(tmp_path, f"budget_gb: {written}"))
    assert run.autocheckpoint["budget_gb"] == value


def test_training_refuses_an_alias_bomb_and_a_hex_budget_in_one_line(tmp_path: Path, capsys) -> None:
    from examples.train import main as train_main

    (tmp_path / "bomb").mkdir(), (tmp_path / "hex").mkdir()
    for path, said in [
        (_write(tmp_path / "bomb", _laughs()), "YAML nodes"),
        (_callback_config(tmp_path / "hex", "budget_gb: 0x10"), "`budget_gb` must be written as a decimal"),
    ]:
        with pytest.raises(SystemExit) as exited:
            train_main(["fit", "--config", str(path)])
        err = capsys.readouterr().err
        assert exited.value.code == 1 and err.count("\n") == 1 and said in err, err


def test_the_plan_command_refuses_a_budget_below_one_byte_and_a_hex_budget(tmp_path: Path, capsys) -> None:
    from lightning_ckpt.offline.cli import main

    path = str(_callback_config(tmp_path, "budget_gb: 1"))
    assert main(["--config", path, "--budget-gb", "5e-324"]) == 1
    assert capsys.readouterr().err.endswith("`budget_gb` must be at least one byte (1e-09 GB), got 5e-324\n")
    with pytest.raises(SystemExit) as exited:
        main(["--config", path, "--budget-gb", "0x10"])
    assert (
        exited.value.code == 2 and "must be a positive finite number, got '0x10'" in capsys.readouterr().err
    )
