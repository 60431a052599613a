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


class AliveStarts:
    """``alive_from`` of every storage for a checkpointed set, and for that set less one candidate
    (only the storages that candidate saves or takes as input change), without recomputing the rest.

    Example:
        >>> from lightning_ckpt.core.profile_types import SavedStorage
        >>> storages = [SavedStorage(8, (("a", 1),), ()), SavedStorage(4, ((None, 2),), (("a", 0),))]
        >>> starts = AliveStarts(storages, {"a"})
        >>> starts.base.tolist(), starts.without("a").tolist()
        ([inf, 0.0], [1.0, 2.0])
    """

    def __init__(self, storages: Sequence[SavedStorage], checkpointed: Collection[str]) -> None:
        self.storages, self.checkpointed = storages, frozenset(checkpointed)
        self.base = np.array([alive_from(s, self.checkpointed) for s in storages], dtype=np.float64)
        self.nbytes = np.array([s.nbytes for s in storages], dtype=np.int64)
        self._touching: dict[str, list[int]] = {}
        for i, storage in enumerate(storages):
            names = {owner for owner, _ in storage.saves if owner is not None}
            for name in names | {name for name, _ in storage.inputs}:
                self._touching.setdefault(name, []).append(i)

    def without(self, candidate: str) -> np.ndarray:
        """The starts with ``candidate`` not checkpointed."""
        if candidate not in self.checkpointed:
            return self.base
        starts, rest = self.base.copy(), self.checkpointed - {candidate}
        for i in self._touching.get(candidate, ()):
            starts[i] = alive_from(self.storages[i], rest)
        return starts
