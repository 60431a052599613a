"""`AutoCheckpointConfig`: every AutoCheckpoint setting, checked once.

The callback, :func:`lightning_ckpt.make_plan`, :func:`lightning_ckpt.plan_offline` and the sweep all take
their settings from this one frozen dataclass, so a setting means, and is refused, the same everywhere.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np

from lightning_ckpt.core.candidates import as_target_list
from lightning_ckpt.core.profile_types import COSTS, Cost
from lightning_ckpt.solver.validate import MAX_WORKERS, METHODS, Method
from lightning_ckpt.units import gb_to_bytes

__all__ = ["GRANULARITIES", "AutoCheckpointConfig", "Granularity"]

Granularity = Literal["block", "op"]
"""What a plan chooses per candidate: keep or checkpoint it whole (``"block"``), or also a selective
policy that saves chosen op outputs and recomputes the rest (``"op"``)."""
GRANULARITIES: tuple[str, ...] = get_args(Granularity)

MAX_BUDGET_GB = 1e9
"""An upper bound that no device reaches (10^18 bytes), so that byte counts stay exact integers."""
MIN_BUDGET_GB = 1e-9
"""One byte: a smaller budget would be 0 bytes once rounded down."""


@dataclass(frozen=True)
class AutoCheckpointConfig:
    """What AutoCheckpoint plans for and how.

    Example:
        >>> AutoCheckpointConfig(budget_gb=40, targets="Block").targets
        ('Block',)
        >>> AutoCheckpointConfig(budget_gb=40).budget_bytes
        40000000000
        >>> AutoCheckpointConfig(budget_gb=1, solver="magic")
        Traceback (most recent call last):
        ...
        ValueError: `solver` must be one of ('auto', 'hirschberg', 'dp', 'greedy', 'ilp'), got 'magic'
    """

    budget_gb: float
    """Peak memory (GB = 1e9 bytes) one device may use for training: parameters, gradients, optimizer
    state, activations and the transient peak of backward."""
    targets: tuple[str, ...] | None = None
    """Candidate modules as class names or qualified-name globs; ``None``: the repeated blocks. A single
    string is one target."""
    cost: Cost = "time"
    """What keeping a module saves: measured recompute ``"time"`` or forward ``"flops"``."""
    solver: Method = "auto"
    """How the plan is solved: ``"auto"`` (the default) and ``"hirschberg"`` are exact under the step's
    peak model; ``"dp"``, ``"ilp"`` and ``"greedy"`` are baselines that solve a looser additive bound of
    the peak (their plans say "additive bound"), kept for comparison: they may recompute more."""
    quantum_bytes: int = 512
    """Memory unit of the knapsack (weights rounded up, capacity down)."""
    workers: int = 1
    """Processes for the knapsack solver on large problems."""
    measure: bool = True
    """Measure the real peak on the step after planning and re-plan once if it is over the budget."""
    granularity: Granularity = "block"
    """``"block"``: keep or checkpoint each candidate whole; ``"op"``: also selective policies per
    candidate (save the outputs of chosen ops, recompute the rest), measured and chosen exactly."""

    def __post_init__(self) -> None:
        _check_budget(self.budget_gb)
        if self.targets is not None:
            object.__setattr__(self, "targets", _check_targets(self.targets))
        if self.cost not in COSTS:
            raise ValueError(f"`cost` must be one of {COSTS}, got {self.cost!r}")
        if self.solver not in METHODS:
            raise ValueError(f"`solver` must be one of {METHODS}, got {self.solver!r}")
        object.__setattr__(self, "cost", str(self.cost))  # np.str_ -> str: checkpoints hold plain data
        object.__setattr__(self, "solver", str(self.solver))
        object.__setattr__(self, "quantum_bytes", _check_positive_int("quantum_bytes", self.quantum_bytes))
        object.__setattr__(self, "workers", _check_positive_int("workers", self.workers, most=MAX_WORKERS))
        if not isinstance(self.measure, bool):
            raise ValueError(f"`measure` must be a bool (True or False), got {self.measure!r}")
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"`granularity` must be one of {GRANULARITIES}, got {self.granularity!r}")
        object.__setattr__(self, "granularity", str(self.granularity))
        object.__setattr__(self, "budget_gb", float(self.budget_gb))

    @property
    def budget_bytes(self) -> int:
        """``budget_gb`` in whole bytes."""
        return gb_to_bytes(self.budget_gb)


def _check_budget(budget_gb: Any) -> None:
    if (
        isinstance(budget_gb, (bool, np.bool_))
        or not isinstance(budget_gb, numbers.Real)
        or not math.isfinite(budget_gb)
        or budget_gb <= 0
        or budget_gb > MAX_BUDGET_GB
    ):
        raise ValueError(
            f"`budget_gb` must be a positive finite number of GB up to {MAX_BUDGET_GB:g}, got {budget_gb!r}"
        )
    if gb_to_bytes(budget_gb) < 1:
        raise ValueError(
            f"`budget_gb` must be at least one byte ({MIN_BUDGET_GB:g} GB), got {float(budget_gb)!r}"
        )


def _check_targets(targets: Any) -> tuple[str, ...]:
    """``targets`` as a tuple of plain ``str`` (a ``np.str_`` would be saved as a numpy object)."""
    names = tuple(str(target) for target in as_target_list(targets))
    if not names:
        raise ValueError(
            "`targets` must be None (the blocks of the model's repeated-block lists) or a non-empty list of"
            f" module class names or name globs, got {targets!r}: an empty list leaves no candidate to checkpoint"
        )
    return names


def _check_positive_int(name: str, value: Any, most: int | None = None) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer, got {value!r}")
    if most is not None and value > most:
        raise ValueError(f"`{name}` must be a positive integer up to {most}, got {value!r}")
    return int(value)
