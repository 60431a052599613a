"""The fake mode profiles run under gives mixed-dtype CPU normalizations the dtypes the real kernels give.

A bf16 activation into a float32 LayerNorm, BatchNorm or GroupNorm (what CPU autocast leaves behind) saves
float32 statistics on CPU; torch's fake kernels saved them in bf16. BERT's masked-LM head under
bf16-mixed was then under-predicted by 512 bytes and ran out of memory at the advised minimum. Its views
run on ATen's view kernels: the real views' layouts and storages, torch's way where it must be.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn as nn

from lightning_ckpt._compat import FakeTensor, FakeTensorMode
from lightning_ckpt.core import fake_mode
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


VIEWS = {
    "view": lambda x: x.view(4, 48),
    "t": lambda x: x[0].t(),
    "transpose": lambda x: x.transpose(0, 2),
    "detach": lambda x: x.detach(),
    "permute": lambda x: x.permute(2, 0, 1),
    "expand": lambda x: x[:, :1].expand(4, 5, 6),
    "select": lambda x: x[1],
    "slice": lambda x: x[:, 2:7:2],
    "unsqueeze": lambda x: x.unsqueeze(1),
    "squeeze": lambda x: x[:, :1].squeeze(1),
    "as_strided": lambda x: x.as_strided((3, 3), (7, 2), 5),
    "split": lambda x: x.split(3, dim=1),
    "unbind": lambda x: x.unbind(2),
    "view of a slice": lambda x: x[:, 2:4].view(4, 12),
    "_unsafe_view": lambda x: aten._unsafe_view(x, [32, 6]),
}


def _view_layouts(outputs, base):
    outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    return [
        (type(outputs).__name__, t.dtype, t.device, tuple(t.shape), t.stride(), t.storage_offset())
        for t in outputs
    ], all(t.untyped_storage()._cdata == base.untyped_storage()._cdata for t in outputs)


@pytest.mark.parametrize("view", VIEWS)
def test_views_run_on_aten_kernels_with_the_real_layout_and_the_input_storage(view):
    """Views take ATen's C++ kernels, not torch's cache and Python references: the same shape, strides,
    offset and storage as a real view, and FakeTensorMode's cache neither hit nor filled."""
    real = torch.randn(4, 8, 6)
    with CpuKernelFakeTensorMode() as mode:
        fake = mode.from_tensor(real)
        before = (FakeTensorMode.cache_hits, FakeTensorMode.cache_misses, dict(FakeTensorMode.cache_bypasses))
        out = VIEWS[view](fake)
        after = (FakeTensorMode.cache_hits, FakeTensorMode.cache_misses, dict(FakeTensorMode.cache_bypasses))
    outputs = out if isinstance(out, (list, tuple)) else [out]
    assert all(isinstance(t, FakeTensor) and t.fake_mode is mode for t in outputs)
    assert _view_layouts(out, fake)[0] == _view_layouts(VIEWS[view](real), real)[0]
    assert _view_layouts(out, fake)[1]  # they alias the input's storage, as a real view does
    assert after == before


def test_views_torch_must_make_take_its_own_way():
    """A view of a constant (torch propagates its value), of a fake tensor of another mode, and a view
    that cannot be made keep torch's behaviour."""
    with CpuKernelFakeTensorMode() as mode:
        constant = torch.tensor([3.0])  # lifted: a fake tensor with its (one) value as a constant
        assert constant.constant is not None
        assert [v.constant.tolist() for v in (constant.view(1, 1), constant.detach())] == [[[3.0]], [3.0]]
        with pytest.raises(RuntimeError, match="view size is not compatible"):
            mode.from_tensor(torch.randn(4, 6)).t().view(24)
    with CpuKernelFakeTensorMode() as other:
        foreign = other.from_tensor(torch.randn(4, 6))
    with pytest.raises(Exception, match="[Mm]ode"):
        with CpuKernelFakeTensorMode():
            foreign.view(24)


