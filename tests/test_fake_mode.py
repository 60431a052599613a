"""The fake mode profiles run under gives mixed-dtype CPU normalizations the dtypes the real kernels give.

A bf16 activation into a float32 LayerNorm, BatchNorm or GroupNorm (what CPU autocast leaves behind) saves
float32 statistics on CPU; torch's fake kernels saved them in bf16. BERT's masked-LM head under
bf16-mixed was then under-predicted by 512 bytes and ran out of memory at the advised minimum.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn as nn

from lightning_ckpt.core.fake_mode import CpuKernelFakeTensorMode
from lightning_ckpt.core.fake_tensors import fake_model
from lightning_ckpt.core.profiler import profile_step
from lightning_ckpt.planning.peak import predict_peak_bytes

aten = torch.ops.aten
X, W, B, MEAN, VAR = (
    torch.randn(4, 8, 6),
    torch.rand(8) + 0.5,
    torch.randn(8),
    torch.zeros(8),
    torch.ones(8),
)
NORMS = {
    "layer": lambda x, w, b, m, v: aten.native_layer_norm(x, [6], w[:6], b[:6], 1e-5),
    "group": lambda x, w, b, m, v: aten.native_group_norm(x, w, b, 4, 8, 6, 2, 1e-5),
    "batch-train": lambda x, w, b, m, v: aten.native_batch_norm(x, w, b, m, v, True, 0.1, 1e-5),
    "batch-eval": lambda x, w, b, m, v: aten.native_batch_norm(x, w, b, m, v, False, 0.1, 1e-5),
    "batch-legit-no-stats": lambda x, w, b, m, v: aten._native_batch_norm_legit(x, w, b, True, 0.1, 1e-5),
}


def _layout(outputs):
    return [(t.dtype, tuple(t.shape), t.stride()) for t in outputs]


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("input_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("params", ["float32", "input dtype"])
def test_fake_outputs_have_the_dtype_shape_and_stride_of_the_cpu_kernels(norm, input_dtype, params):
    param_dtype = torch.float32 if params == "float32" else input_dtype
    args = (X.to(input_dtype), *(t.to(param_dtype) for t in (W, B, MEAN, VAR)))
    real = NORMS[norm](*args)
    with CpuKernelFakeTensorMode() as mode:
        fake = NORMS[norm](*(mode.from_tensor(t) for t in args))
    assert _layout(fake) == _layout(real)


def _layer_norm_backward(grad, x, w, b, m, v):
    _, mean, rstd = aten.native_layer_norm(x, [6], w[:6], b[:6], 1e-5)
    return aten.native_layer_norm_backward(grad, x, [6], mean, rstd, w[:6], b[:6], [True] * 3)


def _batch_norm_backward(grad, x, w, b, m, v):
    _, mean, invstd = aten.native_batch_norm(x, w, b, m.clone(), v.clone(), True, 0.1, 1e-5)
    return aten.native_batch_norm_backward(grad, x, w, m, v, mean, invstd, True, 1e-5, [True] * 3)


LAYOUTS = {"contiguous": lambda t: t, "transposed": lambda t: t.transpose(1, 2).contiguous().transpose(1, 2)}


@pytest.mark.parametrize("op", [_layer_norm_backward, _batch_norm_backward, NORMS["batch-train"]])
@pytest.mark.parametrize("grad_layout", LAYOUTS)
@pytest.mark.parametrize("input_layout", LAYOUTS)
@pytest.mark.parametrize("input_dtype", [torch.bfloat16, torch.float32])
def test_gradients_and_batch_norm_outputs_have_the_strides_of_the_cpu_kernels(
    op, grad_layout, input_layout, input_dtype
):
    """A LayerNorm over a permuted input (Swin) gets a contiguous input gradient from the CPU kernel, and a
    batch norm its output in the input's suggested memory format; the fake kernels followed the strides."""
    x, grad = (LAYOUTS[layout](t.to(input_dtype)) for layout, t in ((input_layout, X), (grad_layout, X + 1)))
    args = (grad, x, W, B, MEAN, VAR) if op is not NORMS["batch-train"] else (x, W, B, MEAN, VAR)
    real = op(*args)
    with CpuKernelFakeTensorMode() as mode:
        fake = op(*(mode.from_tensor(t) for t in args))
    assert _layout(fake) == _layout(real)


class _HeadNorms(nn.Module):
    """A block whose bf16 matmul output goes into float32 norms: a masked-LM head, a conv with BatchNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.dense, self.norm = nn.Linear(16, 16), nn.LayerNorm(16)
        self.conv, self.batch_norm, self.group_norm = (
            nn.Conv1d(4, 4, 3, padding=1),
            nn.BatchNorm1d(4),
            nn.GroupNorm(2, 4),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(nn.functional.gelu(self.dense(x)))
        return self.group_norm(self.batch_norm(self.conv(x)))


def test_a_fake_profile_under_cpu_autocast_predicts_every_plan_as_the_real_profile_does():
    torch.manual_seed(0)
    model = nn.Sequential(_HeadNorms(), _HeadNorms(), _HeadNorms())
    names = ["0", "1", "2"]
    batch = torch.randn(8, 4, 16)

    def step() -> torch.Tensor:
        with torch.autocast("cpu", torch.bfloat16, cache_enabled=False):
            return model(batch).float().square().mean()

    real = profile_step(model, step, names, "flops", batch=batch)
    model.zero_grad(set_to_none=True)
    with fake_model(model) as fake:
        batch = fake.fake(batch)
        profile = profile_step(model, step, names, "flops", batch=batch)
    assert sorted(s.nbytes for s in profile.storages) == sorted(s.nbytes for s in real.storages)
    for count in range(len(names) + 1):
        for checkpointed in itertools.combinations(names, count):
            assert predict_peak_bytes(profile, checkpointed) == predict_peak_bytes(real, checkpointed)
