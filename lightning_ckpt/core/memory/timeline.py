"""Which saved storages are alive at a given point of the backward pass, for a checkpointing choice.

Forward events carry increasing sequence numbers. A storage saved at sequence ``s`` stays alive during the
backward until the backward reaches ``s``; so, when the backward is at forward time ``t``, the storages
alive are those whose earliest *effective* save is at or before ``t``. A save inside a checkpointed
candidate is not effective (the checkpoint drops it), but each call of a checkpointed candidate keeps its
tensor inputs, from the start of the call.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from lightning_ckpt.core.profile_types import SavedStorage


def alive_from(storage: SavedStorage, checkpointed: Collection[str]) -> float:
    """Forward time from which ``storage`` is held for the backward (``inf``: never held)."""
    saves = [seq for owner, seq in storage.saves if owner is None or owner not in checkpointed]
    kept_inputs = [seq for name, seq in storage.inputs if name in checkpointed]
    return float(min(saves + kept_inputs, default=math.inf))


def alive_bytes(
    storages: Sequence[SavedStorage], times: Sequence[float], checkpointed: Collection[str]
) -> np.ndarray:
    """Bytes held for the backward when it is at each of ``times`` (int64 array, one per time)."""
    starts = np.array([alive_from(storage, checkpointed) for storage in storages], dtype=np.float64)
    return held_at(starts, np.array([storage.nbytes for storage in storages], dtype=np.int64), times)


def held_at(starts: np.ndarray, nbytes: np.ndarray, times: Sequence[float]) -> np.ndarray:
    """Bytes of the storages held from ``starts`` (``alive_from`` each) at each of ``times``.

    Example:
        >>> held_at(np.array([1.0, 3.0, np.inf]), np.array([10, 20, 40]), [0, 1, 5]).tolist()
        [0, 10, 30]
    """
    nbytes = np.where(np.isinf(starts), 0, nbytes)  # never held, even at the end of the forward
    order = np.argsort(starts, kind="stable")
    cumulative = np.concatenate([[0], np.cumsum(nbytes[order])])
    return cumulative[np.searchsorted(starts[order], np.asarray(times, dtype=np.float64), side="right")]
