"""Op-level plans on models this project did not write (issue 24): a transformers Llama from a tiny
config (its layers share inputs, so its peak points were not nested: planned on a nested bound) and
torch's ``nn.TransformerEncoder``, each under a cap equal to the budget, predicted within 2%."""

from __future__ import annotations

import itertools
import types

import lightning as L
import numpy as np
import pytest
import torch
from callback_helpers import assert_within_two_percent, fast_trainer
from real_models import PaddedLM, padded_token_loader
from test_budget_promise import exact_budget
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_ckpt import AutoCheckpoint
from lightning_ckpt.planning.choices import Option, choice_peak_bytes
from lightning_ckpt.planning.op_plan import op_form
from lightning_ckpt.planning.peak import PeakModel, fixed_peak_bytes, predict_peak_bytes
from lightning_ckpt.planning.points import PeakPoint, peak_of_points
from lightning_ckpt.testing import memory_cap


class Encoder(L.LightningModule):
    """Token embedding, ``nn.TransformerEncoder`` (4 layers, dropout on), a linear head."""

    def __init__(self, width: int = 64, layers: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(256, width)
        layer = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, 256)

    def training_step(self, batch, batch_idx):
        ids, targets = batch
        logits = self.head(self.encoder(self.embed(ids)))
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def _encoder_loader() -> DataLoader:
    ids = torch.randint(0, 256, (16, 33), generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(ids[:, :-1].contiguous(), ids[:, 1:].contiguous()), batch_size=4)


MODELS = {
    "llama": (lambda: PaddedLM("llama"), lambda: padded_token_loader(num_batches=4)),
    "transformer_encoder": (Encoder, _encoder_loader),
}


@pytest.mark.parametrize("name", MODELS)
def test_op_level_plans_of_models_written_elsewhere_hold_a_cap_equal_to_the_budget(name):
    make, make_loader = MODELS[name]
    probe = AutoCheckpoint(budget_gb=1000, measure=False)
    fast_trainer([probe], max_steps=1).fit(make(), train_dataloaders=make_loader())
    low, high = fixed_peak_bytes(probe.profile), predict_peak_bytes(probe.profile, [])
    form, _ = op_form(PeakModel(probe.profile))  # Llama's shared inputs: a nested bound (2026-12-02)
    assert form is not None, f"{name}: op level needs nested points or a nested bound of them"
    budget = exact_budget(int(low + 0.2 * (high - low)))
    model, loader = make(), make_loader()  # the data set before the cap: on a device only the batch is
    callback = AutoCheckpoint(budget_gb=budget / 1e9, cost="flops", granularity="op")
    L.seed_everything(0, verbose=False)
    with memory_cap(budget, model=model) as cap:
        fast_trainer([callback], max_steps=3).fit(model, train_dataloaders=loader)
    plan = callback.plan
    assert plan.selective, f"{name}: FLOP-priced plans at this budget should choose selective options"
    assert plan.predicted_peak_bytes <= budget and plan.measured_peak_bytes <= budget
    assert_within_two_percent(plan.predicted_peak_bytes, cap.peak_bytes, f"{name} op level")


def test_the_nested_bound_never_predicts_less_than_the_points():
    """Two candidates sharing an input (held while either is checkpointed) and a point where one weighs
    less than its largest: not nested; the bound's peak is at least the points' for every choice."""
    points = (
        PeakPoint(100, np.array([0, 0])),
        PeakPoint(120, np.array([50, 0]), when=(1, False)),
        PeakPoint(110, np.array([40, 30]), ((((0, False), (1, False)), 7),)),
    )
    form, note = op_form(_peak_with(points))
    assert form is not None and "at most 17 B over them" in note
    weight = dict(zip(form.order, form.weight_bytes, strict=True))
    options = [
        [Option("keep", "keep", weight[i], 0, 0.0), Option("checkpoint", "checkpoint", 0, 0, 1.0)]
        for i in range(2)
    ]
    for mask in itertools.product([True, False], repeat=2):
        exact = peak_of_points(points, mask)
        bound = choice_peak_bytes(form, options, [0 if kept else 1 for kept in mask])
        assert exact <= bound <= exact + 17, mask


def _peak_with(points):
    """A stand-in for ``PeakModel`` with these points (what ``op_form`` reads)."""
    return types.SimpleNamespace(points=points, matrix=None)
