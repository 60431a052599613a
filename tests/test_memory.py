"""Memory model: predicted vs measured peak, the knapsack contract, the counters, optimizer estimates."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn as nn
from callback_helpers import gpt_loss, tiny_gpt, token_batch

from lightning_ckpt.core.candidates import find_candidates
from lightning_ckpt.core.memory.meter import measure_peak_bytes, track_peak_bytes
from lightning_ckpt.core.memory.optimizer import estimate_optimizer_bytes
from lightning_ckpt.core.profile_types import ModuleProfile, StaticMemory, StepProfile
from lightning_ckpt.core.profiler import profile_step
from lightning_ckpt.core.wrapping import apply_checkpointing, remove_checkpointing
from lightning_ckpt.planning.additive import keep_cost_bytes
from lightning_ckpt.planning.peak import fixed_peak_bytes, predict_peak_bytes


def _setup(
    batch_size: int = 8, seq_len: int = 128, targets=None, autocast: bool = False, device: str = "cpu"
):
    """The tests' GPT where activations dominate (B=8, T=128: with dropout on, the CPU attention saves its
    (B, nh, T, T) matrices), profiled before its first AdamW step."""
    model = tiny_gpt(block_size=seq_len).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx, labels = (t.to(device) for t in token_batch(model, batch_size))

    def step():
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            return gpt_loss(model, idx, labels)

    candidates = find_candidates(model, targets)
    profile = profile_step(model, step, candidates, "flops", optimizer=optimizer)
    step().backward()  # a real first step: gradients and optimizer state now exist
    optimizer.step()
    return model, optimizer, step, candidates, profile


def _measured(model, optimizer, step, checkpointed, device=None) -> int:
    remove_checkpointing(model)
    apply_checkpointing(model, checkpointed)
    optimizer.zero_grad(set_to_none=False)
    measure_peak_bytes(step, model=model, optimizer=optimizer, device=device)  # warm-up
    optimizer.zero_grad(set_to_none=False)
    return measure_peak_bytes(step, model=model, optimizer=optimizer, device=device)


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_predicted_peak_within_10_percent_of_measured_and_drops_with_checkpointing(autocast):
    model, optimizer, step, blocks, profile = _setup(autocast=autocast)
    measured = []
    for checkpointed in ([], blocks[len(blocks) // 2 :], blocks):
        predicted = predict_peak_bytes(profile, checkpointed)
        measured.append(_measured(model, optimizer, step, checkpointed))
        assert predicted == pytest.approx(measured[-1], rel=0.10), checkpointed
    assert measured[0] > measured[1] > measured[2]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_predicted_peak_on_cuda_against_the_allocator():
    model, optimizer, step, blocks, profile = _setup(device="cuda")
    for checkpointed in ([], blocks[2:], blocks):
        measured = _measured(model, optimizer, step, checkpointed, device="cuda")
        assert predict_peak_bytes(profile, checkpointed) == pytest.approx(measured, rel=0.10)


def _assert_knapsack_contract(profile: StepProfile, subsets: int = 60) -> None:
    names = [m.name for m in profile.modules]
    keep = keep_cost_bytes(profile)
    fixed = fixed_peak_bytes(profile)
    assert set(keep) == set(names) and min(keep.values()) >= 0
    assert predict_peak_bytes(profile, names) == fixed
    rng = random.Random(0)
    for _ in range(subsets):
        checkpointed = {name for name in names if rng.random() < 0.5}
        bound = fixed + sum(keep[name] for name in names if name not in checkpointed)
        assert predict_peak_bytes(profile, checkpointed) <= bound


@pytest.mark.parametrize(
    "targets", [None, ["transformer.h.*.attn", "MLP", "lm_head"]], ids=["blocks", "fine"]
)
def test_knapsack_contract_on_random_subsets(targets):
    *_, profile = _setup(batch_size=2, seq_len=32, targets=targets)
    _assert_knapsack_contract(profile)
    no_checkpoint = predict_peak_bytes(profile, [])
    assert no_checkpoint <= fixed_peak_bytes(profile) + sum(keep_cost_bytes(profile).values())


def test_knapsack_contract_on_a_hand_made_profile_without_timeline():
    rng = random.Random(1)
    modules = tuple(
        ModuleProfile(f"m{i}", rng.randrange(100, 1000), rng.randrange(0, 200), 0.0, 0) for i in range(8)
    )
    profile = StepProfile(
        modules,
        StaticMemory("single device", 10, 10, 20, 5),
        other_activation_bytes=50,
        backward_extra_bytes=30,
    )
    _assert_knapsack_contract(profile)
    assert predict_peak_bytes(profile, []) == profile.static_bytes + 50 + 30 + sum(
        m.activation_bytes for m in modules
    )


def test_predict_rejects_unknown_names():
    *_, profile = _setup(batch_size=1, seq_len=8)
    with pytest.raises(
        ValueError, match=r"`checkpointed` must hold candidates of the profile.*got \['block'\]"
    ):
        predict_peak_bytes(profile, ["block"])
    with pytest.raises(TypeError, match="`checkpointed` must be a collection of candidate names"):
        predict_peak_bytes(profile, "transformer.h.0")


def test_track_peak_bytes_counts_live_storages_once_from_a_baseline():
    model = nn.Linear(16, 16)
    with track_peak_bytes(model=model) as meter:
        a = torch.zeros(1000)  # 4000 bytes
        views = [a[1:], a.view(10, 100)]  # no new storage
        b = a + 1  # 4000 more
        del a, b, views
        c = torch.zeros(500)  # 2000: below the peak
    assert meter.peak_bytes == (16 * 16 + 16) * 4 + 8000  # the parameters live from entry on
    assert c.numel() == 500


def test_track_peak_bytes_stops_counting_gradients_once_freed():
    model = nn.Linear(100, 100, bias=False)
    model.weight.grad = torch.ones_like(model.weight)  # 40 kB, alive on entry
    with track_peak_bytes(model=model) as meter:
        model.weight.grad = None  # zero_grad(set_to_none=True)
        a = torch.zeros(10_000)  # 40 kB: the peak is the weight and `a`, not the freed gradient too
    assert meter.peak_bytes == 2 * 40_000 and a.numel() == 10_000


def test_measure_peak_bytes_runs_backward_and_counts_gradients():
    model = nn.Linear(100, 100, bias=False)
    x = torch.randn(1, 100)
    peak = measure_peak_bytes(lambda: model(x).sum(), model=model)
    assert model.weight.grad is not None
    assert peak >= 2 * model.weight.nbytes  # the weight, and its gradient allocated in the backward


def test_estimate_optimizer_bytes():
    params = [torch.zeros(10, requires_grad=True), torch.zeros(5, requires_grad=True), torch.zeros(3)]
    param_bytes = 15 * 4
    assert estimate_optimizer_bytes(params) == 0
    assert estimate_optimizer_bytes(params, torch.optim.Adam) == 2 * param_bytes + 2 * 4
    assert estimate_optimizer_bytes(params, torch.optim.Adam(params[:2], amsgrad=True)) == 3 * param_bytes + 8
    assert estimate_optimizer_bytes(params, torch.optim.SGD(params[:2], lr=0.1, momentum=0.9)) == param_bytes
    assert estimate_optimizer_bytes(params, torch.optim.SGD(params[:2], lr=0.1)) == 0
    with pytest.warns(UserWarning, match="unknown optimizer 'lamb'"):
        assert estimate_optimizer_bytes(params, "Lamb") == 2 * param_bytes
    optimizer = torch.optim.AdamW(params[:2])
    params[0].grad, params[1].grad = torch.ones(10), torch.ones(5)
    optimizer.step()
    assert estimate_optimizer_bytes(params, optimizer) == 2 * param_bytes + 2 * 4
