"""Every private torch and Lightning name the package uses, in one place.

Each entry says what it is for and the versions it was checked against (torch 2.13.0, lightning 2.6.6;
the package requires torch>=2.4, lightning>=2.4, and each of these exists there too). When a release moves
one of them, this file is the only one to change. Lightning names are imported on first use, so that the
torch-only layers (``lightning_ckpt.core``) never import Lightning.
"""

from __future__ import annotations

import contextlib
import inspect
import weakref
from collections.abc import Callable, Generator, Iterator
from typing import Any

import torch
from torch._prims_common import suggest_memory_format  # torch 2.13 (private): ATen's rule, in Python
from torch._subclasses.fake_tensor import (  # torch 2.4-2.13 (the manager: FakeTensors run as meta ones)
    FakeTensor,
    FakeTensorMode,
    in_kernel_invocation_manager,
    unset_fake_temporarily,
)
from torch.nn.modules.batchnorm import _NormBase  # torch 2.4-2.13: BatchNorm/InstanceNorm base
from torch.utils._python_dispatch import (  # torch 2.4-2.13 (the last two: wrapper subclasses, DTensor)
    TorchDispatchMode,
    is_traceable_wrapper_subclass,
    is_traceable_wrapper_subclass_type,
)
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map_only, tree_unflatten  # torch 2.4-2.13
from torch.utils.checkpoint import _checkpoint_without_reentrant_generator  # torch 2.4-2.13

try:  # torch 2.5-2.13: FlopCounterMode's own dispatch mode, apart from its module tracker
    from torch.utils.flop_counter import _FlopCounterMode as FlopDispatchMode
except ImportError:  # torch 2.4: the counter is its own dispatch mode
    FlopDispatchMode = None

from torch._ops import HigherOrderOperator  # torch 2.4-2.13: cond, while_loop, flex_attention and the like

__all__ = [
    "CHECKPOINT_WRAPPER_CLASS",
    "COMPILED_MODULE_CLASS",
    "WRAPPER_NAME_PARTS",
    "FakeTensor",
    "FakeTensorMode",
    "FlopDispatchMode",
    "HigherOrderOperator",
    "NormBase",
    "TorchDispatchMode",
    "autocast_enabled",
    "checkpoint_region",
    "collect_rng_states",
    "compiled_by_lightning",
    "composable_api_names",
    "convert_precision",
    "default_foreach",
    "fake_module_conversions",
    "fake_runs_meta_kernel",
    "fsdp2_is_root",
    "fsdp2_param_dtype",
    "fsdp2_post_forward_mesh_getter",
    "fsdp2_post_forward_mesh_infos",
    "fsdp_policy_classes",
    "give_device_mesh",
    "grouped_mm_on_fake_tensors",
    "has_composite_implicit_kernel",
    "in_kernel_invocation_manager",
    "init_fake_process_group",
    "inner_tensors",
    "is_traceable_wrapper_subclass",
    "is_traceable_wrapper_subclass_type",
    "lightning_device_mesh",
    "original_storage_resize",
    "set_rng_states",
    "storage_key",
    "suggest_memory_format",
    "strategy_checkpointing_kwargs",
    "tree_flatten",
    "tree_leaves",
    "tree_map_only",
    "tree_unflatten",
    "unset_fake_temporarily",
]

NormBase = _NormBase

CHECKPOINT_WRAPPER_CLASS = "CheckpointWrapper"
"""Class name of ``torch.distributed.algorithms._checkpoint.checkpoint_wrapper.CheckpointWrapper``
(torch 2.4-2.13), matched by name so that torch.distributed is only imported where it is used."""

COMPILED_MODULE_CLASS = "OptimizedModule"
"""Class name of ``torch._dynamo.eval_frame.OptimizedModule``, what ``torch.compile(module)`` returns."""

WRAPPER_NAME_PARTS = frozenset(
    {"_fsdp_wrapped_module", "_orig_mod", "_checkpoint_wrapped_module", "_forward_module"}
)
"""Submodule names that wrappers insert: FSDP (torch 2.4-2.13), torch.compile (``_orig_mod``), torch's
``checkpoint_wrapper`` and Lightning's ``_LightningModuleWrapperBase`` (``_forward_module``, 2.4-2.6)."""


def storage_key(storage: torch.UntypedStorage) -> int:
    """An id for a storage, stable while it is alive: the address of its C++ ``StorageImpl``
    (``UntypedStorage._cdata``, torch 2.4-2.13)."""
    return storage._cdata


