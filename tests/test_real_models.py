"""Models this project did not write, as people use them: padded Hugging Face models with their KV cache
on, T5's decoder, transformers' own checkpointing switch, torch's ``checkpoint_wrapper``, a ResNet with
BatchNorm, a block called twice, and a second AutoCheckpoint.

Every training run is under :class:`lightning_ckpt.testing.memory_cap` with the cap equal to the budget
(the CPU stand-in of a GPU with ``budget_gb`` of memory); batches are made before the cap.
"""

from __future__ import annotations

import logging
import warnings

import lightning as L
import pytest
import torch
from callback_helpers import assert_within_two_percent, fast_trainer, probe_profile, tiny_gpt, token_loader
from real_models import (
    PaddedLM,
    PretrainedLM,
    Qwen2MoeLM,
    ResNet,
    hf_model,
    image_loader,
    padded_token_loader,
)
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper  # noqa: PLC2701
from torch.utils.checkpoint import CheckpointError, checkpoint

from lightning_ckpt import AutoCheckpoint
from lightning_ckpt.core import hf_models
from lightning_ckpt.core.wrapping import apply_checkpointing
from lightning_ckpt.lightning.checks import explain_recompute_error
from lightning_ckpt.planning.peak import fixed_peak_bytes, predict_peak_bytes
from lightning_ckpt.testing import memory_cap


def _middle_budget(profile) -> int:
    return (fixed_peak_bytes(profile) + predict_peak_bytes(profile, [])) // 2


def _capped_fit(model, loader, budget_bytes: int, steps: int = 4, **trainer) -> tuple[AutoCheckpoint, int]:
    """Train ``steps`` steps under a cap equal to the budget; (callback, measured peak bytes)."""
    callback = AutoCheckpoint(budget_gb=budget_bytes / 1e9)
    with memory_cap(budget_bytes, model=model) as cap:
        fast_trainer([callback], max_steps=steps, **trainer).fit(model, train_dataloaders=loader)
    return callback, cap.peak_bytes


def _sizes(profile) -> list[tuple]:
    return [(m.name, m.activation_bytes, m.input_bytes, m.flops) for m in profile.modules]


@pytest.mark.parametrize("kind", ["gpt2", "llama", "t5", "bert"])
def test_padded_transformers_models_with_their_cache_on_train_within_the_budget(kind, caplog, monkeypatch):
    pytest.importorskip("transformers")
    monkeypatch.setattr(hf_models, "_SAID", set())  # said once per process: say it again here
    caplog.set_level(logging.INFO, logger="lightning.pytorch.utilities.rank_zero")
    profile = probe_profile(PaddedLM(kind), padded_token_loader())
    names = [m.name for m in profile.modules]
    if kind == "t5":  # the decoder's blocks are candidates too
        assert [n for n in names if ".decoder.block." in n] == [f"model.decoder.block.{i}" for i in range(4)]
        assert len(names) == 8
    for budget in (fixed_peak_bytes(profile), _middle_budget(profile)):
        model, data = PaddedLM(kind), padded_token_loader()
        assert model.model.config.use_cache is not False  # the default: the cache is on
        callback, peak = _capped_fit(model, data, budget)
        assert callback.plan.checkpointed
        assert_within_two_percent(callback.plan.predicted_peak_bytes, peak, f"{kind} at {budget} B")
    assert model.model.config.use_cache is not False  # left as it was
    if kind != "bert":  # BERT's masked LM takes no cache
        assert "use_cache=False while" in caplog.text


