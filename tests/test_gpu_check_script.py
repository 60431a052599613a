"""`scripts/gpu_check.py` runs end to end: the tiny CPU smoke run, and the refusal without a GPU.

Both run the script with CUDA hidden (``CUDA_VISIBLE_DEVICES=""``), so they test the same thing on a GPU
machine; the GPU run itself is for a person with the GPU (see the script's docstring).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
HEADER = "step       batch   peak GB  predicted GB  meas/pred  budget GB     ckpt       ms  note"


def _run_without_cuda(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def test_cpu_smoke_run_prints_a_row_per_step_and_writes_json(tmp_path):
    out = tmp_path / "check.json"
    result = _run_without_cuda("--allow-cpu", "--steps", "3", "--json", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert HEADER in lines
    start = lines.index(HEADER) + 1
    shapes = ["4x32"] * 3 + ["4x64"] * 3 + ["4x32"] * 2  # 3 short, 3 full, 2 short again (--return-steps)
    rows = lines[start : start + len(shapes)]
    assert [row.split()[:2] for row in rows] == [[str(step), shape] for step, shape in enumerate(shapes)]
    assert [step for step, row in enumerate(rows) if row.endswith("plan")] == [0, 3]  # one plan per shape
    assert "max measured/predicted: n/a (no CUDA allocator)" in lines and lines[-1] == "PASS"
    report = json.loads(out.read_text())
    assert report["exit_status"] == 0 and len(report["rows"]) == len(shapes)
    assert report["rows"][0]["peak_bytes"] is None  # no allocator on the CPU
    assert report["probe"]["64"]["minimum_bytes"] < report["budget_bytes"]
    assert report["budget_bytes"] < report["probe"]["32"]["unchecked_bytes"]
    assert report["rows"][3]["checkpointed"] > 0


def test_cpu_smoke_run_under_fsdp2_shards_the_model_and_keeps_the_schedule(tmp_path):
    """``--fsdp2``: ModelParallelStrategy with one rank (gloo on the CPU); the same rows, one plan per shape."""
    out = tmp_path / "check.json"
    result = _run_without_cuda(
        "--allow-cpu", "--fsdp2", "--steps", "2", "--return-steps", "1", "--json", str(out)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FSDP2 (ModelParallelStrategy, world size 1)" in result.stdout.splitlines()[0]
    report = json.loads(out.read_text())
    assert report["exit_status"] == 0 and report["settings"]["fsdp2"] is True
    assert [row["shape"][1] for row in report["rows"]] == [32, 32, 64, 64, 32]
    assert [row["step"] for row in report["rows"] if row["note"] == "plan"] == [0, 2]
    assert all(row["predicted_bytes"] <= report["budget_bytes"] for row in report["rows"])
    assert (
        "cannot build a fake twin" not in result.stderr
    )  # profiled on the sharded twin, not on real tensors


def test_without_cuda_it_refuses_with_status_2():
    result = _run_without_cuda("--steps", "1")
    assert result.returncode == 2
    assert "needs a CUDA GPU" in result.stderr


def test_cpu_smoke_run_at_op_level_plans_per_shape_within_the_budget(tmp_path):
    """``--granularity op``: the callback plans op-level options; every step's prediction within budget."""
    out = tmp_path / "check.json"
    result = _run_without_cuda(
        "--allow-cpu", "--granularity", "op", "--steps", "2", "--return-steps", "1", "--json", str(out)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["exit_status"] == 0 and report["settings"]["granularity"] == "op"
    assert [row["step"] for row in report["rows"] if row["note"] == "plan"] == [0, 2]
    assert all(row["predicted_bytes"] <= report["budget_bytes"] for row in report["rows"])


def test_cpu_smoke_run_at_op_level_under_fsdp2_measures_plain_copies_of_the_sharded_blocks(tmp_path):
    """``--granularity op --fsdp2``: options measured on plain copies of the ``fully_shard``-ed blocks."""
    out = tmp_path / "check.json"
    result = _run_without_cuda(
        "--allow-cpu",
        "--granularity",
        "op",
        "--fsdp2",
        "--steps",
        "2",
        "--return-steps",
        "1",
        "--json",
        str(out),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    assert report["exit_status"] == 0 and report["settings"]["granularity"] == "op"
    assert report["settings"]["fsdp2"] is True
    assert all(row["predicted_bytes"] <= report["budget_bytes"] for row in report["rows"])
