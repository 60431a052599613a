"""Working sets: blocks alike (plain attributes included) are measured on their kind's first two calls."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from lightning_ckpt.core.working_sets import forward_working_sets

_CACHE: dict[str, torch.Tensor] = {}


class _Block(nn.Module):
    """A block whose no-grad forward holds ``4 x width x repeats`` float32 at its peak."""

    def __init__(self, width: int = 8, repeats: int = 4, cached: bool = False) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.repeats = repeats
        self.cached = cached
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.cached and "table" not in _CACHE:  # one table for all blocks, made on the first call
            _CACHE["table"] = torch.zeros(1024)
        wide = x.repeat(1, self.repeats)
        return self.linear(x) + wide[:, : x.shape[1]]


def _working(blocks: list[_Block], alike: bool) -> tuple[dict[str, int], list[int]]:
    model = nn.Sequential(*blocks)
    x = torch.randn(4, 8, requires_grad=True)  # as in a training forward: every block input carries grad
    working = forward_working_sets(dict(model.named_children()), lambda: model(x), alike=alike)
    return working, [block.calls for block in blocks]


def test_blocks_alike_are_measured_twice_and_given_the_same_bytes():
    working, calls = _working([_Block() for _ in range(6)], alike=True)
    whole, whole_calls = _working([_Block() for _ in range(6)], alike=False)
    assert calls == [1, 1, 0, 0, 0, 0] and whole_calls == [1] * 6
    assert working == whole and len(set(whole.values())) == 1 and whole["0"] > 0


def test_a_plain_attribute_makes_blocks_of_other_kinds():
    blocks = [_Block(repeats=4), _Block(repeats=4), _Block(repeats=4), _Block(repeats=16), _Block(repeats=16)]
    working, calls = _working(blocks, alike=True)
    assert calls == [1, 1, 0, 1, 1]  # repeats=16 is another kind: measured, not given the first kind's bytes
    whole, _ = _working([_Block(repeats=b.repeats) for b in blocks], alike=False)
    assert working == whole and working["3"] > working["0"]


def test_a_kind_whose_first_calls_differ_is_measured_on_every_call():
    _CACHE.clear()
    working, calls = _working([_Block(cached=True) for _ in range(4)], alike=True)
    assert calls == [1] * 4  # the first call made the shared table: its bytes differ from the second's
    assert working["0"] > working["1"] == working["2"] == working["3"]


class _GradientPenalty(nn.Module):
    """A block whose forward runs a backward inside itself (``torch.autograd.grad``)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        (grad,) = torch.autograd.grad(self.linear(x).pow(2).sum(), x, create_graph=True)
        return x + grad


def test_a_forward_that_runs_a_backward_inside_is_refused_by_name_and_leaves_no_hooks():
    model = nn.Sequential(_GradientPenalty(), _GradientPenalty())
    x = torch.randn(4, 8, requires_grad=True)
    for alike in (True, False):  # refused at once, not measured again call by call
        with pytest.raises(RuntimeError, match=r"runs a backward inside itself .*leave it out of `targets`"):
            forward_working_sets(dict(model.named_children()), lambda: model(x), alike=alike)
    model(x).sum().backward()  # the saved-tensor hooks are gone: a training step works
    assert x.grad is not None and "forward" not in vars(model[0])


def test_a_transformers_layer_index_alone_does_not_tell_blocks_apart():
    blocks = [_Block() for _ in range(5)]
    for index, block in enumerate(blocks):
        block.layer_idx = index  # what a transformers decoder layer holds for its KV cache
    working, calls = _working(blocks, alike=True)
    assert calls == [1, 1, 0, 0, 0]
    whole, _ = _working([_Block() for _ in range(5)], alike=False)
    assert working == whole


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_transformers_decoders_are_measured_on_two_layers_with_every_layers_bytes(name):
    """Llama and GPT-2 from tiny configs, on fake tensors as a fit measures them: the same working sets
    whether alike layers are skipped or not, and only two layers run."""
    transformers = pytest.importorskip("transformers")
    from lightning_ckpt.core.fake_tensors import fake_model

    config = (
        transformers.LlamaConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=5, num_attention_heads=4
        )
        if name == "llama"
        else transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=5, n_head=4, n_positions=32)
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).train()
    layers = model.model.layers if name == "llama" else model.transformer.h
    ran = [0] * len(layers)
    for i, layer in enumerate(layers):  # a skipped layer's own hooks still run; its MLP does not
        layer.mlp.register_forward_pre_hook(lambda *_, i=i: ran.__setitem__(i, ran[i] + 1))
    modules = {str(i): layer for i, layer in enumerate(layers)}
    with fake_model(model) as fake:
        ids = fake.fake(torch.randint(0, 64, (2, 16)))

        def step():
            return model(input_ids=ids, labels=ids, use_cache=False).loss

        skipped = forward_working_sets(modules, step, alike=True)
        runs, ran[:] = list(ran), [0] * len(layers)
        whole = forward_working_sets(modules, step, alike=False)
    assert skipped == whole and min(whole.values()) > 0
    assert runs == [1, 1, 0, 0, 0] and ran == [1] * 5, runs
