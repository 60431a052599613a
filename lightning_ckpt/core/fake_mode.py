"""``FakeTensorMode`` whose outputs have the dtypes and strides the real kernels give them, its views made
by ATen's own view kernels.

On CPU, a normalization whose input is bf16 or fp16 and whose parameters are float32 (what autocast
leaves behind: a bf16 activation into a float32 LayerNorm, BatchNorm or GroupNorm) saves its statistics
(mean and rstd) in float32. torch's fake kernels for these ops (``torch._refs.native_layer_norm``, the
batch-norm decompositions, the group-norm meta kernel; torch 2.13) cast them to the input dtype on CPU,
so a profile on fake tensors under-counted each such saved statistic by half. Given float32 statistics,
the group-norm backward's fake kernel then returns a float32 gradient that autograd casts back, a
temporary the real kernel never makes. And their batch-norm outputs and layer-norm input gradients follow
the strides of a permuted input, where the CPU kernels lay them out contiguous (a copy that a later view
then makes on fake tensors only). This mode corrects these after torch's dispatch cache, which so
keeps torch's own results for any other mode.

It also runs the views (``view``, ``t``, ``transpose``, ``detach``, ...) of tensors with concrete shapes
straight on ATen's C++ view kernels, as the real step does, without the dispatch cache: FakeTensorMode
computes a ``view`` the cache has not seen with the Python reference ``_reshape_view_helper`` (2.5-5 ms on
this project's 2-core VM) and rebuilds every cached view from its entry (0.15-0.3 ms); the C++ kernel
takes 0.07-0.1 ms either way. Views are most of a training step's ops on fake tensors (autograd detaches
every saved tensor, a linear layer transposes its weight): the example GPT's first fake profile in a new
process took 0.70-0.93 CPU s, now 0.53-0.74 (five alternated pairs of processes, 2026-12-07).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from lightning_ckpt._compat import (
    FakeTensor,
    FakeTensorMode,
    has_composite_implicit_kernel,
    in_kernel_invocation_manager,
    suggest_memory_format,
)

__all__ = ["CpuKernelFakeTensorMode"]

_aten = torch.ops.aten
_NORMS_WITH_STATISTICS = frozenset(
    {
        _aten.native_layer_norm.default,
        _aten.native_group_norm.default,
        _aten.native_batch_norm.default,
        _aten._native_batch_norm_legit.default,
        _aten._native_batch_norm_legit.no_stats,
        _aten._native_batch_norm_legit_no_training.default,
    }
)
"""Ops whose outputs 1 and 2 are the saved mean and rstd (invstd) and whose tensor arguments after the
input are its parameters (weight, bias, running statistics)."""

_GROUP_NORM_BACKWARD = _aten.native_group_norm_backward.default
"""Its fake kernel (torch 2.13) gives the input's gradient the dtype of float32 statistics, not of the input."""

_BATCH_NORMS = _NORMS_WITH_STATISTICS - {_aten.native_layer_norm.default, _aten.native_group_norm.default}
_FIRST_OUTPUT_FORMAT = {
    **dict.fromkeys(_BATCH_NORMS, lambda args: suggest_memory_format(args[0])),
    _aten.native_batch_norm_backward.default: lambda args: suggest_memory_format(args[1]),
    _aten.native_layer_norm_backward.default: lambda args: torch.contiguous_format,
}
"""Per op, the memory format its CPU kernel gives its first output (the normalized input, or the input's
gradient), from its arguments: batch norm the one ATen suggests for the input, the layer-norm backward
always contiguous. Their fake kernels follow the input's or the incoming gradient's strides instead, and
a ``view`` of a permuted one then makes a copy the real step never makes (Swin: the gradient of a
LayerNorm over a transposed input)."""

_REDUCED_FLOATS = (torch.bfloat16, torch.float16)


