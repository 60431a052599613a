"""Checkpoint wrapping: exact gradients with dropout, real recomputation, names and state_dict unchanged."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

from lightning_ckpt.core.profiler import profile_step
from lightning_ckpt.core.wrapping import (
    apply_checkpointing,
    checkpointed_names,
    remove_checkpointing,
    strip_wrapper_prefixes,
)
from tests.tiny_gpt import GPT, GPTConfig, make_batch

BLOCKS = [f"transformer.h.{i}" for i in range(4)]


def _model(**config) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(block_size=32, **config))


def _train(model: GPT, steps: int = 3, autocast: bool = False) -> list[list[torch.Tensor]]:
    """Seeded AdamW steps with dropout on; returns the gradients of every step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(1234)
    grads = []
    for step in range(steps):
        idx, targets = make_batch(model.config, batch_size=4, seed=step)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(idx, targets)
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        optimizer.step()
        optimizer.zero_grad()
    return grads


@pytest.mark.parametrize("names", [BLOCKS[1:3], BLOCKS, ["transformer.h.0.attn", "transformer.h.3.mlp"]])
def test_gradients_and_parameters_exact_with_dropout(names):
    reference, wrapped = _model(), _model()
    assert apply_checkpointing(wrapped, names) == names
    expected, actual = _train(reference), _train(wrapped)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    torch.testing.assert_close(list(wrapped.parameters()), list(reference.parameters()), rtol=0, atol=0)


def test_bf16_autocast_stays_close():
    reference, wrapped = _model(), _model()
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
    model = _model()
    counts = _count_forwards(model)
    apply_checkpointing(model, BLOCKS[:2])
    idx, targets = make_batch(model.config, batch_size=2)
    model(idx, targets).backward()
    assert counts == {BLOCKS[0]: 2, BLOCKS[1]: 2, BLOCKS[2]: 1, BLOCKS[3]: 1}
    remove_checkpointing(model)
    model(idx, targets).backward()
    assert counts == {BLOCKS[0]: 3, BLOCKS[1]: 3, BLOCKS[2]: 2, BLOCKS[3]: 2}


def test_flop_counter_shows_extra_forward_of_exactly_the_checkpointed_modules():
    model = _model()
    idx, targets = make_batch(model.config, batch_size=2)
    candidates = [*BLOCKS, "transformer.h.0.attn", "transformer.h.3.mlp"]
    profile = profile_step(model, lambda: model(idx, targets), candidates, "flops")
    forward_flops = {module.name: module.flops for module in profile.modules}

    def step_flops() -> int:
        with FlopCounterMode(display=False) as counter:
            model(idx, targets).backward()
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
    model = _model()
    counts = _count_forwards(model)
    apply_checkpointing(model, BLOCKS[:1])
    with pytest.warns(UserWarning, match="already checkpointed"):
        assert apply_checkpointing(model, BLOCKS[:1]) == []
    idx, targets = make_batch(model.config, batch_size=2)
    model(idx, targets).backward()
    assert counts[BLOCKS[0]] == 2


def test_torch_checkpoint_wrapper_is_detected_and_not_wrapped_again():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    model = _model()
    model.transformer.h[0] = checkpoint_wrapper(model.transformer.h[0])
    assert "transformer.h.0._checkpoint_wrapped_module.ln_1" in dict(model.named_modules())
    with pytest.warns(UserWarning, match="already checkpointed"):
        assert apply_checkpointing(model, ["transformer.h.0", "transformer.h.1"]) == ["transformer.h.1"]


def test_unknown_name_raises_and_wraps_nothing():
    model = _model()
    with pytest.raises(ValueError, match=r"`names` must name submodules.*'nope'.*transformer\.h"):
        apply_checkpointing(model, [BLOCKS[0], "nope"])
    assert checkpointed_names(model) == []
    with pytest.raises(TypeError, match="`names` must hold module names"):
        apply_checkpointing(model, [3])


def test_state_dict_and_parameter_names_unchanged_and_round_trip():
    plain, wrapped = _model(), _model()
    apply_checkpointing(wrapped, BLOCKS)
    assert list(wrapped.state_dict()) == list(plain.state_dict())
    assert [n for n, _ in wrapped.named_parameters()] == [n for n, _ in plain.named_parameters()]
    with torch.no_grad():
        for p in wrapped.parameters():
            p.add_(1.0)
    plain.load_state_dict(wrapped.state_dict())
    torch.testing.assert_close(plain.state_dict(), wrapped.state_dict())
    wrapped.load_state_dict(_model().state_dict())
    assert checkpointed_names(wrapped) == BLOCKS
    torch.testing.assert_close(wrapped.state_dict(), _model().state_dict())


def test_remove_restores_forward_and_logs(caplog):
    model = _model()
    with caplog.at_level(logging.INFO, logger="lightning_ckpt.core.wrapping"):
        apply_checkpointing(model, BLOCKS[:2])
    assert "applied to 2 module(s): transformer.h.0, transformer.h.1" in caplog.text
    assert checkpointed_names(model) == BLOCKS[:2]
    assert remove_checkpointing(model) == BLOCKS[:2]
    assert checkpointed_names(model) == [] and "forward" not in model.transformer.h[0].__dict__


def test_deepcopy_of_wrapped_model_checkpoints_its_own_modules():
    model = _model()
    apply_checkpointing(model, BLOCKS[:1])
    clone = copy.deepcopy(model)
    assert checkpointed_names(clone) == BLOCKS[:1]
    assert clone.transformer.h[0].forward.original.__self__ is clone.transformer.h[0]


class _DDPLike(nn.Module):
    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args):
        return self.module(*args)


def test_names_resolve_through_wrapper_prefixes():
    model = _model()
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
    class TakesDebug(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4)

        def forward(self, x, debug=None, context_fn=None):
            return self.linear(x) * (2.0 if debug else 1.0) + (0.0 if context_fn is None else context_fn)

    model = nn.Sequential(TakesDebug())
    x = torch.randn(3, 4, requires_grad=True)
    expected = model[0](x, debug=True, context_fn=1.0)
    apply_checkpointing(model, ["0"])
    torch.testing.assert_close(model[0](x, debug=True, context_fn=1.0), expected)
