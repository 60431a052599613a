"""A saved plan is checked on a fresh profile before its first resumed step, under a cap equal to the
budget: a model with other activations, or a hand-edited plan, is planned anew instead of running over."""

from __future__ import annotations

import logging

import pytest
from callback_helpers import block_names, probe_profile, tiny_gpt
from lightning.pytorch.callbacks import ModelCheckpoint
from test_budget_promise import capped_fit, exact_budget, loader

from lightning_ckpt import AutoCheckpoint
from lightning_ckpt.planning.peak import PeakModel, fixed_peak_bytes, predict_peak_bytes

GB = 1e9


def _middle_budget(model) -> int:
    profile = probe_profile(model, loader((32,)))
    return exact_budget((fixed_peak_bytes(profile) + predict_peak_bytes(profile, [])) // 2)


@pytest.fixture
def info_logs(caplog):
    """INFO records, the callback's too (``rank_zero_info``, whose logger an in-process
    ``lightning-ckpt plan`` earlier in the session may have set to WARNING)."""
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.INFO, logger="lightning.pytorch.utilities.rank_zero")
    return caplog


def test_a_resumed_model_with_larger_activations_plans_anew_within_the_budget(tmp_path, info_logs):
    """n_head 2 -> 8: the same class, parameters and candidates, attention matrices four times larger."""
    budget = _middle_budget(tiny_gpt(n_head=8))
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    first = AutoCheckpoint(budget_gb=budget / GB)
    capped_fit(
        budget, [first, saver], loader((32,) * 2), 2, model=tiny_gpt(n_head=2), enable_checkpointing=True
    )
    ckpt = next(tmp_path.glob("*step=2.ckpt"))

    second = AutoCheckpoint(budget_gb=budget / GB)
    trainer, _ = capped_fit(budget, [second], loader((32,) * 4), 4, model=tiny_gpt(n_head=8), ckpt_path=ckpt)
    assert trainer.global_step == 4
    assert PeakModel(second.profile).peak_bytes(first.plan.checkpointed) > budget, (
        "the old plan would not fit"
    )
    assert "the activations differ from what it was made for" in info_logs.text
    assert second.plan.predicted_peak_bytes <= budget and second.plan.measured_peak_bytes <= budget


def test_a_hand_edited_plan_is_not_trusted(info_logs):
    """An edit consistent in itself (every number plausible, nothing checkpointed, predicted at the budget)
    passes the saved-data checks of `CheckpointPlan.from_dict`; the fresh profile before its first step
    catches it."""
    budget = _middle_budget(tiny_gpt())
    saved = AutoCheckpoint(budget_gb=budget / GB)
    capped_fit(budget, [saved], loader((32,) * 2), 2)
    state = saved.state_dict()
    plan = state["plans"][0][1]
    assert plan["checkpointed"], "the budget needs checkpointing"
    plan.update(
        checkpointed=[],
        kept=block_names(tiny_gpt()),
        predicted_peak_bytes=budget,
        recompute_seconds=0.0,
        measured_peak_bytes=None,
    )

    callback = AutoCheckpoint(budget_gb=budget / GB)
    callback.load_state_dict(state)
    trainer, _ = capped_fit(budget, [callback], loader((32,) * 3), 3)
    assert trainer.global_step == 3
    assert "a fresh profile predicts" in info_logs.text and "over the budget" in info_logs.text
    assert callback.plan.checkpointed and callback.plan.predicted_peak_bytes <= budget
