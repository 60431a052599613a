"""SolverOptions: defaults, validation messages, and that the options reach every process."""

from __future__ import annotations

import dataclasses
import pickle
import socket

import numpy as np
import pytest

from lightning_ckpt.solver import SolverOptions, solve_knapsack
from lightning_ckpt.solver.dense.hirschberg import Task
from lightning_ckpt.solver.options import DEFAULT_OPTIONS
from lightning_ckpt.solver.runtime import pool
from lightning_ckpt.solver.runtime import workers as solver_workers


def test_defaults_are_the_measured_values():
    assert dataclasses.asdict(SolverOptions()) == {
        "parallel_min_solve_cells": 1 << 29,
        "parallel_min_task_cells": 1 << 24,
        "leaf_max_cells": 1 << 22,
        "checkpoint_share": 1.0,
        "dp_table_limit_bytes": 2 * 2**30,
        "group_window": 1 << 19,
        "group_items": 8,
        "tile": 2048,
        "sparse_max_states": 1 << 22,
        "ilp_time_limit_s": 60.0,
    }
    assert SolverOptions() == DEFAULT_OPTIONS and DEFAULT_OPTIONS.grouping == (1 << 19, 8, 2048)


def test_options_are_frozen_normalized_and_picklable():
    options = SolverOptions(leaf_max_cells=np.int64(5), checkpoint_share=1)
    assert type(options.leaf_max_cells) is int and type(options.checkpoint_share) is float
    assert pickle.loads(pickle.dumps(options)) == options
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.tile = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"parallel_min_solve_cells": -1},
            r"`SolverOptions.parallel_min_solve_cells` must be an integer >= 0, got -1",
        ),
        (
            {"parallel_min_task_cells": 1.5},
            r"`SolverOptions.parallel_min_task_cells` must be an integer >= 0, got 1.5",
        ),
        ({"leaf_max_cells": True}, r"`SolverOptions.leaf_max_cells` must be an integer >= 0, got True"),
        ({"leaf_max_cells": "4"}, r"`SolverOptions.leaf_max_cells` must be an integer >= 0, got '4'"),
        (
            {"dp_table_limit_bytes": -5},
            r"`SolverOptions.dp_table_limit_bytes` must be an integer >= 0, got -5",
        ),
        ({"group_window": 0}, r"`SolverOptions.group_window` must be an integer in \[1, 2\*\*48\], got 0"),
        ({"group_items": 0}, r"`SolverOptions.group_items` must be an integer in \[1, 1024\], got 0"),
        ({"group_items": 1025}, r"`SolverOptions.group_items` must be an integer in \[1, 1024\], got 1025"),
        ({"tile": 2**49}, r"`SolverOptions.tile` must be an integer in \[1, 2\*\*48\], got 562949953421312"),
        (
            {"checkpoint_share": -0.5},
            r"`SolverOptions.checkpoint_share` must be a finite number >= 0, got -0.5",
        ),
        (
            {"checkpoint_share": float("inf")},
            r"`SolverOptions.checkpoint_share` must be a finite number >= 0, got inf",
        ),
        ({"ilp_time_limit_s": 0}, r"`SolverOptions.ilp_time_limit_s` must be a finite number > 0, got 0"),
        (
            {"ilp_time_limit_s": float("inf")},
            r"`SolverOptions.ilp_time_limit_s` must be a finite number > 0, got inf",
        ),
        (
            {"group_items": np.bool_(True)},
            r"`SolverOptions.group_items` must be an integer in \[1, 1024\], got np.True_",
        ),
        (
            {"checkpoint_share": None},
            r"`SolverOptions.checkpoint_share` must be a finite number >= 0, got None",
        ),
    ],
)
def test_validation_messages(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SolverOptions(**kwargs)


def test_solve_knapsack_rejects_options_of_another_type():
    with pytest.raises(ValueError, match=r"`options` must be a SolverOptions or None, got dict"):
        solve_knapsack([1], [1.0], 1, options={"leaf_max_cells": 0})  # type: ignore[arg-type]


def test_worker_handler_keeps_the_grouping_it_was_sent():
    """What a worker process does with an ``attach`` (its descriptor over a socket), a task and
    a ``detach``, run here."""
    weights, values = np.array([2, 3, 4]), np.array([3.0, 4.0, 5.5])
    arena = pool.SharedArena(16)
    options = SolverOptions(group_window=3, group_items=2, tile=1)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    state: dict = {"fd_socket": theirs}
    try:
        socket.send_fds(ours, [b"f"], [arena.fd])
        solver_workers._handle(("attach", 16, weights, values, options), state)
        assert state["grouping"] == (3, 2, 1)
        assert solver_workers._handle(("task", Task("profile", 0, 3, 5, 0)), state) is None
        assert arena.array[:6].tolist() == [0.0, 0.0, 3.0, 4.0, 5.5, 7.0]
        solver_workers._handle(("detach",), state)
        assert state == {"fd_socket": theirs}
    finally:
        arena.close()
        ours.close()
        theirs.close()


@pytest.mark.parametrize("method", ["auto", "hirschberg"])
def test_non_default_options_reach_the_workers_and_keep_the_answer(method):
    rng = np.random.default_rng(11)
    weights, values = rng.integers(1, 200, 50), rng.uniform(1, 10, 50)
    tuned = SolverOptions(
        parallel_min_solve_cells=0,
        parallel_min_task_cells=0,
        leaf_max_cells=500,
        checkpoint_share=0.5,
        group_window=7,
        group_items=3,
        tile=5,
        sparse_max_states=0,  # the dense path, against the default's sparse answer for "auto"
    )
    reference = solve_knapsack(weights, values, 2_000, method=method)
    for workers in (1, 2):
        result = solve_knapsack(weights, values, 2_000, method=method, workers=workers, options=tuned)
        assert result == reference
        assert result.stats.workers_used == workers and result.stats.cell_updates > 0
