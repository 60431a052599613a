"""The optimizer step's temporaries are in every plan: the first, a later shape's, a resumed run's.

The fake twin of an optimizer steps on fake copies of the real state (Adam's ``step`` count made a constant
fake scalar, so the data-dependent ``.item()`` it calls still runs); what it allocates is what the real
step allocates, byte for byte, before and after the real optimizer has state.
"""

from __future__ import annotations

import itertools
import warnings

import lightning as L
import pytest
import torch
from callback_helpers import fast_trainer, tiny_gpt
from lightning.pytorch.callbacks import ModelCheckpoint
from test_budget_promise import exact_budget, loader
from torch import nn

from lightning_ckpt import AutoCheckpoint
from lightning_ckpt.core import fake_tensors
from lightning_ckpt.core.fake_tensors import fake_model, optimizer_step_extra_bytes
from lightning_ckpt.core.storage import LiveStorageTracker
from lightning_ckpt.planning import BudgetTooSmallError
from lightning_ckpt.testing import CountRestoredState, memory_cap

GB = 1e9
SHORT, LONG = 8, 32

OPTIMIZERS = {
    "adamw-foreach": lambda params: torch.optim.AdamW(params, foreach=True),
    "adamw-for-loop": lambda params: torch.optim.AdamW(params, foreach=False),
    "adam-amsgrad": lambda params: torch.optim.Adam(params, amsgrad=True),
    "sgd-momentum-foreach": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=True),
}


def _real_step_temporaries(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    model(torch.randn(4, 64)).sum().backward()
    with LiveStorageTracker() as tracker:
        optimizer.step()
    optimizer.zero_grad()
    return tracker.peak_bytes - tracker.live_bytes


def _fake_step_temporaries(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "could not run on fake tensors" fallback to 0
        with fake_model(model) as fake:
            return optimizer_step_extra_bytes(optimizer, fake)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_the_fake_step_allocates_what_the_real_one_does_with_and_without_state(name):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))
    optimizer = OPTIMIZERS[name](model.parameters())
    fresh = _fake_step_temporaries(model, optimizer)
    first = _real_step_temporaries(model, optimizer)  # creates the state
    with_state = _fake_step_temporaries(model, optimizer)
    later = _real_step_temporaries(model, optimizer)
    assert fresh == with_state == later, (fresh, first, with_state, later)
    if name.startswith("adam"):
        assert with_state > 0
        assert all(int(s["step"]) == 2 for s in optimizer.state.values())  # the real state untouched


def _counted_twins(monkeypatch) -> list:
    """The twin optimizers made (one per measured step) while the test runs, every optimizer measured on
    its twin (the general path: no step from the formula for torch's own)."""
    monkeypatch.setattr(fake_tensors, "known_step_bytes", lambda optimizer: None)
    made: list = []
    real = fake_tensors._twin_optimizer
    monkeypatch.setattr(fake_tensors, "_twin_optimizer", lambda *a: made.append(a) or real(*a))
    return made


def _grid_optimizer(name: str, foreach, decay: float, option: bool, groups: list) -> torch.optim.Optimizer:
    if name in ("Adam", "AdamW"):
        return getattr(torch.optim, name)(
            groups, lr=1e-3, foreach=foreach, weight_decay=decay, amsgrad=option
        )
    momentum = {"SGD": 0.5 if option else 0.0, "SGD-momentum": 0.9, "SGD-nesterov": 0.9}[name]
    return torch.optim.SGD(
        groups,
        lr=0.1,
        foreach=foreach,
        weight_decay=decay,
        momentum=momentum,
        dampening=0.1 if name == "SGD" and option else 0.0,
        nesterov=name == "SGD-nesterov",
    )


