"""Run by tests/test_fsdp2.py: AutoCheckpoint under FSDP2 (``ModelParallelStrategy``, 2 CPU processes, gloo).

The model is the example GPT sharded as Lightning's docs shard one: ``fully_shard`` on each block, then on
the whole model, in ``configure_model``. Every rank writes what it saw to ``OUT_DIR``.

Usage:
    python tests/fsdp2_script.py OUT_DIR probe SHARDING
        Rank r writes ``bounds{r}.json``: its predicted peak with every block checkpointed (the minimum)
        and with none (unchecked), and its static bytes.
    python tests/fsdp2_script.py OUT_DIR plain SHARDING
        Trains without the callback; writes ``plain_losses{r}.json``, ``plain_gathers{r}.json`` (count and
        elements of the all-gathers of each step) and, on rank 0, the full parameters (``plain.pt``).
    python tests/fsdp2_script.py OUT_DIR capped SHARDING BUDGET_BYTES
        Trains inside ``memory_cap(BUDGET_BYTES)`` per rank with ``budget_gb`` equal to the cap; writes the
        same as ``plain`` (``capped_*``), ``plan{r}.json``, ``facts{r}.json`` (the rank's own predicted
        peak for the plan, its minimum and unchecked peaks, the cap's peak, the callback's measured peak)
        and ``flag{r}.txt``. Rank 1 sees the recompute times reversed: only the broadcast of one rank's
        plan makes the ranks checkpoint the same blocks.
    python tests/fsdp2_script.py OUT_DIR compare SHARDING BUDGET_BYTES
        ``capped``, then ``plain``, in one launch.
    python tests/fsdp2_script.py OUT_DIR compare-op SHARDING BUDGET_BYTES
        ``compare`` at op level (``granularity="op"``, priced in FLOPs so that selective options are
        chosen); ``facts{r}.json`` also has the selective policies applied while training, and its
        ``predicted`` is the op-level plan's own prediction.
    python tests/fsdp2_script.py OUT_DIR fallback SHARDING BUDGET_BYTES
        As ``capped``, without a cap, on a model whose saved hyperparameters no longer build it: the
        profile falls back to one real step (with a warning).

Every run with the callback writes the warnings lightning_ckpt gave to ``warnings{r}.json``.

SHARDING is ``reshard`` (``reshard_after_forward=True``, FSDP2's default), ``keep`` (False: the blocks
stay gathered from their forward to their backward; the callback's ``targets=["Block"]``), ``bf16``
(``MixedPrecisionPolicy(param_dtype=torch.bfloat16)``: gathered in bf16, reduced in fp32) or ``reshard-N``
(``reshard_after_forward=N``: after a block's forward each rank keeps 1/N of its unsharded parameters,
and its backward all-gathers them over N ranks; tests/fsdp2_ranks_script.py runs it on 4 ranks).
"""

from __future__ import annotations

import json
import sys
import warnings
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from callback_helpers import TINY_GPT, exit_cleanly, fast_trainer, token_loader  # noqa: E402
from capped_ddp_script import PolicySpy  # noqa: E402
from ddp_script import rank_dependent_times  # noqa: E402

import lightning_ckpt.callback as callback_module  # noqa: E402
from examples.gpt import GPT  # noqa: E402
from lightning_ckpt import AutoCheckpoint  # noqa: E402
from lightning_ckpt.planning.peak import fixed_peak_bytes, predict_peak_bytes  # noqa: E402
from lightning_ckpt.testing import memory_cap  # noqa: E402

STEPS, BATCH = 4, 4  # BATCH rows per rank and step


class ShardedGPT(GPT):
    """The example GPT, each block and then the whole model ``fully_shard``-ed over the data-parallel mesh."""

    def __init__(self, sharding: str = "reshard", **kwargs) -> None:
        super().__init__(**kwargs)

    def configure_model(self) -> None:
        mesh = self.device_mesh["data_parallel"]
        sharding = self.hparams.sharding
        bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        options = {
            "mp_policy": bf16 if sharding == "bf16" else MixedPrecisionPolicy(),
            "reshard_after_forward": reshard_after_forward(sharding),
        }
        for block in self.transformer.h:
            fully_shard(block, mesh=mesh, **options)
        fully_shard(self, mesh=mesh, mp_policy=options["mp_policy"])


def reshard_after_forward(sharding: str) -> bool | int:
    """``fully_shard``'s ``reshard_after_forward`` for a SHARDING name: ``keep`` False, ``reshard-N`` the
    int N (reshard to N ranks after the forward), anything else True."""
    if sharding.startswith("reshard-"):
        return int(sharding.removeprefix("reshard-"))
    return sharding != "keep"


