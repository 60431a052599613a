"""The predicted peak is within 2% of the measured one, both directions, on models this project did not write.

Measured by :class:`lightning_ckpt.testing.memory_cap` (an independent counter of every live storage,
batches and Lightning's own tensors included), over whole training runs: under Lightning's loop
(gradients freed after the forward) with the cap equal to the budget, so that the advised minimum is a
budget every step fits, and in a plain PyTorch loop that calls ``zero_grad()`` before the forward, with
an unreachable cap.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from callback_helpers import assert_within_two_percent, fast_trainer, probe_profile, tiny_gpt, token_loader
from test_budget_promise import exact_budget
from torch import nn

from lightning_ckpt import AutoCheckpoint
from lightning_ckpt.core.wrapping import apply_checkpointing, remove_checkpointing
from lightning_ckpt.planning.peak import fixed_peak_bytes, predict_peak_bytes
from lightning_ckpt.testing import memory_cap

UNREACHABLE = 10**12


class EncoderLM(L.LightningModule):
    """A language model around torch's own ``nn.TransformerEncoder`` (causal, pre-norm)."""

    def __init__(self, width: int = 64, layers: int = 4, vocab: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(
            width, 4, 4 * width, dropout=0.1, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)

    def training_step(self, batch, batch_idx):
        idx, targets = batch
        mask = nn.Transformer.generate_square_subsequent_mask(idx.shape[1])
        logits = self.head(self.encoder(self.embed(idx), mask=mask, is_causal=True))
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class HuggingFaceLM(L.LightningModule):
    """A tiny transformers causal LM built from its config (random weights, nothing downloaded)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        transformers = pytest.importorskip("transformers")
        if kind == "gpt2":
            config = transformers.GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=4, n_head=4)
            self.model = transformers.GPT2LMHeadModel(config)
        else:
            config = transformers.LlamaConfig(
                vocab_size=256,
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=4,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=64,
            )
            self.model = transformers.LlamaForCausalLM(config)
        self.model.config.use_cache = False  # training: no KV cache

    def training_step(self, batch, batch_idx):
        idx, _ = batch
        return self.model(input_ids=idx, labels=idx).loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


MODELS = {
    "example-gpt": lambda: tiny_gpt(seed=0),
    "nn.TransformerEncoder": lambda: _seeded(EncoderLM),
    "hf-gpt2": lambda: _seeded(HuggingFaceLM, "gpt2"),
    "hf-llama": lambda: _seeded(HuggingFaceLM, "llama"),
}


def _seeded(cls, *args):
    torch.manual_seed(0)
    return cls(*args)


def _profile(make_model):
    return probe_profile(make_model(), token_loader())


def _budgets(profile, count: int) -> list[int]:
    """``count`` budgets from the advised minimum to the unchecked peak, each exact in GB."""
    low, high = fixed_peak_bytes(profile), predict_peak_bytes(profile, [])
    return [exact_budget(low + (high - low) * i // (count - 1)) for i in range(count)]


def _lightning_peak(make_model, budget_bytes: int) -> tuple[int, int]:
    """(predicted, measured) peak of a Lightning fit with AutoCheckpoint at ``budget_bytes``, on a device
    of exactly the budget (the advised minimum included: every step at or under it)."""
    model, callback, data = make_model(), AutoCheckpoint(budget_gb=budget_bytes / 1e9), token_loader()
    with memory_cap(budget_bytes, model=model) as meter:
        fast_trainer([callback], max_steps=4).fit(model, train_dataloaders=data)
    return callback.plan.predicted_peak_bytes, meter.peak_bytes


def _plain_loop_peak(make_model, profile, checkpointed) -> int:
    """Peak of a plain loop: zero_grad(set_to_none) first, then forward, backward, AdamW step."""
    model = make_model()
    optimizer = model.configure_optimizers()
    apply_checkpointing(model, checkpointed)
    batches = token_loader(num_batches=4)  # made before the cap: on a device only the batch is there
    with memory_cap(UNREACHABLE, model=model, optimizer=optimizer) as meter:
        for batch_idx, batch in enumerate(batches):
            optimizer.zero_grad(set_to_none=True)
            model.training_step(batch, batch_idx).backward()
            optimizer.step()
    remove_checkpointing(model)
    return meter.peak_bytes


@pytest.mark.parametrize("name", list(MODELS))
def test_prediction_within_two_percent_under_lightning(name):
    make_model = MODELS[name]
    budgets = _budgets(_profile(make_model), 4 if name == "example-gpt" else 2)
    for budget in budgets:
        predicted, measured = _lightning_peak(make_model, budget)
        assert_within_two_percent(predicted, measured, f"{name} at {budget} B")


@pytest.mark.parametrize("name", ["example-gpt", "nn.TransformerEncoder", "hf-llama"])
def test_prediction_within_two_percent_in_a_plain_loop(name):
    make_model = MODELS[name]
    profile = _profile(make_model)
    names = [m.name for m in profile.modules]
    for checkpointed in ([], names[::2], names):
        predicted = predict_peak_bytes(profile, checkpointed, zero_grad="before_forward")
        measured = _plain_loop_peak(make_model, profile, checkpointed)
        assert_within_two_percent(predicted, measured, f"{name} {checkpointed}")


def test_where_zero_grad_runs_changes_the_prediction_by_at_most_one_gradient_copy():
    profile = _profile(MODELS["example-gpt"])
    after = predict_peak_bytes(profile, [], zero_grad="after_forward")
    before = predict_peak_bytes(profile, [], zero_grad="before_forward")
    never = predict_peak_bytes(profile, [], zero_grad="never")
    assert before <= after <= never <= before + profile.static.grad_bytes
    assert before < never
    with pytest.raises(ValueError, match="`zero_grad` must be one of .* got 'sometimes'"):
        predict_peak_bytes(profile, [], zero_grad="sometimes")
