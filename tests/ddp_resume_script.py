"""Run by tests/test_callback_ddp.py: a DDP fit (2 CPU processes, gloo) resumed where the ranks' batches
fall under different saved plans: three fits in one launch, to keep the test's time low.

Usage:
    python tests/ddp_resume_script.py OUT_DIR

1. ``probe`` (no cap, nothing needed): both ranks train on (4, 16) then (4, 32) batches; the budget is
   the larger of the unchecked peak at 16 tokens and the least peak at 32, so that the plan for 16
   checkpoints nothing and the one for 32 does.
2. ``first``: the same two steps at that budget, each rank inside ``memory_cap(budget)``; the checkpoint
   after them holds two plans, one per family.
3. ``resumed``: from that checkpoint, rank 0 sees (4, 16) batches and rank 1 (4, 32): each rank's batch
   falls under another saved plan, and both hold on its own fresh profile.

Each rank writes ``facts{rank}.json``: per fit, the global step and the plan in force (its checkpointed
blocks) at each step, the number of plans, the cap's peak; and the budget. A rank that runs out of
memory writes ``oom{rank}.txt``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
from torch.utils.data import DataLoader

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from callback_helpers import exit_cleanly, fit_in_cap, next_token_pairs, tiny_gpt  # noqa: E402
from capped_ddp_script import ddp_trainer  # noqa: E402
from test_budget_promise import exact_budget  # noqa: E402

from lightning_ckpt import AutoCheckpoint  # noqa: E402
from lightning_ckpt.planning.peak import fixed_peak_bytes, predict_peak_bytes  # noqa: E402
from lightning_ckpt.testing import CountRestoredState, memory_cap  # noqa: E402

BATCH = 4


def loader(lengths: tuple[int, ...], seed: int) -> DataLoader:
    """One batch of (BATCH, length) tokens per length, in order (no distributed sampler)."""
    pairs = [next_token_pairs(BATCH, length, seed=seed + i) for i, length in enumerate(lengths)]
    return DataLoader(pairs, batch_size=None, shuffle=False)


class PlanSpy(L.Callback):
    """The plan in force at each step (after AutoCheckpoint's ``on_train_batch_start``)."""

    def __init__(self, callback: AutoCheckpoint) -> None:
        self.callback, self.steps = callback, []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.steps.append([trainer.global_step, list(self.callback.plan.checkpointed)])


def shapes(length: int) -> tuple:
    return (((BATCH, length), "torch.int64"),) * 2


def probe() -> int:
    callback = AutoCheckpoint(budget_gb=1000, measure=False)
    L.seed_everything(0, verbose=False)
    trainer = ddp_trainer(callback, 2, use_distributed_sampler=False)
    trainer.fit(tiny_gpt(dropout=0.0), train_dataloaders=loader((16, 32), seed=0))
    short, long = (callback._book.profiles[shapes(n)] for n in (16, 32))
    least = max(predict_peak_bytes(short, []), fixed_peak_bytes(long))
    budget = exact_budget(least)  # the smallest at least that which budget_gb gives back exactly
    assert budget < predict_peak_bytes(long, []), "the plan for 32 tokens must checkpoint something"
    return budget


def fit(out_dir: Path, name: str, budget: int, lengths: dict[int, tuple], **fit_kwargs) -> dict:
    model = tiny_gpt(dropout=0.0)
    cap = memory_cap(budget, model=model)
    callback = AutoCheckpoint(budget_gb=budget / 1e9)
    spy = PlanSpy(callback)
    L.seed_everything(0, verbose=False)
    max_steps = 2 if name == "first" else 5
    trainer = ddp_trainer(callback, max_steps, spy, CountRestoredState(cap), use_distributed_sampler=False)
    rank = trainer.global_rank
    data = loader(lengths[rank], seed=10 * rank)  # made before the cap: on a device only the batch is there
    fit_in_cap(trainer, model, cap, out_dir / f"oom{rank}.txt", train_dataloaders=data, **fit_kwargs)
    if name == "first":
        trainer.save_checkpoint(out_dir / "step2.ckpt")
    return {"rank": rank, "steps": spy.steps, "plans": len(callback.plans), "cap_peak": cap.peak_bytes}


def main(out_dir: Path) -> None:
    budget = probe()
    facts = {"budget": budget}
    facts["first"] = fit(out_dir, "first", budget, {0: (16, 32), 1: (16, 32)})
    resumed = {0: (16,) * 3, 1: (32,) * 3}
    facts["resumed"] = fit(out_dir, "resumed", budget, resumed, ckpt_path=str(out_dir / "step2.ckpt"))
    (out_dir / f"facts{facts['first']['rank']}.json").write_text(json.dumps(facts))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    exit_cleanly()
