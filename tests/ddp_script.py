"""Run by tests/test_callback_ddp.py: AutoCheckpoint under DDP with 2 CPU processes (gloo).

Usage: python tests/ddp_script.py OUT_DIR {ddp,single}. Each DDP rank writes its plan; rank 0 (or the
single process, on a batch twice as large) writes the parameters after training.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import lightning as L
import torch

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from callback_helpers import exit_cleanly, tiny_gpt, token_loader  # noqa: E402

import lightning_ckpt.callback as callback_module  # noqa: E402
from lightning_ckpt import AutoCheckpoint  # noqa: E402

STEPS, BATCH = 3, 4


class ShardedTokens(L.LightningDataModule):
    """Rank r of w trains on rows r, r+w, ... of one fixed token set, so DDP's 2 x BATCH rows per step are
    exactly the single process's batch of 2 x BATCH rows (no sampler shuffling involved)."""

    def __init__(self, batch_size: int) -> None:
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self):
        loader = token_loader(batch_size=2 * BATCH, num_batches=STEPS + 1)
        rank, world = self.trainer.global_rank, self.trainer.world_size
        inputs, targets = loader.dataset.tensors
        rows = torch.arange(rank, inputs.shape[0], world)
        dataset = torch.utils.data.TensorDataset(inputs[rows], targets[rows])
        return torch.utils.data.DataLoader(dataset, batch_size=self.batch_size, shuffle=False)


def rank_dependent_times(profile_in_fit):
    """Profile as usual, then make the recompute times differ by rank (the layers are alike, so they are
    timed alike: each rank's grow along the blocks, rank 1's reversed): only the broadcast of rank 0's
    plan can make both ranks checkpoint the same blocks."""

    def profile_step_per_rank(*args, **kwargs):
        profile = profile_in_fit(*args, **kwargs)
        if torch.distributed.is_initialized():
            seconds = [m.recompute_seconds * (1 + i) for i, m in enumerate(profile.modules)]
            seconds = seconds[::-1] if torch.distributed.get_rank() == 1 else seconds
            modules = [
                dataclasses.replace(m, recompute_seconds=s)
                for m, s in zip(profile.modules, seconds, strict=True)
            ]
            profile = dataclasses.replace(profile, modules=tuple(modules))
        return profile

    return profile_step_per_rank


def main(out_dir: Path, mode: str) -> None:
    callback_module.profile_in_fit = rank_dependent_times(callback_module.profile_in_fit)
    L.seed_everything(0, verbose=False)
    model = tiny_gpt(seed=1, dropout=0.0)
    ddp = mode == "ddp"
    callback = AutoCheckpoint(budget_gb=float(sys.argv[3]))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2 if ddp else 1,
        strategy="ddp" if ddp else "auto",
        max_steps=STEPS,
        callbacks=[callback] if ddp else [],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
    )
    trainer.fit(model, datamodule=ShardedTokens(BATCH if ddp else 2 * BATCH))
    if ddp:
        plan = callback.plan.to_dict()
        (out_dir / f"plan{trainer.global_rank}.json").write_text(json.dumps(plan, sort_keys=True))
    if trainer.is_global_zero:
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, out_dir / f"{mode}.pt")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
    exit_cleanly()
