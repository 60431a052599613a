"""Run by tests/test_callback_ddp.py: AutoCheckpoint under DDP (2 CPU processes, gloo) on a capped device.

Usage:
    python tests/capped_ddp_script.py OUT_DIR probe
        Rank 0 writes ``bounds.json``: the per-rank minimum (every block checkpointed) and unchecked
        (nothing checkpointed) predicted peaks in bytes, DDP's gradient buckets included.
    python tests/capped_ddp_script.py OUT_DIR capped BUDGET_BYTES
        Each rank trains inside ``memory_cap(BUDGET_BYTES, model=model)`` with ``budget_gb`` equal to the
        cap, then writes ``plan{rank}.json`` and ``flag{rank}.txt`` (``ok``, or ``oom`` and the error).
    python tests/capped_ddp_script.py OUT_DIR mixed BUDGET_BYTES
        Rank 0 sees (1, 256) batches, rank 1 (5, 64) (batching by token count), vocabulary 2048: the rank
        heaviest with nothing checkpointed is not the heaviest under its own plan.
    python tests/capped_ddp_script.py OUT_DIR uneven BUDGET_BYTES
        The same, but the ranks see batches of different shapes at the same step (as with padding to each
        batch's longest sequence): rank 0 sequences of 16, 16, 32, 32 tokens, rank 1 of 32 throughout.
    python tests/capped_ddp_script.py OUT_DIR op BUDGET_BYTES
        As ``capped``, at op level (``granularity="op"``, priced in FLOPs so that selective options are
        chosen); ``facts{rank}.json`` also has the selective policies applied while training.
    python tests/capped_ddp_script.py OUT_DIR op-uneven BUDGET_BYTES
        ``uneven`` at op level: each rank checks the plan on its own batch shapes.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from callback_helpers import exit_cleanly, tiny_gpt, token_loader  # noqa: E402

from lightning_ckpt import AutoCheckpoint  # noqa: E402
from lightning_ckpt.lightning.apply_plan import current_policies  # noqa: E402
from lightning_ckpt.planning.peak import fixed_peak_bytes, predict_peak_bytes  # noqa: E402
from lightning_ckpt.testing import memory_cap  # noqa: E402

STEPS, BATCH = 4, 4  # BATCH rows per rank and step


def ddp_trainer(
    callback: AutoCheckpoint, max_steps: int, *others: L.Callback, static_graph: bool = False, **kwargs
) -> L.Trainer:
    # "ddp" with a short timeout: a rank that dies of OOM must not leave its peer waiting 30 minutes
    strategy = DDPStrategy(
        process_group_backend="gloo", timeout=timedelta(seconds=120), static_graph=static_graph
    )
    return L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_steps=max_steps,
        callbacks=[callback, *others],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        deterministic=True,
        **kwargs,
    )


def probe(out_dir: Path) -> None:
    callback = AutoCheckpoint(budget_gb=1000, measure=False)
    L.seed_everything(0, verbose=False)
    trainer = ddp_trainer(callback, max_steps=1)
    trainer.fit(tiny_gpt(), train_dataloaders=token_loader(batch_size=BATCH, num_batches=2 * STEPS))
    if trainer.is_global_zero:
        bounds = {
            "minimum": fixed_peak_bytes(callback.profile),
            "unchecked": predict_peak_bytes(callback.profile, []),
            "static": callback.profile.static_bytes,
        }
        (out_dir / "bounds.json").write_text(json.dumps(bounds))


class UnevenTokens(L.LightningDataModule):
    """Rank 0: sequences of 16 tokens for two steps, then 32; rank 1: 32 from the start.

    Both ranks' rows are made when it is built, before the cap: on a device only the batch is there (rows
    made inside ``train_dataloader`` put 4 KiB of tokens under the cap, over a plan within 3 KiB of it)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows = {
            rank: self._rows(rank, (16, 16, 32, 32) if rank == 0 else (32,) * STEPS) for rank in (0, 1)
        }

    @staticmethod
    def _rows(rank: int, lengths: tuple[int, ...]) -> list:
        generator = torch.Generator().manual_seed(rank)
        rows = []
        for length in lengths:
            tokens = torch.randint(0, 256, (BATCH, length + 1), generator=generator)
            rows += [(row[:-1], row[1:]) for row in tokens]
        return rows

    def train_dataloader(self):
        return torch.utils.data.DataLoader(
            self.rows[self.trainer.global_rank], batch_size=BATCH, shuffle=False
        )