def test_a_fake_step_under_autograd_keeps_views_aliased():
    """Saved views (autograd's detach of each saved tensor, a weight's transpose) share their base's
    storage: a fake profile counts each storage once, as the real one does."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 6))
    x = torch.randn(4, 8, 6)
    real = profile_step(model, lambda: model(x).square().mean(), ["0", "2"], "flops")
    with fake_model(model) as fake:
        fake_x = fake.fake(x)
        faked = profile_step(model, lambda: model(fake_x).square().mean(), ["0", "2"], "flops")
    assert [m.activation_bytes for m in faked.modules] == [m.activation_bytes for m in real.modules]
    assert faked.storages == real.storages and faked.phases == real.phases


def _layer_norm_backward_args(x):
    weight, bias = x[0, 0] + 1, x[0, 1]
    _, mean, rstd = aten.native_layer_norm(x, [6], weight, bias, 1e-5)
    return x * 2, x, [6], mean, rstd, weight, bias, [True] * 3


ON_META = {  # ops run on their meta kernels, outputs kept by layout (the first four: torch decomposes them)
    "addmm": (aten.addmm, lambda x: (x[0, 0], x[0].t(), x[1])),
    "addmm bf16": (aten.addmm, lambda x: tuple(t.bfloat16() for t in (x[0, 0], x[0].t(), x[1]))),
    "gelu_backward": (aten.gelu_backward, lambda x: (x.transpose(0, 1) * 2, x.transpose(0, 1))),
    "native_layer_norm_backward": (aten.native_layer_norm_backward, _layer_norm_backward_args),
    "_log_softmax": (aten._log_softmax, lambda x: (x, 1, False)),
    "nll_loss_forward": (
        aten.nll_loss_forward,
        lambda x: (x[0], torch.tensor([1, 0, 5, 3, 2, 4, 0, 1]), None, 1, -100),
    ),
}


@pytest.mark.parametrize("op", ON_META)
def test_ops_run_on_meta_kernels_with_the_real_layouts_then_from_their_layouts(op):
    """An op runs once on its meta kernel (one that FakeTensorMode would decompose too), then is made
    again from the output layouts it gave: the real kernel's dtype, shape and strides both times, new storages each
    time, and FakeTensorMode's cache neither hit nor filled."""
    func, make_args = ON_META[op]
    real = torch.randn(4, 8, 6)
    expected = func(*make_args(real))
    expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
    with CpuKernelFakeTensorMode() as mode:
        args = make_args(mode.from_tensor(real))
        before = (FakeTensorMode.cache_hits, FakeTensorMode.cache_misses, dict(FakeTensorMode.cache_bypasses))
        runs = [func(*args)]
        kept = len(CpuKernelFakeTensorMode._meta_outputs)
        runs.append(func(*args))
        after = (FakeTensorMode.cache_hits, FakeTensorMode.cache_misses, dict(FakeTensorMode.cache_bypasses))
    assert len(CpuKernelFakeTensorMode._meta_outputs) == kept  # made again from the layouts kept
    storages = set()
    for out in runs:
        outputs = [out] if isinstance(out, torch.Tensor) else list(out)
        assert all(
            isinstance(t, FakeTensor) and t.fake_mode is mode and t.device.type == "cpu" for t in outputs
        )
        assert _layout(outputs) == _layout(expected)
        storages |= {t.untyped_storage()._cdata for t in outputs}
    inputs = {a.untyped_storage()._cdata for a in args if isinstance(a, torch.Tensor)}
    assert len(storages) == 2 * len(expected) and not storages & inputs
    assert after == before


def test_ops_torch_must_make_take_its_own_way():
    """An op of a constant (whose value torch may propagate) takes torch's dispatch, and the route is
    taken only for ops that make new tensors and that FakeTensorMode runs on meta kernels or decomposes."""
    with CpuKernelFakeTensorMode():
        constant = torch.tensor([[1.0, 2.0]])  # lifted: a fake tensor holding its value
        seen = FakeTensorMode.cache_misses + FakeTensorMode.cache_hits
        out = aten._log_softmax(constant, 1, False)
        assert (
            FakeTensorMode.cache_misses
            + FakeTensorMode.cache_hits
            + sum(FakeTensorMode.cache_bypasses.values())
            > seen
        )
    assert tuple(out.shape) == (1, 2)
    assert all(fake_mode._on_meta(op) for op in (aten.addmm.default, aten.mm.default, aten.add.Tensor))
    assert not fake_mode._on_meta(aten.add_.Tensor)  # mutates its input
    assert not fake_mode._on_meta(aten._native_batch_norm_legit.default)  # its dtypes corrected here
    assert not fake_mode._on_meta(aten.nonzero.default)  # sized by data
    assert not fake_mode._on_meta(aten._to_copy.default)  # may move devices: torch's own fake implementation
    assert not fake_mode._on_meta(aten.view.default)  # a view: ATen's view kernel, above


def test_only_new_dense_outputs_have_their_layouts_kept():
    """An output that aliases an input, two outputs on one storage, or one at an offset is not kept:
    made again from a layout, it would get a storage of its own."""
    with CpuKernelFakeTensorMode() as mode:
        x = mode.from_tensor(torch.randn(4, 4))
        y = x * 2
        assert fake_mode._fresh_layouts(mode, y, [x]) is not None
        assert fake_mode._fresh_layouts(mode, x, [x]) is None
        assert fake_mode._fresh_layouts(mode, (y, y), [x]) is None
        assert fake_mode._fresh_layouts(mode, y[1], [x]) is None


def test_the_storage_tracker_answers_a_fake_tensors_device_itself():
    """C++ asks a fake tensor its device thousands of times a step (``prim.device``); the live-storage
    tracker above the fake mode answers as the mode's handler would (cpu, meta inside a kernel), without
    dispatching it through the mode."""
    from lightning_ckpt.core.storage import LiveStorageTracker

    asked = []

    class Counting(CpuKernelFakeTensorMode):
        def dispatch(self, func, types, args=(), kwargs=None):
            asked.append(func)
            return super().dispatch(func, types, args, kwargs)

    mode = Counting()
    x = mode.from_tensor(torch.randn(4, 6))
    with mode, LiveStorageTracker() as tracker:
        y = torch.nn.functional.linear(x, x)  # the linear's argument parsing asks both devices
        assert y.device == torch.device("cpu") and tracker.peak_bytes == 4 * 4 * 4
    with mode:
        z = torch.nn.functional.linear(x, x)
    assert torch.ops.prim.device.default not in [f for f in asked[: asked.index(aten.mm.default) + 1]]
    assert torch.ops.prim.device.default in asked  # without the tracker the mode answers
    assert z.device == y.device


def test_kept_layouts_are_told_apart_by_the_inputs_strides_and_dtype():
    """The same op on inputs of one shape but other strides or dtype is not served the first call's
    layout: each gets the real kernel's strides and dtype."""
    real = torch.randn(6, 6)
    inputs = {"contiguous": real, "transposed": real.t(), "bf16": real.bfloat16(), "again": real}
    with CpuKernelFakeTensorMode() as mode:
        fakes = {name: mode.from_tensor(t) for name, t in inputs.items()}
        outs = {name: aten.silu(fake) for name, fake in fakes.items()}
    for name, t in inputs.items():
        assert _layout([outs[name]]) == _layout([aten.silu(t)]), name
    assert outs["transposed"].stride() != outs["contiguous"].stride()
