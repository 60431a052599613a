"""Timing forwards: blocks alike are timed on their kind's first two calls and share the faster time."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn as nn
from callback_helpers import gpt_loss, tiny_gpt, token_batch

from lightning_ckpt.config import AutoCheckpointConfig
from lightning_ckpt.core.profiler import profile_step, time_forwards
from lightning_ckpt.core.timing import block_kind
from lightning_ckpt.planning.make import make_plan
from lightning_ckpt.planning.peak import predict_peak_bytes


class _Counted(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.linear(x).relu()


class _Stack(nn.Module):
    """Six blocks of width 8, then two of width 8 behind a widening (another kind: other input shapes)."""

    def __init__(self, check_outputs: bool = False) -> None:
        super().__init__()
        self.h = nn.ModuleList(_Counted(8) for _ in range(6))
        self.wide = nn.ModuleList(_Counted(16) for _ in range(2))
        self.check_outputs = check_outputs

    def forward(self, x):
        for block in self.h:
            out = block(x)
            if self.check_outputs and out is x:  # reads what a skipped block returns
                raise RuntimeError("a block returned its input")
            x = out
        x = torch.cat([x, x], dim=-1)
        for block in self.wide:
            x = block(x)
        return x.sum()


NAMES = [*(f"h.{i}" for i in range(6)), "wide.0", "wide.1"]


def _calls(model: _Stack) -> list[int]:
    return [block.calls for block in (*model.h, *model.wide)]


def test_blocks_alike_run_twice_per_kind_and_share_the_faster_time():
    model = _Stack()
    x = torch.randn(4, 8)
    seconds = time_forwards(model, NAMES, lambda: model(x), repeats=1)
    assert _calls(model) == [1, 1, 0, 0, 0, 0, 1, 1]  # two timed per kind, the rest skipped
    assert len({seconds[f"h.{i}"] for i in range(6)}) == 1 and seconds["h.0"] > 0
    assert seconds["wide.0"] == seconds["wide.1"] > 0
    assert all("forward" not in block.__dict__ for block in (*model.h, *model.wide))  # put back


def test_every_block_runs_when_asked_nested_or_when_a_skip_breaks_the_forward():
    x = torch.randn(4, 8)
    model = _Stack()
    time_forwards(model, NAMES, lambda: model(x), repeats=1, alike=False)
    assert _calls(model) == [1] * 8
    model = _Stack()
    time_forwards(model, ["h", *NAMES], lambda: model(x), repeats=1)  # "h" holds the blocks
    assert _calls(model) == [1] * 8
    model = _Stack(check_outputs=True)  # the skipped h.2 returns h.1's output: its own input
    seconds = time_forwards(model, NAMES, lambda: model(x), repeats=1)
    assert _calls(model) == [2, 2, 1, 1, 1, 1, 1, 1]  # the skipping run stopped at h.2, then one whole
    assert len({seconds[f"h.{i}"] for i in range(6)}) == 6  # each measured (distinct float times)


def test_block_kind_tells_apart_what_changes_a_forward():
    base = _Counted(8)
    assert block_kind(base) == block_kind(_Counted(8))
    assert block_kind(base) != block_kind(_Counted(16))
    assert block_kind(base) != block_kind(_Counted(8).double())
    assert block_kind(base) != block_kind(_Counted(8).eval())
    frozen = _Counted(8)
    frozen.linear.weight.requires_grad_(False)
    assert block_kind(base) != block_kind(frozen)


def test_a_gpt_profile_times_its_layers_alike_and_keeps_its_memory_fields():
    torch.manual_seed(0)
    model = tiny_gpt(n_layer=4)
    idx, targets = token_batch(model)
    names = [f"transformer.h.{i}" for i in range(4)]
    timed = profile_step(model, lambda: gpt_loss(model, idx, targets), names, "time")
    counted = profile_step(model, lambda: gpt_loss(model, idx, targets), names, "flops")
    assert len({m.recompute_seconds for m in timed.modules}) == 1 and timed.modules[0].recompute_seconds > 0
    no_seconds = tuple(dataclasses.replace(m, recompute_seconds=0.0) for m in timed.modules)
    assert repr(dataclasses.replace(timed, modules=no_seconds)) == repr(counted)


@pytest.mark.parametrize("budget_share", [0.2, 0.5, 0.8])
def test_plans_with_blocks_alike_do_not_depend_on_their_shared_time(budget_share):
    """Equal times tie the blocks: the exact solver's choice among them is by bytes alone, the same
    whatever the time (and the same on every call)."""
    torch.manual_seed(0)
    model = tiny_gpt(n_layer=6)
    idx, targets = token_batch(model)
    names = [f"transformer.h.{i}" for i in range(6)]
    profile = profile_step(model, lambda: gpt_loss(model, idx, targets), names, "flops")
    low, high = predict_peak_bytes(profile, names), predict_peak_bytes(profile, [])
    budget = int(low + budget_share * (high - low))
    plans = []
    for seconds in np.geomspace(1e-5, 1.0, 7).tolist() * 2:
        modules = tuple(dataclasses.replace(m, recompute_seconds=seconds) for m in profile.modules)
        plan = make_plan(dataclasses.replace(profile, modules=modules), budget, AutoCheckpointConfig(1))
        assert plan.predicted_peak_bytes <= budget
        plans.append(plan.checkpointed)
    assert len(set(plans)) == 1 and 0 < len(plans[0]) < 6
