"""Op-level options for one block (issue 24, items 1 and 4): the op record, the frontier, and selective
checkpointing applied with removable hooks (gradients, held bytes, state_dict, removal)."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from examples.gpt import Block, GPTConfig
from lightning_ckpt.core.fake_tensors import fake_model
from lightning_ckpt.core.selective.apply import apply_selective_checkpointing, selective_policy_of
from lightning_ckpt.core.selective.measure import held_bytes
from lightning_ckpt.core.selective.ops import record_ops
from lightning_ckpt.core.selective.options import (
    MATMUL_OPS,
    SDPA_OPS,
    BlockOption,
    block_options,
    named_options,
    profile_block,
)
from lightning_ckpt.core.selective.policy import SelectivePolicy
from lightning_ckpt.core.wrapping import (
    apply_checkpointing,
    checkpointing_removed,
    is_checkpointed,
    remove_checkpointing,
)


def _gpt_block(dropout: float) -> nn.Module:
    torch.manual_seed(0)
    return Block(GPTConfig(block_size=16, n_embd=32, n_head=2, dropout=dropout))


def _encoder_layer(dropout: float) -> nn.Module:
    torch.manual_seed(0)
    return nn.TransformerEncoderLayer(32, 2, dim_feedforward=64, dropout=dropout, batch_first=True)


MODELS = {"gpt_block": _gpt_block, "encoder_layer": _encoder_layer}


def _input() -> torch.Tensor:
    return torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(1), requires_grad=True)


@pytest.fixture(scope="module")
def profiles() -> dict[tuple[str, float], object]:
    """Each model's profile, with dropout off and on (computed once: timing runs are the slow part)."""
    return {
        (name, p): profile_block(make(p), _input(), repeats=1)
        for name, make in MODELS.items()
        for p in (0, 0.5)
    }


@pytest.mark.parametrize("name", MODELS)
def test_the_record_names_attention_and_matmuls(profiles, name):
    calls = profiles[(name, 0)].calls
    names = {str(call.func) for call in calls}
    assert names & SDPA_OPS and names & MATMUL_OPS
    heavy = [call for call in calls if str(call.func) in SDPA_OPS | MATMUL_OPS and call.output_bytes]
    assert all(call.savable == call.recomputed for call in heavy)  # past the early stop, saving is useless
    indices = [call.index for call in calls if str(call.func) == "aten.addmm.default"]
    assert indices == list(range(len(indices)))


@pytest.mark.parametrize("name", MODELS)
def test_random_calls_are_found_and_never_saved(profiles, name):
    calls = profiles[(name, 0.5)].calls
    random = [call for call in calls if call.random]
    assert random and all(torch.Tag.nondeterministic_seeded in call.func.tags for call in random)
    assert not [call for call in random if call.savable]
    assert not [call for call in profiles[(name, 0)].calls if call.random]  # SDPA without dropout draws none
    masks = [call for call in calls if str(call.func) == "aten.empty_like.default"]
    assert masks and all(call.mutated and not call.savable for call in masks)  # bernoulli_ fills them


def _assert_frontier(options: list[BlockOption], profile) -> None:
    assert (options[0].kind, options[-1].kind) == ("keep", "checkpoint")
    assert options[0].saved_bytes == profile.keep_bytes and options[-1].saved_bytes == 0
    for more, fewer in zip(options, options[1:], strict=False):
        assert more.saved_bytes > fewer.saved_bytes
        assert more.recompute_seconds < fewer.recompute_seconds


@pytest.mark.parametrize("name", MODELS)
def test_options_trade_bytes_for_recompute_with_keep_and_checkpoint_at_the_ends(profiles, name):
    profile = profiles[(name, 0.5)]
    _assert_frontier(block_options(profile), profile)
    free = dataclasses.replace(profile, sac_overhead_seconds=0.0)  # SAC for free: selective options pay
    options = block_options(free)
    _assert_frontier(options, free)
    assert any(option.kind == "selective" for option in options)


def test_overhead_is_charged_to_every_selective_option(profiles):
    profile = profiles[("gpt_block", 0)]
    costly = dataclasses.replace(profile, sac_overhead_seconds=10 * profile.forward_seconds)
    assert [option.kind for option in block_options(costly)] == ["keep", "checkpoint"]
    for option in named_options(costly).values():
        if option.kind == "selective":
            assert option.recompute_seconds >= costly.sac_overhead_seconds


