"""The tests' one GPT (the example's ``examples.gpt.GPT``, tiny), random token data, fast Trainer flags.

The Trainer tests fit it; the plain-loop tests (profiler, memory, wrapping, candidates, peak points) call it
through ``token_batch`` and ``gpt_loss``. With dropout on (``TINY_GPT``), its attention on CPU and on fake
tensors is SDPA's math path: the (B, nh, T, T) attention matrix is materialised and saved, as written-out
attention would be.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from examples.gpt import GPT

TINY_GPT = dict(block_size=32, n_layer=4, n_head=2, n_embd=32, dropout=0.1)


def tiny_gpt(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    return GPT(**(TINY_GPT | overrides))


def next_token_pairs(
    rows: int, seq_len: int, vocab_size: int = 256, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids and their next-token targets, both (rows, seq_len)."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab_size, (rows, seq_len + 1), generator=generator)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def token_batch(
    model: GPT, batch_size: int = 8, seq_len: int | None = None, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """One random batch for ``model`` (its ``config``'s vocabulary), both (batch_size, seq_len);
    ``seq_len`` is the model's ``block_size`` unless given."""
    config = model.config
    return next_token_pairs(batch_size, seq_len or config.block_size, config.vocab_size, seed)


def gpt_loss(model: GPT, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The plain-loop step's loss: ``GPT.forward`` returns ``(logits, loss)``, this the mean cross-entropy."""
    return model(idx, targets)[1]


def token_loader(
    num_batches: int = 8, batch_size: int = 4, block_size: int = 32, seed: int = 0
) -> DataLoader:
    dataset = TensorDataset(*next_token_pairs(num_batches * batch_size, block_size, seed=seed))
    return DataLoader(dataset, batch_size=batch_size, shuffle=False)


def fast_trainer(callbacks=(), max_steps: int = 3, **kwargs) -> L.Trainer:
    options = dict(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        deterministic=True,
    )
    return L.Trainer(callbacks=list(callbacks), **(options | kwargs))


def fit(model: GPT, callbacks=(), max_steps: int = 3, seed: int = 0, **trainer_kwargs) -> L.Trainer:
    L.seed_everything(seed, verbose=False)
    trainer = fast_trainer(callbacks, max_steps=max_steps, **trainer_kwargs)
    trainer.fit(model, train_dataloaders=token_loader())
    return trainer


def block_names(model: GPT) -> list[str]:
    return [f"transformer.h.{i}" for i in range(len(model.transformer.h))]


def probe_profile(model: L.LightningModule, loader: DataLoader, **trainer):
    """The step profile AutoCheckpoint makes at the shapes of the first batch of ``loader``: a 2-step fit
    on that batch twice, no cap (a first batch whose length is not a power of two is planned at its own
    shapes on the second step)."""
    from lightning_ckpt import AutoCheckpoint

    probe = AutoCheckpoint(budget_gb=1000, measure=False)
    batch = next(iter(loader))
    twice = DataLoader([batch, batch], batch_size=None)
    fast_trainer([probe], max_steps=2, **trainer).fit(model, train_dataloaders=twice)
    return probe.profile


def assert_within_two_percent(predicted: int, measured: int, what: str) -> None:
    """The prediction is within 2% of the measured peak, in both directions."""
    text = f"{what}: predicted {predicted} B, measured {measured} B ({predicted / measured - 1:+.2%})"
    assert abs(predicted - measured) <= 0.02 * measured, text


def fit_in_cap(trainer: L.Trainer, model: L.LightningModule, cap, oom_file, **fit_kwargs) -> list[str]:
    """``trainer.fit(model, **fit_kwargs)`` inside the memory ``cap``: the lightning_ckpt warnings it
    raised. Out of memory, the step and the error go to ``oom_file`` (a ``Path``) and it raises."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with cap:
                trainer.fit(model, **fit_kwargs)
        except torch.OutOfMemoryError as error:
            oom_file.write_text(f"step {trainer.global_step}: {error}")
            raise
    return [str(w.message) for w in caught if "lightning_ckpt" in w.filename]


def exit_cleanly() -> None:
    """End a rank whose work is written: its process group destroyed (no collective: a rank that failed
    never gets here), its output flushed, and the interpreter's teardown skipped. Left to that teardown,
    gloo's threads sometimes abort a rank that is done ("terminate called without an active exception",
    exit status -6: twice in about twenty launches on 2026-12-02, with every file written)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def script_module(name: str):
    """``scripts/<name>.py`` loaded as a module (the scripts are not a package)."""
    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
