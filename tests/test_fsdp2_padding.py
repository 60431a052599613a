"""Dynamic padding under FSDP2 (``ModelParallelStrategy``, 2 CPU processes, gloo): every step each rank
gets a batch of a new length of its own (tests/fsdp2_padding_script.py).

A profile under FSDP2 runs collectives (the twin shards on the live mesh, the timing forwards gather the
live parameters), so when one rank meets a new family of shapes every rank profiles, including one whose
own batch a plan already covers. Before, that rank reused its profile while the other gathered, and the
run hung until gloo's timeout. Each rank trains inside ``memory_cap(budget)`` over every step, with the
losses and all-gathers of the same FSDP2 run without the callback; with a budget that the family's top
does not fit (each rank plans its own shapes); at op level too, where the no-grad
forward that catches the blocks' inputs used to leave the root gathered (one all-gather fewer in each
planning step: planning left a trace on training). Every rank runs the same plan at every step, though
each files it under its own family (it used to run its own family's plan: at some steps the ranks
checkpointed different blocks).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
from test_fsdp2 import _read, _run, _tail, needs_distributed  # noqa: E402

STEPS = 6


@needs_distributed
@pytest.mark.parametrize("mode", ["block", "op", "tight"])
def test_fsdp2_with_a_new_length_every_step_trains_within_the_budget_as_fsdp2_without_it(tmp_path, mode):
    """``tight``: the family top (4, 32) does not fit, so every rank plans its own shapes instead."""
    result = _run(TESTS / "fsdp2_padding_script.py", tmp_path, mode, timeout=300)
    assert result.returncode == 0 and not list(tmp_path.glob("*oom*")), _tail(result)
    plans_per_rank, checkpointed_per_rank = [], []
    for rank in (0, 1):
        capped, plain = (_read(tmp_path, f"{run}_facts{rank}.json") for run in ("capped", "plain"))
        assert capped["warnings"] == [] and len(capped["losses"]) == STEPS
        assert plain["cap_peak"] > capped["budget"] >= capped["cap_peak"], (
            "the budget binds; every step within"
        )
        assert capped["losses"] == plain["losses"], "the same steps as without the callback"
        assert capped["gathers"] == plain["gathers"], "no all-gather that the run without it does not make"
        assert 1 <= len(capped["plans"]) <= 5, "one plan per family of shapes, not one per length"
        lengths = [plan[0][1] for plan in capped["plans"]]
        plans_per_rank.append(len(lengths))
        checkpointed_per_rank.append(capped["checkpointed"])
        if mode == "tight":
            assert 32 not in lengths and 31 in lengths, "the top refused: the batch's own shapes planned"
        else:
            assert 32 in lengths, "a family's top planned"
            assert any(capped["checkpointed"]), capped["checkpointed"]
    assert max(plans_per_rank) >= 2, "a family planned mid-fit while the other rank's batch was covered"
    assert checkpointed_per_rank[0] == checkpointed_per_rank[1], "the same plan on every rank at every step"