def _options(profile) -> list[BlockOption]:
    free = dataclasses.replace(profile, sac_overhead_seconds=0.0)
    return list({o.name: o for o in [*named_options(profile).values(), *block_options(free)]}.values())


def _wrap(model: nn.Module, option: BlockOption) -> None:
    if option.kind == "selective":
        apply_selective_checkpointing(model, {"0": option.policy})
    elif option.kind == "checkpoint":
        apply_checkpointing(model, ["0"])


def _grads(model: nn.Module) -> list[torch.Tensor]:
    torch.manual_seed(2)
    x = _input()
    model(x).square().sum().backward()
    grads = [x.grad, *(p.grad for p in model.parameters())]
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("dropout", [0, 0.5])
@pytest.mark.parametrize("name", MODELS)
def test_each_option_gives_the_plain_gradients_and_holds_the_predicted_bytes(profiles, name, dropout):
    model = nn.Sequential(MODELS[name](dropout))
    expected, keys = _grads(model), list(model.state_dict())
    options = _options(profiles[(name, dropout)])
    assert {"keep", "checkpoint", "sdpa+matmuls"} <= {o.name for o in options}
    for option in options:
        _wrap(model, option)
        assert list(model.state_dict()) == keys
        torch.manual_seed(3)
        measured = held_bytes(model, _input())
        assert measured == pytest.approx(option.saved_bytes, rel=0.02), option.name
        torch.testing.assert_close(_grads(model), expected, msg=option.name)
        remove_checkpointing(model)


def test_removal_leaves_the_module_as_it_was(profiles):
    model = nn.Sequential(_gpt_block(0.5))
    hooks = (dict(model[0]._forward_pre_hooks), dict(model[0]._forward_hooks), dict(vars(model[0])))
    policy = named_options(profiles[("gpt_block", 0.5)])["sdpa+matmuls"].policy
    assert apply_selective_checkpointing(model, {"0": policy}) == ["0"]
    assert is_checkpointed(model[0]) and selective_policy_of(model[0]) is policy
    model.eval()
    with torch.no_grad():  # no region opens: evaluation runs as the plain module
        torch.testing.assert_close(model(_input()), model[0].forward(_input()))
    model.train()
    with pytest.warns(UserWarning, match="already checkpointed"):
        assert apply_checkpointing(model, ["0"]) == []
    assert remove_checkpointing(model) == ["0"]
    assert (dict(model[0]._forward_pre_hooks), dict(model[0]._forward_hooks), dict(vars(model[0]))) == hooks
    assert not is_checkpointed(model[0]) and selective_policy_of(model[0]) is None


def test_bad_input_is_refused_with_the_argument_named(profiles):
    with pytest.raises(ValueError, match="`max_prefixes` must be a positive integer, got 0"):
        block_options(profiles[("gpt_block", 0)], max_prefixes=0)
    with pytest.raises(ValueError, match="`saved` must be a frozenset of"):
        SelectivePolicy(frozenset({"aten.mm.default"}))
    with pytest.raises(ValueError, match="`saved` must be a frozenset of"):
        SelectivePolicy({("aten.mm.default", 0)})
    model = nn.Sequential(nn.Linear(2, 2))
    with pytest.raises(TypeError, match=r"`policies\['0'\]` must be a SelectivePolicy, got list"):
        apply_selective_checkpointing(model, {"0": []})
    with pytest.raises(ValueError, match="`policies` must name submodules"):
        apply_selective_checkpointing(model, {"nope": SelectivePolicy(frozenset())})
    with pytest.raises(ValueError, match="`repeats` must be a positive integer, got 0"):
        record_ops(model, torch.randn(1, 2), repeats=0)


@pytest.mark.parametrize("dropout", [0, 0.5])
@pytest.mark.parametrize("name", MODELS)
def test_a_record_on_fake_tensors_equals_the_real_one_but_for_times(name, dropout):
    model = MODELS[name](dropout)
    real = record_ops(model, _input(), repeats=1)
    with fake_model(model) as fake:
        fake_calls = record_ops(model, fake.fake(_input()), repeats=1)

    def sizes(calls):
        return [
            (c.key, c.output_bytes, c.saved_bytes, c.flops, c.random, c.mutated, c.recomputed) for c in calls
        ]

    assert sizes(fake_calls) == sizes(real)
    assert any(c.random for c in real) == (dropout > 0)