def inner_tensors(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The tensors a wrapper subclass (``DTensor``: its local shard) holds, read with its ``__tensor_flatten__``
    (torch 2.4-2.13; DTensor lists ``_local_tensor`` and, in 2.13, its mesh: not a tensor, left out)."""
    names, _ = tensor.__tensor_flatten__()
    return [inner for inner in (getattr(tensor, name) for name in names) if isinstance(inner, torch.Tensor)]


original_storage_resize = torch.UntypedStorage.resize_
"""``UntypedStorage.resize_``: FSDP2 frees and re-allocates its unsharded parameters by resizing their
storages (``free_storage``/``alloc_storage`` in ``torch.distributed.fsdp._fully_shard._fsdp_param``,
torch 2.4-2.13), which no dispatch mode sees; the live-storage counter wraps it while it counts (as
torch's own ``torch.distributed._tools.mem_tracker`` does)."""


def fsdp2_is_root(module: Any) -> bool:
    """Whether a ``fully_shard``-ed module is FSDP2's root, the one its iteration state lives on
    (``FSDPModule._get_fsdp_state()._is_root``, set by its first forward; torch 2.4-2.13)."""
    return bool(getattr(module._get_fsdp_state(), "_is_root", False))


def fsdp2_param_dtype(module: Any) -> Any:
    """The ``MixedPrecisionPolicy.param_dtype`` a ``fully_shard``-ed module computes in (None: its
    parameters' own dtype): ``mp_policy`` of the ``FSDPParamGroup`` of ``FSDPModule._get_fsdp_state()``
    (``_fsdp_param_groups``, torch 2.13; ``_fsdp_param_group`` before)."""
    state = module._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None) or [getattr(state, "_fsdp_param_group", None)]
    dtypes = [group.mp_policy.param_dtype for group in groups if group is not None]
    return dtypes[0] if dtypes else None


def fsdp2_post_forward_mesh_infos(module: Any) -> list[Any]:
    """The meshes a ``fully_shard``-ed module's parameters are resharded to after its forward, where that
    is not their own mesh (``reshard_after_forward`` an int): ``post_forward_mesh_info`` of each
    ``FSDPParamGroup`` of ``FSDPModule._get_fsdp_state()`` (``_fsdp_param_groups``, torch 2.13;
    ``_fsdp_param_group`` before)."""
    state = module._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None) or [getattr(state, "_fsdp_param_group", None)]
    pairs = [(group.post_forward_mesh_info, group.mesh_info) for group in groups if group is not None]
    return [post for post, own in pairs if post is not None and post is not own]


@contextlib.contextmanager
def fsdp2_post_forward_mesh_getter(wrap: Callable[[Callable], Callable]) -> Iterator[None]:
    """While the block runs, ``fully_shard`` gets the mesh ``reshard_after_forward=int`` reshards to from
    ``wrap(original)``: ``_get_post_forward_mesh_info`` of ``torch.distributed.fsdp._fully_shard._fsdp_init``
    and of ``_fully_shard``, which imports it by name (torch 2.6-2.13; else nothing is replaced)."""
    try:
        from torch.distributed.fsdp._fully_shard import _fsdp_init, _fully_shard
    except ImportError:
        yield
        return
    modules = [m for m in (_fsdp_init, _fully_shard) if hasattr(m, "_get_post_forward_mesh_info")]
    originals = [m._get_post_forward_mesh_info for m in modules]
    for module, original in zip(modules, originals, strict=True):
        module._get_post_forward_mesh_info = wrap(original)
    try:
        yield
    finally:
        for module, original in zip(modules, originals, strict=True):
            module._get_post_forward_mesh_info = original


@contextlib.contextmanager
def fake_module_conversions() -> Iterator[None]:
    """While the block runs, ``Module.to()`` (``.float()``...) works on a module made under ``FakeTensorMode``,
    as libraries call it in their constructors (peft: each adapter to its base layer's device and dtype).
    torch 2.13 (pytorch#152539) swaps a fake parameter for its copy with ``torch.utils.swap_tensors``, which
    refuses a tensor held by weak reference, as FakeTensorMode's converter memos hold it (pytorch#148977).
    Here such a tensor is first dropped from those memos (a cached conversion, made again if asked).

    Example:
        >>> with FakeTensorMode(), fake_module_conversions():
        ...     linear = torch.nn.Linear(2, 2).to(torch.float64)
        >>> type(linear.weight).__name__, linear.weight.dtype
        ('FakeTensor', torch.float64)
    """
    original = torch.utils.swap_tensors

    def swap_tensors(t1: torch.Tensor, t2: torch.Tensor) -> None:
        for tensor in (t1, t2):
            if isinstance(tensor, FakeTensor):
                _drop_from_fake_memos(tensor)
        original(t1, t2)

    torch.utils.swap_tensors = swap_tensors
    try:
        yield
    finally:
        torch.utils.swap_tensors = original