@pytest.mark.parametrize("name", ["Adam", "AdamW", "SGD", "SGD-momentum", "SGD-nesterov"])
def test_the_formula_for_torchs_own_optimizers_is_what_their_twin_step_allocates(monkeypatch, name):
    """Every setting the formula covers (for-loop and foreach, weight decay, amsgrad / dampening, a
    bf16 layer beside fp32 ones, two param groups), before and after the real optimizer has state."""
    twin_step = fake_tensors.optimizer_step_extra_bytes

    def measured(optimizer: torch.optim.Optimizer, model: nn.Module) -> tuple[int | None, int]:
        formula = fake_tensors.known_step_bytes(optimizer)
        with monkeypatch.context() as patched, warnings.catch_warnings():
            patched.setattr(fake_tensors, "known_step_bytes", lambda optimizer: None)
            warnings.simplefilter("error")
            with fake_model(model) as fake:
                return formula, twin_step(optimizer, fake)

    cases = 0
    for foreach, decay, option, mixed, split in itertools.product(
        (False, True, None), (0.0, 0.1), (False, True), (False, True), (False, True)
    ):
        model = nn.Sequential(nn.Linear(24, 40), nn.ReLU(), nn.Linear(40, 8), nn.LayerNorm(8))
        if mixed:
            model[2].to(torch.bfloat16)
        params = list(model.parameters())
        groups = [{"params": params[:3]}, {"params": params[3:], "weight_decay": 0.0}] if split else params
        optimizer = _grid_optimizer(name, foreach, decay, option, groups)
        fresh = measured(optimizer, model)
        for param in params:
            param.grad = torch.ones_like(param)
        optimizer.step()  # the real state
        with_state = measured(optimizer, model)
        assert fresh[0] == fresh[1] and with_state[0] == with_state[1], (foreach, decay, option, mixed, split)
        cases += 1
    assert cases == 48
    assert fresh[0] > 0 or not name.startswith("Adam")


def test_settings_the_formula_does_not_follow_are_measured_on_the_twin():
    w = nn.Parameter(torch.zeros(64, 32))
    followed = torch.optim.AdamW([w])
    assert fake_tensors.known_step_bytes(followed) == 2 * w.numel() * 4
    for other in (
        torch.optim.AdamW([w], maximize=True),
        torch.optim.Adam([w], capturable=True),
        torch.optim.RMSprop([w]),
        torch.optim.AdamW([nn.Parameter(torch.zeros(32, 64).t())]),  # not contiguous
    ):
        assert fake_tensors.known_step_bytes(other) is None
        with fake_model(nn.Linear(1, 1)) as fake:  # their twin needs the model's parameters: refused, 0
            with pytest.warns(UserWarning, match="could not run on fake tensors"):
                assert optimizer_step_extra_bytes(other, fake) == 0


def test_a_reused_measurement_is_the_fresh_one_until_settings_or_parameters_change(monkeypatch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))
    adam = torch.optim.Adam(model.parameters(), foreach=False)
    made = _counted_twins(monkeypatch)

    def measured(reuse: bool = True) -> int:
        with fake_model(model) as fake:
            return optimizer_step_extra_bytes(adam, fake, reuse=reuse)

    fresh = measured()
    _real_step_temporaries(model, adam)  # the state the twin made is the state the real step makes
    adam.param_groups[0]["lr"] = 1e-4  # what a scheduler changes: not what the step allocates
    assert measured() == fresh == measured(reuse=False) > 0
    assert len(made) == 2, "the reused measurement made no twin"
    adam.param_groups[0]["weight_decay"] = 0.1  # Adam's L2 term: a gradient-sized temporary more
    with_decay = measured()
    assert with_decay == measured(reuse=False) > fresh and len(made) == 4
    model.append(nn.Linear(64, 256))  # parameters the optimizer did not have
    adam.add_param_group({"params": list(model[-1].parameters())})
    assert measured() == measured(reuse=False) > with_decay and len(made) == 6


def test_a_fit_planning_several_shapes_measures_the_optimizer_step_once(monkeypatch):
    made = _counted_twins(monkeypatch)
    callback = AutoCheckpoint(budget_gb=1000, measure=False)
    lengths = (8, 9, 17, 31)
    fast_trainer([callback], max_steps=len(lengths)).fit(
        _GPT(), train_dataloaders=loader(lengths, batch_size=1)
    )
    steps = {
        plan_shapes: profile.optimizer_step_bytes for plan_shapes, profile in callback._book.profiles.items()
    }
    assert len(steps) == 3 and len(set(steps.values())) == 1 and min(steps.values()) > 0
    assert len(made) == 1, "planned before the first step, reused after it (the state it made)"