def _step_matmul_flops(model: nn.Module) -> int:
    """Matmul FLOPs of a forward and backward (FlopCounterMode's module hooks add ops to a recomputation,
    so the forward runs under it too: a selective region's ops must be the same in both)."""
    torch.manual_seed(2)
    with FlopCounterMode(display=False) as counter:
        model(_input()).square().sum().backward()
    model.zero_grad(set_to_none=True)
    counts = counter.get_flop_counts()["Global"]
    return sum(
        n for packet, n in counts.items() if str(packet) in {name.rsplit(".", 1)[0] for name in MATMUL_OPS}
    )


@pytest.mark.parametrize("dropout", [0, 0.5])
@pytest.mark.parametrize("name", MODELS)
def test_backward_recomputes_exactly_the_matmuls_an_option_does_not_save(profiles, name, dropout):
    profile = profiles[(name, dropout)]
    model = nn.Sequential(MODELS[name](dropout))
    if name == "gpt_block" and dropout == 0:  # the MLP's c_proj saves its input: early stop skips it
        assert [c.recomputed for c in profile.calls if str(c.func) in MATMUL_OPS] == [True, True, True, False]
    kept = _step_matmul_flops(model)
    matmuls = [call for call in profile.calls if str(call.func) in MATMUL_OPS]
    for option in _options(profile):
        saved = option.policy.saved if option.policy else set()
        recomputed = sum(c.flops for c in matmuls if c.recomputed and c.key not in saved)
        recomputed = 0 if option.kind == "keep" else recomputed
        _wrap(model, option)
        assert _step_matmul_flops(model) - kept == recomputed, option.name
        remove_checkpointing(model)


def test_checkpointing_removed_puts_a_selective_checkpoint_back_selective(profiles):
    model = nn.Sequential(_gpt_block(0.5), _gpt_block(0.5))
    policy = named_options(profiles[("gpt_block", 0.5)])["sdpa+matmuls"].policy
    apply_selective_checkpointing(model, {"0": policy})
    apply_checkpointing(model, ["1"])
    expected = _grads(model)
    with checkpointing_removed(model) as names:
        assert sorted(names) == ["0", "1"] and not is_checkpointed(model[0])
    assert selective_policy_of(model[0]) is policy
    assert is_checkpointed(model[1]) and selective_policy_of(model[1]) is None
    torch.testing.assert_close(_grads(model), expected)  # the fresh states recompute as before


def test_selective_checkpointing_of_a_transformers_model_turns_its_kv_cache_off_while_training():
    """As ``apply_checkpointing`` does (the same ``wrap_modules``): padded GPT-2 with its config's cache on,
    its layers wrapped selectively, trains with the plain model's gradients and no cache; eval mode and
    ``checkpointing_removed``'s restore keep that behaviour, ``remove_checkpointing`` gives the cache back."""
    pytest.importorskip("transformers")
    from real_models import PaddedLM, padded_token_loader

    plain, wrapped = PaddedLM("gpt2"), PaddedLM("gpt2")
    layers = list(wrapped.model.transformer.h)
    names = [name for name, module in wrapped.named_modules() if any(module is layer for layer in layers)]
    policy = SelectivePolicy(frozenset({("aten.addmm.default", 0)}))
    assert apply_selective_checkpointing(wrapped, dict.fromkeys(names, policy)) == names
    ids, mask = next(iter(padded_token_loader()))
    labels = ids.masked_fill(mask == 0, -100)
    for model in (plain, wrapped):
        model.train()
        torch.manual_seed(0)  # the same dropout masks
        with checkpointing_removed(model) if model is wrapped else contextlib.nullcontext():
            pass  # taken off and put back: still selective, the cache still off
        out = model.model(input_ids=ids, attention_mask=mask, labels=labels)
        assert (out.past_key_values is None) == (model is wrapped)
        out.loss.backward()
    assert all(selective_policy_of(layer) == policy for layer in layers)
    for (name, param), reference in zip(wrapped.named_parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(param.grad, reference.grad, msg=name)
    assert remove_checkpointing(wrapped) == names
    with torch.no_grad():
        assert wrapped.model(input_ids=ids, attention_mask=mask).past_key_values is not None