def _drop_from_fake_memos(tensor: FakeTensor) -> None:
    """Remove ``tensor`` from its mode's converter memos that hold their values by weak reference
    (``WeakValueDictionary``: torch 2.13's ``tensor_memo`` of the converter and of its meta converter)."""
    converter = tensor.fake_mode.fake_tensor_converter
    for memo in (
        getattr(converter, "tensor_memo", None),
        getattr(converter.meta_converter, "tensor_memo", None),
    ):
        if isinstance(memo, weakref.WeakValueDictionary):
            for key in [key for key, ref in list(memo.data.items()) if ref() is tensor]:
                del memo.data[key]


_GROUPED_MM = getattr(getattr(torch.ops.aten, "_grouped_mm", None), "default", None)
"""``aten._grouped_mm`` (torch 2.8-2.13; None before): the experts' matmuls of Qwen2-MoE, Mixtral, OLMoE..."""


@contextlib.contextmanager
def grouped_mm_on_fake_tensors() -> Iterator[None]:
    """While the block runs, ``torch._grouped_mm`` works on fake tensors of any floating dtype, as its CPU and
    CUDA kernels do (torch 2.9-2.13). Its meta kernel (torch 2.13) accepts only bf16, so a mixture-of-experts
    model in float32 or bf16-mixed (transformers casts the experts' input to fp32 weights) could not be
    profiled on fake tensors. Here such a call runs the meta kernel on bf16 stand-ins (the same checks) and
    returns the real kernel's dtype (``out_dtype``, else the inputs'). bf16 calls are left as they are.

    Example:
        >>> a, b = torch.ones(12, 8), torch.ones(3, 8, 8)
        >>> offs = torch.tensor([4, 8, 12], dtype=torch.int32)
        >>> with FakeTensorMode() as mode, grouped_mm_on_fake_tensors():
        ...     out = torch._grouped_mm(mode.from_tensor(a), mode.from_tensor(b), offs=mode.from_tensor(offs))
        >>> type(out).__name__, tuple(out.shape), out.dtype
        ('FakeTensor', (12, 8), torch.float32)
    """
    from torch._subclasses import fake_impls

    table = fake_impls.op_implementations_dict
    if _GROUPED_MM is None or _GROUPED_MM in table:  # no such op, or installed already (nested)
        yield
        return
    table[_GROUPED_MM] = _grouped_mm_in_any_float
    try:
        yield
    finally:
        table.pop(_GROUPED_MM, None)


def _grouped_mm_in_any_float(fake_mode: FakeTensorMode, func: Any, *args: Any, **kwargs: Any) -> Any:
    """``_grouped_mm``'s meta kernel run on bf16 stand-ins of non-bf16 floating inputs (see above)."""
    dtype = args[0].dtype
    if dtype == torch.bfloat16 or not dtype.is_floating_point:
        return NotImplemented  # torch's own meta kernel: its own checks and errors
    out_dtype = kwargs.get("out_dtype", args[4] if len(args) > 4 else None) or dtype

    def stand_in(value: Any) -> Any:
        is_input = isinstance(value, torch.Tensor) and value.dtype == dtype
        return value.to(torch.bfloat16) if is_input else value

    with in_kernel_invocation_manager(fake_mode):
        out = func(*map(stand_in, args), **{key: stand_in(value) for key, value in kwargs.items()})
        if out.dtype != out_dtype:
            out = out.to(out_dtype)
    return FakeTensor(fake_mode, out, args[0].fake_device)


def lightning_device_mesh(pl_module: Any) -> Any:
    """The device mesh ``ModelParallelStrategy`` gives the module before ``configure_model``
    (``LightningModule._device_mesh``, lightning 2.4-2.6), or None."""
    return getattr(pl_module, "_device_mesh", None)


def give_device_mesh(pl_module: Any, device_mesh: Any) -> None:
    """Give a module the device mesh as ``ModelParallelStrategy.setup_environment`` does (lightning 2.4-2.6)."""
    pl_module._device_mesh = device_mesh


def init_fake_process_group(world_size: int) -> None:
    """Make this process rank 0 of torch's fake process group of ``world_size`` ranks: collectives move
    no data (``torch.testing._internal.distributed.fake_pg``, backend ``"fake"``; torch 2.4-2.13)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.distributed.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)


def autocast_enabled() -> bool:
    """Whether any autocast is on for any device (``torch._C._is_any_autocast_enabled``, torch 2.4-2.13)."""
    return torch._C._is_any_autocast_enabled()


def collect_rng_states() -> dict[str, Any]:
    """Lightning's snapshot of every RNG (torch CPU and CUDA, numpy, python), lightning 2.4-2.6."""
    from lightning.fabric.utilities.seed import _collect_rng_states

    return _collect_rng_states(include_cuda=torch.cuda.is_available())


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore a :func:`collect_rng_states` snapshot (lightning 2.4-2.6)."""
    from lightning.fabric.utilities.seed import _set_rng_states

    _set_rng_states(states)


def convert_precision(precision: Any) -> str:
    """Lightning's unified precision name (``32`` -> ``"32-true"``), lightning 2.4-2.6."""
    from lightning.fabric.connector import _convert_precision_to_unified_args

    return str(_convert_precision_to_unified_args(precision))


