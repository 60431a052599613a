"""The one error a plan can end in: the budget is below what the model needs."""

from __future__ import annotations

import math
from collections.abc import Sequence

from lightning_ckpt.units import BYTES_PER_GB

__all__ = ["BudgetTooSmallError"]


class BudgetTooSmallError(ValueError):
    """The budget is below what the model needs even with every candidate checkpointed.

    Example:
        >>> print(BudgetTooSmallError(10**9, 2_345_600_000, 12, shapes=[(8, 1024), (8, 1024)]))
        `budget_gb`=1 is too small for batch shapes (8, 1024), (8, 1024): even with all 12 candidate modules checkpointed this step needs 2.3456 GB per device. The smallest budget that works is budget_gb=2.346; raise the budget or shrink the batch or sequence length.
    """

    def __init__(
        self,
        budget_bytes: int,
        minimum_bytes: int,
        num_candidates: int,
        shapes: Sequence[Sequence[int]] | None = None,
    ) -> None:
        self.budget_bytes = int(budget_bytes)
        self.minimum_bytes = int(minimum_bytes)
        self.num_candidates = int(num_candidates)
        self.shapes = None if shapes is None else tuple(tuple(int(n) for n in shape) for shape in shapes)
        minimum_gb = math.ceil(minimum_bytes / BYTES_PER_GB * 1000) / 1000
        where = "" if not self.shapes else " for batch shapes " + ", ".join(map(str, self.shapes))
        super().__init__(
            f"`budget_gb`={budget_bytes / BYTES_PER_GB:g} is too small{where}: even with all {num_candidates}"
            f" candidate modules checkpointed this step needs {minimum_bytes / BYTES_PER_GB:.4f} GB per device."
            f" The smallest budget that works is budget_gb={minimum_gb:g}; raise the budget or shrink the batch"
            " or sequence length."
        )
