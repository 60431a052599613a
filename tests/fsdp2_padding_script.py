"""Run by tests/test_fsdp2_padding.py: AutoCheckpoint under FSDP2 on 2 CPU processes (gloo) with dynamic
padding: every step each rank gets a batch of a new length of its own (``LENGTHS``), as a padding
collator makes them.

Usage:
    python tests/fsdp2_padding_script.py OUT_DIR [op | tight]

``op``: the callback at ``granularity="op"``, priced in FLOPs (selective options get chosen). ``tight``:
lengths up to 31 (``TIGHT``) and a budget between the least peaks at 31 and at 32 tokens, so that the
family top (4, 32) does not fit and each rank plans its own shapes instead.

In one launch, on each rank:

1. ``probe``: one step at the longest batch with an unlimited budget, for its least and unchecked peaks;
   the budget is halfway between them (the larger over ranks: one budget for both);
2. ``capped``: the steps inside ``memory_cap(budget)`` per rank with ``budget_gb`` equal to the cap;
3. ``plain``: the same steps without the callback (and no cap).

Each writes ``{name}_facts{r}.json``: the losses and all-gathers per step, the cap's peak, the blocks
checkpointed at each step, the batch shapes of every plan made and the lightning_ckpt warnings. A rank
that runs out of memory writes ``capped_oom{r}.txt``. Dropout is off: the runs can equal each other.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.utils.data import DataLoader

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from callback_helpers import TINY_GPT, exit_cleanly, fast_trainer, fit_in_cap, next_token_pairs  # noqa: E402
from fsdp2_script import ShardedGPT, StepRecorder  # noqa: E402

from lightning_ckpt import AutoCheckpoint  # noqa: E402
from lightning_ckpt.planning.peak import fixed_peak_bytes, predict_peak_bytes  # noqa: E402
from lightning_ckpt.testing import memory_cap  # noqa: E402

WORLD, BATCH = 2, 4
LENGTHS = ((20, 9, 30, 13, 32, 17), (11, 27, 16, 31, 8, 24))  # rank r's padded length at each step
TIGHT = ((20, 9, 30, 13, 31, 17), (11, 27, 16, 31, 8, 24))
LONGEST = max(max(lengths) for lengths in LENGTHS)


class Checkpointed(L.Callback):
    """The blocks checkpointed in each step (after the callback's own batch start has applied its plan)."""

    def __init__(self, callback: AutoCheckpoint) -> None:
        self.callback = callback
        self.steps: list[list[str]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.steps.append(list(self.callback.plan.checkpointed))


def loader(lengths: tuple[int, ...], seed: int) -> DataLoader:
    """One (BATCH, length) batch of next-token pairs per length, in order."""
    batches = [next_token_pairs(BATCH, n, seed=seed + i) for i, n in enumerate(lengths)]
    return DataLoader(batches, batch_size=None, shuffle=False)


def trainer_for(callbacks: list, steps: int) -> L.Trainer:
    strategy = ModelParallelStrategy(
        data_parallel_size=WORLD, tensor_parallel_size=1, timeout=timedelta(seconds=180)
    )
    return fast_trainer(
        callbacks, max_steps=steps, devices=WORLD, strategy=strategy, use_distributed_sampler=False
    )


def model() -> ShardedGPT:
    torch.manual_seed(0)
    return ShardedGPT(**(TINY_GPT | {"dropout": 0.0, "block_size": LONGEST}))


OPTIONS: dict = {}
"""AutoCheckpoint's settings besides the budget (``op``: op level, priced in FLOPs)."""


def bounds(length: int) -> tuple[int, int]:
    """The least and the unchecked peak at (BATCH, length), the larger of each over ranks."""
    callback = AutoCheckpoint(budget_gb=1000, measure=False, **OPTIONS)
    L.seed_everything(0, verbose=False)
    trainer = trainer_for([callback], 2)  # a length not a power of two: its own shapes planned at step 1
    trainer.fit(model(), train_dataloaders=loader((length, length), seed=100 + trainer.global_rank))
    peaks = torch.tensor([fixed_peak_bytes(callback.profile), predict_peak_bytes(callback.profile, [])])
    torch.distributed.all_reduce(peaks, op=torch.distributed.ReduceOp.MAX)
    return int(peaks[0]), int(peaks[1])


def probe_budget(tight: bool) -> int:
    """Halfway between the least and the unchecked peak at the longest batch; ``tight``: halfway between
    the least peaks at 31 and at 32 tokens."""
    if tight:
        return (bounds(LONGEST - 1)[0] + bounds(LONGEST)[0]) // 2
    return sum(bounds(LONGEST)) // 2


def fit(out_dir: Path, name: str, budget_bytes: int | None, lengths: tuple = LENGTHS) -> None:
    recorder, rank_model = StepRecorder(), model()
    cap = memory_cap(budget_bytes or 10**12, model=rank_model)
    callback = None if budget_bytes is None else AutoCheckpoint(budget_gb=budget_bytes / 1e9, **OPTIONS)
    checkpointed = Checkpointed(callback)
    callbacks = [callback, checkpointed, recorder] if callback else [recorder]
    L.seed_everything(0, verbose=False)
    trainer = trainer_for(callbacks, len(lengths[0]))
    rank = trainer.global_rank
    data = loader(lengths[rank], seed=10 * rank)
    caught = fit_in_cap(trainer, rank_model, cap, out_dir / f"{name}_oom{rank}.txt", train_dataloaders=data)
    facts = {"losses": recorder.losses, "gathers": recorder.gathers, "cap_peak": cap.peak_bytes}
    if callback is not None:
        facts |= {
            "budget": budget_bytes,
            "checkpointed": checkpointed.steps,
            "plans": [[list(shape) for shape, _ in shapes] for shapes in callback.plans],
            "warnings": caught,
        }
    (out_dir / f"{name}_facts{rank}.json").write_text(json.dumps(facts))


if __name__ == "__main__":
    out, mode = Path(sys.argv[1]), (sys.argv[2:] or ["block"])[0]
    OPTIONS |= {"granularity": "op", "cost": "flops"} if mode == "op" else {}
    lengths = TIGHT if mode == "tight" else LENGTHS
    budget = probe_budget(tight=mode == "tight")
    fit(out, "capped", budget, lengths)
    fit(out, "plain", None, lengths)
    exit_cleanly()
