"""`budget_gb` is a promise: every step stays within it, the first step and longer batches included.

Every fit here runs inside ``memory_cap(budget_bytes, model=model)``, the CPU stand-in of a device with
exactly ``budget_gb`` of memory: one byte over it anywhere (profiling, planning, forward, backward,
optimizer step) is a ``torch.OutOfMemoryError``. The budgets lie between the minimum (every block
checkpointed) and the unchecked peak (nothing checkpointed) that a probe fit predicts for the same shape.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import lightning as L
import pytest
import torch
from callback_helpers import block_names, fast_trainer, tiny_gpt
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from lightning_ckpt import AutoCheckpoint
from lightning_ckpt.core.wrapping import checkpointed_names
from lightning_ckpt.planning import BudgetTooSmallError
from lightning_ckpt.planning.peak import fixed_peak_bytes, predict_peak_bytes
from lightning_ckpt.testing import CountRestoredState, memory_cap
from lightning_ckpt.units import gb_to_bytes

GB = 1e9
SHORT, LONG = 16, 32  # sequence lengths; the tiny GPT's block_size is 32
BATCH = 4


def shape_key(batch_size: int, length: int) -> tuple:
    """The callback's key for a (inputs, targets) batch of int64 tokens."""
    return (((batch_size, length), "torch.int64"),) * 2


def loader(lengths: tuple[int, ...], batch_size: int = BATCH, seed: int = 0) -> DataLoader:
    """One batch per entry of ``lengths``, with that sequence length, in that order.

    The rows exist beforehand; each batch is stacked by the DataLoader (inside the cap, as on a device).
    """
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for length in lengths:
        tokens = torch.randint(0, 256, (batch_size, length + 1), generator=generator)
        rows += [(row[:-1], row[1:]) for row in tokens]
    return DataLoader(rows, batch_size=batch_size, shuffle=False)


