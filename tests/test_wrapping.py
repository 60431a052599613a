"""Checkpoint wrapping: exact gradients with dropout, real recomputation, names and state_dict unchanged."""

from __future__ import annotations

import copy
import logging
import pickle

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from callback_helpers import gpt_loss, tiny_gpt, token_batch
from torch.utils.checkpoint import set_checkpoint_early_stop
from torch.utils.flop_counter import FlopCounterMode

from examples.gpt import GPT
from lightning_ckpt.core.profiler import profile_step
from lightning_ckpt.core.wrapping import (
    apply_checkpointing,
    checkpointed_names,
    is_checkpointed,
    remove_checkpointing,
    strip_wrapper_prefixes,
)

BLOCKS = [f"transformer.h.{i}" for i in range(4)]


def _train(model: GPT, steps: int = 3, autocast: bool = False) -> list[list[torch.Tensor]]:
    """Seeded AdamW steps with dropout on; returns the gradients of every step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(1234)
    grads = []
    for step in range(steps):
        idx, targets = token_batch(model, batch_size=4, seed=step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = gpt_loss(model, idx, targets)
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        optimizer.step()
        optimizer.zero_grad()
    return grads


@pytest.mark.parametrize("names", [BLOCKS[1:3], BLOCKS, ["transformer.h.0.attn", "transformer.h.3.mlp"]])
def test_gradients_and_parameters_exact_with_dropout(names):
    reference, wrapped = tiny_gpt(), tiny_gpt()
    assert apply_checkpointing(wrapped, names) == names
    expected, actual = _train(reference), _train(wrapped)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    torch.testing.assert_close(list(wrapped.parameters()), list(reference.parameters()), rtol=0, atol=0)


def test_bf16_autocast_stays_close():
    reference, wrapped = tiny_gpt(), tiny_gpt()
    apply_checkpointing(wrapped, BLOCKS)
    expected, actual = _train(reference, autocast=True), _train(wrapped, autocast=True)
    torch.testing.assert_close(actual, expected, rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(list(wrapped.parameters()), list(reference.parameters()), rtol=2e-2, atol=2e-3)


def _count_forwards(model: GPT) -> dict[str, int]:
    counts = dict.fromkeys(BLOCKS, 0)
    for name in BLOCKS:
        block = model.get_submodule(name)
        original = block.forward

        def counting(*args, _name=name, _original=original, **kwargs):
            counts[_name] += 1
            return _original(*args, **kwargs)

        block.forward = counting  # an instance attribute that checkpointing must wrap and later restore
    return counts


def test_wrapped_modules_run_forward_twice_and_others_once():
    model = tiny_gpt()
    counts = _count_forwards(model)
    apply_checkpointing(model, BLOCKS[:2])
    idx, targets = token_batch(model, batch_size=2)
    gpt_loss(model, idx, targets).backward()
    assert counts == {BLOCKS[0]: 2, BLOCKS[1]: 2, BLOCKS[2]: 1, BLOCKS[3]: 1}
    remove_checkpointing(model)
    gpt_loss(model, idx, targets).backward()
    assert counts == {BLOCKS[0]: 3, BLOCKS[1]: 3, BLOCKS[2]: 2, BLOCKS[3]: 2}


def test_flop_counter_shows_extra_forward_of_exactly_the_checkpointed_modules():
    model = tiny_gpt()
    idx, targets = token_batch(model, batch_size=2)
    candidates = [*BLOCKS, "transformer.h.0.attn", "transformer.h.3.mlp"]
    profile = profile_step(model, lambda: gpt_loss(model, idx, targets), candidates, "flops")
    forward_flops = {module.name: module.flops for module in profile.modules}

    def step_flops() -> int:
        with FlopCounterMode(display=False) as counter:
            gpt_loss(model, idx, targets).backward()
        return counter.get_total_flops()

    baseline = step_flops()
    # (a module whose last saved tensor comes before its last matmul, e.g. a bare Linear, recomputes
    # less: torch stops the recomputation early once every saved tensor is back)
    for names in (BLOCKS[1:2], BLOCKS[1:3], BLOCKS, candidates[4:]):
        apply_checkpointing(model, names)
        assert step_flops() - baseline == sum(forward_flops[name] for name in names)
        remove_checkpointing(model)


class _KwargsDict(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 6)
        self.dropout = nn.Dropout(0.5)

    def forward(self, x, mask, *, scale: float, extra=None):
        hidden = self.dropout(self.linear(x)) * mask * scale
        return {"out": hidden.tanh(), "pair": (hidden.sum(), extra)}


class _Host(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _KwargsDict()
        self.head = nn.Linear(6, 1)

    def forward(self, x):
        mask = (x > 0).float()  # an input that does not require grad
        result = self.inner(x, mask, scale=2.0, extra="tag")
        assert result["pair"][1] == "tag"
        return self.head(result["out"]).sum() + result["pair"][0]


def test_kwargs_dict_and_tuple_outputs_and_inputs_without_grad():
    torch.manual_seed(0)
    reference = _Host()
    wrapped = copy.deepcopy(reference)
    apply_checkpointing(wrapped, ["inner"])
    x = torch.randn(5, 6)
    for model in (reference, wrapped):
        torch.manual_seed(7)
        model(x).backward()
    torch.testing.assert_close(
        [p.grad for p in wrapped.parameters()], [p.grad for p in reference.parameters()]
    )


def test_wrapping_twice_is_a_no_op_with_a_warning():
    model = tiny_gpt()
    counts = _count_forwards(model)
    apply_checkpointing(model, BLOCKS[:1])
    with pytest.warns(UserWarning, match="already checkpointed"):
        assert apply_checkpointing(model, BLOCKS[:1]) == []
    idx, targets = token_batch(model, batch_size=2)
    gpt_loss(model, idx, targets).backward()
    assert counts[BLOCKS[0]] == 2


def test_torch_checkpoint_wrapper_is_detected_and_not_wrapped_again():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    model = tiny_gpt()
    model.transformer.h[0] = checkpoint_wrapper(model.transformer.h[0])
    assert "transformer.h.0._checkpoint_wrapped_module.ln_1" in dict(model.named_modules())
    with pytest.warns(UserWarning, match="already checkpointed"):
        assert apply_checkpointing(model, ["transformer.h.0", "transformer.h.1"]) == ["transformer.h.1"]


def test_unknown_name_raises_and_wraps_nothing():
    model = tiny_gpt()
    with pytest.raises(ValueError, match=r"`names` must name submodules.*'nope'.*transformer\.h"):
        apply_checkpointing(model, [BLOCKS[0], "nope"])
    assert checkpointed_names(model) == []
    with pytest.raises(TypeError, match="`names` must hold module names"):
        apply_checkpointing(model, [3])


def test_state_dict_and_parameter_names_unchanged_and_round_trip():
    plain, wrapped = tiny_gpt(), tiny_gpt()
    apply_checkpointing(wrapped, BLOCKS)
    assert list(wrapped.state_dict()) == list(plain.state_dict())
    assert [n for n, _ in wrapped.named_parameters()] == [n for n, _ in plain.named_parameters()]
    with torch.no_grad():
        for p in wrapped.parameters():
            p.add_(1.0)
    plain.load_state_dict(wrapped.state_dict())
    torch.testing.assert_close(plain.state_dict(), wrapped.state_dict())
    wrapped.load_state_dict(tiny_gpt().state_dict())
    assert checkpointed_names(wrapped) == BLOCKS
    torch.testing.assert_close(wrapped.state_dict(), tiny_gpt().state_dict())


def test_remove_restores_forward_and_logs(caplog):
    model = tiny_gpt()
    with caplog.at_level(logging.INFO, logger="lightning_ckpt.core.wrapping"):
        apply_checkpointing(model, BLOCKS[:2])
    assert "applied to 2 module(s): transformer.h.0, transformer.h.1" in caplog.text
    assert checkpointed_names(model) == BLOCKS[:2]
    assert remove_checkpointing(model) == BLOCKS[:2]
    assert checkpointed_names(model) == [] and "forward" not in model.transformer.h[0].__dict__
    assert _no_hooks_left(model) and remove_checkpointing(model) == []


def _no_hooks_left(model: nn.Module) -> bool:
    return all(
        not m._forward_hooks and not m._forward_pre_hooks and not is_checkpointed(m) for m in model.modules()
    )


@pytest.mark.parametrize("copy_model", [copy.deepcopy, lambda model: pickle.loads(pickle.dumps(model))])
def test_a_copy_of_a_wrapped_model_checkpoints_its_own_modules(copy_model):
    model = tiny_gpt()
    apply_checkpointing(model, BLOCKS[:1])
    clone = copy_model(model)
    counts = _count_forwards(clone)
    assert checkpointed_names(clone) == BLOCKS[:1]
    idx, targets = token_batch(clone, batch_size=2)
    gpt_loss(clone, idx, targets).backward()
    assert counts == {BLOCKS[0]: 2, BLOCKS[1]: 1, BLOCKS[2]: 1, BLOCKS[3]: 1}
    assert remove_checkpointing(clone) == BLOCKS[:1] and _no_hooks_left(clone)
    assert checkpointed_names(model) == BLOCKS[:1]


class _DDPLike(nn.Module):
    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args):
        return self.module(*args)


def test_names_resolve_through_wrapper_prefixes():
    model = tiny_gpt()
    wrapped = _DDPLike(torch.compile(model))
    assert "module._orig_mod.transformer.h.1" in dict(wrapped.named_modules())
    assert (
        apply_checkpointing(wrapped, ["transformer.h.1", "module._orig_mod.transformer.h.2"]) == BLOCKS[1:3]
    )
    assert checkpointed_names(wrapped) == BLOCKS[1:3]
    assert checkpointed_names(model) == BLOCKS[1:3]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("module.transformer.h.0", "transformer.h.0"),
        ("_orig_mod.layers.3._fsdp_wrapped_module", "layers.3"),
        ("layers.3._checkpoint_wrapped_module.mlp", "layers.3.mlp"),
        ("encoder.module.fc", "encoder.module.fc"),
        ("", ""),
    ],
)
def test_strip_wrapper_prefixes(name, expected):
    assert strip_wrapper_prefixes(name) == expected


def test_module_kwargs_named_like_checkpoint_options_reach_the_module():
    class TakesOptions(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4)

        def forward(self, x, debug=None, context_fn=None, preserve_rng_state=0.0, fn=0.0, early_stop=0.0):
            offset = (0.0 if context_fn is None else context_fn) + preserve_rng_state + fn + early_stop
            return self.linear(x) * (2.0 if debug else 1.0) + offset

    options = {"debug": True, "context_fn": 1.0, "preserve_rng_state": 2.0, "fn": 3.0, "early_stop": 4.0}
    model = nn.Sequential(TakesOptions())
    x = torch.randn(3, 4, requires_grad=True)
    expected = model[0](x, **options)
    expected.square().sum().backward()
    expected_grad, x.grad = x.grad, None
    apply_checkpointing(model, ["0"])
    actual = model[0](x, **options)
    actual.square().sum().backward()
    torch.testing.assert_close((actual, x.grad), (expected, expected_grad))


def _patch_forward_on_top(module: nn.Module, calls: list[int]) -> None:
    """What accelerate's ``add_hook_to_module`` does: a new instance ``forward`` that calls the old one."""
    old_forward = module.forward

    def new_forward(*args, **kwargs):
        calls.append(1)
        return old_forward(*args, **kwargs)

    module.forward = new_forward


