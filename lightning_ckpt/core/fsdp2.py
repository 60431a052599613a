"""FSDP2 (``torch.distributed.fsdp.fully_shard``) as the planner meets it: which models it shards, the
sharding it can plan for, and the per-iteration state that extra forwards must not leave behind.

A model sharded by ``fully_shard`` keeps each parameter as a ``DTensor`` whose local shard is this rank's
memory (:func:`lightning_ckpt.core.storage.storages_of`). Its forward and backward gather the unsharded
parameters unit by unit and reduce-scatter the gradients; the profile runs FSDP2 itself on fake tensors,
so all of that is measured, not modelled. Only data parallelism is planned for: every parameter sharded
``Shard(0)`` over one mesh dimension. Tensor parallelism, and HSDP's replicated mesh dimension, change what
each rank computes and holds in ways the profile does not see, and are refused with a message.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch.nn as nn

from lightning_ckpt._compat import (
    fsdp2_is_root,
    fsdp2_post_forward_mesh_getter,
    fsdp2_post_forward_mesh_infos,
    unset_fake_temporarily,
)

__all__ = [
    "check_data_parallel",
    "fsdp2_modules",
    "is_fsdp2",
    "iteration_state_reset",
    "post_forward_meshes",
    "user_class",
]


def fsdp2_modules(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model`` that ``fully_shard`` was applied to (outermost first)."""
    if not _distributed_available():
        return []
    from torch.distributed.fsdp import FSDPModule

    return [module for module in model.modules() if isinstance(module, FSDPModule)]


def user_class(module: nn.Module) -> type:
    """The module's class as its author wrote it: ``fully_shard`` swaps it for a subclass of
    ``FSDPModule`` and it (``Block`` becomes ``FSDPBlock``), so targets and candidate lists see through that.

    Example:
        >>> user_class(nn.Linear(2, 2)).__name__
        'Linear'
    """
    mro = type(module).__mro__
    if not _distributed_available():
        return mro[0]
    from torch.distributed.fsdp import FSDPModule

    return mro[mro.index(FSDPModule) + 1] if FSDPModule in mro[1:-1] else mro[0]


def is_fsdp2(model: nn.Module) -> bool:
    """Whether ``fully_shard`` shards any part of ``model``.

    Example:
        >>> is_fsdp2(nn.Linear(2, 2))
        False
    """
    return bool(fsdp2_modules(model))


def check_data_parallel(model: nn.Module) -> None:
    """Refuse parameters that are not sharded for data parallelism alone: ``DTensor`` parameters outside
    ``fully_shard``, over a mesh named ``tensor_parallel``, over more than one mesh dimension (HSDP, FSDP
    with tensor parallelism) or placed other than ``Shard(0)``.

    Raises:
        ValueError: naming the first such parameter, its placements and its mesh.

    Example:
        >>> check_data_parallel(nn.Linear(2, 2))  # plain parameters: nothing to refuse
    """
    if not _distributed_available():
        return
    from torch.distributed.tensor import DTensor, Shard

    sharded = is_fsdp2(model)
    for name, param in model.named_parameters():
        if not isinstance(param, DTensor):
            continue
        mesh = param.device_mesh
        dims = mesh.mesh_dim_names or tuple(f"dim {i}" for i in range(mesh.ndim))
        data_parallel = sharded and mesh.ndim == 1 and "tensor_parallel" not in dims
        if data_parallel and tuple(param.placements) == (Shard(0),):
            continue
        raise ValueError(
            "AutoCheckpoint plans FSDP2 data parallelism only (each parameter Shard(0) by fully_shard over"
            f" one data-parallel mesh dimension), got {name} placed {tuple(param.placements)} over mesh"
            f" {dict(zip(dims, mesh.shape, strict=True))}: tensor parallelism and HSDP are not planned for"
            " yet; shard with fully_shard(module, mesh=device_mesh['data_parallel']) only"
        )


@contextlib.contextmanager
def iteration_state_reset(model: nn.Module) -> Iterator[None]:
    """Forwards in the block (no-grad timing runs) leave FSDP2's per-iteration state as a step leaves it.

    A forward without a backward leaves the root's parameters gathered (FSDP2 does not reshard the root
    after its forward) and the order of the forward recorded for the backward's prefetching (cleared at
    the end of a backward). On exit every root module's ``reset_iter_state()`` reshards and clears both,
    so the step after profiling starts as every other step does.
    """
    try:
        yield
    finally:
        for module in fsdp2_modules(model):
            if fsdp2_is_root(module) and hasattr(module, "reset_iter_state"):
                module.reset_iter_state()


@contextlib.contextmanager
def post_forward_meshes(live: nn.Module | None) -> Iterator[None]:
    """While the block runs, ``fully_shard(module, reshard_after_forward=N)`` (an int: after its forward
    each rank keeps 1/N of the unit's unsharded parameters, and its backward all-gathers them over those
    N ranks) can shard a fake twin: it reshards to the ``live`` model's N-rank mesh where it has one, else
    to one made outside the fake mode.

    ``fully_shard`` builds that mesh from the real tensor of its mesh's ranks, which a fake mode refuses,
    and each new mesh is a new process group on every rank: reusing the live model's costs neither.

    Example:
        >>> with post_forward_meshes(None):  # no live model: meshes made outside the fake mode
        ...     is_fsdp2(nn.Linear(2, 2))
        False
    """
    if not _distributed_available():
        yield
        return
    infos = [
        info
        for module in fsdp2_modules(live or nn.Module())
        for info in fsdp2_post_forward_mesh_infos(module)
    ]
    with fsdp2_post_forward_mesh_getter(lambda original: _post_forward_mesh_getter(original, infos)):
        yield


def _post_forward_mesh_getter(original: Callable, live_infos: list[Any]) -> Callable:
    """``original`` (torch's), answering an int ``reshard_after_forward`` with a live mesh of that many ranks
    over the same ranks, or with torch's own answer computed outside any fake mode."""

    def get_post_forward_mesh_info(reshard_after_forward: Any, mesh_info: Any) -> Any:
        if isinstance(reshard_after_forward, bool) or not isinstance(reshard_after_forward, int):
            return original(reshard_after_forward, mesh_info)
        with unset_fake_temporarily():
            ranks = sorted(mesh_info.mesh.mesh.flatten().tolist())
            for info in live_infos:
                same_ranks = sorted(info.mesh.mesh.flatten().tolist()) == ranks
                if same_ranks and info.shard_mesh_size == reshard_after_forward:
                    return info
            return original(reshard_after_forward, mesh_info)

    return get_post_forward_mesh_info


def _distributed_available() -> bool:
    import torch.distributed

    return torch.distributed.is_available()