class CpuKernelFakeTensorMode(FakeTensorMode):
    """A ``FakeTensorMode`` whose mixed-dtype CPU normalizations save float32 statistics, as the real
    kernels do (``param_scalar_type`` in ATen's CPU layer, group and batch norm), whose group-norm
    backward gives the input's gradient the input's dtype, as every kernel does, whose batch-norm
    outputs and layer-norm input gradients on CPU have the real kernels' strides, and whose views of
    fake tensors with concrete sizes run on ATen's view kernels.

    Example:
        >>> x, weight, bias = torch.ones(4, 8, dtype=torch.bfloat16), torch.ones(8), torch.zeros(8)
        >>> with CpuKernelFakeTensorMode() as mode:
        ...     out, mean, rstd = torch.ops.aten.native_layer_norm(
        ...         mode.from_tensor(x), [8], mode.from_tensor(weight), mode.from_tensor(bias), 1e-5
        ...     )
        >>> out.dtype, mean.dtype, torch.ops.aten.native_layer_norm(x, [8], weight, bias, 1e-5)[1].dtype
        (torch.bfloat16, torch.float32, torch.float32)
    """

    def dispatch(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if _plain_view(func) and self._concrete_fakes(args, kwargs):
            return self._view(func, types, args, kwargs or {})
        out = super().dispatch(func, types, args, kwargs or {})
        if func in _NORMS_WITH_STATISTICS and _mixed_on_cpu(args):
            out = (out[0], out[1].float(), out[2].float(), *out[3:])
        if func is _GROUP_NORM_BACKWARD and out[0] is not None and out[0].dtype != args[1].dtype:
            out = (out[0].to(args[1].dtype), *out[1:])
        if func in _FIRST_OUTPUT_FORMAT and out[0] is not None and out[0].device.type == "cpu":
            out = (out[0].contiguous(memory_format=_FIRST_OUTPUT_FORMAT[func](args)), *out[1:])
        return out

    def _concrete_fakes(self, args: Any, kwargs: Any) -> bool:
        """Whether every tensor argument is this mode's dense fake tensor with concrete sizes and no
        constant value (torch propagates constants, and symbolic sizes need its Python references)."""
        if self.shape_env is not None:
            return False
        tensors = [a for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor)]
        return bool(tensors) and all(
            isinstance(t, FakeTensor)
            and t.fake_mode is self
            and t.constant is None
            and t.layout == torch.strided
            for t in tensors
        )

    def _view(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        """``func``'s output from ATen's view kernel run on the fake tensors' meta data, on the input's
        device: the shape, strides and storage the real kernel gives (torch's own dispatch where that
        kernel is missing)."""
        try:
            with in_kernel_invocation_manager(self):
                out = func(*args, **kwargs)
        except NotImplementedError:
            return super().dispatch(func, types, args, kwargs)
        outs = [out] if isinstance(out, torch.Tensor) else out  # split, unbind: a list or tuple
        if any(type(t) is not torch.Tensor or t.device.type != "meta" for t in outs):
            return super().dispatch(func, types, args, kwargs)  # not a fresh view: torch's way
        device = args[0].fake_device
        views = [FakeTensor(self, t, device) for t in outs]
        return views[0] if isinstance(out, torch.Tensor) else type(out)(views)


@functools.cache
def _plain_view(func: Any) -> bool:
    """Whether ``func`` is an ATen view with a kernel of its own that changes no input's metadata
    (``transpose_`` does), found once per op from its schema: not one that decomposes (``to``,
    ``reshape``: they alias or copy). And ``_unsafe_view`` (``matmul``'s reshape of its result: a view
    that autograd does not track as one), which torch's cache never keeps: its Python reference ran on
    each call (a transformers Llama's 4 layers: 68 calls, 31 ms)."""
    return func is _aten._unsafe_view.default or (
        getattr(func, "is_view", False) is True  # an op overload's schema (not a packet's)
        and func.namespace == "aten"
        and func is not _aten.lift_fresh.default  # a real tensor's fake twin: torch makes it
        and torch.Tag.inplace_view not in func.tags
        and not has_composite_implicit_kernel(func)
    )


def _mixed_on_cpu(args: Any) -> bool:
    """Whether a normalization's input is a reduced float on CPU and one of its parameters is float32."""
    first, *rest = args
    return (
        first.device.type == "cpu"
        and first.dtype in _REDUCED_FLOATS
        and any(isinstance(arg, torch.Tensor) and arg.dtype == torch.float32 for arg in rest)
    )