def test_a_forward_patched_on_top_keeps_checkpointing_visible_applied_and_removable():
    reference, model = tiny_gpt(), tiny_gpt()
    apply_checkpointing(model, BLOCKS[1:3])
    calls: list[int] = []
    _patch_forward_on_top(model.transformer.h[1], calls)
    assert is_checkpointed(model.transformer.h[1]) and checkpointed_names(model) == BLOCKS[1:3]
    torch.testing.assert_close(_train(model, steps=2), _train(reference, steps=2), rtol=0, atol=0)
    assert len(calls) == 4, "twice a step: forward, then the recomputation in backward"

    idx, targets = token_batch(model, batch_size=2)
    with FlopCounterMode(display=False) as counter:
        model.transformer.h[1](torch.randn(*idx.shape, model.config.n_embd))
    block_flops = counter.get_total_flops()

    def step_flops() -> int:
        with FlopCounterMode(display=False) as counter:
            gpt_loss(model, idx, targets).backward()
        return counter.get_total_flops()

    checkpointed = step_flops()
    assert remove_checkpointing(model) == BLOCKS[1:3] and checkpointed_names(model) == []
    del calls[:]
    plain = step_flops()
    assert len(calls) == 1, "once: the patched forward stays, the checkpointing is gone"
    assert checkpointed - plain == 2 * block_flops


