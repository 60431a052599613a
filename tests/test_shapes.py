"""Dynamic padding: one plan per family of shapes, every step within the budget.

A batch whose shapes a plan covers (same tensors, no size larger) uses that plan; a batch nothing covers
is planned at its family's top (the fit's first at its sequence length rounded up to a power of two, a
later one with each size that differs from the first planned shapes rounded up), falling back to its own
shapes when the top does not fit or does not run. A fixed length is planned exactly on the second step.
"""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch
from callback_helpers import fast_trainer, probe_profile, tiny_gpt
from test_budget_promise import BATCH, bounds, capped_fit, exact_budget, loader, shape_key
from torch.utils.data import DataLoader

import lightning_ckpt.callback as callback_module
from lightning_ckpt import AutoCheckpoint, CheckpointPlan
from lightning_ckpt.lightning.plan_book import PlanBook, agreed_key
from lightning_ckpt.lightning.shapes import covers, family_top, pad_batch
from lightning_ckpt.planning.peak import PeakModel, fixed_peak_bytes, predict_peak_bytes
from lightning_ckpt.testing import memory_cap

GB = 1e9
LENGTHS = (9, 13, 20, 27, 31, 11, 32, 17)  # a new length every step, as a padding collator gives


def _counted_profiles(monkeypatch) -> list:
    calls: list = []
    real = callback_module.profile_in_fit
    monkeypatch.setattr(
        callback_module, "profile_in_fit", lambda *a, **k: calls.append(k["pad_to"]) or real(*a, **k)
    )
    return calls


def test_a_family_top_rounds_only_the_sizes_that_vary_and_covers_them():
    anchor = (((4, 9), "torch.int64"),) * 2
    top = family_top((((4, 20), "torch.int64"),) * 2, [anchor])
    assert top == (((4, 32), "torch.int64"),) * 2
    assert covers(top, (((4, 27), "torch.int64"),) * 2) and covers(top, (((3, 32), "torch.int64"),) * 2)
    assert not covers(top, (((4, 33), "torch.int64"),) * 2)
    assert not covers(top, (((4, 20), "torch.int32"),) * 2), "another dtype is another family"


def test_a_batch_uses_its_own_plan_else_the_closest_family_that_covers_it():
    plan = CheckpointPlan((), (), (), 0, 10, 5, 0.0, "all-fit", 0.0)
    keys = [(((8, n), "torch.int64"),) for n in (256, 64, 50)]
    book = PlanBook(plans=dict.fromkeys(keys, plan))
    assert book.key_for((((8, 50), "torch.int64"),)) == keys[2]
    assert book.key_for((((8, 51), "torch.int64"),)) == keys[1], "64 is closer than 256"
    assert book.key_for((((8, 257), "torch.int64"),)) is None


class _OtherRank:
    """Rank 0 of two; what the other rank adds to ``any_rank``'s all-reduce is scripted."""

    def __init__(self, other_flags: list[int]) -> None:
        self.world_size, self.strategy, self.root_device, self.other = (
            2,
            self,
            torch.device("cpu"),
            other_flags,
        )

    def reduce(self, tensor, reduce_op):
        assert reduce_op == "max"
        return torch.maximum(tensor, torch.tensor(self.other, dtype=tensor.dtype))


