"""AutoCheckpoint with DDP on 2 CPU processes: one plan on every rank, same training as one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).with_name("ddp_script.py")


def _run(out_dir: Path, mode: str, budget_gb: float) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, str(SCRIPT), str(out_dir), mode, str(budget_gb)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=SCRIPT.parents[1])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_ddp_ranks_share_one_plan_and_train_like_one_process(tmp_path):
    budget_gb = 0.0022  # between the all-checkpointed and the no-checkpointing peak of the tiny GPT (batch 4)
    _run(tmp_path, "ddp", budget_gb)
    _run(tmp_path, "single", budget_gb)
    plans = [json.loads((tmp_path / f"plan{rank}.json").read_text()) for rank in (0, 1)]
    assert plans[0] == plans[1]  # although rank 1 timed the blocks in reverse order
    assert 0 < len(plans[0]["checkpointed"]) < 4
    ddp, single = torch.load(tmp_path / "ddp.pt"), torch.load(tmp_path / "single.pt")
    assert ddp.keys() == single.keys()
    for key in ddp:
        torch.testing.assert_close(ddp[key], single[key], rtol=1e-4, atol=1e-5, msg=key)


CAPPED_SCRIPT = Path(__file__).with_name("capped_ddp_script.py")


def _run_capped(out_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, str(CAPPED_SCRIPT), str(out_dir), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=SCRIPT.parents[1])


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
@pytest.mark.parametrize("mode", ["capped", "uneven"])
def test_ddp_ranks_stay_within_a_device_of_exactly_the_budget(tmp_path, mode):
    """Each rank trains inside `memory_cap(budget)`: DDP's gradient buckets count, and no rank goes over."""
    probe = _run_capped(tmp_path, "probe")
    assert probe.returncode == 0, probe.stdout[-3000:] + probe.stderr[-3000:]
    bounds = json.loads((tmp_path / "bounds.json").read_text())
    assert bounds["minimum"] < bounds["unchecked"]
    budget_bytes = (bounds["minimum"] + bounds["unchecked"]) // 2
    while int(budget_bytes / 1e9 * 1e9) != budget_bytes:  # budget_gb must give back exactly the cap
        budget_bytes += 1

    result = _run_capped(tmp_path, mode, str(budget_bytes))
    flags = {rank: (tmp_path / f"flag{rank}.txt") for rank in (0, 1)}
    report = {rank: flag.read_text() if flag.exists() else "no flag" for rank, flag in flags.items()}
    assert report == {0: "ok", 1: "ok"}, f"{report}, bounds {bounds}, cap {budget_bytes}\n" + (
        result.stdout[-3000:] + result.stderr[-3000:]
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    _assert_one_plan_within_budget(tmp_path, budget_bytes)
    plans = [json.loads((tmp_path / f"plan{rank}.json").read_text()) for rank in (0, 1)]
    assert plans[0] == plans[1]
    assert plans[0]["checkpointed"], "a budget below the unchecked peak must checkpoint something"
    assert plans[0]["predicted_peak_bytes"] <= budget_bytes
    for rank in (0, 1):
        facts = json.loads((tmp_path / f"facts{rank}.json").read_text())
        assert facts["callback_budget_bytes"] == budget_bytes and facts["global_step"] == 4
        assert facts["plans"] == (2 if mode == "uneven" and rank == 0 else 1)
        assert facts["profiles"] == facts["plans"], "a rank whose plan holds plans from its own profile"
        assert facts["peak_bytes"] > bounds["static"], "the cap saw the rank's training memory"


def _assert_one_plan_within_budget(out_dir: Path, budget_bytes: int) -> None:
    plans = [json.loads((out_dir / f"plan{rank}.json").read_text()) for rank in (0, 1)]
    assert plans[0]["checkpointed"] == plans[1]["checkpointed"]
    assert plans[0]["predicted_peak_bytes"] <= budget_bytes


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_ddp_plan_fits_every_rank_not_only_the_heaviest_unchecked_one(tmp_path):
    """Rank 0 at (1, 256) is heavier with nothing checkpointed; rank 1 at (5, 64), with its larger logits,
    is heavier under rank 0's plan (it ran out at step 1 when only rank 0's batch was checked)."""
    budget_bytes = 10_860_000
    result = _run_capped(tmp_path, "mixed", str(budget_bytes))
    report = {
        rank: (tmp_path / f"flag{rank}.txt").read_text()
        for rank in (0, 1)
        if (tmp_path / f"flag{rank}.txt").exists()
    }
    assert report == {0: "ok", 1: "ok"}, f"{report}\n" + result.stdout[-3000:] + result.stderr[-3000:]
    _assert_one_plan_within_budget(tmp_path, budget_bytes)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_ddp_op_level_plans_are_one_plan_on_every_rank_within_a_device_of_the_budget(tmp_path):
    """Op level on 2 DDP ranks, each inside `memory_cap(budget)`: rank 0's options and times, the
    heaviest rank's plan, the same selective policies applied on both, no rank over, within 2%; with
    batches of other shapes on each rank (``op-uneven``), each rank checks the plan on its own."""
    probe = _run_capped(tmp_path, "probe")
    assert probe.returncode == 0, probe.stdout[-3000:] + probe.stderr[-3000:]
    bounds = json.loads((tmp_path / "bounds.json").read_text())
    budget_bytes = int(bounds["minimum"] + 0.3 * (bounds["unchecked"] - bounds["minimum"]))
    while int(budget_bytes / 1e9 * 1e9) != budget_bytes:  # budget_gb must give back exactly the cap
        budget_bytes += 1
    for mode in ("op", "op-uneven"):
        result = _run_capped(tmp_path, mode, str(budget_bytes))
        assert result.returncode == 0, mode + result.stdout[-3000:] + result.stderr[-3000:]
        plans = [json.loads((tmp_path / f"plan{rank}.json").read_text()) for rank in (0, 1)]
        facts = [json.loads((tmp_path / f"facts{rank}.json").read_text()) for rank in (0, 1)]
        assert facts[0]["policies"] == facts[1]["policies"] and facts[0]["policies"], mode
        for rank in (0, 1):
            measured = facts[rank]["peak_bytes"]
            assert measured <= budget_bytes and facts[rank]["global_step"] == 4, (mode, rank)
        if mode == "op":  # one plan, the same on both ranks, and what was applied
            selective = {item["name"]: item["saved_ops"] for item in plans[0]["items"] if item["saved_ops"]}
            assert plans[0] == plans[1] and facts[0]["policies"] == selective
            for rank in (0, 1):
                measured = facts[rank]["peak_bytes"]
                assert abs(plans[rank]["predicted_peak_bytes"] - measured) <= 0.02 * measured, (
                    rank,
                    measured,
                )


RESUME_SCRIPT = Path(__file__).with_name("ddp_resume_script.py")


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_a_resume_whose_ranks_fall_under_different_saved_plans_runs_one_plan(tmp_path):
    """The checkpoint holds a plan for 16 tokens (nothing checkpointed) and one for 32 (some blocks); resumed
    with rank 0 at 16 and rank 1 at 32, each rank's saved plan holds on its own profile. Every rank must
    still run the same plan at every step (they ran their own: rank 0 none, rank 1 three blocks)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, str(RESUME_SCRIPT), str(tmp_path)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=SCRIPT.parents[1])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    facts = [json.loads((tmp_path / f"facts{rank}.json").read_text()) for rank in (0, 1)]
    first = facts[0]["first"]["steps"]
    assert first[0][1] == [] and first[1][1], "the setting: a plan per family, the two differ"
    for fit in ("first", "resumed"):
        assert facts[0][fit]["steps"] == facts[1][fit]["steps"], f"{fit}: the ranks ran different plans"
        for rank in (0, 1):
            assert facts[rank][fit]["cap_peak"] <= facts[rank]["budget"]
    assert [step for step, _ in facts[0]["resumed"]["steps"]] == [2, 3, 4]


APART_SCRIPT = Path(__file__).with_name("ddp_apart_script.py")


@pytest.fixture(scope="module")
def apart_facts(tmp_path_factory) -> list[dict]:
    """The facts of both ranks from one launch of ddp_apart_script.py (three fits)."""
    out_dir = tmp_path_factory.mktemp("apart")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, str(APART_SCRIPT), str(out_dir)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=SCRIPT.parents[1])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [json.loads((out_dir / f"facts{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_planning_that_fails_on_one_rank_fails_every_rank_at_once(apart_facts):
    """Rank 1's timing forward raises (block level), then rank 0's timing of the op-level options: the
    failing rank raises its error, the other a RankFailedError naming it (it used to wait in its next
    collective), and neither leaves a wrapped or hooked model behind."""
    cases = {
        "block": (1, "profiling", "rank 1 cannot time this batch"),
        "op": (0, "timing the op-level options", "rank 0 cannot time these options"),
    }
    for case, (failing, what, message) in cases.items():
        own, other = apart_facts[failing][case], apart_facts[1 - failing][case]
        assert (own["type"], own["message"]) == ("ValueError", message), case
        assert other["type"] == "RankFailedError", (case, other)
        assert f"{what} failed on rank {failing} of 2 (ValueError: {message})" in other["message"], case
        for error in (own, other):
            assert error["seconds"] < 60, f"{case}: a rank waited for the process group's timeout"
            assert (error["checkpointed"], error["hooks"]) == ([], 0), case


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
@pytest.mark.parametrize("case", ["buffers", "fallback", "static_graph"])
def test_a_rank_that_profiles_alone_runs_no_collective(apart_facts, case):
    """Only rank 1 meets new shapes and profiles. buffers: a model with a buffer at step 2, which DDP's
    forward broadcast in the measuring forward, alone, and both ranks waited for the timeout. fallback: a
    step profiled on real tensors at step 1, where DDP's forward rebuilt its buckets (a broadcast) alone.
    static_graph: that fallback under DDP's static graph, which failed on every rank at step 0."""
    for rank, facts in enumerate(apart_facts):
        fit = facts[case]
        assert fit["error"] is None, (rank, fit["error"])
        assert fit["seconds"] < 60, f"rank {rank} waited for the process group's timeout"
    assert [len(facts[case]["plans"]) for facts in apart_facts] == [1, 2], "only rank 1 planned again"
    assert apart_facts[0][case]["steps"] == apart_facts[1][case]["steps"]
