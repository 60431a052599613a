"""The predicted peak of a training step for any set of checkpointed candidates.

The peak is the largest of the step's points (:mod:`lightning_ckpt.planning.points`), each an affine
function of the kept candidates: the static bytes (parameters, gradients, optimizer state, buffers),
the saved storages alive there under the choice, the phase's measured extra (gradients, temporaries),
the recompute of a checkpointed candidate in its own backward, and the optimizer step. The points are
built once per profile (:class:`PeakModel`); evaluating a choice is then a matrix product.

Example:
    >>> from lightning_ckpt.core.profile_types import ModuleProfile, StaticMemory, StepProfile
    >>> modules = (ModuleProfile("a", 30, 10, 0.1, 0), ModuleProfile("b", 50, 10, 0.1, 0))
    >>> profile = StepProfile(modules, StaticMemory("cpu", 100, 0, 0, 0), 5, 2)
    >>> predict_peak_bytes(profile, ["b"]), fixed_peak_bytes(profile), predict_peak_bytes(profile, [])
    (187, 167, 187)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from lightning_ckpt.planning.points import PointMatrix, peak_points

if TYPE_CHECKING:
    from lightning_ckpt.core.profile_types import StepProfile, ZeroGrad

__all__ = ["PeakModel", "fixed_peak_bytes", "predict_peak_bytes"]


class PeakModel:
    """A profile's peak points, built once, to predict the peak of many checkpointing choices.

    Args:
        profile: the step's profile.
        zero_grad: when the loop frees the last step's gradients (default ``profile.zero_grad``): they
            are held through the forward (``"after_forward"``, Lightning), not (``"before_forward"``), or
            through the whole step (``"never"``, gradient accumulation); in the backward the new ones count
            as they are made.

    Raises:
        ValueError: if ``zero_grad`` is not one of its values.
    """

    def __init__(self, profile: StepProfile, *, zero_grad: ZeroGrad | None = None) -> None:
        self.names = [module.name for module in profile.modules]
        self.points = peak_points(profile, zero_grad=zero_grad)
        self.matrix = PointMatrix(self.points)

    def kept_mask(self, checkpointed: Iterable[str]) -> np.ndarray:
        """The kept mask (profile order) of a set of checkpointed candidate names.

        Raises:
            TypeError: for a string in place of a collection of names.
            ValueError: for a name that is not a candidate of the profile.
        """
        if isinstance(checkpointed, str):
            raise TypeError(
                f"`checkpointed` must be a collection of candidate names, got the string {checkpointed!r}"
            )
        chosen = frozenset(checkpointed)
        unknown = sorted(chosen - set(self.names))
        if unknown:
            raise ValueError(
                f"`checkpointed` must hold candidates of the profile {sorted(self.names)[:6]}, got {unknown[:6]}"
            )
        return np.array([name not in chosen for name in self.names], dtype=np.bool_)

    def peak_bytes(self, checkpointed: Iterable[str]) -> int:
        """Predicted peak bytes with the candidates ``checkpointed`` checkpointed (see :meth:`kept_mask`)."""
        return self.matrix.peak(self.kept_mask(checkpointed))


def predict_peak_bytes(
    profile: StepProfile, checkpointed: Iterable[str], *, zero_grad: ZeroGrad | None = None
) -> int:
    """Predicted peak bytes of a training step with the candidates ``checkpointed`` checkpointed.

    One choice; for many on the same profile build a :class:`PeakModel` once.

    Raises:
        TypeError: for a string in place of a collection of names.
        ValueError: if a name in ``checkpointed`` is not a candidate of ``profile``, or ``zero_grad`` is
            not one of its values.
    """
    return PeakModel(profile, zero_grad=zero_grad).peak_bytes(checkpointed)


def fixed_peak_bytes(profile: StepProfile) -> int:
    """The predicted peak with every candidate checkpointed: the least any plan can reach.

    It holds the static bytes, the activations saved outside candidates, the inputs that the checkpoints
    keep, the backward's extra and the recomputation of a checkpointed candidate during its backward.
    """
    return predict_peak_bytes(profile, [module.name for module in profile.modules])
