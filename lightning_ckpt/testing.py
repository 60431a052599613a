"""A capped device for CPU tests: ``torch.OutOfMemoryError`` as soon as live tensor bytes pass a cap.

On a GPU, one allocation over the card's memory is an out-of-memory crash. :class:`memory_cap` is the CPU
stand-in of a GPU with ``cap_bytes`` of memory: it counts the bytes of every live tensor storage (the
``model``'s parameters, gradients and buffers and the ``optimizer``'s state alive on entry, and every
storage created inside the block while it lives) and raises ``torch.OutOfMemoryError`` from the
allocation that would pass the cap, wherever it happens (forward, backward, optimizer step, profiling).
Fake and meta tensors take no memory and are not counted.

Example:
    >>> import torch
    >>> with memory_cap(4096) as cap:
    ...     a = torch.ones(512)           # 2 KiB
    ...     b = a * 2                     # 4 KiB live: at the cap, allowed
    ...     del a
    ...     c = b + 1                     # one freed first: 4 KiB again
    >>> cap.peak_bytes
    4096
    >>> with memory_cap(4096):
    ...     a = torch.ones(1024)
    ...     b = a * 2
    Traceback (most recent call last):
    ...
    torch.OutOfMemoryError: memory_cap: 8192 live bytes would pass the cap of 4096 bytes (+4096 B in aten.mul.Tensor)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import lightning.pytorch as pl
import torch

from lightning_ckpt.core.memory.meter import state_tensors
from lightning_ckpt.core.storage import LiveStorageTracker, unique_storage_bytes

__all__ = ["CountRestoredState", "memory_cap"]


class memory_cap(LiveStorageTracker):  # noqa: N801 - used like a function: `with memory_cap(n) as cap`
    """Raise ``torch.OutOfMemoryError`` when the live bytes of tensor storages would pass ``cap_bytes``.

    Args:
        cap_bytes: the device's memory, e.g. ``int(budget_gb * 1e9)``.
        model: its parameters, gradients and buffers count from entry on (until they are freed).
        optimizer: its state counts from entry on.
        tensors: any other tensors that already exist and count.

    Attributes:
        peak_bytes: the most bytes live at once inside the block.
        live_bytes: the bytes live now.
    """

    def __init__(
        self,
        cap_bytes: int,
        *,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        tensors: Iterable[torch.Tensor] = (),
    ) -> None:
        if isinstance(cap_bytes, bool) or not isinstance(cap_bytes, int) or cap_bytes < 1:
            raise ValueError(f"`cap_bytes` must be a positive integer, got {cap_bytes!r}")
        super().__init__(existing=[*state_tensors(model, optimizer), *tensors], count_fake=False)
        self.cap_bytes = cap_bytes

    def _admit(self, nbytes: int, where: Any) -> None:
        if self.live_bytes + nbytes > self.cap_bytes:
            raise torch.OutOfMemoryError(
                f"memory_cap: {self.live_bytes + nbytes} live bytes would pass the cap of"
                f" {self.cap_bytes} bytes (+{nbytes} B in {where})"
            )


class CountRestoredState(pl.Callback):
    """Make ``cap`` count what a resumed fit loaded from its checkpoint before training starts.

    ``torch.load`` builds tensors where no op runs, and ``Optimizer.load_state_dict`` keeps them, so a
    :class:`memory_cap` entered before ``trainer.fit(..., ckpt_path=...)`` would not see the restored optimizer
    state: a resumed run could pass the cap on a GPU and not here. Pass this callback to that fit.

    Attributes:
        state_bytes: the bytes of optimizer state alive when training started (0 until then).
    """

    def __init__(self, cap: memory_cap) -> None:
        self.cap = cap
        self.state_bytes = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for optimizer in trainer.optimizers:
            tensors = list(state_tensors(pl_module, optimizer))
            self.cap.count_existing(tensors)
            self.state_bytes += unique_storage_bytes(state_tensors(None, optimizer))
