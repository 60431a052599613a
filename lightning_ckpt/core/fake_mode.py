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

And the other ops that make new tensors (``mm``, ``add``, ``silu``, ``cat``...) run on their meta kernels
with torch's device logic, which is what FakeTensorMode does on a miss of its cache, and their outputs'
layouts are kept by op and argument layouts: a later call with the same ones makes new fake tensors of
those layouts (0.15-0.2 ms, where a hit of torch's cache took 0.2-0.3 ms, most of it hashing the
arguments). The ops that FakeTensorMode runs as Python decompositions from ``torch._decomp``, each of
whose ops it then dispatches and caches one by one (``addmm``: 5-9 ms the first time), take their meta
kernels too (1.7-3.7 ms). Only outputs that are new dense tensors are kept (no alias of an input, no
offset); ops with fake implementations of their own (constructors, data-dependent ops, device moves),
constants, and the normalizations whose dtypes this mode corrects keep torch's dispatch. A 16-layer
transformers Llama's first plan took 1.70 CPU s before, 1.36 s with it (one run each, 2026-12-07).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from lightning_ckpt._compat import (
    FakeTensor,
    FakeTensorMode,
    fake_runs_meta_kernel,
    has_composite_implicit_kernel,
    in_kernel_invocation_manager,
    storage_key,
    suggest_memory_format,
    tree_leaves,
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
_KEEP_TORCH_DISPATCH = _NORMS_WITH_STATISTICS | {
    _GROUP_NORM_BACKWARD,
    _aten.native_batch_norm_backward.default,
}
"""Normalizations whose fake dtypes this mode corrects keep torch's dispatch: their meta kernels and
torch's decompositions disagree (``_native_batch_norm_legit``'s meta kernel saves float32 statistics of an
all-bf16 call, as its decomposition and the CPU kernel do not)."""


