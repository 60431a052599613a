"""Run by tests/test_callback_ddp.py: a DDP fit (2 CPU processes, gloo) whose first profile fails on
rank 1 only (its real timing forward raises). Every rank must raise at once: rank 1 its own error, rank 0
``RankFailedError`` naming rank 1 and that error, not a gloo error nor a wait for the timeout.

Usage:
    python tests/ddp_failure_script.py OUT_DIR

Each rank writes ``error{rank}.json``: the error's type and message, the seconds from the fit's start to
the error, and what the model holds after it (checkpointed modules, forward hooks).
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


class FailsOnRank1(GPT):
    """The tiny GPT whose step raises on rank 1 when it runs on real tensors without autograd: the
    profile's timing forward there, nowhere else."""

    def training_step(self, batch, batch_idx):
        real = not isinstance(batch[0], FakeTensor)
        if real and not torch.is_grad_enabled() and torch.distributed.get_rank() == 1:
            raise ValueError("rank 1 cannot time this batch")
        return super().training_step(batch, batch_idx)


def main(out_dir: Path) -> None:
    torch.manual_seed(0)
    model = FailsOnRank1(**TINY_GPT)
    trainer = ddp_trainer(AutoCheckpoint(budget_gb=0.0022), 2)
    start = time.perf_counter()
    try:
        trainer.fit(model, train_dataloaders=token_loader(batch_size=4, num_batches=4))
        error = None
    except Exception as caught:
        error = caught
    hooks = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())
    facts = {
        "type": type(error).__name__,
        "message": str(error),
        "seconds": time.perf_counter() - start,
        "checkpointed": checkpointed_names(model),
        "hooks": hooks,
    }
    (out_dir / f"error{trainer.global_rank}.json").write_text(json.dumps(facts))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    exit_cleanly()
