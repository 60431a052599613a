"""Each op-level option's recompute priced as a step pays it (issue 24): the block's forward and backward
timed whole under every option, priced against the full checkpoint in the same rounds."""

from __future__ import annotations

import dataclasses
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
    rounds = {"keep": [12.0, 10.0, 11.0, 10.5, 13.0], "checkpoint": [30.0] * 5}  # fastest 10, span 20
    _fixed_seconds(
        monkeypatch, lambda name: rounds.get(name, [30.0 + d for d in paired.get(name, [-10.0] * 5)])
    )
    times = timing.timed_option_times(block, x, profile=profile, repeats=5)
    plain = {o.name: o for o in option_times(profile).options}
    for option in times.options:
        if option.kind == "selective":
            differences = paired.get(option.name, [-10.0] * 5)
            lower, _, upper = statistics.quantiles(differences, n=4, method="inclusive")
            fastest = 30.0 + min(differences)
            fraction = (fastest - 10.0 + (upper - lower) / 5**0.5) / 20.0
            assert option.recompute_seconds == pytest.approx(profile.forward_seconds * fraction)
        else:
            assert option == plain[option.name]
    sdpa = next(o for o in times.options if o.name == "sdpa")  # fastest 31: (21 + 2 / sqrt 5) / 20
    assert sdpa.recompute_seconds == pytest.approx((1.05 + 0.1 / 5**0.5) * profile.forward_seconds)
    costs = {c.name: c for c in option_costs(block, (x,), times)}
    assert costs["sdpa"].recompute_seconds(0.5) == pytest.approx(0.5 * (1.05 + 0.1 / 5**0.5))
    assert costs["checkpoint"].recompute_seconds(0.5) == 0.5 and costs["keep"].recompute_seconds(0.5) == 0


def test_one_disturbed_round_does_not_price_an_option(measured, monkeypatch):
    """A shared machine only adds time: a round slowed by another job moves the spread, not the fastest."""
    block, x, profile = measured
    quiet = {"keep": [10.0] * 5, "checkpoint": [30.0] * 5}
    disturbed = {"keep": [10.0] * 4 + [25.0], "checkpoint": [30.0] * 4 + [45.0]}
    priced = []
    for rounds in (quiet, disturbed):
        _fixed_seconds(monkeypatch, lambda name, rounds=rounds: rounds.get(name, [14.0] * 5))
        times = timing.timed_option_times(block, x, profile=profile, repeats=5)
        priced.append({o.name: o.recompute_seconds for o in times.options})
    assert priced[0] == priced[1]
    assert priced[0]["sdpa"] == pytest.approx(0.2 * profile.forward_seconds)


def test_without_a_measurable_checkpoint_the_op_records_prices_stay(measured, monkeypatch):
    block, x, profile = measured
    _fixed_seconds(monkeypatch, lambda name: [10.0] * 5)
    assert timing.timed_option_times(block, x, profile=profile, repeats=5) == option_times(profile)


def test_a_profile_made_without_the_sac_overhead_measures_it_only_where_the_timing_falls_back(
    measured, monkeypatch
):
    """The callback profiles blocks without eager SAC's overhead (timing each option whole leaves it
    out); the fallback to the op record's prices measures it then, and prices as a full profile would."""
    block, x, profile = measured
    lean = profile_block(block, x, repeats=1, sac_overhead=False)
    assert lean.sac_overhead_seconds is None and profile.sac_overhead_seconds is not None
    calls = []
    monkeypatch.setattr(timing, "sac_overhead_seconds", lambda *a, **k: calls.append(a) or 0.25)
    rounds = {"keep": [10.0] * 5, "checkpoint": [30.0] * 5}
    _fixed_seconds(monkeypatch, lambda name: rounds.get(name, [14.0] * 5))
    timed = timing.timed_option_times(block, x, profile=lean, repeats=5)
    assert calls == [] and timed.sac_overhead_seconds is None  # priced by the rounds: never measured apart
    assert {o.name: o.recompute_seconds for o in timed.options}["sdpa"] == pytest.approx(
        0.2 * lean.forward_seconds
    )
    _fixed_seconds(monkeypatch, lambda name: [10.0] * 5)  # no measurable checkpoint: the op record prices
    fallback = timing.timed_option_times(block, x, profile=lean, repeats=5)
    assert len(calls) == 1 and fallback.sac_overhead_seconds == 0.25
    expected = option_times(dataclasses.replace(lean, sac_overhead_seconds=0.25))
    assert fallback == expected
    assert all(o.recompute_seconds >= 0.25 for o in fallback.options if o.kind == "selective")


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