def test_user_pre_hooks_run_inside_the_checkpoint_and_forward_hooks_once_outside():
    """A pre-hook runs in forward and again in the recomputation, on the original arguments; a forward hook
    runs once, outside the region, so the tensors it saves are not recomputed (even without early stop)."""
    reference, model = tiny_gpt(), tiny_gpt()
    runs = {id(reference): {"pre": 0, "post": 0}, id(model): {"pre": 0, "post": 0}}

    def add_hooks(gpt: GPT) -> None:
        block, count = gpt.transformer.h[1], runs[id(gpt)]

        def rewrite_input(module, args):  # rewrites the argument and draws from the RNG
            count["pre"] += 1
            return (args[0] * 2 + 0.1 * torch.randn_like(args[0]),)

        def scale_output(module, args, output):  # saves `output` and the weight for backward
            count["post"] += 1
            return output * module.ln_2.weight

        block.register_forward_pre_hook(rewrite_input)
        block.register_forward_hook(scale_output)

    add_hooks(reference)
    add_hooks(model)
    apply_checkpointing(model, BLOCKS[:2])
    with set_checkpoint_early_stop(False):
        torch.testing.assert_close(_train(model, steps=1), _train(reference, steps=1), rtol=0, atol=0)
    assert runs[id(reference)] == {"pre": 1, "post": 1}
    assert runs[id(model)] == {"pre": 2, "post": 1}