def test_transformers_own_checkpointing_is_taken_over_and_restored(caplog):
    pytest.importorskip("transformers")
    reference = probe_profile(PaddedLM("gpt2"), padded_token_loader())
    model = PaddedLM("gpt2", own_checkpointing=True)
    assert model.model.is_gradient_checkpointing
    budget = _middle_budget(reference)
    with caplog.at_level(logging.WARNING, logger="lightning_ckpt.core.hf_models"):
        callback, peak = _capped_fit(model, padded_token_loader(), budget)
    assert "turned off the model's own gradient checkpointing (5 module(s)" in caplog.text
    assert _sizes(callback.profile) == _sizes(reference)  # profiled as the plain model: nothing hidden
    assert_within_two_percent(
        callback.plan.predicted_peak_bytes, peak, "gpt2 with its own checkpointing taken over"
    )
    assert model.model.is_gradient_checkpointing  # turned back on after the fit
    assert all(layer.gradient_checkpointing for layer in model.model.transformer.h)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_a_mixture_of_experts_model_is_planned_on_fake_tensors_and_trains_within_the_budget(precision):
    """Qwen2-MoE's experts run ``torch._grouped_mm``, whose meta kernel takes only bf16 (the real kernels
    take fp32 too; under bf16-mixed the weights, and so the experts' inputs, are fp32): its step fell back
    to an unchecked real step 0, out of memory under the cap at the smallest budget."""
    probe = AutoCheckpoint(budget_gb=1000, measure=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast_trainer([probe], max_steps=1, precision=precision).fit(Qwen2MoeLM(), padded_token_loader())
    assert not [str(w.message) for w in caught if "does not run on fake tensors" in str(w.message)]
    for budget in (fixed_peak_bytes(probe.profile), _middle_budget(probe.profile)):
        callback, peak = _capped_fit(Qwen2MoeLM(), padded_token_loader(), budget, precision=precision)
        assert callback.plan.checkpointed
        assert_within_two_percent(
            callback.plan.predicted_peak_bytes, peak, f"Qwen2-MoE {precision} at {budget} B"
        )


def test_a_pretrained_model_left_in_eval_mode_trains_without_its_cache_within_the_budget(tmp_path):
    """``from_pretrained`` returns the model in eval mode and Lightning trains it so: its KV cache was left
    on (it was turned off in training mode only), and a checkpointed layer's recomputation met a cache the
    forward had grown ("The size of tensor a (64) must match the size of tensor b (32)" in backward)."""
    pytest.importorskip("transformers")
    hf_model("llama").save_pretrained(tmp_path)
    profile = probe_profile(PretrainedLM(str(tmp_path)), padded_token_loader())
    for budget in (fixed_peak_bytes(profile), _middle_budget(profile)):
        model, data = PretrainedLM(str(tmp_path)), padded_token_loader()
        assert not model.model.training and model.model.config.use_cache
        callback, peak = _capped_fit(model, data, budget)
        assert callback.plan.checkpointed and not model.model.training
        assert_within_two_percent(callback.plan.predicted_peak_bytes, peak, f"pretrained llama at {budget} B")
    with torch.no_grad():  # generation after the fit keeps its cache
        ids, mask = next(iter(data))
        assert model.model(input_ids=ids, attention_mask=mask).past_key_values is not None


class _WrappedGPT(L.LightningModule):
    """The tiny GPT with block 0 checkpointed by the user: torch's ``checkpoint_wrapper`` (``"wrapper"``) or
    ``torch.utils.checkpoint`` called inside its own training step (``"inline"``)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.gpt, self.how = tiny_gpt(), how
        if how == "wrapper":
            self.gpt.transformer.h[0] = CheckpointWrapper(self.gpt.transformer.h[0])

    def training_step(self, batch, batch_idx):
        idx, targets = batch
        t = self.gpt.transformer
        x = t.drop(t.wte(idx) + t.wpe(torch.arange(idx.shape[1])))
        for i, block in enumerate(t.h):
            x = checkpoint(block, x, use_reentrant=False) if i == 0 and self.how == "inline" else block(x)
        logits = self.gpt.lm_head(t.ln_f(x))
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


@pytest.mark.parametrize("how", ["wrapper", "inline"])
def test_a_block_checkpointed_by_the_user_is_counted_as_checkpointed(how):
    """torch's ``checkpoint_wrapper``, or ``torch.utils.checkpoint`` called in the training step: never
    wrapped twice, and the prediction counts the block as checkpointed (within 2%)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        profile = probe_profile(_WrappedGPT(how), token_loader())
    assert [m.name for m in profile.modules] == [f"gpt.transformer.h.{i}" for i in (1, 2, 3)]
    if how == "inline":
        assert any("['gpt.transformer.h.0'] are recomputed in the backward" in str(w.message) for w in caught)
    for budget in (fixed_peak_bytes(profile), _middle_budget(profile), predict_peak_bytes(profile, [])):
        callback, peak = _capped_fit(_WrappedGPT(how), token_loader(), budget)
        assert_within_two_percent(callback.plan.predicted_peak_bytes, peak, f"{how} GPT at {budget} B")


def test_resnet_with_batchnorm_gets_candidates_and_predictions_within_two_percent():
    profile = probe_profile(ResNet(), image_loader())
    assert [m.name for m in profile.modules] == [f"layer{i}.{j}" for i in (1, 2, 3) for j in (0, 1)]
    for budget in (fixed_peak_bytes(profile), _middle_budget(profile), predict_peak_bytes(profile, [])):
        callback, peak = _capped_fit(ResNet(), image_loader(), budget)
        assert_within_two_percent(callback.plan.predicted_peak_bytes, peak, f"resnet at {budget} B")


def test_checkpointed_batchnorm_updates_running_statistics_once_per_step():
    plain, checkpointed = ResNet(), ResNet()
    apply_checkpointing(checkpointed, [f"layer{i}.{j}" for i in (1, 2, 3) for j in (0, 1)])
    for model in (plain, checkpointed):
        optimizer = model.configure_optimizers()
        for batch_idx, batch in enumerate(image_loader()):
            optimizer.zero_grad()
            model.training_step(batch, batch_idx).backward()
            optimizer.step()
    buffers = dict(plain.named_buffers())
    assert buffers["layer1.0.bn1.num_batches_tracked"] == 4
    for name, value in checkpointed.named_buffers():
        torch.testing.assert_close(value, buffers[name], msg=name)
    for (name, value), reference in zip(checkpointed.named_parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(value, reference, msg=name)


class _SharedBlock(L.LightningModule):
    """The tiny GPT with block 2 called twice per forward (weight sharing)."""

    def __init__(self) -> None:
        super().__init__()
        self.gpt = tiny_gpt()

    def training_step(self, batch, batch_idx):
        idx, targets = batch
        t = self.gpt.transformer
        x = t.wte(idx) + t.wpe(torch.arange(idx.shape[1]))
        for block in [*t.h, t.h[2]]:
            x = block(x)
        return nn.functional.cross_entropy(self.gpt.lm_head(t.ln_f(x)).flatten(0, 1), targets.flatten())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def test_a_block_called_twice_is_left_out_by_name_and_the_rest_is_planned():
    with pytest.warns(UserWarning, match=r"\['gpt.transformer.h.2'\] run more than once per forward"):
        profile = probe_profile(_SharedBlock(), token_loader())
    assert [m.name for m in profile.modules] == [
        "gpt.transformer.h.0",
        "gpt.transformer.h.1",
        "gpt.transformer.h.3",
    ]
    callback, peak = _capped_fit(_SharedBlock(), token_loader(), _middle_budget(profile))
    assert "gpt.transformer.h.2" not in callback.plan.checkpointed
    assert_within_two_percent(callback.plan.predicted_peak_bytes, peak, "GPT with a shared block")


def test_a_second_autocheckpoint_is_refused_in_setup():
    callbacks = [AutoCheckpoint(budget_gb=1.0), AutoCheckpoint(budget_gb=2.0)]
    with pytest.raises(
        ValueError, match=r"one AutoCheckpoint per Trainer .* got 2 \(budget_gb=1, budget_gb=2\)"
    ):
        fast_trainer(callbacks, max_steps=1).fit(tiny_gpt(), train_dataloaders=token_loader())


class _Cached(nn.Module):
    """A block that keeps a cache of its inputs across calls, as a KV cache does: its recomputation sees a
    longer cache (torch's ``CheckpointError``), or fails outright (``fail=True``)."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.cache: list[torch.Tensor] = []
        self.fail = fail

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.cache.append(x)
        if self.fail and len(self.cache) > 1:
            raise RuntimeError("The size of tensor a (4) must match the size of tensor b (2)")
        return self.linear(torch.cat(self.cache)).sum(0, keepdim=True) * x


@pytest.mark.parametrize("fail", [False, True], ids=["checkpoint-error", "error-in-recompute"])
def test_a_recomputation_that_diverges_names_the_module_and_the_fix(fail):
    model = nn.Sequential(nn.Linear(8, 8), _Cached(fail))
    apply_checkpointing(model, ["1"])
    loss = model(torch.randn(2, 8)).sum()
    with pytest.raises((CheckpointError, RuntimeError)) as raised:
        loss.backward()
    explain_recompute_error(raised.value)  # what the callback's on_exception does
    notes = "".join(raised.value.__notes__)
    assert notes.count("while recomputing checkpointed module '1'") == 1
    assert "use_cache=False" in notes


def test_packed_sequence_check_is_patched_only_for_the_fake_profile_and_not_for_packed_batches():
    masking = pytest.importorskip("transformers.masking_utils")
    original = masking.find_packed_sequence_indices
    with hf_models.unpacked_positions_on_fake_tensors({"input_ids": torch.ones(1)}) as patched:
        assert patched and masking.find_packed_sequence_indices is not original
        positions = torch.tensor([[0, 1, 0, 1]])  # two packed sequences: real tensors still checked
        assert masking.find_packed_sequence_indices(positions).tolist() == [[0, 0, 1, 1]]
    assert masking.find_packed_sequence_indices is original
    with hf_models.unpacked_positions_on_fake_tensors({"position_ids": positions}) as patched:
        assert not patched and masking.find_packed_sequence_indices is original
