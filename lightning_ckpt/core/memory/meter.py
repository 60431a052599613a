"""Measure the real peak memory of a block of code: the CUDA allocator's counters, or live storages."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from lightning_ckpt.core.storage import LiveStorageTracker

__all__ = ["measure_peak_bytes", "state_tensors", "track_peak_bytes"]


class track_peak_bytes:  # noqa: N801 - used like a function: `with track_peak_bytes() as meter`
    """Measure the real peak memory of the code in a ``with`` block; read ``meter.peak_bytes`` after.

    On CUDA: the caching allocator's counters (reset on entry; the peak of everything on the device). On
    any other device (and fake tensors): a dispatch mode that counts every live storage: those created
    inside the block, and the ``model``'s parameters, gradients and buffers and the ``optimizer``'s state
    alive on entry, each until it is freed (gradients set to ``None`` by ``zero_grad`` stop counting);
    or, if ``baseline_bytes`` is given, that constant in place of the model's and optimizer's.

    Example:
        >>> with track_peak_bytes(baseline_bytes=100) as meter:
        ...     x = torch.ones(1024)
        ...     y = (x * 2).sum()
        >>> meter.peak_bytes
        8296

        Across two hooks (start in one, stop in the other), the same without ``with``:

        >>> meter = track_peak_bytes(baseline_bytes=100).start()
        >>> x = torch.ones(1024)
        >>> meter.stop()
        4196
    """

    def __init__(
        self,
        device: torch.device | str | None = None,
        *,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        baseline_bytes: int | None = None,
    ) -> None:
        self.device = torch.device(device) if device is not None else _model_device(model)
        self.baseline_bytes = baseline_bytes or 0
        self._existing = state_tensors(model, optimizer) if baseline_bytes is None else []
        self.peak_bytes = 0
        self._tracker: LiveStorageTracker | None = None

    def start(self) -> track_peak_bytes:
        """Start measuring (what ``with`` does on entry); for measurements that span two hooks."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._tracker = LiveStorageTracker(existing=self._existing).__enter__()
            self._existing = []
        return self

    def stop(self) -> int:
        """Stop measuring (what ``with`` does on exit); returns ``peak_bytes``."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device)
        else:
            self._tracker.__exit__(None, None, None)
            self.peak_bytes = self.baseline_bytes + self._tracker.peak_bytes
        return int(self.peak_bytes)

    def __enter__(self) -> track_peak_bytes:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()


def measure_peak_bytes(
    step_fn: Callable[[], Any],
    *,
    device: torch.device | str | None = None,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> int:
    """Run ``step_fn`` once (and ``backward()`` on what it returns, if that requires grad); real peak bytes.

    Gradients are left as the step makes them (the caller zeroes or restores them). See
    :class:`track_peak_bytes` for what is counted on each device.

    Example:
        >>> model = torch.nn.Linear(256, 256)
        >>> x = torch.randn(64, 256)
        >>> measure_peak_bytes(lambda: model(x).square().sum(), model=model) > 0
        True
    """
    with track_peak_bytes(device, model=model, optimizer=optimizer) as meter:
        loss = step_fn()
        if isinstance(loss, torch.Tensor) and loss.requires_grad:
            loss.backward()
    return meter.peak_bytes


def _model_device(model: torch.nn.Module | None) -> torch.device:
    param = next(model.parameters(), None) if model is not None else None
    return param.device if param is not None else torch.device("cpu")


def state_tensors(model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None) -> list[Any]:
    """The model's parameters, gradients and buffers and the optimizer's state tensors.

    Example:
        >>> len(state_tensors(torch.nn.Linear(2, 2), None))  # weight and bias, no gradients yet
        2
    """
    tensors: list[Any] = []
    if model is not None:
        params = list(model.parameters())
        tensors += params + [p.grad for p in params if p.grad is not None] + list(model.buffers())
    if optimizer is not None:
        tensors += [
            t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)
        ]
    return tensors