def test_a_full_backward_hook_runs_once_with_the_plain_gradients():
    reference, model = tiny_gpt(), tiny_gpt()
    seen: list[list[torch.Tensor]] = [[], []]

    def add_hook(gpt: GPT, grads: list[torch.Tensor]) -> None:
        def record(module, grad_in, grad_out):
            grads.extend([*grad_in, *grad_out])

        gpt.transformer.h[0].register_full_backward_hook(record)

    add_hook(reference, seen[0])
    add_hook(model, seen[1])
    apply_checkpointing(model, BLOCKS[:1])
    torch.testing.assert_close(_train(model, steps=1), _train(reference, steps=1), rtol=0, atol=0)
    assert len(seen[1]) == 2
    torch.testing.assert_close(seen[1], seen[0], rtol=0, atol=0)


class _Twice(nn.Module):
    """Calls one checkpointed block twice (shared weights), with a checkpointed child inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.gpt = tiny_gpt(n_layer=1)
        self.config = self.gpt.config

    def forward(self, idx, targets):
        gpt = self.gpt.transformer
        x = gpt.drop(gpt.wte(idx) + gpt.wpe(torch.arange(idx.shape[1])))
        logits = self.gpt.lm_head(gpt.ln_f(gpt.h[0](gpt.h[0](x))))
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # as GPT.forward


def test_nested_and_reused_modules_give_the_plain_gradients():
    reference, model = _Twice(), _Twice()
    assert apply_checkpointing(model, ["gpt.transformer.h.0", "gpt.transformer.h.0.attn"]) == [
        "gpt.transformer.h.0",
        "gpt.transformer.h.0.attn",
    ]
    torch.testing.assert_close(_train(model, steps=2), _train(reference, steps=2), rtol=0, atol=0)


def test_torch_composable_checkpoint_is_detected_and_not_wrapped_again():
    from torch.distributed._composable import checkpoint

    model = tiny_gpt()
    checkpoint(model.transformer.h[0])
    with pytest.warns(UserWarning, match="already checkpointed"):
        assert apply_checkpointing(model, BLOCKS[:2]) == BLOCKS[1:2]


class _RefusesHooks(nn.Linear):
    def register_forward_hook(self, *args, **kwargs):
        raise RuntimeError("no forward hooks here")


def test_a_failure_midway_leaves_nothing_half_wrapped():
    model = nn.Sequential(nn.Linear(2, 2), _RefusesHooks(2, 2), nn.Linear(2, 2))
    with pytest.raises(RuntimeError, match="no forward hooks here"):
        apply_checkpointing(model, ["0", "1", "2"])
    assert checkpointed_names(model) == [] and _no_hooks_left(model)


def test_no_grad_runs_once_and_an_exception_in_forward_closes_the_region():
    reference, model = tiny_gpt(), tiny_gpt()
    counts = _count_forwards(model)
    apply_checkpointing(model, BLOCKS)
    idx, targets = token_batch(model, batch_size=2)
    with torch.no_grad():
        model(idx, targets)
    assert set(counts.values()) == {1}

    def failing_forward(*args):
        raise RuntimeError("boom in block 2")

    model.transformer.h[2].mlp.forward = failing_forward
    with pytest.raises(RuntimeError, match="boom"):
        model(idx, targets)
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    del model.transformer.h[2].mlp.forward
    torch.testing.assert_close(_train(model, steps=1), _train(reference, steps=1), rtol=0, atol=0)


def test_an_error_in_the_recomputation_surfaces_as_itself():
    model = tiny_gpt()
    apply_checkpointing(model, BLOCKS[:1])
    layer_norm = model.transformer.h[0].ln_1
    layer_norm_forward, calls = layer_norm.forward, []

    def fails_when_recomputed(x):
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("fails in the recomputation")
        return layer_norm_forward(x)

    layer_norm.forward = fails_when_recomputed
    idx, targets = token_batch(model, batch_size=2)
    loss = gpt_loss(model, idx, targets)
    with pytest.raises(ValueError, match="fails in the recomputation"):
        loss.backward()


def test_remove_closes_the_regions_an_interrupt_left_open():
    reference, model = tiny_gpt(), tiny_gpt()
    apply_checkpointing(model, BLOCKS)

    def interrupted(*args):
        raise KeyboardInterrupt

    model.transformer.h[2].mlp.forward = interrupted
    idx, targets = token_batch(model, batch_size=2)
    with pytest.raises(KeyboardInterrupt):
        model(idx, targets)
    del model.transformer.h[2].mlp.forward
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is not None  # skipped always_call
    assert remove_checkpointing(model) == BLOCKS
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    apply_checkpointing(model, BLOCKS)
    torch.testing.assert_close(_train(model, steps=1), _train(reference, steps=1), rtol=0, atol=0)


def test_inside_torch_compile_the_hooks_step_aside_with_a_warning():
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.3), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
    model = copy.deepcopy(reference)
    apply_checkpointing(model, ["2"])
    compiled = torch.compile(model, backend="aot_eager")
    x = torch.randn(4, 8)
    torch.manual_seed(1)
    reference(x).sum().backward()
    torch.manual_seed(1)
    with pytest.warns(UserWarning, match="inside torch.compile"):
        compiled(x).sum().backward()
    torch.testing.assert_close([p.grad for p in model.parameters()], [p.grad for p in reference.parameters()])
    assert checkpointed_names(model) == ["2"]


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_a_transformers_model_trains_without_its_kv_cache_and_gets_it_back_on_remove(kind):
    """Padded, with the config's cache on: wrapped by ``apply_checkpointing`` alone (no callback), the
    backward works and gives the plain model's gradients; eval mode keeps the cache; remove gives it back."""
    pytest.importorskip("transformers")
    from real_models import PaddedLM, padded_token_loader

    plain, wrapped = PaddedLM(kind), PaddedLM(kind)
    layers = wrapped.model.transformer.h if kind == "gpt2" else wrapped.model.model.layers
    names = [name for name, module in wrapped.named_modules() if any(module is layer for layer in layers)]
    assert len(apply_checkpointing(wrapped, names)) == 4
    ids, mask = next(iter(padded_token_loader()))
    labels = ids.masked_fill(mask == 0, -100)
    for model in (plain, wrapped):
        model.train()
        torch.manual_seed(0)  # the same dropout masks
        out = model.model(input_ids=ids, attention_mask=mask, labels=labels)
        assert (out.past_key_values is None) == (model is wrapped)
        out.loss.backward()
    for (name, param), reference in zip(wrapped.named_parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(param.grad, reference.grad, msg=name)
    wrapped.eval()
    with torch.no_grad():
        assert wrapped.model(input_ids=ids, attention_mask=mask).past_key_values is not None
    wrapped.train()
    assert remove_checkpointing(wrapped) == names
    with torch.no_grad():
        assert wrapped.model(input_ids=ids, attention_mask=mask).past_key_values is not None