class StepRecorder(L.Callback):
    """Each step's loss, and the all-gathers FSDP2 runs in it: (count, elements, how many of them over
    fewer ranks than the world: the post-forward meshes of ``reshard_after_forward=N``)."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.gathers: list[tuple[int, int, int]] = []
        self._count = [0, 0, 0]
        original = torch.distributed.all_gather_single

        def counted(output, input, *args, **kwargs):
            group_size = torch.distributed.get_world_size(kwargs.get("group"))
            self._count[0] += 1
            self._count[1] += output.numel()
            self._count[2] += group_size < torch.distributed.get_world_size()
            return original(output, input, *args, **kwargs)

        torch.distributed.all_gather_single = counted

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._count[:] = [0, 0, 0]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))
        self.gathers.append(tuple(self._count))


def trainer_for(callbacks: list, max_steps: int) -> L.Trainer:
    strategy = ModelParallelStrategy(
        data_parallel_size=2, tensor_parallel_size=1, timeout=timedelta(seconds=120)
    )
    return fast_trainer(callbacks, max_steps=max_steps, devices=2, strategy=strategy)


def model_for(sharding: str) -> ShardedGPT:
    torch.manual_seed(0)
    return ShardedGPT(sharding=sharding, **TINY_GPT)  # dropout on: the recompute must replay its masks


def probe(out_dir: Path, sharding: str) -> None:
    callback = AutoCheckpoint(budget_gb=1000, measure=False)
    L.seed_everything(0, verbose=False)
    trainer = trainer_for([callback], max_steps=1)
    trainer.fit(model_for(sharding), train_dataloaders=token_loader(batch_size=BATCH, num_batches=2 * STEPS))
    profile = callback.profile
    bounds = {
        "minimum": fixed_peak_bytes(profile),
        "unchecked": predict_peak_bytes(profile, []),
        "static": profile.static_bytes,
    }
    (out_dir / f"bounds{trainer.global_rank}.json").write_text(json.dumps(bounds))


def train(
    out_dir: Path, sharding: str, budget_bytes: int | None, fallback: bool = False, op: bool = False
) -> None:
    callback_module.profile_in_fit = rank_dependent_times(callback_module.profile_in_fit)
    recorder, spy = StepRecorder(), PolicySpy()
    targets = ["Block"] if sharding == "keep" else None  # a class name, through fully_shard's FSDPBlock
    op_level = {"granularity": "op", "cost": "flops"} if op else {}
    callback = None
    if budget_bytes is not None:
        callback = AutoCheckpoint(budget_gb=budget_bytes / 1e9, targets=targets, **op_level)
    L.seed_everything(0, verbose=False)
    trainer = trainer_for([recorder, spy] + ([callback] if callback else []), max_steps=STEPS)
    model = model_for(sharding)
    loader = token_loader(batch_size=BATCH, num_batches=2 * STEPS)
    rank = trainer.global_rank
    if callback is None:
        trainer.fit(model, train_dataloaders=loader)
    else:
        if fallback:
            model.hparams["n_layer"] = "four"  # no twin can be built from these
        try:
            with (
                warnings.catch_warnings(record=True) as caught,
                memory_cap(10**12 if fallback else budget_bytes, model=model) as cap,
            ):
                warnings.simplefilter("always")
                trainer.fit(model, train_dataloaders=loader)
        except torch.OutOfMemoryError as error:
            (out_dir / f"flag{rank}.txt").write_text(f"oom at step {trainer.global_step}: {error}")
            raise
        plan = callback.plan
        (out_dir / f"plan{rank}.json").write_text(json.dumps(plan.to_dict(), sort_keys=True))
        facts = {
            "predicted": plan.predicted_peak_bytes
            if op
            else predict_peak_bytes(callback.profile, plan.checkpointed),
            "policies": spy.policies,
            "minimum": fixed_peak_bytes(callback.profile),
            "unchecked": predict_peak_bytes(callback.profile, []),
            "cap_peak": cap.peak_bytes,
            "measured_max_over_ranks": plan.measured_peak_bytes,
            "static": callback.profile.static_bytes,
            "global_step": trainer.global_step,
        }
        (out_dir / f"facts{rank}.json").write_text(json.dumps(facts))
        ours = [str(w.message) for w in caught if "lightning_ckpt" in w.filename]
        (out_dir / f"warnings{rank}.json").write_text(json.dumps(ours))
        (out_dir / f"flag{rank}.txt").write_text("ok")
    mode = "plain" if callback is None else "capped"
    (out_dir / f"{mode}_losses{rank}.json").write_text(json.dumps(recorder.losses))
    (out_dir / f"{mode}_gathers{rank}.json").write_text(json.dumps(recorder.gathers))
    full = {name: param.full_tensor().detach() for name, param in model.named_parameters()}
    if rank == 0:
        torch.save(full, out_dir / f"{mode}.pt")


if __name__ == "__main__":
    out, mode, sharding = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    if mode == "probe":
        probe(out, sharding)
    elif mode in ("compare", "compare-op"):
        train(out, sharding, int(sys.argv[4]), op=mode == "compare-op")
        train(out, sharding, None)
    else:
        train(out, sharding, int(sys.argv[4]) if mode != "plain" else None, fallback=mode == "fallback")
    exit_cleanly()
