"""Run by tests/test_callback_ddp.py: DDP fits (2 CPU processes, gloo) whose planning fails on one rank
only. Every rank must raise at once: the failing rank its own error, the other ``RankFailedError`` naming
it and that error, not a gloo error nor a wait for the timeout.

1. ``block``: the first profile's real timing forward raises on rank 1 (the model's own step).
2. ``op``: at ``granularity="op"``, rank 0's timing of the blocks' options raises (an injected fault):
   rank 0 times them for every rank and broadcasts.

Usage:
    python tests/ddp_failure_script.py OUT_DIR

Each rank writes ``error{rank}.json``: per fit, the error's type and message, the seconds from the fit's
start to the error, and what the model holds after it (checkpointed modules, forward hooks).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from callback_helpers import TINY_GPT, exit_cleanly, token_loader  # noqa: E402
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


def main(out_dir: Path) -> None:
    torch.manual_seed(0)
    facts = {"block": _failed_fit(FailsOnRank1(**TINY_GPT), AutoCheckpoint(budget_gb=0.0022))}
    op_options._timed = _option_timing_fails_on_rank_0  # an injected fault: rank 0 times, then broadcasts
    torch.manual_seed(0)
    facts["op"] = _failed_fit(GPT(**TINY_GPT), AutoCheckpoint(budget_gb=0.0022, granularity="op"))
    rank = torch.distributed.get_rank()
    (out_dir / f"error{rank}.json").write_text(json.dumps(facts))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    exit_cleanly()
