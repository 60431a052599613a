"""Profiler: storage accounting with purpose-built modules, hygiene of hooks, fake tensors, validation."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn as nn
from callback_helpers import gpt_loss, tiny_gpt, token_batch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.nn.modules import module as module_globals
from torch.utils.flop_counter import FlopCounterMode

from examples.gpt import GPT
from lightning_ckpt.core.profile_types import StepProfile
from lightning_ckpt.core.profiler import profile_step
from lightning_ckpt.core.storage import LiveStorageTracker
from lightning_ckpt.core.wrapping import (
    apply_checkpointing,
    checkpointed_names,
    checkpointing_removed,
    remove_checkpointing,
)
from lightning_ckpt.planning.peak import predict_peak_bytes

BLOCKS = ["transformer.h.0", "transformer.h.1"]
F32 = 4


class _SavesTwiceAndViews(nn.Module):
    def forward(self, x):
        hidden = x * 2  # saves nothing (scalar)
        return hidden.sin() + hidden.cos() + hidden.t().sin().t()  # hidden saved three times, once as a view


class _Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8, bias=False)
        self.register_buffer("scale", torch.full((8,), 3.0))

    def forward(self, x):
        return self.linear(x) * self.scale  # saves x and the weight (mm), and the buffer (mul)


class _Inner(nn.Module):
    def forward(self, h):
        return h.repeat(1, 4).cos()  # saves the (4, 32) repeat: 512 bytes


class _Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _Inner()

    def forward(self, x):
        hidden = x.sin()  # saves x (4, 8): 128 bytes
        return self.inner(hidden).sum(-1).exp()  # exp saves its (4,) output: 16 bytes


class _Host(nn.Module):
    def __init__(self, child: nn.Module) -> None:
        super().__init__()
        self.child = child

    def forward(self, x):
        return self.child(x).pow(2).sum()  # pow saves the child's output: outside every candidate


def _profile(child: nn.Module, candidates: list[str], x: torch.Tensor) -> StepProfile:
    host = _Host(child)
    return profile_step(host, lambda: host(x), candidates, cost="flops")


def test_a_storage_saved_twice_and_as_a_view_counts_once():
    x = torch.randn(6, 6, requires_grad=True)
    profile = _profile(_SavesTwiceAndViews(), ["child"], x)
    assert profile.module("child").activation_bytes == 36 * F32
    assert profile.module("child").input_bytes == 36 * F32
    assert profile.other_activation_bytes == 36 * F32  # the child's output, saved by pow


@pytest.mark.parametrize("fake", [False, True], ids=["real", "fake"])
def test_the_counter_skips_views_and_in_place_ops_and_counts_a_constant_made_fake(fake):
    """Views and in-place ops take the fast path (no new storage by their schema); ``lift_fresh`` (a
    constant made fake) aliases its input by its schema but brings a new storage. A real constant is made
    without an op: not counted."""
    mode = FakeTensorMode() if fake else None
    with mode or contextlib.nullcontext(), LiveStorageTracker() as tracker:
        a = torch.ones(256)  # 1 KiB
        a.view(16, 16).t().add_(1).mul_(2)
        c = torch.tensor([1.0, 2.0])  # 8 bytes: lift_fresh under the fake mode
        views = [a[1:], c[:1]]
    assert (tracker.peak_bytes, tracker.live_bytes) == (1024 + 8 * fake,) * 2, views


class _DeadBranch(nn.Module):
    """A block that also computes an output nothing uses: what that part of its graph saves (sin's input)
    dies with it in the forward, as in Qwen3-Next's chunked delta rule. (A dead op that saves its own
    output, as sigmoid does, stays counted: the recorder's pack hook holds the output, whose graph holds
    the hook's pack, a cycle that only the garbage collector frees; the safe side.)"""

    def __init__(self, dead: bool) -> None:
        super().__init__()
        self.linear, self.dead = nn.Linear(64, 64), dead

    def forward(self, x):
        if self.dead:
            (self.linear(x) * 3).sin()
        return self.linear(x).relu()


@pytest.mark.parametrize("fake", [False, True], ids=["real", "fake"])
def test_what_a_graph_that_dies_in_the_forward_saved_is_not_an_activation(fake):
    """Before, its saves counted as the block's activations to the end of the backward: a block
    checkpointed after them was predicted 4.19 MB under its peak on Qwen3-Next (out of memory under a
    cap equal to the budget, scripts/model_sweep.py)."""
    torch.manual_seed(0)
    blocks = {dead: nn.Sequential(*(_DeadBranch(dead) for _ in range(3))) for dead in (False, True)}
    x = torch.randn(32, 64)
    mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
    with mode:
        profiles = {
            dead: profile_step(m, lambda m=m: m(x).sum(), ["0", "1", "2"], "flops", batch=x)
            for dead, m in blocks.items()
        }
    assert [m.activation_bytes for m in profiles[True].modules] == [
        m.activation_bytes for m in profiles[False].modules
    ]
    model, names = blocks[True], ["0", "1", "2"]
    for checkpointed in ([], ["1"], names):
        apply_checkpointing(model, checkpointed)
        with LiveStorageTracker(existing=[*model.parameters(), x]) as tracker:
            model(x).sum().backward()
        remove_checkpointing(model)
        model.zero_grad(set_to_none=True)
        predicted = predict_peak_bytes(profiles[True], checkpointed, zero_grad="before_forward")
        assert predicted == tracker.peak_bytes, checkpointed


def test_parameters_and_buffers_are_not_activations():
    x = torch.randn(5, 8)
    profile = _profile(_Linear(), ["child"], x)
    assert profile.module("child").activation_bytes == x.nbytes
    assert profile.static.param_bytes == 64 * F32 and profile.static.buffer_bytes == 8 * F32
    assert profile.static.grad_bytes == 64 * F32


def test_a_tensor_saved_while_nested_candidates_run_belongs_to_the_innermost():
    x = torch.randn(4, 8, requires_grad=True)
    profile = _profile(_Outer(), ["child", "child.inner"], x)
    assert profile.module("child.inner").activation_bytes == 4 * 32 * F32
    assert profile.module("child").activation_bytes == (4 * 8 + 4) * F32
    assert profile.module("child.inner").input_bytes == 4 * 8 * F32
    assert profile.other_activation_bytes == 4 * F32


def _gpt(n_layer: int = 2) -> tuple[GPT, torch.Tensor, torch.Tensor]:
    model = tiny_gpt(n_layer=n_layer)
    return model, *token_batch(model, batch_size=2)


def _assert_no_hooks_left(model: nn.Module) -> None:
    for module in model.modules():
        assert not module._forward_pre_hooks and not module._forward_hooks
    assert not module_globals._global_forward_pre_hooks and not module_globals._global_forward_hooks
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
    assert torch._C._len_torch_dispatch_stack() == 0


@pytest.mark.parametrize("cost", ["time", "flops"])
def test_hooks_gone_and_grads_restored_after_profiling(cost):
    model, idx, targets = _gpt()
    model.lm_head.weight.grad = torch.ones_like(model.lm_head.weight)
    grad = model.lm_head.weight.grad
    profile = profile_step(model, lambda: gpt_loss(model, idx, targets), BLOCKS, cost)
    _assert_no_hooks_left(model)
    assert model.lm_head.weight.grad is grad and torch.equal(grad, torch.ones_like(grad))
    assert model.transformer.h[0].ln_1.weight.grad is None
    assert all(m.flops > 0 and m.activation_bytes > m.input_bytes > 0 for m in profile.modules)
    assert all((m.recompute_seconds > 0) == (cost == "time") for m in profile.modules)


def test_hooks_gone_after_an_exception_and_a_second_profile_runs_cleanly():
    model, idx, targets = _gpt()
    expected = profile_step(model, lambda: gpt_loss(model, idx, targets), BLOCKS, "flops")

    def failing_forward(*args):
        raise RuntimeError("boom in block 1")

    model.transformer.h[1].mlp.forward = failing_forward
    with pytest.raises(RuntimeError, match="boom"):
        profile_step(model, lambda: gpt_loss(model, idx, targets), BLOCKS, "time")
    _assert_no_hooks_left(model)
    assert all(p.grad is None for p in model.parameters())
    del model.transformer.h[1].mlp.forward
    assert profile_step(model, lambda: gpt_loss(model, idx, targets), BLOCKS, "flops") == expected


def test_flops_are_the_forward_flops_of_each_module():
    model, idx, targets = _gpt()
    profile = profile_step(model, lambda: gpt_loss(model, idx, targets), [*BLOCKS, "lm_head"], "flops")
    x = torch.randn(*idx.shape, model.config.n_embd)
    for name in [*BLOCKS, "lm_head"]:
        with FlopCounterMode(display=False) as counter:
            model.get_submodule(name)(x)
        assert profile.module(name).flops == counter.get_total_flops()


def test_checkpointed_modules_are_refused_and_profiled_inside_checkpointing_removed():
    model, idx, targets = _gpt()
    expected = profile_step(model, lambda: gpt_loss(model, idx, targets), BLOCKS, "flops")
    apply_checkpointing(model, BLOCKS[:1])
    with pytest.raises(ValueError, match="must have no checkpointed modules.*checkpointing_removed"):
        profile_step(model, lambda: gpt_loss(model, idx, targets), BLOCKS, "flops")
    with checkpointing_removed(model):
        assert profile_step(model, lambda: gpt_loss(model, idx, targets), BLOCKS, "flops") == expected
    assert checkpointed_names(model) == BLOCKS[:1]


def test_fake_tensors_give_the_same_bytes_as_a_real_cpu_run():
    model, idx, targets = _gpt()
    real = profile_step(model, lambda: gpt_loss(model, idx, targets), BLOCKS, "flops")
    mode = FakeTensorMode()
    with mode:
        fake_model = tiny_gpt(**model.hparams)  # the same seed and sizes, on fake tensors
        fake_idx, fake_targets = mode.from_tensor(idx), mode.from_tensor(targets)
        fake = profile_step(fake_model, lambda: gpt_loss(fake_model, fake_idx, fake_targets), BLOCKS, "flops")
    assert fake.modules == real.modules
    assert fake.other_activation_bytes == real.other_activation_bytes
    assert fake.backward_extra_bytes == real.backward_extra_bytes
    assert fake.static_bytes == real.static_bytes


def test_bf16_autocast_saves_less_than_fp32():
    model, idx, targets = _gpt()
    fp32 = profile_step(model, lambda: gpt_loss(model, idx, targets), BLOCKS, "flops")

    def bf16_step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return gpt_loss(model, idx, targets)

    bf16 = profile_step(model, bf16_step, BLOCKS, "flops")
    for half, full in zip(bf16.modules, fp32.modules, strict=True):
        assert 0 < half.activation_bytes < full.activation_bytes
        assert half.flops == full.flops


def test_bad_arguments():
    model, idx, targets = _gpt()
    with pytest.raises(ValueError, match=r"`cost` must be one of \('time', 'flops'\), got 'fast'"):
        profile_step(model, lambda: gpt_loss(model, idx, targets), BLOCKS, "fast")
    with pytest.raises(ValueError, match=r"`candidates` must name submodules.*'transformer\.h\.7'"):
        profile_step(model, lambda: gpt_loss(model, idx, targets), ["transformer.h.7"])
    with pytest.raises(
        ValueError, match="`step_fn` must return the loss, a tensor that requires grad, got NoneType"
    ):
        profile_step(model, lambda: None, BLOCKS)
    with FakeTensorMode():
        fake_model = tiny_gpt(**model.hparams)
    with pytest.raises(ValueError, match='`cost` must be "flops" when the model has fake tensors'):
        profile_step(fake_model, lambda: None, BLOCKS, "time")


def test_profiling_leaves_training_unchanged_when_the_caller_restores_rng():
    def train(profile_first: bool) -> list[torch.Tensor]:
        model, idx, targets = _gpt()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        torch.manual_seed(3)
        for step in range(3):
            if profile_first and step == 1:
                rng = torch.get_rng_state()
                profile_step(
                    model, lambda: gpt_loss(model, idx, targets), BLOCKS, "time", optimizer=optimizer
                )
                torch.set_rng_state(rng)
            gpt_loss(model, idx, targets).backward()
            optimizer.step()
            optimizer.zero_grad()
        return list(model.parameters())

    torch.testing.assert_close(train(True), train(False), rtol=0, atol=0)