class _GPT(L.LightningModule):
    """The tiny GPT, wide and short (the optimizer step is the peak), trained with foreach AdamW."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.gpt = tiny_gpt(seed=seed, n_embd=64)

    def training_step(self, batch, batch_idx):
        return self.gpt(*batch)[1]

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3, foreach=True)


def _advice(lengths, budget_bytes: int = 1, ckpt_path=None, **trainer_kwargs) -> int:
    """The smallest budget the callback advises for the first of ``lengths`` that ``budget_bytes`` cannot
    hold (1 byte: the first)."""
    callback = AutoCheckpoint(budget_gb=budget_bytes / GB)
    trainer = fast_trainer([callback], max_steps=len(lengths), **trainer_kwargs)
    with pytest.raises(BudgetTooSmallError) as caught:
        trainer.fit(_GPT(seed=1), train_dataloaders=loader(lengths, batch_size=1), ckpt_path=ckpt_path)
    return exact_budget(caught.value.minimum_bytes)


def _checkpoint_at_short_length(tmp_path, budget_bytes: int, **trainer_kwargs):
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1)
    callback = AutoCheckpoint(budget_gb=budget_bytes / GB)
    batches = 2 * trainer_kwargs.get("accumulate_grad_batches", 1)
    trainer = fast_trainer([callback, saver], max_steps=2, enable_checkpointing=True, **trainer_kwargs)
    trainer.fit(_GPT(), train_dataloaders=loader((SHORT,) * batches, batch_size=1))
    return next(tmp_path.glob("*step=2.ckpt"))


@pytest.mark.parametrize("trainer_kwargs", [{}, {"accumulate_grad_batches": 2}], ids=["plain", "accumulate"])
def test_training_at_the_advice_of_a_resumed_run_into_a_new_length_stays_within_it(tmp_path, trainer_kwargs):
    accumulate = trainer_kwargs.get("accumulate_grad_batches", 1)
    fresh_advice = _advice((LONG,) * accumulate, **trainer_kwargs)
    short_advice = _advice((SHORT,) * accumulate, **trainer_kwargs)
    assert short_advice < fresh_advice
    later_advice = _advice((SHORT,) * accumulate + (LONG,) * accumulate, short_advice, **trainer_kwargs)
    ckpt = _checkpoint_at_short_length(tmp_path, short_advice, **trainer_kwargs)
    resumed_advice = _advice((LONG,) * 3 * accumulate, ckpt_path=ckpt, **trainer_kwargs)
    assert fresh_advice == later_advice == resumed_advice

    model, callback = _GPT(seed=1), AutoCheckpoint(budget_gb=resumed_advice / GB)
    data = loader((LONG,) * 4 * accumulate, batch_size=1)
    with memory_cap(resumed_advice, model=model) as cap:  # every step, the optimizer's included
        restored = CountRestoredState(cap)
        trainer = fast_trainer([callback, restored], max_steps=4, **trainer_kwargs)
        trainer.fit(model, train_dataloaders=data, ckpt_path=ckpt)
    assert trainer.global_step == 4
    assert restored.state_bytes > 0
    assert callback.plan.predicted_peak_bytes <= resumed_advice
    assert cap.peak_bytes >= 0.98 * callback.plan.predicted_peak_bytes  # the advice is not loose either


def test_an_offline_plan_counts_the_optimizer_step_as_the_callback_does(tmp_path):
    from test_offline import _yaml

    from lightning_ckpt.lightning.fake_run import profile_run_on_fake_tensors
    from lightning_ckpt.offline.data import first_batch
    from lightning_ckpt.offline.run_config import load_run_config

    run = load_run_config(_yaml(tmp_path))
    offline = profile_run_on_fake_tensors(run, None, first_batch(run.data)).profile
    callback = AutoCheckpoint(budget_gb=1000, cost="flops", measure=False)
    fast_trainer([callback], max_steps=1).fit(run.model.instantiate(), datamodule=run.data.instantiate())
    assert offline.optimizer_step_bytes == callback.profile.optimizer_step_bytes > 0
