"""Op level under FSDP2 (``granularity="op"``, ``ModelParallelStrategy``, 2 CPU processes, gloo).

Each rank trains 4 steps inside ``memory_cap(budget)``, priced in FLOPs so that selective options are
chosen. The blocks' options are measured on plain, unsharded copies (rank 0 times them, every rank sizes
them); one plan on both ranks, the same selective policies applied on both, losses and parameters equal
to the same FSDP2 run without the callback (dropout on: a policy never recomputes a random op with fresh
randomness), no all-gather that the run without checkpointing does not make, and each rank's prediction
within 2% of what its cap counted.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
from test_fsdp2 import (  # noqa: E402
    SCRIPT,
    _assert_as_without_the_callback,
    _read,
    _run,
    _tail,
    needs_distributed,
)

CASES = {  # sharding: (budget bytes, all-gathers per step)
    "keep": (1_900_000, 5),  # reshard_after_forward=False: each block stays gathered to its backward
    "bf16": (1_100_000, 9),  # MixedPrecisionPolicy(param_dtype=bf16)
    "reshard": (1_400_000, 9),  # FSDP2's default: resharded after the forward, gathered again in backward
}


@needs_distributed
@pytest.mark.parametrize("sharding", sorted(CASES))
def test_fsdp2_op_level_plans_one_selective_plan_within_the_budget_as_fsdp2_trains(tmp_path, sharding):
    budget_bytes, gathers_per_step = CASES[sharding]
    result = _run(SCRIPT, tmp_path, "compare-op", sharding, budget_bytes)
    report = {
        r: (tmp_path / f"flag{r}.txt").read_text() for r in (0, 1) if (tmp_path / f"flag{r}.txt").exists()
    }
    assert result.returncode == 0 and report == {0: "ok", 1: "ok"}, f"{report}\n{_tail(result)}"
    plans = [_read(tmp_path, f"plan{rank}.json") for rank in (0, 1)]
    facts = [_read(tmp_path, f"facts{rank}.json") for rank in (0, 1)]
    assert plans[0] == plans[1], "one plan on every rank (rank 1 timed the blocks in reverse order)"
    selective = {item["name"]: item["saved_ops"] for item in plans[0]["items"] if item["saved_ops"]}
    assert selective and facts[0]["policies"] == facts[1]["policies"] == selective
    for rank in (0, 1):
        assert _read(tmp_path, f"warnings{rank}.json") == []
        assert facts[rank]["global_step"] == 4 and facts[rank]["predicted"] <= budget_bytes
        error = facts[rank]["predicted"] / facts[rank]["cap_peak"] - 1
        assert abs(error) <= 0.02, f"{error:+.2%} {facts[rank]}"
    _assert_as_without_the_callback(tmp_path, gathers_per_step=gathers_per_step)