def test_ranks_run_one_round_whose_plan_covers_every_rank_batch_else_plan_together():
    plan = CheckpointPlan((), (), (), 0, 10, 5, 0.0, "all-fit", 0.0)
    long, short, batch = ((((8, n), "torch.int64"),) for n in (256, 64, 50))
    book = PlanBook()
    book.file(long, dataclasses.replace(plan, checkpointed=("a", "b")))  # round 0
    book.file(short, dataclasses.replace(plan, checkpointed=("a",), kept=("b",), measured_peak_bytes=9))
    # values: [plan now, own plan unmeasured] + per round [not covering it, its plan unmeasured, kept]
    agree = lambda other: agreed_key(_OtherRank(other), book, batch, short, False)  # noqa: E731
    assert agree([0, 0] + [0, 0, 0] + [0, 0, 0]) == (False, short, False), "both common: the one keeping more"
    assert agree([0, 0] + [0, 0, 0] + [0, 1, 0]) == (False, short, True), "unmeasured on the other rank"
    assert agree([0, 0] + [0, 0, 0] + [1, 0, 0]) == (False, long, True), "only round 0 covers the other's"
    assert agree([0, 0] + [1, 0, 0] + [1, 0, 0])[0], "no round covers both batches: plan together"
    assert agree([1, 0] + [0, 0, 0] + [0, 0, 0])[0], "the other rank has a new family"
    assert agree([0, 0] + [0, 0, 3] + [0, 0, 0]) == (False, long, True), "the choice is the reduced one's"
    book.unchecked = {short}  # restored from a checkpoint, not checked on a fresh profile yet
    assert agree([0, 0] + [0, 0, 0] + [0, 0, 0]) == (False, long, True), "an unchecked plan covers nothing"
    book.unchecked = set()
    alone = types.SimpleNamespace(world_size=1)
    assert agreed_key(alone, book, batch, short, False) == (False, short, False), "one process: its own"


def test_pad_batch_repeats_the_last_entry_and_refuses_a_smaller_target():
    batch = (torch.tensor([[5, 6, 7]]), {"mask": torch.tensor([[1, 1, 0]]), "name": "x"})
    ids, extra = pad_batch(batch, (((2, 5), "torch.int64"),) * 2)
    assert ids.tolist() == [[5, 6, 7, 7, 7], [5, 6, 7, 7, 7]] and extra["name"] == "x"
    assert extra["mask"].tolist() == [[1, 1, 0, 0, 0], [1, 1, 0, 0, 0]]
    with pytest.raises(ValueError, match=r"`shapes` must cover the batch's shapes .*\(1, 3\).*, got"):
        pad_batch(batch, (((1, 2), "torch.int64"),) * 2)


@pytest.mark.parametrize("where", ["middle", "minimum"])
def test_a_new_length_every_step_plans_a_few_families_and_every_step_fits(monkeypatch, where):
    budget = bounds(32).budget(where)
    calls = _counted_profiles(monkeypatch)
    callback = AutoCheckpoint(budget_gb=budget / GB)
    trainer, _ = capped_fit(budget, [callback], loader(LENGTHS), max_steps=len(LENGTHS))
    assert trainer.global_step == len(LENGTHS)
    # the first length at its rung 16, then the top 32: every later length is covered
    assert list(callback.plans) == [shape_key(BATCH, 16), shape_key(BATCH, 32)]
    assert len(calls) == 2
    for plan in callback.plans.values():
        assert plan.predicted_peak_bytes <= budget


def test_a_family_plan_holds_at_every_length_it_covers():
    """The oracle: each length's own fake profile predicts the plan of its family within the budget."""
    budget = bounds(32).budget("middle")
    callback = AutoCheckpoint(budget_gb=budget / GB, measure=False)
    fast_trainer([callback], max_steps=3).fit(tiny_gpt(), train_dataloaders=loader((9, 20, 32)))
    family = callback.plans[shape_key(BATCH, 32)]
    assert family.checkpointed, "the budget is below the top's unchecked peak"
    for length in (17, 25):
        profile = probe_profile(tiny_gpt(), loader((length,)))
        assert profile.batch_bytes == 2 * BATCH * length * 8, "the length's own profile (ids, targets)"
        assert PeakModel(profile).peak_bytes(family.checkpointed) <= family.predicted_peak_bytes


def test_a_top_past_the_model_positions_plans_the_batch_own_shapes_without_warning(monkeypatch, recwarn):
    calls = _counted_profiles(monkeypatch)
    callback = AutoCheckpoint(budget_gb=1000, measure=False)
    fast_trainer([callback], max_steps=3).fit(tiny_gpt(block_size=24), train_dataloaders=loader((10, 20, 18)))
    assert list(callback.plans) == [shape_key(BATCH, 16), shape_key(BATCH, 20)], "18 is covered by 20"
    assert calls == [shape_key(BATCH, 16), shape_key(BATCH, 32), shape_key(BATCH, 20)]
    assert not [w for w in recwarn if "training step does not run on fake tensors" in str(w.message)]


