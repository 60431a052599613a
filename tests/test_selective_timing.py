"""Each op-level option's recompute priced as a step pays it (issue 24): the block's forward and backward
timed whole under every option, priced against the full checkpoint in the same rounds."""

from __future__ import annotations

import statistics

import pytest
import torch

from examples.gpt import Block, GPTConfig
from lightning_ckpt.core.selective import timing
from lightning_ckpt.core.selective.costs import option_costs, option_times
from lightning_ckpt.core.selective.options import profile_block


@pytest.fixture(scope="module")
def measured():
    torch.manual_seed(0)
    block = Block(GPTConfig(block_size=16, n_embd=32, n_head=2, dropout=0.0))
    x = torch.randn(2, 16, 32, requires_grad=True)
    return block, x, profile_block(block, x, repeats=1)


def _fixed_seconds(monkeypatch, seconds_of) -> None:
    """Stand in for the interleaved timing: option name -> its five rounds' seconds."""
    fixed = lambda runs, repeats, clock: {name: seconds_of(name) for name in runs}  # noqa: E731
    monkeypatch.setattr(timing, "interleaved_seconds", fixed)


def test_a_selective_option_costs_its_extra_over_keep_as_a_fraction_of_the_full_checkpoints(
    measured, monkeypatch
):
    block, x, profile = measured
    paired = {"sdpa": [1.0, 2.0, 3.0, 4.0, 9.0]}  # its rounds minus the checkpoint's: quartiles 2 and 4
    rounds = {"keep": [10.0] * 5, "checkpoint": [30.0] * 5}
    _fixed_seconds(
        monkeypatch, lambda name: rounds.get(name, [30.0 + d for d in paired.get(name, [-10.0] * 5)])
    )
    times = timing.timed_option_times(block, x, profile=profile, repeats=5)
    plain = {o.name: o for o in option_times(profile).options}
    for option in times.options:
        if option.kind == "selective":
            lower, _, upper = statistics.quantiles(
                paired.get(option.name, [-10.0] * 5), n=4, method="inclusive"
            )
            fraction = (20.0 + 2 * upper - lower) / 20.0
            assert option.recompute_seconds == pytest.approx(profile.forward_seconds * fraction)
        else:
            assert option == plain[option.name]
    sdpa = next(o for o in times.options if o.name == "sdpa")
    assert sdpa.recompute_seconds == pytest.approx(1.3 * profile.forward_seconds)  # dearer than checkpoint
    costs = {c.name: c for c in option_costs(block, (x,), times)}
    assert costs["sdpa"].recompute_seconds(0.5) == pytest.approx(0.65)  # the step's recompute scales it
    assert costs["checkpoint"].recompute_seconds(0.5) == 0.5 and costs["keep"].recompute_seconds(0.5) == 0


def test_without_a_measurable_checkpoint_the_op_records_prices_stay(measured, monkeypatch):
    block, x, profile = measured
    _fixed_seconds(monkeypatch, lambda name: [10.0] * 5)
    assert timing.timed_option_times(block, x, profile=profile, repeats=5) == option_times(profile)


def test_real_timing_prices_every_option_and_accumulates_no_gradient(measured):
    block, x, profile = measured
    times = timing.timed_option_times(block, x, profile=profile, repeats=2)
    assert [o.name for o in times.options] == [o.name for o in option_times(profile).options]
    assert all(o.recompute_seconds >= 0 for o in times.options) and times.options[0].recompute_seconds == 0
    assert x.grad is None and all(p.grad is None for p in block.parameters())


@pytest.mark.parametrize("repeats", [1, 2.5, True])
def test_too_few_rounds_are_refused_with_the_argument_named(measured, repeats):
    block, x, profile = measured
    with pytest.raises(ValueError, match=rf"`repeats` must be an integer of at least 2, got {repeats!r}"):
        timing.timed_option_times(block, x, profile=profile, repeats=repeats)
