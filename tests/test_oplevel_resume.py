"""A saved op-level plan on a resume (issue 24): the same options and saved op calls back, checked on
a fresh profile (sized again, not timed) under a cap equal to the budget, predicted within 2%; a plan
whose saved op calls the model no longer makes is refused with a line saying why, and planned anew."""

from __future__ import annotations

import logging

import pytest
import torch
from callback_helpers import assert_within_two_percent
from lightning.pytorch.callbacks import ModelCheckpoint
from test_budget_promise import bounds, capped_fit, exact_budget, loader

from lightning_ckpt import AutoCheckpoint

GB = 1e9


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """An op-level fit (FLOP-priced: selective options are chosen) checkpointed after 2 steps."""
    low, high = bounds(32)
    budget = exact_budget(int(low + 0.2 * (high - low)))
    tmp_path = tmp_path_factory.mktemp("oplevel_resume")
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    first = AutoCheckpoint(budget_gb=budget / GB, cost="flops", granularity="op")
    capped_fit(budget, [first, saver], loader((32,) * 2), 2, enable_checkpointing=True)
    assert first.plan.selective, "the first fit's plan must have selective blocks"
    return budget, first.plan, next(tmp_path.glob("*step=2.ckpt"))


@pytest.fixture
def info_logs(caplog):
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.INFO, logger="lightning.pytorch.utilities.rank_zero")
    return caplog


def _options(plan):
    return [(item.name, item.option, item.saved_ops) for item in plan.items]


def test_a_resumed_op_level_plan_comes_back_whole_and_holds_a_cap_equal_to_the_budget(saved, info_logs):
    budget, plan, ckpt = saved
    second = AutoCheckpoint(budget_gb=budget / GB, cost="flops", granularity="op")
    capped_fit(budget, [second], loader((32,) * 4), 4, ckpt_path=ckpt)
    resumed = second.plan
    assert _options(resumed) == _options(plan) and resumed.selective == plan.selective
    assert "holds on a fresh profile" in info_logs.text and "planning anew" not in info_logs.text
    assert resumed.predicted_peak_bytes == plan.predicted_peak_bytes <= budget
    assert resumed.measured_peak_bytes <= budget
    assert_within_two_percent(resumed.predicted_peak_bytes, resumed.measured_peak_bytes, "resumed op plan")


def test_a_saved_plan_whose_op_calls_the_model_no_longer_makes_is_refused(saved, info_logs, tmp_path):
    budget, plan, ckpt = saved
    state = torch.load(ckpt, weights_only=False)
    (key,) = [k for k in state["callbacks"] if k.startswith("AutoCheckpoint")]
    for _, data in state["callbacks"][key]["plans"]:
        for item in data["items"]:
            if item["saved_ops"]:
                item["saved_ops"] = [*item["saved_ops"], ["aten.addmm.default", 99]]
    edited = tmp_path / "edited.ckpt"
    torch.save(state, edited)
    second = AutoCheckpoint(budget_gb=budget / GB, cost="flops", granularity="op")
    capped_fit(budget, [second], loader((32,) * 4), 4, ckpt_path=edited)
    assert "its saved op calls no longer match the model" in info_logs.text
    assert "('aten.addmm.default', 99), which is not a savable call of its forward now" in info_logs.text
    assert ["aten.addmm.default", 99] not in [list(c) for i in second.plan.items for c in i.saved_ops]
    assert second.plan.measured_peak_bytes <= budget


def test_a_re_plan_after_a_resume_weighs_measured_options_not_only_keep_and_checkpoint(saved, info_logs):
    """The resumed plan's options are sized, not timed; when its first measured step comes out over the
    budget (here 10 kB over, reported by the meter), the re-plan measures the options first, so it can
    still choose selective ones."""
    budget, plan, ckpt = saved
    second = AutoCheckpoint(budget_gb=budget / GB, cost="flops", granularity="op")
    measured = second._stop_measuring
    second._stop_measuring = lambda: max(measured(), budget + 10_000)
    capped_fit(budget, [second], loader((32,) * 4), 4, ckpt_path=ckpt)
    assert "holds on a fresh profile" in info_logs.text and "AutoCheckpoint re-plan" in info_logs.text
    replanned = second.plan
    assert replanned.replanned and replanned.selective, replanned
    assert replanned.predicted_peak_bytes <= budget - 10_000


def test_under_fsdp2_a_saved_plan_is_checked_on_every_rank_or_on_none(monkeypatch):
    """The op-level check of a saved plan runs the live model (FSDP2: all-gathers), so a rank whose plan
    could be checked plans anew when another rank cannot check its own, instead of gathering alone."""
    import types

    from lightning_ckpt.config import AutoCheckpointConfig
    from lightning_ckpt.lightning import granularity

    calls, flags = [], []
    monkeypatch.setattr(granularity, "profiles_collectively", lambda trainer: trainer.sharded)
    monkeypatch.setattr(granularity, "any_rank", lambda trainer, flag: flags.append(flag) or (trainer.other,))
    monkeypatch.setattr(granularity, "saved_options_in_fit", lambda *a: calls.append(a) or ({}, "checked"))
    book = granularity.OptionBook(AutoCheckpointConfig(budget_gb=1.0, granularity="op"))
    selective = types.SimpleNamespace(selective=True)
    for sharded, other, plan, problem, expected in (
        (
            True,
            True,
            selective,
            None,
            "another rank plans anew (under FSDP2 and FSDP every rank checks together)",
        ),
        (True, False, selective, None, "checked"),  # every rank can check: it runs here
        (True, True, None, None, None),  # nothing to check here: its flag tells the others
        (True, True, selective, "over", "over"),  # the block-level check refused it already
        (False, False, selective, None, "checked"),  # DDP, one device: each rank on its own
    ):
        trainer = types.SimpleNamespace(sharded=sharded, other=other)
        assert book.check_saved(trainer, None, None, 0, plan, None, problem) == (expected, plan)
    assert len(calls) == 2 and flags == [False, False, True, True, False]
