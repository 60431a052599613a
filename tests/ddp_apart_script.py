"""Run by tests/test_callback_ddp.py: DDP fits (2 CPU processes, gloo) where the ranks' planning parts
ways, three fits in one launch to keep the tests' time low.

1. ``block``: the first profile's real timing forward raises on rank 1 (the model's own step). Every rank
   must raise at once: the failing rank its own error, the other ``RankFailedError`` naming it and that
   error, not a gloo error nor a wait for the timeout.
2. ``op``: the same at ``granularity="op"``, where rank 0's timing of the blocks' options raises (an
   injected fault): rank 0 times them for every rank and broadcasts.
3. ``buffers``: a model with a buffer, which DDP broadcasts before a forward after a training step; at
   step 2 only rank 1 meets shapes no plan covers, so only rank 1 profiles (rank 0's plan holds). Its
   measuring forwards must run no collective: they used to broadcast the buffer alone, and both ranks
   waited until the timeout.
4. ``fallback``: the same model, whose step does not run on fake tensors (profiled on real ones), rank 1
   alone at step 1: DDP rebuilds its gradient buckets (a broadcast) on the first forward with autograd
   after the first synchronised backward, which that real profile used to be, on rank 1 alone.
5. ``static_graph``: the fallback under ``DDPStrategy(static_graph=True)``, where a forward and backward
   through DDP under ``no_sync`` before the first real backward failed on every rank (an internal assert
   of DDP's delayed all-reduce).

Usage:
    python tests/ddp_apart_script.py OUT_DIR

Each rank writes ``facts{rank}.json``: per failing fit, the error's type and message, the seconds from
the fit's start to the error, and what the model holds after it (checkpointed modules, forward hooks);
for the others, the error (None), the seconds, the plans in the rank's book and the plan in force at
each step.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from callback_helpers import TINY_GPT, exit_cleanly, next_token_pairs, token_loader  # noqa: E402
from capped_ddp_script import ddp_trainer  # noqa: E402

from examples.gpt import GPT  # noqa: E402
from lightning_ckpt import AutoCheckpoint  # noqa: E402
from lightning_ckpt._compat import FakeTensor  # noqa: E402
from lightning_ckpt.core.wrapping import checkpointed_names  # noqa: E402
from lightning_ckpt.lightning import op_options  # noqa: E402


class FailsOnRank1(GPT):
    """The tiny GPT whose step raises on rank 1 when it runs on real tensors without autograd: the
    profile's timing forward there, nowhere else."""

    def training_step(self, batch, batch_idx):
        real = not isinstance(batch[0], FakeTensor)
        if real and not torch.is_grad_enabled() and torch.distributed.get_rank() == 1:
            raise ValueError("rank 1 cannot time this batch")
        return super().training_step(batch, batch_idx)


def _failed_fit(model: GPT, callback: AutoCheckpoint) -> dict:
    """Fit until it raises: the error, the seconds to it, and what the model holds after it."""
    trainer = ddp_trainer(callback, 2)
    start = time.perf_counter()
    try:
        trainer.fit(model, train_dataloaders=token_loader(batch_size=4, num_batches=4))
        error = None
    except Exception as caught:
        error = caught
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    return {
        "type": type(error).__name__,
        "message": str(error),
        "seconds": time.perf_counter() - start,
        "checkpointed": checkpointed_names(model),
        "hooks": hooks,
    }


def _option_timing_fails_on_rank_0(trainer, *args):
    if trainer.global_rank == 0:
        raise ValueError("rank 0 cannot time these options")
    raise AssertionError("only rank 0 times the op-level options")


class BufferedGPT(GPT):
    """The tiny GPT with a buffer (as a rotary ``inv_freq`` or BatchNorm statistics are)."""

    def __init__(self, **config) -> None:
        super().__init__(**config)
        self.register_buffer("scale", torch.ones(1))


class PlanSpy(L.Callback):
    def __init__(self, callback: AutoCheckpoint) -> None:
        self.callback, self.steps = callback, []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.steps.append(list(self.callback.plan.checkpointed))


class RealOnlyGPT(BufferedGPT):
    """A step that does not run on fake tensors (as one with ``.item()`` would not)."""

    def training_step(self, batch, batch_idx):
        if isinstance(batch[0], FakeTensor):
            raise RuntimeError("this step needs real tensors")
        return super().training_step(batch, batch_idx)


def _apart_fit(model_class: type, alone_from: int, **trainer_kwargs) -> dict:
    """Rank 0 trains on (4, 32) batches, rank 1 on (4, 32) until step ``alone_from``, then (8, 32): only
    rank 1 profiles there."""
    rank = torch.distributed.get_rank()
    rows = [4] * 4 if rank == 0 else [4] * alone_from + [8] * (4 - alone_from)
    batches = [next_token_pairs(n, 32, seed=10 * rank + i) for i, n in enumerate(rows)]
    torch.manual_seed(0)
    model, callback = model_class(**TINY_GPT), AutoCheckpoint(budget_gb=1000, measure=False)
    spy = PlanSpy(callback)
    trainer = ddp_trainer(callback, 4, spy, use_distributed_sampler=False, **trainer_kwargs)
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the real-tensor fallback's warning, on every profile
            trainer.fit(model, train_dataloaders=DataLoader(batches, batch_size=None))
        error = None
    except Exception as caught:
        error = f"{type(caught).__name__}: {caught}"
    plans = [[shape for shape, _ in shapes] for shapes in callback.plans]
    return {"error": error, "seconds": time.perf_counter() - start, "plans": plans, "steps": spy.steps}


def main(out_dir: Path) -> None:
    torch.manual_seed(0)
    facts = {"block": _failed_fit(FailsOnRank1(**TINY_GPT), AutoCheckpoint(budget_gb=0.0022))}
    op_options._timed = _option_timing_fails_on_rank_0  # an injected fault: rank 0 times, then broadcasts
    torch.manual_seed(0)
    facts["op"] = _failed_fit(GPT(**TINY_GPT), AutoCheckpoint(budget_gb=0.0022, granularity="op"))
    facts["buffers"] = _apart_fit(BufferedGPT, alone_from=2)
    facts["fallback"] = _apart_fit(RealOnlyGPT, alone_from=1)
    facts["static_graph"] = _apart_fit(RealOnlyGPT, alone_from=1, static_graph=True)
    rank = torch.distributed.get_rank()
    (out_dir / f"facts{rank}.json").write_text(json.dumps(facts))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    exit_cleanly()
