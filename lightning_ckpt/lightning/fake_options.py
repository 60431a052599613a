"""Op-level options on a fake model (``lightning-ckpt plan`` with ``granularity: op``, issue 24).

Offline there is no device to time a block on, so each option is priced in FLOPs: what its backward
recomputes, counted op by op as ``torch.utils.flop_counter`` counts them. The candidates' inputs are
caught in one more forward of the fake step (under ``torch.no_grad()``), one input per distinct block
as in a fit (:func:`~lightning_ckpt.lightning.op_options.caught_inputs`), and each distinct block's op
calls and options are recorded and sized on the fake tensors it already has
(:func:`~lightning_ckpt.core.selective.costs.option_costs`): nothing is allocated. Each call's FLOPs
stand in for its seconds (a fake tensor's time means nothing), so the prefixes of saved calls are taken
by FLOPs per byte.

Example:
    >>> from examples.gpt import GPT
    >>> from lightning_ckpt.lightning.fake_run import precision_plugin
    >>> from lightning_ckpt._compat import FakeTensorMode
    >>> with FakeTensorMode() as mode:
    ...     model = GPT(block_size=8, n_layer=2, n_head=2, n_embd=16)
    ...     batch = (mode.from_tensor(torch.zeros(2, 8, dtype=torch.long)),) * 2
    ...     options = fake_options(model, batch, precision_plugin("32-true"), ["transformer.h.0", "transformer.h.1"])
    >>> unsharded_twin(model, GPT) is model  # nothing sharded: the model itself
    True
    >>> sorted(options), options["transformer.h.0"][0].name, options["transformer.h.1"][-1].name
    (['transformer.h.0', 'transformer.h.1'], 'keep', 'checkpoint')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn as nn

from lightning_ckpt._compat import fsdp2_param_dtype
from lightning_ckpt.core.fsdp2 import fsdp2_modules, is_fsdp2
from lightning_ckpt.core.hf_models import training_without_cache, unpacked_positions_on_fake_tensors
from lightning_ckpt.core.names import resolve_modules
from lightning_ckpt.core.selective.costs import OptionCost, option_costs, option_times
from lightning_ckpt.core.selective.ops import record_ops
from lightning_ckpt.core.selective.options import BlockOpProfile
from lightning_ckpt.lightning.op_options import caught_inputs, prepared_block
from lightning_ckpt.lightning.step import PrecisionOnlyTrainer

__all__ = ["fake_options", "unsharded_twin"]


def fake_options(
    model: pl.LightningModule, batch: Any, plugin: Any, candidates: Sequence[str]
) -> dict[str, list[OptionCost]]:
    """Candidate name -> its options on the fake ``model`` (keep first, full checkpoint last), priced in
    FLOPs; ``batch`` fake and ``plugin`` the run's precision plugin. Call it inside the model's
    ``FakeTensorMode``. Candidates the step does not call are left out (the planner gives them keep and
    checkpoint only)."""
    trainer = PrecisionOnlyTrainer(plugin)
    modules = resolve_modules(model, list(candidates), argument="candidates")
    batch = plugin.convert_input(batch)
    with training_without_cache(model), unpacked_positions_on_fake_tensors(batch):  # as the fit runs
        signatures, first = caught_inputs(trainer, model, batch, 0, modules)
        measured = {
            signature: _options(trainer, modules[name], args, kwargs)
            for signature, (name, args, kwargs) in first.items()
        }
    return {name: measured[signature] for name, signature in signatures.items()}


def unsharded_twin(model: nn.Module, build: Callable[[], nn.Module]) -> nn.Module:
    """``model`` itself, or for a model that ``fully_shard`` shards (FSDP2, whose hooks gather and
    reduce-scatter around each block) a twin ``build`` makes unsharded: a block's options depend on its
    computation only, as a fit measures them on plain copies
    (:mod:`~lightning_ckpt.lightning.plain_blocks`).

    Raises:
        ValueError: naming ``granularity`` for blocks under a ``MixedPrecisionPolicy`` with a
            ``param_dtype`` (a fit casts its plain copies to it; offline does not yet).
    """
    if not is_fsdp2(model):
        return model
    cast = {fsdp2_param_dtype(m) for m in fsdp2_modules(model)} - {None}
    if cast:
        raise ValueError(
            "`granularity` must be 'block' to plan offline a ModelParallelStrategy (FSDP2) model whose"
            f" MixedPrecisionPolicy casts parameters (plan it in a fit), got 'op' with param_dtype {sorted(map(str, cast))}"
        )
    return build()


def _options(trainer: Any, block: torch.nn.Module, args: tuple, kwargs: dict) -> list[OptionCost]:
    """One distinct block's options, its op calls recorded and its options sized on its fake inputs."""
    called, args, context = prepared_block(trainer, block, args, kwargs)
    with context:
        calls = tuple(
            dataclasses.replace(c, seconds=float(c.flops)) for c in record_ops(called, *args, repeats=1)
        )
        return option_costs(called, args, option_times(BlockOpProfile(calls, 0.0, 0.0)))
