"""`scripts/fake_audit.py` compares a step on real and on fake tensors op by op: on BERT's masked-LM head
under bf16-mixed it finds the float32 statistics torch's fake LayerNorm kernel gave in bf16, and none
with the fake mode AutoCheckpoint profiles under."""

from __future__ import annotations

import pytest
from callback_helpers import script_module

from lightning_ckpt._compat import FakeTensorMode
from lightning_ckpt.core import fake_tensors


def test_no_op_differs_on_bert_under_bf16_mixed_and_torchs_own_fake_mode_is_caught(monkeypatch):
    pytest.importorskip("transformers")
    audit = script_module("fake_audit").audit
    report = audit("Bert", "bf16-mixed")
    assert report["differ"] == [] and report["ops_real"] > 1000, report
    monkeypatch.setattr(fake_tensors, "CpuKernelFakeTensorMode", FakeTensorMode)  # torch 2.13's kernels
    differ = audit("Bert", "bf16-mixed")["differ"]
    assert [op for op, _, _ in differ] == ["aten.native_layer_norm.default"], differ
    _, real, fake = differ[0]
    assert [layout[0] for layout in real] == ["torch.bfloat16", "torch.float32", "torch.float32"]
    assert [layout[0] for layout in fake] == ["torch.bfloat16"] * 3


def test_an_unknown_architecture_is_refused_by_name(capsys):
    with pytest.raises(SystemExit) as exit_info:
        script_module("fake_audit").main(["Nope"])
    assert exit_info.value.code == 2 and "'Nope'" in capsys.readouterr().err


def test_swins_layer_norm_gradient_keeps_the_cpu_kernels_strides(monkeypatch):
    """Swin's LayerNorm over a transposed input: the real kernel's input gradient is contiguous, torch's
    fake one followed the strides (and a view of it then copied on fake tensors only)."""
    pytest.importorskip("transformers")
    audit = script_module("fake_audit").audit
    assert audit("Swin", "32-true")["differ"] == []
    monkeypatch.setattr(fake_tensors, "CpuKernelFakeTensorMode", FakeTensorMode)  # torch 2.13's kernels
    report = audit("Swin", "32-true")
    assert "aten.native_layer_norm_backward.default" in [op for op, _, _ in report["differ"]], report
    assert report["only_fake"].count("aten.clone.default") >= 1, report
