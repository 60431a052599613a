"""FSDP2 at op level: plain, unsharded copies of sharded blocks to measure options on (issue 24).

A ``fully_shard``-ed block cannot be timed or sized alone: its forward and backward hooks all-gather and
reduce-scatter, collectives that one rank cannot run by itself, and its parameters are ``DTensor``
shards. What an op-level option holds and recomputes depends on the block's computation only, which is
that of the unsharded block in FSDP2's compute dtype. So each distinct block is rebuilt as a plain module
(the LightningModule's class called with its saved hyperparameters on the meta device, the block taken
from it by name), with this rank's parameter shard tiled over each full parameter (real values, no
collective: ranks may rebuild different blocks), the live block's buffers, and the parameters cast to the
``MixedPrecisionPolicy``'s ``param_dtype``. Rank 0 times these copies; every rank sizes its own on a fake
twin, as on one device. A model that cannot be rebuilt this way is refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn as nn

from lightning_ckpt._compat import fsdp2_param_dtype
from lightning_ckpt.core.fsdp2 import fsdp2_modules, is_fsdp2, user_class
from lightning_ckpt.lightning.run_spec import module_spec

__all__ = ["plain_blocks"]


def plain_blocks(pl_module: nn.Module, blocks: Mapping[str, nn.Module]) -> dict[str, nn.Module]:
    """``blocks`` (name -> block of ``pl_module``) as they are where nothing is sharded, and unsharded
    copies (see above) of those that ``fully_shard`` shards.

    Raises:
        ValueError: naming ``granularity`` when the model cannot be rebuilt from its saved
            hyperparameters, or a rebuilt block's parameters differ from the live one's.

    Example:
        >>> model = nn.Sequential(nn.Linear(2, 2))  # nothing sharded: the blocks themselves
        >>> plain_blocks(model, {"0": model[0]})["0"] is model[0]
        True
    """
    if not is_fsdp2(pl_module):
        return dict(blocks)
    rebuilt = _rebuilt_on_meta(pl_module)
    return {name: _plain_copy(pl_module, rebuilt, name, block) for name, block in blocks.items()}


def _rebuilt_on_meta(pl_module: nn.Module) -> nn.Module:
    try:
        with torch.device("meta"):
            return module_spec(pl_module, user_class(pl_module)).instantiate()
    except Exception as error:  # the user's class refused its saved hyperparameters
        raise ValueError(
            "`granularity` must be 'block' for an FSDP2 model that cannot be rebuilt from its saved"
            " hyperparameters (op level measures plain copies of its blocks; call"
            f" `self.save_hyperparameters()` in `__init__`), got 'op' and: {error}"
        ) from error


def _plain_copy(pl_module: nn.Module, rebuilt: nn.Module, name: str, live: nn.Module) -> nn.Module:
    """The block ``name`` of ``rebuilt`` filled from ``live`` (see the module docstring)."""
    plain = rebuilt.get_submodule(name)
    device = next((p.device for p in live.parameters()), torch.device("cpu"))
    plain.to_empty(device=device)
    live_params = dict(live.named_parameters())
    shapes = {n: tuple(p.shape) for n, p in plain.named_parameters()}
    if shapes != {n: tuple(p.shape) for n, p in live_params.items()}:
        raise ValueError(
            "`granularity` must be 'block' for an FSDP2 model whose rebuilt blocks differ from the live"
            f" ones (op level measures plain copies), got 'op' and {name} rebuilt with parameters {shapes}"
        )
    dtype = _compute_dtype(pl_module, live)
    with torch.no_grad():
        for param_name, param in plain.named_parameters():
            source = live_params[param_name]
            param.data = _tiled(_local(source), param.shape).to(dtype or source.dtype)
            param.requires_grad_(source.requires_grad)
        for buffer_name, buffer in live.named_buffers():
            owner, _, attr = buffer_name.rpartition(".")
            plain.get_submodule(owner).register_buffer(attr, buffer.detach().clone(), persistent=False)
    return plain.train(live.training)


def _local(param: torch.Tensor) -> torch.Tensor:
    to_local = getattr(param, "to_local", None)
    return (to_local() if to_local else param).detach()


def _tiled(local: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """``local``'s values repeated over ``shape`` (zeros where this rank holds no shard)."""
    numel = shape.numel()
    flat = local.reshape(-1)
    if flat.numel() == 0:
        return torch.zeros(shape, dtype=local.dtype, device=local.device)
    repeats = -(-numel // flat.numel())
    return flat.repeat(repeats)[:numel].reshape(shape).clone()


def _compute_dtype(pl_module: nn.Module, block: nn.Module) -> torch.dtype | None:
    """The ``param_dtype`` of the innermost ``fully_shard``-ed module holding ``block`` (None: as kept)."""
    holders = [m for m in fsdp2_modules(pl_module) if m is block or any(s is block for s in m.modules())]
    return fsdp2_param_dtype(holders[-1]) if holders else None
