"""The capped knapsack a plan really solves, from a profiled model whose blocks differ.

A stack of ``n`` MLP blocks of random widths and hidden sizes (``tests.hetero_models.Mixed``) is
profiled on CPU, each block gets a random recompute time, and the planner's own formulation
(``planning.points`` -> ``planning.nested``) gives the weights, values,
capacity and take/skip caps at a budget between checkpointing every block and keeping every one.
Unlike the synthetic families, a profiled plan's caps come from the real backward timeline.

Example::

    weights, values, capacity, take, skip = plan_instance(200, budget_fraction=0.5)
"""

from __future__ import annotations

import random

import numpy as np

__all__ = ["plan_instance"]


def plan_instance(n: int, budget_fraction: float = 0.5, seed: int = 0, quantum_bytes: int = 512):
    """``(weights, values, capacity, take, skip)`` of the plan of ``n`` mixed blocks (numpy arrays)."""
    import dataclasses

    import torch

    from lightning_ckpt.core.profiler import profile_step
    from lightning_ckpt.planning.nested import nested_instance, prefix_form
    from lightning_ckpt.planning.peak import fixed_peak_bytes, predict_peak_bytes
    from lightning_ckpt.planning.points import PointMatrix, peak_points
    from tests.hetero_models import Mixed

    rng = np.random.default_rng(seed)
    widths, hiddens = (
        rng.choice([32, 48, 64, 96, 128], n).tolist(),
        rng.choice([64, 128, 256, 512], n).tolist(),
    )
    torch.manual_seed(seed)
    model, x = Mixed(widths, hiddens), torch.randn(64, 16)
    profile = profile_step(model, lambda: model(x), [f"h.{i}" for i in range(n)], "flops", optimizer="sgd")
    seconds = random.Random(seed)
    modules = tuple(
        dataclasses.replace(m, recompute_seconds=seconds.uniform(0.001, 0.01)) for m in profile.modules
    )
    profile = dataclasses.replace(profile, modules=modules)
    low, high = fixed_peak_bytes(profile), predict_peak_bytes(profile, [])
    points = peak_points(profile)
    form = prefix_form(points, PointMatrix(points))
    if form is None:
        raise RuntimeError("the profiled stack's peak points are not nested")
    budget = int(low + budget_fraction * (high - low))
    found = nested_instance(form, [m.recompute_seconds for m in modules], budget, quantum_bytes)
    if found is None:
        raise RuntimeError(f"nothing can be kept at budget fraction {budget_fraction}")
    as_int = lambda a: np.asarray(a, dtype=np.int64)  # noqa: E731
    return (
        as_int(found.weights),
        np.asarray(found.values, dtype=np.float64),
        int(found.capacity),
        as_int(found.take_capacities),
        as_int(found.skip_capacities),
    )
