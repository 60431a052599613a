"""`AutoCheckpointConfig`: one set of checks for the callback, the planner, the offline plan and the sweep."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from lightning_ckpt import AutoCheckpoint
from lightning_ckpt.config import AutoCheckpointConfig
from lightning_ckpt.core.candidates import find_candidates
from lightning_ckpt.offline.plan import plan_offline
from tests.callback_helpers import fast_trainer, tiny_gpt, token_loader


def test_settings_are_frozen_and_normalized():
    config = AutoCheckpointConfig(budget_gb=2, targets="Block", workers=2)
    assert config.targets == ("Block",) and config.budget_gb == 2.0 and isinstance(config.budget_gb, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.workers = 3  # type: ignore[misc]


def test_numpy_numbers_are_taken_as_plain_ones():
    config = AutoCheckpointConfig(budget_gb=np.float32(2.5), quantum_bytes=np.int64(256), workers=np.int32(2))
    assert (config.budget_gb, config.quantum_bytes, config.workers) == (2.5, 256, 2)
    assert (
        type(config.budget_gb) is float and type(config.quantum_bytes) is int and type(config.workers) is int
    )


def test_callback_keeps_its_settings_in_one_config():
    callback = AutoCheckpoint(budget_gb=3, targets=["Block"], cost="flops")
    assert callback.config == AutoCheckpointConfig(3, ("Block",), cost="flops")
    assert callback.budget_bytes == 3_000_000_000


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"budget_gb": 1, "workers": 2000}, r"`workers` must be a positive integer up to 1024, got 2000"),
        (
            {"budget_gb": 1e300},
            r"`budget_gb` must be a positive finite number of GB up to 1e\+09, got 1e\+300",
        ),
        ({"budget_gb": 1, "targets": [3]}, r"`targets` must be None or a list .* got \[3\]"),
        (
            {"budget_gb": 1, "targets": []},
            r"`targets` must be None .* or a non-empty list .*, got \[\]: an empty",
        ),
        ({"budget_gb": 5e-324}, r"`budget_gb` must be at least one byte \(1e-09 GB\), got 5e-324$"),
        ({"budget_gb": 4e-10}, r"`budget_gb` must be at least one byte \(1e-09 GB\), got 4e-10$"),
        (
            {"budget_gb": 1, "granularity": "ops"},
            r"`granularity` must be one of \('block', 'op'\), got 'ops'$",
        ),
        ({"budget_gb": 1, "measure": "no"}, r"`measure` must be a bool \(True or False\), got 'no'"),
        ({"budget_gb": 1, "measure": 1}, r"`measure` must be a bool \(True or False\), got 1"),
        (
            {"budget_gb": 1, "workers": np.float32(2.0)},
            r"`workers` must be a positive integer, got np.float32\(2.0\)",
        ),
        (
            {"budget_gb": 1, "quantum_bytes": np.bool_(True)},
            r"`quantum_bytes` must be a positive integer, got np.True_",
        ),
    ],
)
def test_the_same_refusal_from_the_config_and_the_callback(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AutoCheckpointConfig(**kwargs)
    with pytest.raises(ValueError, match=match):
        AutoCheckpoint(**kwargs)


def test_find_candidates_refuses_bad_targets_with_the_same_error():
    with pytest.raises(ValueError, match=r"`targets` must be None or a list .* got \[3\]"):
        find_candidates(torch.nn.Sequential(torch.nn.Linear(1, 1)), [3])


def test_offline_plan_refuses_the_config_settings_the_callback_refuses(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text(
        "model:\n  class_path: examples.gpt.GPT\n  init_args: {block_size: 8, n_layer: 2, n_head: 2, n_embd: 16}\n"
        "data:\n  class_path: examples.data.CharDataModule\n"
        "  init_args: {block_size: 8, batch_size: 2, max_chars: 1000}\n"
        "trainer:\n  callbacks:\n    - class_path: lightning_ckpt.AutoCheckpoint\n"
        "      init_args: {budget_gb: 1, workers: 2000}\n"
    )
    with pytest.raises(ValueError, match="`workers` must be a positive integer up to 1024, got 2000"):
        plan_offline(config)


def test_numpy_strings_are_plain_str_and_the_checkpoint_loads_with_weights_only(tmp_path):
    """``np.str_`` targets (and cost, solver) would be pickled as numpy objects, which
    ``torch.load(weights_only=True)``, the default, refuses: they are normalized to ``str``."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    config = AutoCheckpointConfig(1, targets=[np.str_("Block")], cost=np.str_("flops"), solver=np.str_("dp"))
    assert (config.targets, config.cost, config.solver) == (("Block",), "flops", "dp")
    assert type(config.targets[0]) is str and type(config.cost) is str and type(config.solver) is str

    first = AutoCheckpoint(budget_gb=1000, targets=[np.str_("Block")])
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    trainer = fast_trainer([first, saver], max_steps=2, enable_checkpointing=True)
    trainer.fit(tiny_gpt(), train_dataloaders=token_loader())
    (ckpt,) = tmp_path.glob("*.ckpt")
    state = torch.load(ckpt, weights_only=True)["callbacks"][first.state_key]
    assert state["setting"]["config"]["targets"] == ("Block",) and state["plans"]

    second = AutoCheckpoint(budget_gb=1000, targets=["Block"])
    trainer = fast_trainer([second], max_steps=3)
    trainer.fit(tiny_gpt(), train_dataloaders=token_loader(), ckpt_path=ckpt)
    # the saved plan, loaded with weights_only and kept (a resume checks it on one fresh profile)
    assert (second.plan.checkpointed, second.plan.kept) == (first.plan.checkpointed, first.plan.kept)
