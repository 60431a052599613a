"""Planning: from a step's profile and a budget to the plan (which candidates to checkpoint).

- :mod:`~lightning_ckpt.planning.points`: the step's peak as a maximum over points, each affine in the
  kept set; :mod:`~lightning_ckpt.planning.peak` predicts the peak of any choice from them.
- :mod:`~lightning_ckpt.planning.exact`: the exact routes; nested points are a knapsack with prefix
  capacities (:mod:`~lightning_ckpt.planning.nested`), others the small module-level instance
  (:mod:`~lightning_ckpt.planning.non_nested`).
- :mod:`~lightning_ckpt.planning.additive`: the baselines' route, on the additive bound.
- :mod:`~lightning_ckpt.planning.make`: :func:`make_plan`, which picks the route and builds the
  :class:`~lightning_ckpt.planning.plan.CheckpointPlan`; a saved one is checked field by field on load
  (:mod:`~lightning_ckpt.planning.plan_checks`).
"""

from lightning_ckpt.planning.errors import BudgetTooSmallError
from lightning_ckpt.planning.make import make_plan
from lightning_ckpt.planning.peak import PeakModel, fixed_peak_bytes, predict_peak_bytes
from lightning_ckpt.planning.plan import CheckpointPlan, PlanItem

__all__ = [
    "BudgetTooSmallError",
    "CheckpointPlan",
    "PeakModel",
    "PlanItem",
    "fixed_peak_bytes",
    "make_plan",
    "predict_peak_bytes",
]
