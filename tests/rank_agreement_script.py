"""Run by tests/test_rank_agreement.py: ``run_together`` and ``run_on_rank`` on 3 real gloo processes
(a stand-in trainer with Lightning's own DDP broadcast), failing on no rank, on two, on all, on the
broadcasting rank. After each case every rank all-gathers the case's index: each gets its own index from
every rank only if the collectives of the cases before paired up.

Usage:
    python tests/rank_agreement_script.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
import types
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from lightning.fabric.utilities.distributed import _all_gather_ddp_if_available
from lightning.pytorch.strategies import DDPStrategy

sys.path[:0] = [str(Path(__file__).resolve().parents[1])]
from lightning_ckpt.lightning.ranks import run_on_rank, run_together  # noqa: E402

WORLD = 3


class _Strategy:
    """What the rank helpers use of a Lightning strategy, on the default process group."""

    root_device = torch.device("cpu")

    def broadcast(self, obj, src=0):
        return DDPStrategy.broadcast(self, obj, src)

    def reduce(self, tensor, reduce_op="max"):
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor

    def all_gather(self, tensor):
        return _all_gather_ddp_if_available(tensor)


def _fails_on(rank: int, failing: set[int]):
    def fn() -> int:
        if rank in failing:
            raise ValueError(f"boom on {rank}")
        return rank

    return fn


def _work(rank: int, out_dir: str) -> None:
    store = f"file://{out_dir}/store"
    dist.init_process_group(
        "gloo", init_method=store, rank=rank, world_size=WORLD, timeout=timedelta(seconds=60)
    )
    trainer = types.SimpleNamespace(world_size=WORLD, global_rank=rank, strategy=_Strategy())
    cases = {
        "together, none fails": lambda: run_together(trainer, "x", _fails_on(rank, set())),
        "together, 1 and 2 fail": lambda: run_together(trainer, "x", _fails_on(rank, {1, 2})),
        "together, all fail": lambda: run_together(trainer, "x", _fails_on(rank, {0, 1, 2})),
        "on rank 1, it fails": lambda: run_on_rank(trainer, 1, "y", _fails_on(rank, {1})),
        "on rank 1, it works": lambda: run_on_rank(trainer, 1, "y", lambda: {"from": rank}),
    }
    facts = {}
    for index, (name, call) in enumerate(cases.items()):
        try:
            facts[name] = ["returned", call()]
        except Exception as error:
            facts[name] = [type(error).__name__, str(error)]
        # every rank at this case: the collectives of the ones before paired up
        facts[name].append(trainer.strategy.all_gather(torch.tensor([index])).flatten().tolist())
    Path(out_dir, f"facts{rank}.json").write_text(json.dumps(facts))
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.start_processes(_work, args=(sys.argv[1],), nprocs=WORLD, start_method="spawn")
