"""Running an extra, invisible training step inside a Lightning fit (for profiling).

The profiling forward/backward must leave no trace on training: RNG streams, gradients, buffers
(BatchNorm running stats) and logged metrics are exactly as they were before, so a run with AutoCheckpoint
has the same loss curve and optimizer steps as one without it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from lightning_ckpt._compat import collect_rng_states, set_rng_states
from lightning_ckpt.core.hf_models import training_step_running


@contextlib.contextmanager
def untouched_training_state(module: torch.nn.Module) -> Iterator[None]:
    """Restore RNG states, ``.grad`` of every parameter and every buffer's value on exit.

    Example:
        >>> layer = torch.nn.BatchNorm1d(2)
        >>> with untouched_training_state(layer):
        ...     layer(torch.randn(4, 2)).sum().backward()
        >>> layer.weight.grad is None, bool(layer.running_mean.abs().sum() == 0)
        (True, True)
    """
    rng_states = collect_rng_states()
    grads = {param: param.grad for param in module.parameters()}
    buffers = [(buf, buf.detach().clone()) for buf in module.buffers()]
    for param in grads:
        param.grad = None
    try:
        yield
    finally:
        for param, grad in grads.items():
            param.grad = grad
        with torch.no_grad():
            for buf, saved in buffers:
                buf.copy_(saved)
        set_rng_states(rng_states)


@contextlib.contextmanager
def muted_logging(pl_module: pl.LightningModule) -> Iterator[None]:
    """Make ``self.log``/``self.log_dict`` no-ops, so a profiling step logs nothing twice."""
    pl_module.log = _ignore  # type: ignore[method-assign]
    pl_module.log_dict = _ignore  # type: ignore[method-assign]
    try:
        yield
    finally:
        del pl_module.log, pl_module.log_dict


def _ignore(*args: Any, **kwargs: Any) -> None:
    return None


def training_loss_fn(
    trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
) -> Callable:
    """A function that runs ``training_step`` on ``batch`` as the trainer would, and returns the loss.

    It runs as the trainer runs it: inside the precision plugin's autocast context and, when the strategy
    wraps the module in FSDP, through the wrapper's forward, so FSDP gathers its root parameters as in a
    real step. Not through DDP's: its forward makes collectives (the buffers' broadcast, the gradient
    buckets' rebuild on the first forward after a synchronised backward) that a measuring step, which may
    run on one rank alone, must not make, and adds no memory of its own. Logging is muted. ``trainer``
    may be anything with a ``precision_plugin`` (offline plans).
    """

    kept: list[torch.Tensor] = []

    def step_fn() -> torch.Tensor:
        with muted_logging(pl_module), training_step_running():  # no KV cache, even under no_grad
            output = _run_training_step(trainer, pl_module, batch, batch_idx)
        loss = output["loss"] if isinstance(output, Mapping) else output
        if not isinstance(loss, torch.Tensor):
            raise TypeError(
                f"AutoCheckpoint needs `training_step` to return a loss tensor or a dict with 'loss', got {type(output)}"
            )
        kept[:] = [loss.detach().clone()]  # as Lightning's loop keeps it through the backward (progress bar)
        return loss

    return step_fn


def _run_training_step(trainer: Any, pl_module: pl.LightningModule, batch: Any, batch_idx: int) -> Any:
    strategy = getattr(trainer, "strategy", None)
    wrapper = None if strategy is None else strategy.model
    if wrapper is not None and wrapper is not pl_module and not isinstance(wrapper, DDP):
        return strategy.training_step(batch, batch_idx)  # autocast + FSDP's forward redirection
    with trainer.precision_plugin.train_step_context():
        return pl_module.training_step(batch, batch_idx)


@dataclass(frozen=True)
class PrecisionOnlyTrainer:
    """What :func:`training_loss_fn` reads from a Trainer when the step must bypass the strategy's
    wrapper (fake-tensor profiles, offline plans): only the precision plugin."""

    precision_plugin: Any


def no_gradient_sync(trainer: pl.Trainer) -> contextlib.AbstractContextManager:
    """DDP's ``no_sync()`` (no all-reduce of gradients that are thrown away), else a null context. The
    measuring steps do not go through DDP's forward (see :func:`training_loss_fn`), so its reducer is
    not armed for them anyway; this keeps it so should one ever be.

    FSDP is left to synchronise: under ``no_sync`` it would keep unsharded gradients, a memory profile
    that real steps never have.
    """
    model = trainer.strategy.model
    if isinstance(model, DDP):
        return model.no_sync()
    return contextlib.nullcontext()
