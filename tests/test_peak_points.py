"""The peak as points (and their prefix-capacity form) against ``predict_peak_bytes`` on every kept set."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch
from callback_helpers import gpt_loss, tiny_gpt, token_batch

from lightning_ckpt.core.candidates import find_candidates
from lightning_ckpt.core.profiler import profile_step
from lightning_ckpt.planning import non_nested as fallback
from lightning_ckpt.planning.nested import nested_instance, prefix_form
from lightning_ckpt.planning.points import PeakPoint, PointMatrix, peak_points
from lightning_ckpt.solver import solve_knapsack
from tests.hetero_models import MODELS, profiled
from tests.peak_replay import check_points
from tests.test_planner import hand_profile


def tiny_gpt_profile(zero_grad: str = "after_forward", autocast_cache: bool = False):
    model = tiny_gpt()
    idx, labels = token_batch(model, 2)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast_cache, cache_enabled=True):
            return gpt_loss(model, idx, labels)

    profile = profile_step(model, step, find_candidates(model), "flops", optimizer="adamw")
    return dataclasses.replace(profile, zero_grad=zero_grad)


@pytest.mark.parametrize("name", sorted(set(MODELS) - {"mixed10"}))  # mixed10: through the plan tests
def test_points_equal_the_prediction_on_every_kept_set(name):
    profile = profiled(name)
    points = peak_points(profile)
    matrix = PointMatrix(points)
    for kept in itertools.product([False, True], repeat=len(profile.modules)):
        expected = check_points(profile, points, kept)  # raises when the points disagree
        assert matrix.peak(np.array(kept)) == expected


@pytest.mark.parametrize(
    ("zero_grad", "autocast_cache"),
    [("after_forward", False), ("before_forward", False), ("never", False), ("after_forward", True)],
)
def test_points_of_a_transformer_equal_the_prediction(zero_grad, autocast_cache):
    profile = tiny_gpt_profile(zero_grad, autocast_cache)
    assert any(s.forward_cached for s in profile.storages) == autocast_cache
    points = peak_points(profile)
    for kept in itertools.product([False, True], repeat=len(profile.modules)):
        check_points(profile, points, kept)
    if not autocast_cache:  # the cast cache's forward-only holds may leave the nested form
        assert prefix_form(points) is not None  # a plain block stack is nested


def test_points_of_a_hand_made_profile_equal_the_prediction():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(1, 6))
        profile = hand_profile(rng.uniform(1, 50, n).tolist(), inputs_mb=rng.uniform(0, 60, n).tolist())
        points = peak_points(profile)
        for kept in itertools.product([False, True], repeat=n):
            check_points(profile, points, kept)


def test_which_steps_are_nested():
    """Stacks (mixed widths, a head after blocks) are nested; skips from encoder to decoder are not."""
    assert prefix_form(peak_points(profiled("mixed"))) is not None
    assert prefix_form(peak_points(profiled("head"))) is not None
    unet = peak_points(profiled("unet"))
    assert prefix_form(unet) is None and any(point.either_bytes for point in unet)


def test_prefix_form_orders_blocks_as_the_forward_and_bounds_each_recompute():
    profile = profiled("mixed")
    form = prefix_form(peak_points(profile))
    assert form.order == tuple(range(len(profile.modules)))
    # every block has a skip bound (its recompute, its checkpointed forward) above its take bound
    assert all(s >= t for s, t in zip(form.skip_base_bytes, form.take_base_bytes, strict=True))
    assert all(w > 0 for w in form.weight_bytes)


def random_nested_points(rng, n: int):
    """Points nested by construction: prefixes of a random order, some bound to the next candidate."""
    order = rng.permutation(n)
    weights = rng.integers(0, 20, n) * (rng.random(n) < 0.8)  # some weightless candidates
    budget = 100
    points = []
    for k in range(n + 1):
        keep = np.zeros(n, dtype=np.int64)
        keep[order[:k]] = weights[order[:k]]
        points.append(PeakPoint(int(rng.integers(0, budget + 1)), keep))
        if k < n:  # the next candidate's recompute (skip) and backward (take) bounds
            points.append(PeakPoint(int(rng.integers(0, budget + 1)), keep, when=(int(order[k]), False)))
            points.append(PeakPoint(int(rng.integers(0, budget + 30)), keep, when=(int(order[k]), True)))
    return tuple(points), budget


def test_nested_points_solve_as_enumeration_does():
    """The prefix-capacity instance (order, carried caps of candidates that cannot be kept) against
    enumerating every kept set on the same points."""
    rng = np.random.default_rng(4)
    for _ in range(300):
        n = int(rng.integers(1, 8))
        points, budget = random_nested_points(rng, n)
        values = rng.uniform(0.0, 1.0, n)
        form = prefix_form(points)
        assert form is not None
        enumerated, _ = fallback.solve_points(points, values, budget, 1)
        kept = np.zeros(n, dtype=bool)
        instance = nested_instance(form, values, budget, 1)
        if instance is not None:
            result = solve_knapsack(
                instance.weights,
                instance.values,
                instance.capacity,
                prefix_capacities=instance.take_capacities,
                skip_capacities=instance.skip_capacities,
            )
            kept[[instance.items[j] for j in result.chosen]] = True
        assert fallback._fits(fallback.quantize_points(points, budget, 1), kept[None, :])[0]
        assert values[kept].sum() == pytest.approx(values[enumerated].sum(), abs=1e-12)


def test_points_count_a_storage_alive_anyway_once_as_the_replay_does():
    """An input given to every block that nothing saves and the model holds to the forward's peak (see
    ``tests/test_recompute_bytes.py``, which measures it): the forward's end lists it as alive anyway,
    and the points and the replay agree on every kept set."""
    from test_recompute_bytes import _Model

    model, x = _Model("alive_anyway"), torch.randn(64, 32)
    names = [f"blocks.{i}" for i in range(3)]
    profile = profile_step(model, lambda: model(x), names, "flops", batch=x)
    _blocks, end = [phase for phase in profile.phases if phase.forward and not phase.if_checkpointed]
    anyway = [profile.storages[k] for k in end.alive_anyway]  # the forward's end, where its peak is
    (bias,) = [storage for storage in anyway if not storage.saves]  # and the last block's output, held
    assert (bias.nbytes, bias.saves, [name for name, _ in bias.inputs]) == (8192, (), names)
    points = peak_points(profile)
    for kept in itertools.product([False, True], repeat=3):
        check_points(profile, points, kept)


def test_points_count_a_returned_storage_the_caller_holds_once_as_the_replay_does():
    """A block returns what its softmax saved and the caller holds it through the next block's call, as
    Bloom's loop holds attention weights (see ``tests/test_recompute_bytes.py``, which measures it), the
    last block's to the forward's end: the points that see it held list it as alive anyway, and the points and the replay agree on every kept set."""
    from test_recompute_bytes import _Model

    model, x = _Model("held_output"), torch.randn(64, 32)
    names = [f"blocks.{i}" for i in range(3)]
    profile = profile_step(model, lambda: model(x), names, "flops", batch=x)
    anyway = {k for phase in profile.phases if phase.forward for k in phase.alive_anyway}
    weights = [profile.storages[k] for k in anyway if profile.storages[k].nbytes == 32768]
    owners = sorted(owner for storage in weights for owner, _ in storage.saves[:1])
    assert owners == names  # the last block's held through the head
    points = peak_points(profile)
    for kept in itertools.product([False, True], repeat=3):
        check_points(profile, points, kept)
