"""Every rank fails together or none does: ``run_together`` and ``run_on_rank`` on 3 gloo processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).with_name("rank_agreement_script.py")


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_failures_on_some_ranks_raise_on_every_rank_and_the_collectives_pair_up(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(SCRIPT), str(tmp_path)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=SCRIPT.parents[1])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    facts = [json.loads((tmp_path / f"facts{rank}.json").read_text()) for rank in range(3)]
    for rank in range(3):  # after each case every rank was at that case
        assert [gathered for *_, gathered in facts[rank].values()] == [[i] * 3 for i in range(5)], facts[rank]
    assert [facts[rank]["together, none fails"][:2] for rank in range(3)] == [
        ["returned", r] for r in range(3)
    ]
    assert facts[0]["together, 1 and 2 fail"][:2] == [
        "RankFailedError",
        "AutoCheckpoint: x failed on rank 1 of 3 (ValueError: boom on 1), so every rank stops here;"
        " that rank's own traceback has the details",
    ]
    assert [facts[r]["together, 1 and 2 fail"][:2] for r in (1, 2)] == [
        ["ValueError", f"boom on {r}"] for r in (1, 2)
    ]
    assert [facts[r]["together, all fail"][:2] for r in range(3)] == [
        ["ValueError", f"boom on {r}"] for r in range(3)
    ]
    assert facts[1]["on rank 1, it fails"][:2] == ["ValueError", "boom on 1"]
    for rank in (0, 2):
        kind, message, _ = facts[rank]["on rank 1, it fails"]
        assert kind == "RankFailedError" and "y failed on rank 1 of 3 (ValueError: boom on 1)" in message
    for rank in range(3):
        assert facts[rank]["on rank 1, it works"][:2] == ["returned", {"from": 1}]  # rank 1's result