def test_a_top_over_the_budget_plans_the_batch_own_shapes_instead_of_failing():
    short_min, long_min = bounds(20).minimum, bounds(32).minimum
    budget = exact_budget((short_min + long_min) // 2)  # fits length 20 checkpointed, not 32
    callback = AutoCheckpoint(budget_gb=budget / GB)
    trainer, _ = capped_fit(budget, [callback], loader((9, 20, 19, 20)), max_steps=4)
    assert trainer.global_step == 4
    assert list(callback.plans) == [shape_key(BATCH, 16), shape_key(BATCH, 20)]


def test_a_padded_llama_with_a_new_length_every_step_stays_within_the_budget(monkeypatch):
    """transformers Llama (from a tiny config) on batches padded to their own longest row."""
    from real_models import PaddedLM

    generator = torch.Generator().manual_seed(0)
    batches = []
    for length in (21, 40, 33, 64, 17, 50):
        ids = torch.randint(1, 256, (4, length), generator=generator)
        mask = (torch.arange(length) < torch.randint(8, length + 1, (4, 1), generator=generator)).long()
        mask[0] = 1  # one row is the longest
        batches.append((ids * mask, mask))
    probe = AutoCheckpoint(budget_gb=1000, measure=False)
    fast_trainer([probe], max_steps=1).fit(
        PaddedLM("llama", 2), train_dataloaders=DataLoader(batches[3:4], batch_size=None)
    )
    budget = exact_budget((fixed_peak_bytes(probe.profile) + predict_peak_bytes(probe.profile, [])) // 2)
    calls = _counted_profiles(monkeypatch)
    model, callback = PaddedLM("llama", 2), AutoCheckpoint(budget_gb=budget / GB)
    trainer = fast_trainer([callback], max_steps=len(batches))
    with memory_cap(budget, model=model):
        trainer.fit(model, train_dataloaders=DataLoader(batches, batch_size=None))
    assert trainer.global_step == len(batches)
    assert [shapes[0][0] for shapes in callback.plans] == [(4, 32), (4, 64)], "21 at its rung, then 64"
    assert len(calls) == 2 and callback.plans[(((4, 64), "torch.int64"),) * 2].checkpointed


def test_lengths_16_to_256_growing_every_step_cost_at_most_five_profiles(monkeypatch):
    """The worst case for the ladder: every batch longer than the last plan's top."""
    calls = _counted_profiles(monkeypatch)
    callback = AutoCheckpoint(budget_gb=1000, measure=False)
    lengths = (16, 17, 33, 65, 129, 200, 256, 100, 40)
    fast_trainer([callback], max_steps=len(lengths)).fit(
        tiny_gpt(block_size=256, n_layer=2), train_dataloaders=loader(lengths, batch_size=2)
    )
    assert [shapes[0][0][1] for shapes in callback.plans] == [16, 32, 64, 128, 256]
    assert len(calls) == 5


def test_a_fixed_length_is_planned_at_its_rung_then_exactly_on_the_second_step(monkeypatch):
    budget = bounds(20).budget("middle")
    calls = _counted_profiles(monkeypatch)
    callback = AutoCheckpoint(budget_gb=budget / GB)
    trainer, _ = capped_fit(budget, [callback], loader((20,) * 4), max_steps=4)
    assert trainer.global_step == 4
    assert calls == [shape_key(BATCH, 32), shape_key(BATCH, 20)]
    assert callback.plan is callback.plans[shape_key(BATCH, 20)], "the exact plan is in force"
    family, exact = callback.plans[shape_key(BATCH, 32)], callback.plan
    assert len(exact.checkpointed) <= len(family.checkpointed)
    assert exact.measured_peak_bytes <= exact.predicted_peak_bytes <= budget


def test_a_length_planned_at_its_rung_is_not_planned_again_after_another_length(monkeypatch):
    calls = _counted_profiles(monkeypatch)
    callback = AutoCheckpoint(budget_gb=1000, measure=False)
    fast_trainer([callback], max_steps=4).fit(tiny_gpt(), train_dataloaders=loader((20, 9, 20, 20)))
    assert calls == [shape_key(BATCH, 32)] and list(callback.plans) == [shape_key(BATCH, 32)]
