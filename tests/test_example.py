"""The GPT example: model shapes and checks, the byte-level data, and a few CPU training steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from examples.data import CharDataModule, RandomWindows, load_text_bytes
from examples.gpt import GPT, Block, GPTConfig, Transformer
from examples.train import main as train_main

CPU_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "gpt-cpu.yaml"
TINY = {"block_size": 16, "n_layer": 2, "n_head": 2, "n_embd": 16}


def test_gpt_forward_shapes_tied_weights_and_blocks_at_transformer_h() -> None:
    model = GPT(**TINY)
    idx = torch.randint(0, 256, (3, 16))
    logits, loss = model(idx, targets=idx)
    assert logits.shape == (3, 16, 256)
    assert torch.isfinite(loss)
    assert model.lm_head.weight is model.transformer.wte.weight
    assert [type(m) for m in model.transformer.h] == [Block, Block]
    assert model(idx)[1] is None


def test_transformer_trunk_trains_without_a_trainer() -> None:
    trunk = Transformer(GPTConfig(**TINY))
    trunk(torch.randint(0, 256, (2, 16))).sum().backward()
    assert all(p.grad is not None for p in trunk.h.parameters())


@pytest.mark.parametrize(
    ("sizes", "message"),
    [
        ({"n_embd": 10, "n_head": 3}, "`n_embd` must be a multiple of `n_head`, got n_embd=10, n_head=3"),
        ({"n_layer": 0}, "`n_layer` must be a positive integer, got 0"),
        ({"dropout": 1.0}, r"`dropout` must be in \[0, 1\), got 1.0"),
    ],
)
def test_gpt_config_rejects_bad_sizes(sizes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GPTConfig(**sizes)


@pytest.mark.parametrize(
    ("ratios", "message"),
    [
        ([4, 4, 4], r"`mlp_ratios` must have one ratio per block \(n_layer=2\), got 3: \[4, 4, 4\]"),
        ([4, 0], r"`mlp_ratios` must hold positive numbers .* got 0 in \[4, 0\]"),
        ([4, -1.0], r"`mlp_ratios` must hold positive numbers .* got -1.0 in \[4, -1.0\]"),
        ([4, float("nan")], r"`mlp_ratios` must hold positive numbers .* got nan"),
        ([4, "8"], r"`mlp_ratios` must hold positive numbers .* got '8'"),
        ("48", r"`mlp_ratios` must be a list of 2 positive numbers or None, got '48'"),
    ],
)
def test_gpt_config_rejects_bad_mlp_ratios(ratios, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GPTConfig(**TINY, mlp_ratios=ratios)


def test_mlp_ratios_set_each_blocks_width_and_the_default_model_is_unchanged() -> None:
    torch.manual_seed(0)
    default = GPT(**TINY)
    torch.manual_seed(0)
    explicit = GPT(**TINY, mlp_ratios=[4, 4])
    assert default.transformer.h[0].mlp.c_fc.out_features == 4 * TINY["n_embd"]
    for (name, tensor), (other_name, other) in zip(
        default.state_dict().items(), explicit.state_dict().items(), strict=True
    ):
        assert name == other_name
        torch.testing.assert_close(tensor, other)
    mixed = GPT(**TINY, mlp_ratios=[1, 2.5])
    assert [block.mlp.c_fc.out_features for block in mixed.transformer.h] == [16, 40]
    assert mixed.state_dict().keys() == default.state_dict().keys()
    # saved with the other arguments, so LightningCLI's config.yaml and checkpoints rebuild the same model
    assert mixed.hparams.mlp_ratios == [1, 2.5]


def test_sequence_longer_than_block_size_is_refused() -> None:
    with pytest.raises(ValueError, match="sequence length must be at most block_size=16, got 17"):
        GPT(**TINY)(torch.zeros(1, 17, dtype=torch.long))


def test_data_is_deterministic_and_targets_are_shifted_inputs() -> None:
    def first_batch() -> tuple[torch.Tensor, torch.Tensor]:
        data = CharDataModule(block_size=8, batch_size=4, max_chars=5000, train_samples=8, val_samples=4)
        data.setup("fit")
        return next(iter(data.train_dataloader()))

    (x1, y1), (x2, y2) = first_batch(), first_batch()
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert torch.equal(x1[:, 1:], y1[:, :-1])
    assert x1.dtype == torch.long and int(x1.max()) < 256


def test_data_reads_a_user_text_file(tmp_path: Path) -> None:
    text_file = tmp_path / "tiny.txt"
    text_file.write_bytes(bytes(range(200)))
    assert load_text_bytes(str(text_file), max_chars=100).tolist() == list(range(100))
    data = CharDataModule(
        text_path=str(text_file), block_size=4, batch_size=2, train_samples=2, val_samples=2
    )
    data.setup("fit")
    x, y = next(iter(data.val_dataloader()))
    assert torch.equal(x + 1, y)  # the file counts up by one byte at a time


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: load_text_bytes("/no/such/file.txt", 10), "`text_path` must name an existing file"),
        (lambda: CharDataModule(batch_size=0), "`batch_size` must be a positive integer, got 0"),
        (lambda: CharDataModule(val_fraction=1.5), r"`val_fraction` must be in \(0, 1\), got 1.5"),
        (lambda: RandomWindows(torch.zeros(5, dtype=torch.uint8), 8, 1, 0), "more than block_size"),
    ],
)
def test_data_rejects_bad_arguments(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.filterwarnings("ignore:LightningCLI.s args parameter")
def test_cpu_config_trains_a_few_steps_with_autocheckpoint(tmp_path: Path) -> None:
    overrides = [
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.max_steps=4",
        "--trainer.limit_val_batches=1",
        "--trainer.enable_model_summary=false",
        "--model.init_args.n_layer=2",
        "--model.init_args.n_embd=32",
        "--model.init_args.block_size=32",
        "--data.init_args.block_size=32",
        "--data.init_args.max_chars=20000",
        "--data.init_args.train_samples=32",
        "--data.init_args.val_samples=8",
    ]
    cli = train_main(["fit", "--config", str(CPU_CONFIG), *overrides])
    callback = next(cb for cb in cli.trainer.callbacks if type(cb).__name__ == "AutoCheckpoint")
    plan = callback.plan
    assert cli.trainer.global_step == 4
    assert sorted(plan.checkpointed + plan.kept) == ["transformer.h.0", "transformer.h.1"]
    assert plan.measured_peak_bytes is not None and plan.measured_peak_bytes > 0
    assert torch.isfinite(cli.trainer.callback_metrics["train_loss"])
