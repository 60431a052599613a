"""AutoCheckpoint under FSDP2 (``fully_shard``, ``ModelParallelStrategy``).

On one process with torch's fake process group: the meter counts a rank's shards, not whole tensors, and
tensor parallelism is refused with one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_ckpt.core.storage import LiveStorageTracker
from lightning_ckpt.testing import memory_cap

TESTS = Path(__file__).resolve().parent

needs_distributed = pytest.mark.skipif(
    not torch.distributed.is_available(), reason="torch.distributed is not available"
)


def _run(script: Path, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS.parent), env.get("PYTHONPATH")]))
    cmd = [sys.executable, str(script), *map(str, args)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=TESTS.parent)


def _tail(result: subprocess.CompletedProcess) -> str:
    return result.stdout[-3000:] + result.stderr[-3000:]


def _read(out: Path, name: str):
    return json.loads((out / name).read_text())


def test_a_resized_storage_counts_at_its_size_and_growth_past_the_cap_is_an_out_of_memory_error():
    """FSDP2 frees an unsharded parameter with ``storage.resize_(0)`` and gathers it again by resizing up:
    no dispatch mode sees that, so the counter watches ``resize_`` itself."""
    kept = torch.zeros(1024)  # 4 KiB, made before: not counted until it grows inside the block
    kept.untyped_storage().resize_(0)
    with LiveStorageTracker() as tracker:
        kept.untyped_storage().resize_(4096)
        grown = tracker.live_bytes
        kept.untyped_storage().resize_(0)
    assert (grown, tracker.live_bytes, tracker.peak_bytes) == (4096, 0, 4096)
    assert torch.UntypedStorage.resize_ is not type(tracker).resizing  # put back on exit
    with pytest.raises(torch.OutOfMemoryError, match=r"\+4096 B in UntypedStorage.resize_"):
        with memory_cap(4095):
            kept.untyped_storage().resize_(4096)
    assert kept.untyped_storage().nbytes() == 0  # refused before it was resized


@needs_distributed
def test_fake_process_group_shards_are_counted_and_tensor_parallelism_is_refused(tmp_path):
    result = _run(TESTS / "fsdp2_fake_pg_script.py", tmp_path / "out.json", timeout=120)
    assert result.returncode == 0, _tail(result)
    facts = _read(tmp_path, "out.json")
    assert facts["entry"] == facts["shards"] < facts["whole"] / 3, "this rank's shards, not whole tensors"
    params = 52
    # after a step: shards, sharded gradients and AdamW state, made by DTensor ops (counted as local
    # ops); the unsharded parameters are freed by resizing; AdamW's `step` scalars (torch.tensor, 4 B
    # each) are made outside dispatch, as without FSDP2
    assert 0 <= facts["state"] - facts["after_step"] <= 4 * params
    op = facts["gathered_op"]  # the counter lets DTensor run its op as local ops, and counts those
    assert (op["peak"], op["live"]) == (2 * op["result"], op["result"]), op
    assert facts["root_sharded_after"] == {"no_grad_forward": False, "inside_reset": True}
    blocks = [f"transformer.h.{i}" for i in range(4)]
    assert facts["candidates"] == [blocks, blocks], "through fully_shard's class swap (FSDPBlock)"
    plain, sharded = facts["profiles"]["plain"], facts["profiles"]["sharded"]
    assert sharded["blocks"] == plain["blocks"], "gathered parameters are not activations"
    assert sharded["after_backward"] == plain["after_backward"], "sharded gradients are gradients"
    assert sharded["param_bytes"] == facts["shards"], "the shards, not the gathered parameters"
    refusals = facts["refusals"]
    assert (
        "placed (Replicate(), Shard(dim=0)) over mesh {'data_parallel': 2, 'tensor_parallel': 2}"
        in refusals["hsdp"]
    )
    assert (
        "transformer.h.0.mlp.c_fc.weight placed (Shard(dim=0),) over mesh {'tensor_parallel': 2}"
        in refusals["tensor_parallel"]
    )
    assert "tensor_parallel_size=2" in refusals["strategy"]
    assert all(message.count("\n") == 0 and "not planned for" in message for message in refusals.values())
