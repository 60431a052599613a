"""Deep models: profiling and the peak points grow linearly with the number of blocks (counted visits, not
timings), and the peak points' sweep equals the former points x storages matrix on random storages."""

from __future__ import annotations

import math
import resource
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn

from lightning_ckpt.core import profiler
from lightning_ckpt.core.memory import timeline
from lightning_ckpt.core.profile_types import SavedStorage, StaticMemory, StepProfile
from lightning_ckpt.planning import points as points_module
from lightning_ckpt.planning.peak import PeakModel
from lightning_ckpt.planning.points import PeakPoint, merged_points


def _chain(num_blocks: int) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Module()
    model.h = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.GELU()) for _ in range(num_blocks))
    return model


def _visits(monkeypatch, num_blocks: int) -> tuple[int, int, int]:
    """Calls of the per-storage work of profiling and of the peak points, and the number of points."""
    calls = {"alive_from": 0, "state": 0}
    alive_from, state = profiler.alive_from, points_module._StorageTable._state

    def counted_alive_from(*args):
        calls["alive_from"] += 1
        return alive_from(*args)

    def counted_state(*args):
        calls["state"] += 1
        return state(*args)

    monkeypatch.setattr(profiler, "alive_from", counted_alive_from)
    monkeypatch.setattr(timeline, "alive_from", counted_alive_from)  # what `alive_bytes` calls
    monkeypatch.setattr(points_module._StorageTable, "_state", counted_state)
    model, x = _chain(num_blocks), torch.randn(2, 4)

    def step() -> torch.Tensor:
        y = x
        for block in model.h:
            y = block(y)
        return y.square().mean()

    names = [f"h.{i}" for i in range(num_blocks)]
    peak = PeakModel(profiler.profile_step(model, step, names, "flops"))
    return calls["alive_from"], calls["state"], len(peak.points)


def test_profiling_and_peak_points_visit_each_storage_a_bounded_number_of_times(monkeypatch):
    small, large = _visits(monkeypatch, 100), _visits(monkeypatch, 400)
    for what, few, many in zip(("alive_from calls", "storage states", "points"), small, large, strict=True):
        assert 0 < many <= 4.4 * few, f"{what}: {few} at 100 blocks, {many} at 400 (linear: about 4x)"
    assert large[2] <= 3 * 400  # identical points merged: a few per block, not one per phase


def _matrix_points(table, specs) -> list[PeakPoint]:
    """The former construction, a points x storages matrix (the oracle of the sweep)."""
    times = np.array([spec[0] for spec in specs], dtype=np.float64)[:, None]
    forward = np.array([spec[4] for spec in specs], dtype=bool)[:, None]
    fixed = np.array([-3 if spec[1] is None else spec[1][0] for spec in specs])[:, None]
    by_saves = np.array([spec[1] is not None and True in spec[1][1] for spec in specs])[:, None]
    by_inputs = np.array([spec[1] is not None and False in spec[1][1] for spec in specs])[:, None]
    with np.errstate(invalid="ignore"):
        saved, taken, always = table.saved <= times, table.taken <= times, table.always <= times
        always |= forward & (table.cached <= times)  # the forward's points: autocast's cache holds casts
    owned, is_fixed = table.owner >= 0, table.owner == fixed
    held = always | (((saved & by_saves) | (taken & by_inputs)) & is_fixed) | (saved & taken & owned)
    free = ~held & ~is_fixed & owned
    plus, minus = free & saved & ~taken, free & taken & ~saved
    signed = np.where(plus, table.nbytes, 0) - np.where(minus, table.nbytes, 0)
    keep = np.zeros((len(specs), table.n), dtype=np.int64)
    for k in np.flatnonzero(owned):
        keep[:, table.owner[k]] += signed[:, k]
    bases = np.where(held | minus, table.nbytes, 0).sum(axis=1)
    result = []
    for row, (time, fixed_one, base, when, _, _) in enumerate(specs):
        base += int(bases[row])
        either = []
        for k, earliest in table.several:
            if not always[row, k]:
                base, term = points_module._either(
                    earliest, time, fixed_one, int(table.nbytes[k]), base, keep[row]
                )
                either += [term] if term else []
        result.append(PeakPoint(base, keep[row], tuple(either), when, time))
    return merged_points(result)


def _random_storages(rng, names: list[str]) -> tuple[SavedStorage, ...]:
    storages = []
    for _ in range(40):
        owners = [None, *names]
        saves = tuple(
            (owners[int(rng.integers(len(owners)))], int(rng.integers(1, 60)))
            for _ in range(rng.integers(0, 3))
        )
        inputs = tuple(
            (names[int(rng.integers(len(names)))], int(rng.integers(1, 60)))
            for _ in range(rng.integers(0, 3))
        )
        cached = bool(rng.random() < 0.2)  # an autocast cast its cache holds through the forward
        storages.append(SavedStorage(int(rng.integers(1, 1000)), saves, inputs, forward_cached=cached))
    return tuple(storages)


def _as_set(points: list[PeakPoint]) -> set:
    return {(p.base_bytes, p.keep_bytes.tobytes(), p.either_bytes, p.when) for p in points}


@pytest.mark.parametrize("seed", range(6))
def test_the_sweep_equals_the_matrix_construction_on_random_storages(seed):
    rng = np.random.default_rng(seed)
    names = ["a", "b", "c", "d"]
    profile = StepProfile(
        tuple(), StaticMemory("cpu", 0, 0, 0, 0), 0, 0, storages=_random_storages(rng, names)
    )
    table = points_module._StorageTable(profile, {name: i for i, name in enumerate(names)})
    literals = [None, *((m, kept) for m in range(len(names)) for kept in (True, False))]
    kinds = (points_module.KEPT, points_module.CHECKPOINTED, points_module.RECOMPUTED)
    fixed = [None, *((m, kind) for m in range(len(names)) for kind in kinds)]
    specs = [
        (
            math.inf if rng.random() < 0.1 else float(rng.integers(0, 64)),
            fixed[int(rng.integers(len(fixed)))],
            int(rng.integers(0, 100)),
            literals[int(rng.integers(len(literals)))],
            bool(rng.random() < 0.5),  # a point of the forward
            (),  # alive anyway: none here (test_peak_points checks those against the replay)
        )
        for _ in range(60)
    ]
    assert _as_set(table.points(specs)) == _as_set(_matrix_points(table, specs))


def _small_stack() -> None:
    """In the child: a 512 KiB main-thread stack, where a 200-block fake profile's graph teardown dies."""
    resource.setrlimit(resource.RLIMIT_STACK, (512 * 1024, resource.getrlimit(resource.RLIMIT_STACK)[1]))


def test_lightning_ckpt_plan_survives_a_graph_deeper_than_the_main_threads_stack():
    """200 blocks under a 512 KiB stack stand for 3000 under the default 8 MiB (about 2.7 KiB per block):
    without :func:`~lightning_ckpt.offline.stack.call_with_deep_stack` this exits with SIGSEGV."""
    sets = [
        *("model.init_args.n_layer=200", "model.init_args.n_embd=8", "model.init_args.n_head=1"),
        *("model.init_args.block_size=16", "data.init_args.batch_size=2", "data.init_args.block_size=16"),
    ]
    command = [sys.executable, "-m", "lightning_ckpt.cli", "plan", "--config", "configs/gpt-cpu.yaml"]
    command += [part for value in sets for part in ("--set", value)]
    done = subprocess.run(
        command, capture_output=True, text=True, preexec_fn=_small_stack, check=False, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "transformer.h.199" in done.stdout