class CpuKernelFakeTensorMode(FakeTensorMode):
    """A ``FakeTensorMode`` whose mixed-dtype CPU normalizations save float32 statistics, as the real
    kernels do (``param_scalar_type`` in ATen's CPU layer, group and batch norm), whose group-norm
    backward gives the input's gradient the input's dtype, as every kernel does, whose batch-norm
    outputs and layer-norm input gradients on CPU have the real kernels' strides, and whose views of
    fake tensors with concrete sizes run on ATen's view kernels, and its other ops on their meta kernels,
    their output layouts kept.

    Example:
        >>> x, weight, bias = torch.ones(4, 8, dtype=torch.bfloat16), torch.ones(8), torch.zeros(8)
        >>> with CpuKernelFakeTensorMode() as mode:
        ...     out, mean, rstd = torch.ops.aten.native_layer_norm(
        ...         mode.from_tensor(x), [8], mode.from_tensor(weight), mode.from_tensor(bias), 1e-5
        ...     )
        >>> out.dtype, mean.dtype, torch.ops.aten.native_layer_norm(x, [8], weight, bias, 1e-5)[1].dtype
        (torch.bfloat16, torch.float32, torch.float32)
    """

    _meta_outputs: dict[tuple, tuple] = {}
    """The output layouts each op's meta kernel gave, by op and argument layouts (per process, like
    FakeTensorMode's own cache)."""

    def dispatch(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if _plain_view(func) and self._concrete_fakes(args, kwargs):
            return self._view(func, types, args, kwargs or {})
        if _on_meta(func) and self._concrete_fakes(args, kwargs):
            out = self._on_meta_kernel(func, types, args, kwargs or {})
        else:
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
        values = [*args, *(kwargs or {}).values()]
        values += [
            item for value in values if isinstance(value, (list, tuple)) for item in value
        ]  # cat's list
        tensors = [a for a in values if isinstance(a, torch.Tensor)]
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

    def _on_meta_kernel(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        """``func``'s outputs from its meta kernel, wrapped with torch's device logic (what FakeTensorMode
        does for an op without a decomposition), or remade from the layouts it gave for the same argument
        layouts before; torch's own dispatch where the kernel is missing."""
        key = _layout_key(func, args, kwargs)
        layouts = self._meta_outputs.get(key) if key is not None else None
        if layouts is not None:
            with in_kernel_invocation_manager(self):
                return _remade(self, layouts)
        try:
            with in_kernel_invocation_manager(self):
                out = func(*args, **kwargs)
        except NotImplementedError:
            return super().dispatch(func, types, args, kwargs)
        flat = tree_leaves((args, kwargs))  # cat's list too
        out = self.wrap_meta_outputs_with_default_device_logic(out, func, flat, device=None)  # no device arg
        layouts = _fresh_layouts(self, out, flat)
        if key is not None and layouts is not None:
            self._meta_outputs[key] = layouts
        return out


@functools.cache
def _on_meta(func: Any) -> bool:
    """Whether ``func`` runs here on its meta kernel, its outputs' layouts kept: an ATen op that makes new
    tensors (not a view, mutating nothing, its outputs not sized by data, no ``device`` argument) that
    FakeTensorMode computes with its meta kernel or in its place with a Python decomposition (``addmm``,
    ``native_layer_norm_backward``), not with a fake implementation of its own."""
    schema = func._schema
    return (
        func.namespace == "aten"
        and func not in _KEEP_TORCH_DISPATCH
        and not schema.is_mutable
        and not func.is_view
        and torch.Tag.view_copy not in func.tags
        and torch.Tag.dynamic_output_shape not in func.tags
        and torch.Tag.data_dependent_output not in func.tags
        and all(argument.name != "device" for argument in schema.arguments)
        and not has_composite_implicit_kernel(func)
        and fake_runs_meta_kernel(func)
    )


def _layout_key(func: Any, args: Any, kwargs: Any) -> tuple | None:
    """``func`` and what its meta kernel reads of its arguments (a tensor's layout and device, other
    values by type and value), or None where an argument has no such key."""
    parts: list = [func]
    for value in (*args, *kwargs.items()):
        part = _argument_key(value)
        if part is None:
            return None
        parts.append(part)
    return tuple(parts)


_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


def _argument_key(value: Any) -> Any:
    if isinstance(value, FakeTensor):
        flags = (value.is_conj(), value.is_neg(), value.requires_grad)
        return (
            FakeTensor,
            value.shape,
            value.stride(),
            value.storage_offset(),
            value.dtype,
            value.fake_device,
            flags,
        )
    if type(value) in _PLAIN:
        return (type(value), value)
    if isinstance(value, (tuple, list)):
        parts = tuple(_argument_key(item) for item in value)
        return None if None in parts else (type(value), parts)
    return None


def _fresh_layouts(mode: FakeTensorMode, out: Any, flat_args: list) -> tuple | None:
    """``(kind, layouts)`` of outputs that are new dense tensors of ``mode`` (None where one is not: an
    alias, an offset or a storage other than ``empty_strided`` of its layout makes, a constant)."""
    outs = [out] if isinstance(out, torch.Tensor) else out
    if not isinstance(outs, (tuple, list)):
        return None
    inputs = {storage_key(a.untyped_storage()) for a in flat_args if isinstance(a, torch.Tensor)}
    layouts, seen = [], set()
    for t in outs:
        if t is None:
            layouts.append(None)
            continue
        if not (
            type(t) is FakeTensor and t.fake_mode is mode and t.constant is None and t.storage_offset() == 0
        ):
            return None
        storage = t.untyped_storage()  # a new wrapper each call: compared by its StorageImpl
        key = storage_key(storage)
        if key in inputs or key in seen or t.is_conj() or t.is_neg():
            return None
        seen.add(key)
        layout = (t.shape, t.stride(), t.dtype, t.fake_device)
        if _meta_tensor(layout).untyped_storage().nbytes() != storage.nbytes():
            return None
        layouts.append(layout)
    kind = None if isinstance(out, torch.Tensor) else type(out)
    return kind, tuple(layouts)


def _remade(mode: FakeTensorMode, layouts: tuple) -> Any:
    """New fake tensors of ``mode`` with the layouts ``_fresh_layouts`` kept."""
    kind, parts = layouts
    outs = [None if part is None else FakeTensor(mode, _meta_tensor(part), part[3]) for part in parts]
    return outs[0] if kind is None else kind(outs)


def _meta_tensor(layout: tuple) -> torch.Tensor:
    shape, stride, dtype, _ = layout
    return torch.empty_strided(shape, stride, dtype=dtype, device="meta")


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