def strategy_checkpointing_kwargs(strategy: Any) -> Any:
    """The FSDP strategy's ``activation_checkpointing_policy`` as it keeps it (lightning 2.4-2.6), or None."""
    return getattr(strategy, "_activation_checkpointing_kwargs", None)


def compiled_by_lightning(module: Any) -> bool:
    """Whether Lightning compiled the module (``LightningModule._compiler_ctx``, lightning 2.4-2.6)."""
    return bool(getattr(module, "_compiler_ctx", None))


def fsdp_policy_classes(policy: Any) -> list[type] | None:
    """The classes of a ``ModuleWrapPolicy`` (``_module_classes``, torch 2.4-2.13), or None."""
    classes = getattr(policy, "_module_classes", None)
    return None if classes is None else list(classes)


def _region_options() -> list[tuple[str, Any]]:
    """The generator's parameters between ``fn`` and ``*args`` as (name, value): torch's defaults, RNG
    state preserved."""
    options = []
    for parameter in list(inspect.signature(_checkpoint_without_reentrant_generator).parameters.values())[1:]:
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            return options
        options.append(
            (parameter.name, True if parameter.name == "preserve_rng_state" else parameter.default)
        )
    raise TypeError("torch.utils.checkpoint._checkpoint_without_reentrant_generator takes no *args any more")


_REGION_OPTIONS = _region_options()


def checkpoint_region(
    recompute: Callable[..., Any], *args: Any, context_fn: Callable[[], Any] | None = None
) -> Generator[None, None, None]:
    """Torch's non-reentrant checkpoint split at the forward: the first ``next()`` starts saving tensors as
    recomputable, the second ends it; backward then calls ``recompute(*args)`` with the RNG state restored.

    ``torch.utils.checkpoint._checkpoint_without_reentrant_generator`` (torch 2.4-2.13; what
    ``torch.utils.checkpoint.checkpoint`` and the composable ``checkpoint`` run). Its options come before
    ``*args``, and newer releases added ``early_stop`` among them (2.13 has it, older ones do not), so they
    are passed by position as its signature lists them: torch's defaults, RNG state preserved, and
    ``context_fn`` (selective checkpointing's two dispatch modes) when one is given.
    """
    options = [
        context_fn if name == "context_fn" and context_fn else value for name, value in _REGION_OPTIONS
    ]
    return _checkpoint_without_reentrant_generator(recompute, *options, *args)


def composable_api_names(module: Any) -> list[str]:
    """Names of torch's composable APIs applied to ``module`` (``"checkpoint"``, ``"fully_shard"``...), read
    with ``torch.distributed._composable.contract._get_registry`` (torch 2.4-2.13; ``{}`` or None if none)."""
    if not torch.distributed.is_available():
        return []
    from torch.distributed._composable.contract import _get_registry

    return list(_get_registry(module) or {})


def default_foreach(params: list[torch.Tensor]) -> bool:
    """Whether a torch optimizer left at ``foreach=None`` runs its foreach kernels on ``params``
    (``torch.optim.optimizer._default_to_fused_or_foreach``, torch 2.4-2.13): on CUDA yes, on CPU no."""
    from torch.optim.optimizer import _default_to_fused_or_foreach

    return bool(_default_to_fused_or_foreach(list(params), differentiable=False, use_fused=False)[1])


def fake_runs_meta_kernel(op: Any) -> bool:
    """Whether FakeTensorMode computes the op overload ``op`` (concrete sizes, no constants) with its meta
    kernel, or in its place with a Python decomposition (``torch._decomp``), not with a fake implementation
    of its own (``fake_impls``' table and checks: constructors, data-dependent ops...; torch 2.4-2.13)."""
    from torch._subclasses import fake_impls

    if op in fake_impls.op_implementations_dict or any(
        is_it(op) for is_it, _ in fake_impls.op_implementations_checks
    ):
        return False
    return torch._C._dispatch_has_computed_kernel_for_dispatch_key(op.name(), "Meta")


def has_composite_implicit_kernel(op: Any) -> bool:
    """Whether the op overload ``op`` has a C++ or Python ``CompositeImplicitAutograd`` kernel: the only
    case where ``op.decompose(...)`` does anything (torch 2.4-2.13: ``OpOverload.decompose``).

    Example:
        >>> has_composite_implicit_kernel(torch.ops.aten.mm.default)
        False
        >>> has_composite_implicit_kernel(torch.ops.aten.linear.default)
        True
    """
    key = torch._C.DispatchKey.CompositeImplicitAutograd
    return key in op.py_kernels or torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key)
