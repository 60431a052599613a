"""The profile's FLOP counter and live-storage counter fast paths: the same counts as torch's own."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from lightning_ckpt._compat import FakeTensorMode
from lightning_ckpt.core.flops import TotalFlopCounter
from lightning_ckpt.core.storage import LiveStorageTracker, _makes_no_storage


def _step(model: nn.Module, x: torch.Tensor) -> None:
    model(x).square().mean().backward()


def _model() -> nn.Module:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    return nn.Sequential(nn.Conv1d(8, 8, 3, padding=1), layer, nn.Linear(32, 16))


@pytest.mark.parametrize("fake", [False, True], ids=["real", "fake"])
def test_total_flops_equal_torchs_counter_op_for_op(fake):
    counts = []
    for counter_type in (FlopCounterMode, TotalFlopCounter):
        mode = FakeTensorMode() if fake else None
        with mode if mode is not None else torch.enable_grad():
            model, x = _model(), torch.randn(2, 8, 32)
            with LiveStorageTracker(), counter_type(display=False) as counter:
                _step(model, x)
        counts.append((counter.get_total_flops(), dict(counter.get_flop_counts()["Global"])))
    assert counts[0][0] > 0
    assert counts[1] == counts[0]


def test_ops_that_make_no_storage_are_told_by_their_schema():
    aten = torch.ops.aten
    makes_none = [torch.ops.prim.device.default, aten.view.default, aten.split.Tensor, aten.add_.Tensor]
    makes_some = [
        aten.mm.default,
        aten._unsafe_view.default,
        aten.lift_fresh.default,
        aten._foreach_add.Scalar,
    ]
    assert [_makes_no_storage(op) for op in makes_none] == [True] * 4
    assert [_makes_no_storage(op) for op in makes_some] == [False] * 4


def test_device_queries_on_fake_tensors_count_nothing():
    with FakeTensorMode(), LiveStorageTracker() as tracker:
        x = torch.empty(64, 64)
        devices = {x.device for _ in range(3)}
        y = x @ x
    assert devices == {torch.device("cpu")}
    assert (tracker.peak_bytes, tracker.live_bytes) == (2 * 64 * 64 * 4, 2 * 64 * 64 * 4)
    del y
