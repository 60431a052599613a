"""Modules registered under two names: ALBERT-style ``ModuleList([layer] * n)``, one block listed twice,
and an attribute alias of a block. The callback leaves such a model exactly as a fit without it would:
same values in every parameter and buffer, no fake tensor anywhere, the same ``state_dict`` keys, the
sharing itself intact; and a failure in the middle of profiling leaves the model as it was."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn

from lightning_ckpt import AutoCheckpoint, find_candidates
from lightning_ckpt._compat import FakeTensor
from lightning_ckpt.core.fake_tensors import fake_model
from lightning_ckpt.core.profiler import profile_step
from lightning_ckpt.core.wrapping import apply_checkpointing, checkpointed_names, remove_checkpointing
from tests.callback_helpers import fit, gpt_loss, tiny_gpt, token_batch


def _albert(model: nn.Module) -> None:
    model.transformer.h = nn.ModuleList([model.transformer.h[0]] * 4)


def _listed_twice(model: nn.Module) -> None:
    h = model.transformer.h
    model.transformer.h = nn.ModuleList([h[0], h[1], h[1], h[2]])


def _alias(model: nn.Module) -> None:
    model.first_block = model.transformer.h[0]


SHARINGS = {"albert": _albert, "listed_twice": _listed_twice, "alias": _alias}


def _shared_gpt(sharing: str) -> nn.Module:
    model = tiny_gpt()
    SHARINGS[sharing](model)
    return model


def _tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer under every name it has."""
    return dict(model.named_parameters(remove_duplicate=False)) | dict(
        model.named_buffers(remove_duplicate=False)
    )


def _assert_untouched_by_fakes(model: nn.Module) -> None:
    fakes = [name for name, tensor in _tensors(model).items() if isinstance(tensor, FakeTensor)]
    assert not fakes, f"fake tensors left in the model: {fakes[:4]}"
    assert not any(isinstance(t, FakeTensor) for t in model.state_dict().values())


@pytest.mark.parametrize(
    ("sharing", "budget_gb", "left_out"),
    [
        ("albert", 1.0, "transformer.h.0"),
        ("listed_twice", 0.0022, "transformer.h.1"),
        ("alias", 0.0022, None),
    ],
)
def test_fit_with_shared_modules_matches_a_fit_without_the_callback(sharing, budget_gb, left_out):
    model, reference = _shared_gpt(sharing), _shared_gpt(sharing)
    callback = AutoCheckpoint(budget_gb=budget_gb, cost="flops")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(model, [callback], max_steps=2)
    fit(reference, [], max_steps=2)

    messages = [str(w.message) for w in caught if "more than once per forward" in str(w.message)]
    if left_out is None:
        assert not messages
        assert callback.plan.checkpointed, "the budget should make the plan checkpoint a block"
    else:  # the shared block runs several times per forward: left out, by name
        assert len(messages) == 1 and repr(left_out) in messages[0]
        assert left_out not in {item.name for item in callback.plan.items}
    _assert_untouched_by_fakes(model)
    assert list(model.state_dict()) == list(reference.state_dict())
    tensors, expected = _tensors(model), _tensors(reference)
    assert list(tensors) == list(expected)
    for name, tensor in tensors.items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0, msg=f"{sharing}: {name} differs")
    assert (model.transformer.h[0] is model.transformer.h[1]) == (sharing == "albert")
    assert (model.transformer.h[1] is model.transformer.h[2]) == (sharing in ("albert", "listed_twice"))
    if sharing == "alias":
        assert model.first_block is model.transformer.h[0]


def test_a_shared_module_is_one_candidate_and_is_wrapped_once():
    model = _shared_gpt("alias")
    assert find_candidates(model, ["Block"]) == [f"transformer.h.{i}" for i in range(4)]
    albert = _shared_gpt("albert")
    assert find_candidates(albert) == ["transformer.h.0"]
    assert find_candidates(albert, ["transformer.h.*.attn", "Block"]) == ["transformer.h.0"]
    with pytest.warns(UserWarning, match="already checkpointed; not wrapping it twice"):
        assert apply_checkpointing(albert, ["transformer.h.0", "transformer.h.2"]) == ["transformer.h.0"]
    assert checkpointed_names(albert) == ["transformer.h.0"]
    assert list(albert.state_dict()) == list(_shared_gpt("albert").state_dict())
    remove_checkpointing(albert)


def test_an_alias_inside_another_candidate_is_dropped():
    model = tiny_gpt()
    model.attn0 = model.transformer.h[0].attn  # the attention of block 0 under a second, top-level name
    assert find_candidates(model, ["Block", "attn0"]) == [f"transformer.h.{i}" for i in range(4)]


def test_profiling_refuses_two_names_of_one_module():
    model = _shared_gpt("albert")
    idx, targets = token_batch(model, batch_size=2)
    with pytest.raises(
        ValueError, match="must name distinct modules.*'transformer.h.0' and 'transformer.h.1'"
    ):
        profile_step(
            model, lambda: gpt_loss(model, idx, targets), ["transformer.h.0", "transformer.h.1"], "flops"
        )


class _Boom(RuntimeError):
    pass


def _snapshot(model: nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return {name: (tensor, tensor.detach().clone()) for name, tensor in _tensors(model).items()}


def _assert_as_before(model: nn.Module, before: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> None:
    _assert_untouched_by_fakes(model)
    now = _tensors(model)
    assert list(now) == list(before)
    for name, (tensor, value) in before.items():
        assert now[name] is tensor, f"{name} is another tensor now"
        torch.testing.assert_close(now[name].detach(), value, rtol=0, atol=0)
    assert all(p.grad is None for p in model.parameters())
    assert not checkpointed_names(model)
    hooks = [m for m in model.modules() if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks]
    assert not hooks, f"hooks left on {len(hooks)} module(s)"


@pytest.mark.parametrize("sharing", ["albert", "listed_twice"])
def test_a_failure_in_the_middle_of_fake_profiling_leaves_the_model_as_it_was(sharing):
    model = _shared_gpt(sharing)
    before = _snapshot(model)
    idx, targets = token_batch(model, batch_size=2)

    def step() -> torch.Tensor:
        x = model.transformer.h[0](model.transformer.wte(idx))
        raise _Boom(f"after a block, on {type(x).__name__}")

    with pytest.raises(_Boom, match="on FakeTensor"), fake_model(model) as fake:
        idx, targets = fake.fake((idx, targets))
        profile_step(model, step, find_candidates(model), "flops")
    _assert_as_before(model, before)


def test_a_fit_whose_profiling_fails_leaves_the_model_as_it_was():
    model = _shared_gpt("listed_twice")
    before = _snapshot(model)
    calls = []

    def fail_twice(*_):  # the fake profile, then the real one it falls back to
        calls.append(1)
        if len(calls) <= 2:
            raise _Boom("in the middle of profiling")

    handle = model.transformer.h[3].register_forward_pre_hook(fail_twice)
    with pytest.warns(UserWarning, match="does not run on fake tensors"), pytest.raises(_Boom):
        fit(model, [AutoCheckpoint(budget_gb=1.0, cost="flops")], max_steps=2)
    handle.remove()
    assert len(calls) == 2
    _assert_as_before(model, before)
