"""Run by tests/test_fsdp2.py: AutoCheckpoint under FSDP2 on 4 CPU processes (gloo), each rank with a
sequence length of its own, a resume from the sharded checkpoint, and the same run without the callback:
three fits in one launch, to keep the test's time low.

Usage:
    python tests/fsdp2_ranks_script.py OUT_DIR probe
        Rank r writes ``bounds{r}.json``: its predicted peak with every block checkpointed (the minimum),
        with none (unchecked), and its static bytes, for its own batch.
    python tests/fsdp2_ranks_script.py OUT_DIR run BUDGET_BYTES
        1. ``capped``: 4 steps (4 epochs of 1 batch) inside ``memory_cap(BUDGET_BYTES)`` per rank, with
           ``budget_gb`` equal to the cap, saving the sharded checkpoint (a directory) after each epoch;
        2. ``resumed``: a new Trainer resumes from the checkpoint after step 2 and trains steps 3-4 under
           the same cap;
        3. ``plain``: the 4 steps without the callback (and no cap).
        Each writes ``{name}_facts{r}.json`` (losses and all-gathers per step, the cap's peak, the
        optimizer state alive when training started; with the callback the checkpointed blocks, the
        batch shape the plan in force was made for, the rank's predicted peak for it, its minimum and
        unchecked peaks, the optimizer step's temporaries in the profile, the callback's measured peak
        and the lightning_ckpt warnings) and, on rank 0, the full parameters after the fit
        (``{name}.pt``). A rank that runs out of memory writes ``{name}_oom{r}.txt``.
    python tests/fsdp2_ranks_script.py OUT_DIR sharding SHARDING BUDGET_BYTES
        ``capped`` and ``plain`` as above (no checkpoints, no resume), each block sharded with SHARDING
        as in tests/fsdp2_script.py (``reshard-2``: ``reshard_after_forward=2``).

Rank r's batches are (4, LENGTHS[r]): each rank plans its own batch; one plan must hold on all. Dropout
is off, so that the resumed steps can equal the uninterrupted ones (Lightning does not restore the RNG).
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.utils.data import DataLoader, TensorDataset

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from callback_helpers import TINY_GPT, exit_cleanly, fast_trainer, fit_in_cap, next_token_pairs  # noqa: E402
from fsdp2_script import ShardedGPT, StepRecorder  # noqa: E402

from lightning_ckpt import AutoCheckpoint  # noqa: E402
from lightning_ckpt.planning.peak import fixed_peak_bytes, predict_peak_bytes  # noqa: E402
from lightning_ckpt.testing import CountRestoredState, memory_cap  # noqa: E402

WORLD, BATCH, STEPS = 4, 4, 4
LENGTHS = (32, 24, 16, 28)  # rank r's sequence length


def rank_loader(rank: int) -> DataLoader:
    """One batch of (BATCH, LENGTHS[rank]) tokens, this rank's own (no distributed sampler), per epoch.

    One, because Lightning resumes from a checkpoint saved at an epoch's end with the batch index past
    the epoch's last batch and then starts the loader again: with two batches per epoch the resumed run
    would train on the first batch where the uninterrupted one trains on the second."""
    pairs = next_token_pairs(BATCH, LENGTHS[rank], seed=rank)
    return DataLoader(TensorDataset(*pairs), batch_size=BATCH, shuffle=False)


def trainer_for(callbacks: list, **kwargs) -> L.Trainer:
    strategy = ModelParallelStrategy(
        data_parallel_size=WORLD, tensor_parallel_size=1, timeout=timedelta(seconds=180)
    )
    options = dict(max_steps=STEPS, devices=WORLD, strategy=strategy, use_distributed_sampler=False)
    return fast_trainer(callbacks, **(options | kwargs))


def model(sharding: str = "reshard") -> ShardedGPT:
    torch.manual_seed(0)
    return ShardedGPT(sharding=sharding, **(TINY_GPT | {"dropout": 0.0}))


def probe(out_dir: Path) -> None:
    callback = AutoCheckpoint(budget_gb=1000, measure=False)
    L.seed_everything(0, verbose=False)
    trainer = trainer_for([callback], max_steps=2)  # 24 and 28 tokens: their own shapes planned at step 1
    trainer.fit(model(), train_dataloaders=rank_loader(trainer.global_rank))
    profile = callback.profile
    bounds = {
        "minimum": fixed_peak_bytes(profile),
        "unchecked": predict_peak_bytes(profile, []),
        "static": profile.static_bytes,
    }
    (out_dir / f"bounds{trainer.global_rank}.json").write_text(json.dumps(bounds))


def fit(
    out_dir: Path,
    name: str,
    budget_bytes: int | None,
    ckpt_path: str | None = None,
    sharding: str = "reshard",
    saving: bool = False,
) -> None:
    """One fit (see the module docstring), saving the sharded checkpoint after each epoch if ``saving``;
    writes its facts."""
    recorder = StepRecorder()
    rank_model = model(sharding)
    cap = memory_cap(budget_bytes or 10**12, model=rank_model)
    restored = CountRestoredState(cap)  # a resume's loaded optimizer state counts from then on
    callbacks: list = [recorder, restored]
    callback = None if budget_bytes is None else AutoCheckpoint(budget_gb=budget_bytes / 1e9)
    callbacks += [callback] if callback else []
    checkpoints = ModelCheckpoint(dirpath=out_dir / "ckpt", every_n_epochs=1, save_top_k=-1)
    L.seed_everything(0, verbose=False)
    trainer = trainer_for(callbacks + [checkpoints] * saving, enable_checkpointing=saving)
    rank, live = trainer.global_rank, rank_model
    loader = rank_loader(rank)  # made before the cap: on a device only the batch is there
    facts: dict = {}
    oom_file = out_dir / f"{name}_oom{rank}.txt"
    caught = fit_in_cap(trainer, live, cap, oom_file, train_dataloaders=loader, ckpt_path=ckpt_path)
    facts |= {
        "losses": recorder.losses,
        "gathers": recorder.gathers,
        "global_step": trainer.global_step,
        "cap_peak": cap.peak_bytes,
        "state_at_start": restored.state_bytes,
    }
    if callback is not None:
        facts |= callback_facts(callback)
        facts["warnings"] = caught
    (out_dir / f"{name}_facts{rank}.json").write_text(json.dumps(facts))
    full = {key: param.full_tensor().detach() for key, param in live.named_parameters()}
    if rank == 0:
        torch.save(full, out_dir / f"{name}.pt")


def callback_facts(callback: AutoCheckpoint) -> dict:
    """The plan in force, and this rank's own prediction for it (from the plan for a restored plan)."""
    plan, profile = callback.plan, callback.profile
    facts = {
        "checkpointed": list(plan.checkpointed),
        "measured_max_over_ranks": plan.measured_peak_bytes,
        "profiled": profile is not None,
        "predicted": plan.predicted_peak_bytes,
    }
    if profile is not None:
        facts |= {
            "predicted": predict_peak_bytes(profile, plan.checkpointed),
            "minimum": fixed_peak_bytes(profile),
            "unchecked": predict_peak_bytes(profile, []),
            "optimizer_step": profile.optimizer_step_bytes,
            "planned_shape": _planned_shape(callback),
        }
    return facts


def _planned_shape(callback: AutoCheckpoint) -> list[int]:
    """The shape of the first batch tensor the plan in force was made for (it covers every batch of the
    same tensors with no size larger)."""
    (shapes,) = [key for key, plan in callback.plans.items() if plan is callback.plan]
    return list(shapes[0][0])


def run(out_dir: Path, budget_bytes: int) -> None:
    fit(out_dir, "capped", budget_bytes, saving=True)
    (step_two,) = (out_dir / "ckpt").glob("epoch=1-step=2*")
    fit(out_dir, "resumed", budget_bytes, ckpt_path=str(step_two))
    fit(out_dir, "plain", None)


def run_sharding(out_dir: Path, sharding: str, budget_bytes: int) -> None:
    fit(out_dir, "capped", budget_bytes, sharding=sharding)
    fit(out_dir, "plain", None, sharding=sharding)


if __name__ == "__main__":
    out, mode = Path(sys.argv[1]), sys.argv[2]
    if mode == "probe":
        probe(out)
    elif mode == "run":
        run(out, int(sys.argv[3]))
    else:
        run_sharding(out, sys.argv[3], int(sys.argv[4]))
    exit_cleanly()