class MixedShapes(L.LightningDataModule):
    """Rank 0: (1, 256) batches; rank 1: (5, 64); vocabulary 2048 (made before the cap, as above)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows = {rank: self._rows(rank, *((1, 256) if rank == 0 else (5, 64))) for rank in (0, 1)}

    @staticmethod
    def _rows(rank: int, batch: int, length: int) -> list:
        generator = torch.Generator().manual_seed(rank)
        rows = []
        for _ in range(STEPS):
            tokens = torch.randint(0, 2048, (batch, length + 1), generator=generator)
            rows.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
        return rows

    def train_dataloader(self):
        return torch.utils.data.DataLoader(self.rows[self.trainer.global_rank], batch_size=None)


class PolicySpy(L.Callback):
    """The selective policies applied to the model while it trains (saved op calls, as lists)."""

    def __init__(self) -> None:
        self.policies: dict[str, list] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        for name, policy in current_policies(pl_module).items():
            if policy is not None:
                self.policies[name] = sorted(map(list, policy.saved))


def capped(
    out_dir: Path, budget_bytes: int, uneven: bool = False, mixed: bool = False, op: bool = False
) -> None:
    model = tiny_gpt(block_size=256, vocab_size=2048) if mixed else tiny_gpt()
    op_level = {"granularity": "op", "cost": "flops"} if op else {}
    callback = AutoCheckpoint(budget_gb=budget_bytes / 1e9, **op_level)
    L.seed_everything(0, verbose=False)
    profiles, profile = [], callback._profile
    callback._profile = lambda *args: profiles.append(args[-1]) or profile(*args)  # count the step's profiles
    spy = PolicySpy()
    trainer = ddp_trainer(callback, STEPS, spy, use_distributed_sampler=not (uneven or mixed))
    loader = UnevenTokens() if uneven else token_loader(batch_size=BATCH, num_batches=2 * STEPS)
    loader = MixedShapes() if mixed else loader
    try:
        with memory_cap(budget_bytes, model=model) as cap:
            if uneven or mixed:
                trainer.fit(model, datamodule=loader)
            else:
                trainer.fit(model, train_dataloaders=loader)
    except torch.OutOfMemoryError as error:
        (out_dir / f"flag{trainer.global_rank}.txt").write_text(f"oom at step {trainer.global_step}: {error}")
        raise
    plan = callback.plan.to_dict()
    (out_dir / f"plan{trainer.global_rank}.json").write_text(json.dumps(plan, sort_keys=True))
    facts = {
        "plans": len(callback.plans),
        "profiles": len(profiles),
        "callback_budget_bytes": callback.budget_bytes,
        "global_step": trainer.global_step,
        "peak_bytes": cap.peak_bytes,
        "policies": spy.policies,
    }
    (out_dir / f"facts{trainer.global_rank}.json").write_text(json.dumps(facts))
    (out_dir / f"flag{trainer.global_rank}.txt").write_text("ok")


if __name__ == "__main__":
    if sys.argv[2] == "probe":
        probe(Path(sys.argv[1]))
    else:
        mode = sys.argv[2]
        uneven, op = mode in ("uneven", "op-uneven"), mode in ("op", "op-uneven")
        capped(Path(sys.argv[1]), int(sys.argv[3]), uneven, mode == "mixed", op)
    exit_cleanly()