class Bounds(NamedTuple):
    minimum: int  # predicted peak with every block checkpointed
    unchecked: int  # predicted peak with nothing checkpointed

    def budget(self, where: str) -> int:
        """An exact budget in bytes: the minimum, or the middle between it and the unchecked peak."""
        return exact_budget(self.minimum if where == "minimum" else (self.minimum + self.unchecked) // 2)


def exact_budget(nbytes: int) -> int:
    """The smallest budget >= ``nbytes`` that ``budget_gb = budget / 1e9`` gives back exactly."""
    budget = nbytes
    while gb_to_bytes(budget / GB) != budget:
        budget += 1
    return budget


@functools.cache
def bounds(length: int = LONG, batch_size: int = BATCH, **trainer_kwargs) -> Bounds:
    """Minimum and unchecked predicted peak of one batch shape, from a 2-step probe fit (uncapped; the
    second batch of a length that is not a power of two is planned at its own shapes)."""
    probe = AutoCheckpoint(budget_gb=1000, measure=False)
    L.seed_everything(0, verbose=False)
    batches = trainer_kwargs.get("accumulate_grad_batches", 1)
    trainer = fast_trainer([probe], max_steps=2, **trainer_kwargs)
    trainer.fit(tiny_gpt(), train_dataloaders=loader((length,) * batches * 2, batch_size))
    assert probe.plan is probe.plans[shape_key(batch_size, length)]
    result = Bounds(fixed_peak_bytes(probe.profile), predict_peak_bytes(probe.profile, []))
    assert result.minimum < result.unchecked
    return result


def capped_fit(
    budget_bytes: int,
    callbacks: list,
    train_loader: DataLoader,
    max_steps: int,
    model: L.LightningModule | None = None,
    ckpt_path=None,
    **trainer_kwargs,
) -> tuple[L.Trainer, L.LightningModule]:
    """Fit inside ``memory_cap(budget_bytes)``, the model's parameters counted from the start."""
    model = tiny_gpt() if model is None else model
    for callback in callbacks:
        if isinstance(callback, AutoCheckpoint):
            assert callback.budget_bytes == budget_bytes, "the cap must equal the callback's budget"
    L.seed_everything(0, verbose=False)
    with memory_cap(budget_bytes, model=model) as cap:
        restored = CountRestoredState(cap)  # a resume's loaded optimizer state counts too
        trainer = fast_trainer([*callbacks, restored], max_steps=max_steps, **trainer_kwargs)
        trainer.fit(model, train_dataloaders=train_loader, ckpt_path=ckpt_path)
    if ckpt_path is not None:
        assert restored.state_bytes > 0, "the resumed fit restored no optimizer state for the cap to count"
    return trainer, model


def assert_too_tight_without_the_callback(
    budget_bytes: int, train_loader: DataLoader, steps: int, **trainer_kwargs
):
    """The same fit without AutoCheckpoint runs out of memory: the cap really is tight."""
    with pytest.raises(torch.OutOfMemoryError, match=f"cap of {budget_bytes} bytes"):
        capped_fit(budget_bytes, [], train_loader, max_steps=steps, **trainer_kwargs)


# -- 1. the first step (profiling, planning and the step itself) and the ones after ---------------------


@pytest.mark.parametrize("where", ["middle", "minimum"])
def test_every_step_fits_a_device_of_exactly_the_budget(where):
    budget = bounds().budget(where)
    steps = 6
    callback = AutoCheckpoint(budget_gb=budget / GB)
    trainer, model = capped_fit(budget, [callback], loader((LONG,) * steps), max_steps=steps)
    assert trainer.global_step == steps
    assert callback.plan.checkpointed, "a budget below the unchecked peak must checkpoint something"
    assert callback.plan.predicted_peak_bytes <= budget
    if where == "minimum":
        assert sorted(callback.plan.checkpointed) == block_names(model)
    assert checkpointed_names(model) == []

    assert_too_tight_without_the_callback(budget, loader((LONG,) * steps), steps)


# -- 2. longer batches later: each new shape is planned before it runs -----------------------------------


@pytest.mark.parametrize(
    ("lengths", "where"),
    [
        ((SHORT, SHORT, LONG, LONG, LONG), "middle"),
        ((SHORT, SHORT, LONG, LONG, LONG), "minimum"),
        ((SHORT, LONG, SHORT, LONG), "middle"),  # back to a shape planned before
    ],
)
def test_longer_later_batches_are_planned_before_they_run(lengths, where):
    budget = bounds(LONG).budget(where)
    callback = AutoCheckpoint(budget_gb=budget / GB)
    trainer, _ = capped_fit(budget, [callback], loader(lengths), max_steps=len(lengths))
    assert trainer.global_step == len(lengths)
    plans = callback.plans
    assert plans.keys() == {shape_key(BATCH, SHORT), shape_key(BATCH, LONG)}
    short, long = plans[shape_key(BATCH, SHORT)], plans[shape_key(BATCH, LONG)]
    assert long.checkpointed, "the long shape's budget is below its unchecked peak"
    assert len(long.checkpointed) >= len(short.checkpointed)
    assert short.predicted_peak_bytes <= budget and long.predicted_peak_bytes <= budget


# -- 3. a later shape that cannot fit: a clear error before its step, not an out-of-memory crash --------


def test_a_later_shape_below_its_minimum_raises_budget_too_small_before_the_step():
    short_min, long_min = bounds(SHORT).minimum, bounds(LONG).minimum
    assert short_min < long_min
    budget = exact_budget((short_min + long_min) // 2)
    model = tiny_gpt()
    callback = AutoCheckpoint(budget_gb=budget / GB)
    lengths = (SHORT, SHORT, LONG, LONG)
    with pytest.raises(BudgetTooSmallError) as caught:
        capped_fit(budget, [callback], loader(lengths), max_steps=len(lengths), model=model)
    error = caught.value
    assert "(4, 32)" in str(error)
    assert (BATCH, LONG) in error.shapes
    assert error.minimum_bytes > budget
    assert model.trainer.global_step == 2, "the short batches trained, the long one did not start"
    assert list(callback.plans) == [shape_key(BATCH, SHORT)]
    assert checkpointed_names(model) == []


# -- 4. a resume with a bigger batch --------------------------------------------------------------------


@pytest.mark.parametrize("where", ["middle", "minimum"])
def test_resume_with_a_bigger_batch_plans_the_new_shape_within_the_budget(tmp_path, where):
    budget = bounds(LONG, batch_size=4).budget(where)
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    first = AutoCheckpoint(budget_gb=budget / GB)
    capped_fit(
        budget, [first, saver], loader((LONG,) * 2, batch_size=2), max_steps=2, enable_checkpointing=True
    )
    assert list(first.plans) == [shape_key(2, LONG)]
    ckpt = next(tmp_path.glob("*step=2.ckpt"))

    second = AutoCheckpoint(budget_gb=budget / GB)
    trainer, _ = capped_fit(
        budget,
        [second],
        loader((LONG,) * 4, batch_size=4),
        max_steps=4,
        model=tiny_gpt(seed=99),
        ckpt_path=ckpt,
    )
    assert trainer.global_step == 4
    assert second.plans.keys() == {shape_key(2, LONG), shape_key(4, LONG)}
    assert second.plan == second.plans[shape_key(4, LONG)]
    assert second.plan.checkpointed and second.plan.predicted_peak_bytes <= budget


# -- 5. gradient accumulation and clipping ---------------------------------------------------------------

ACCUMULATE = {"accumulate_grad_batches": 2}
CLIP = {"gradient_clip_val": 1.0}


@pytest.mark.parametrize("where", ["middle", "minimum"])
@pytest.mark.parametrize(
    "trainer_kwargs", [ACCUMULATE, CLIP, ACCUMULATE | CLIP], ids=["accumulate", "clip", "both"]
)
def test_accumulation_and_clipping_stay_within_the_budget(trainer_kwargs, where):
    budget = bounds(LONG, **trainer_kwargs).budget(where)
    steps = 3
    batches = steps * trainer_kwargs.get("accumulate_grad_batches", 1)
    callback = AutoCheckpoint(budget_gb=budget / GB)
    trainer, _ = capped_fit(budget, [callback], loader((LONG,) * batches), max_steps=steps, **trainer_kwargs)
    assert trainer.global_step == steps
    assert callback.plan.checkpointed
    assert callback.plan.predicted_peak_bytes <= budget
    assert_too_tight_without_the_callback(budget, loader((LONG,) * batches), steps, **trainer_kwargs)


def test_a_shape_already_planned_is_neither_profiled_again_nor_allocates(monkeypatch):
    import lightning_ckpt.callback as callback_module
    from lightning_ckpt.core.storage import LiveStorageTracker

    calls = []
    real_profile = callback_module.profile_in_fit
    monkeypatch.setattr(
        callback_module, "profile_in_fit", lambda *a, **k: calls.append(1) or real_profile(*a, **k)
    )
    allocated = []
    real_start = AutoCheckpoint.on_train_batch_start

    def counted_start(self, *args):
        planned = len(self.plans)
        with LiveStorageTracker() as tracker:
            real_start(self, *args)
        if len(self.plans) == planned:  # a shape planned before: only a lookup
            allocated.append(tracker.peak_bytes)

    monkeypatch.setattr(AutoCheckpoint, "on_train_batch_start", counted_start)
    callback = AutoCheckpoint(budget_gb=1000, measure=False)
    fast_trainer([callback], max_steps=6).fit(tiny_gpt(), train_dataloaders=loader((16, 32, 16, 32, 16, 32)))
    assert len(calls) == 2 and len(callback.plans) == 2
    assert allocated == [0, 0, 0, 0]


class FloatBatchGPT(L.LightningModule):
    """A model fed a large float batch that nothing saves for backward: the batch is on the device anyway."""

    def __init__(self) -> None:
        super().__init__()
        self.gpt = tiny_gpt(dropout=0.0)
        self.scale = torch.nn.Linear(1, 1)

    def training_step(self, batch, batch_idx):
        idx, targets, extra = batch
        _, loss = self.gpt(idx, targets)
        return loss + 0.0 * extra.sum()

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


@pytest.mark.parametrize(
    "case",
    ["checkpointed block's own forward", "a large batch nothing saves"],
)
def test_the_exact_minimum_holds_where_an_additive_model_misses(case):
    """Two moments the prediction once missed (found in review, each ran out at the exact minimum):
    a checkpointed block's forward with big gradients alive, and batch tensors that are never saved."""
    if case.startswith("checkpointed"):
        make_model, batches = (
            (lambda: tiny_gpt(n_layer=2, n_embd=128, dropout=0.0)),
            loader((32,) * 6, batch_size=2),
        )
    else:
        rows = [(t[:-1], t[1:], torch.randn(64, 512)) for t in torch.randint(0, 256, (24, 33))]
        make_model, batches = FloatBatchGPT, DataLoader(rows, batch_size=4)
    probe = AutoCheckpoint(budget_gb=1000, measure=False)
    fast_trainer([probe], max_steps=1).fit(make_model(), train_dataloaders=batches)
    budget = exact_budget(fixed_peak_bytes(probe.profile))
    model = make_model()
    with memory_cap(budget, model=model):
        fast_trainer([AutoCheckpoint(budget_gb=budget / 1e9)], max_steps=5).fit(
            model, train_dataloaders=batches
        )


def test_a_resume_with_another_setting_plans_anew(tmp_path):
    """Plans saved under one setting (no accumulation) are not reused under another (accumulation)."""
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    first = AutoCheckpoint(budget_gb=1000, measure=False)
    fast_trainer([first, saver], max_steps=2, enable_checkpointing=True).fit(
        tiny_gpt(), train_dataloaders=loader((32,) * 4)
    )
    ckpt = next(tmp_path.glob("*step=2.ckpt"))
    same, other = AutoCheckpoint(budget_gb=1000, measure=False), AutoCheckpoint(budget_gb=1000, measure=False)
    fast_trainer([same], max_steps=3).fit(tiny_gpt(), train_dataloaders=loader((32,) * 4), ckpt_path=ckpt)
    fast_trainer([other], max_steps=3, accumulate_grad_batches=2).fit(
        tiny_gpt(), train_dataloaders=loader((32,) * 8), ckpt_path=ckpt
    )
    assert same.profile is not None, "the saved plan is checked on a fresh profile before its first step"
    assert same.plan == first.plan, "the same setting keeps the saved plan (checked, not solved again)"
    assert other.profile is not None and other.profile.zero_grad == "never", "another setting plans anew"


class ItemInStepGPT(L.LightningModule):
    """A training step that reads a tensor's value (``.item()``): it cannot run on fake tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.gpt = tiny_gpt(dropout=0.0)

    def training_step(self, batch, batch_idx):
        _, loss = self.gpt(*batch)
        return loss * (1.0 if loss.item() > 0 else 0.0)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def test_a_step_that_cannot_run_on_fake_tensors_falls_back_with_a_warning_and_still_plans_the_optimizer():
    callback = AutoCheckpoint(budget_gb=1000, measure=False)
    with pytest.warns(UserWarning, match="does not run on fake tensors.*not held to `budget_gb`"):
        fast_trainer([callback], max_steps=2).fit(ItemInStepGPT(), train_dataloaders=loader((32,) * 2))
    assert callback.profile.optimizer_step_bytes > 0, "the optimizer step is still measured on fake twins"
    assert callback.profile.batch_bytes == 2 * BATCH * 32 * 8
