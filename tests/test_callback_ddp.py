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
