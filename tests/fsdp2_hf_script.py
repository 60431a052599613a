"""Run by tests/test_fsdp2.py: a transformers Llama (built from a tiny config, random weights) under FSDP2
on 2 CPU processes (gloo), each decoder layer ``fully_shard``-ed in the LightningModule's
``configure_model``, as Lightning's docs and torchtitan shard a decoder.

Usage:
    python tests/fsdp2_hf_script.py OUT_DIR probe
        Rank r writes ``bounds{r}.json``: its predicted peak with every layer checkpointed (the minimum),
        with none (unchecked), and its static bytes.
    python tests/fsdp2_hf_script.py OUT_DIR {run,lora} BUDGET_BYTES
        ``capped``: 3 steps inside ``memory_cap(BUDGET_BYTES)`` per rank with ``budget_gb`` equal to the
        cap; then ``plain``: the same 3 steps without the callback, with ``use_cache=False`` in the
        config as the callback passes it in training (the cache changes no loss, only the memory). Each
        writes ``{name}_facts{r}.json`` (losses; with the callback the checkpointed layers, the rank's own
        predicted peak for them, its minimum and unchecked peaks, the cap's peak and the lightning_ckpt
        warnings) and, on rank 0, the full parameters after the fit (``{name}.pt``). A rank out of
        memory writes ``{name}_oom{r}.txt``. ``lora``: the same Llama saved by ``save_pretrained`` in
        ``OUT_DIR/llama``, loaded by ``from_pretrained`` and given LoRA adapters by peft
        (``ShardedLoRALlama``), as people fine-tune.

The batches are padded (``input_ids``, ``attention_mask``, ``labels`` -100 on the padding), each rank its
own rows (Lightning's distributed sampler); ``use_cache`` is the config's default (on).
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.distributed.fsdp import fully_shard

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from callback_helpers import exit_cleanly, fast_trainer, fit_in_cap  # noqa: E402
from real_models import padded_token_loader  # noqa: E402

from examples.hf_lm import HFCausalLM  # noqa: E402
from lightning_ckpt import AutoCheckpoint  # noqa: E402
from lightning_ckpt.planning.peak import fixed_peak_bytes, predict_peak_bytes  # noqa: E402
from lightning_ckpt.testing import memory_cap  # noqa: E402

WORLD, STEPS = 2, 3
LLAMA = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
)


class ShardedLlama(HFCausalLM):
    """The transformers causal LM, each decoder layer and then the transformers model ``fully_shard``-ed
    (the root: ``training_step`` calls ``self.model``, so FSDP2's root hooks must be on it)."""

    def configure_model(self) -> None:
        mesh = self.device_mesh["data_parallel"]
        for layer in self.model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(self.model, mesh=mesh)


class ShardedLoRALlama(ShardedLlama):
    """The Llama saved in ``pretrained``, read by ``from_pretrained``, with LoRA adapters from peft on the
    attention's q and v projections (the base frozen, B random so that every adapter learns from the first
    step, dropout on the adapters' input; peft puts the model back in training mode), each decoder layer
    sharded through peft's wrappers."""

    def __init__(
        self, model_type: str = "llama", config: dict | None = None, pretrained: str = "", **kwargs
    ) -> None:
        super().__init__(model_type, config, **kwargs)  # learning_rate, weight_decay
        import peft
        import transformers

        self.model = transformers.AutoModelForCausalLM.from_pretrained(pretrained)
        config = peft.LoraConfig(
            r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.1, init_lora_weights=False
        )
        self.model = peft.get_peft_model(self.model, config)

    def configure_model(self) -> None:
        mesh = self.device_mesh["data_parallel"]
        for layer in self.model.base_model.model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(self.model, mesh=mesh)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=1e-3)


class DictBatches(torch.utils.data.Dataset):
    """``padded_token_loader``'s rows as the dicts a tokenizer gives: ids, mask, labels (-100 on padding)."""

    def __init__(self) -> None:
        ids, mask = padded_token_loader(num_batches=2 * STEPS, batch_size=4).dataset.tensors
        self.rows = ids, mask, ids.masked_fill(mask == 0, -100)

    def __len__(self) -> int:
        return len(self.rows[0])

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return dict(zip(("input_ids", "attention_mask", "labels"), (t[i] for t in self.rows), strict=True))


class Losses(L.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))


def trainer_for(callbacks: list, max_steps: int = STEPS) -> L.Trainer:
    strategy = ModelParallelStrategy(
        data_parallel_size=WORLD, tensor_parallel_size=1, timeout=timedelta(seconds=180)
    )
    return fast_trainer(callbacks, max_steps=max_steps, devices=WORLD, strategy=strategy)


def model(lora: Path | None = None) -> ShardedLlama:
    """The Llama of ``LLAMA``; with ``lora``, the one saved there with LoRA adapters."""
    torch.manual_seed(0)
    if lora is None:
        return ShardedLlama("llama", LLAMA)
    return ShardedLoRALlama("llama", LLAMA, pretrained=str(lora))


def loader() -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(DictBatches(), batch_size=4, shuffle=False)


def probe(out_dir: Path) -> None:
    callback = AutoCheckpoint(budget_gb=1000, measure=False)
    L.seed_everything(0, verbose=False)
    trainer = trainer_for([callback], max_steps=1)
    trainer.fit(model(), train_dataloaders=loader())
    profile = callback.profile
    bounds = {
        "minimum": fixed_peak_bytes(profile),
        "unchecked": predict_peak_bytes(profile, []),
        "static": profile.static_bytes,
    }
    (out_dir / f"bounds{trainer.global_rank}.json").write_text(json.dumps(bounds))


def fit(out_dir: Path, name: str, budget_bytes: int | None, lora: Path | None = None) -> None:
    losses = Losses()
    callback = None if budget_bytes is None else AutoCheckpoint(budget_gb=budget_bytes / 1e9)
    L.seed_everything(0, verbose=False)
    trainer = trainer_for([losses] + ([callback] if callback else []))
    rank, live = trainer.global_rank, model(lora)
    if callback is None:  # as AutoCheckpoint trains it: the unchecked prediction is compared to this run
        live.model.config.use_cache = False  # peft's model passes `config` through to the Llama's
    batches = loader()  # made before the cap: on a device only the batch is there
    cap = memory_cap(budget_bytes or 10**12, model=live)
    caught = fit_in_cap(trainer, live, cap, out_dir / f"{name}_oom{rank}.txt", train_dataloaders=batches)
    facts = {"losses": losses.losses, "global_step": trainer.global_step, "cap_peak": cap.peak_bytes}
    if callback is not None:
        plan, profile = callback.plan, callback.profile
        facts |= {
            "checkpointed": list(plan.checkpointed),
            "candidates": [item.name for item in plan.items],
            "predicted": predict_peak_bytes(profile, plan.checkpointed),
            "minimum": fixed_peak_bytes(profile),
            "unchecked": predict_peak_bytes(profile, []),
            "warnings": caught,
        }
    (out_dir / f"{name}_facts{rank}.json").write_text(json.dumps(facts))
    full = {key: param.full_tensor().detach() for key, param in live.named_parameters()}
    if rank == 0:
        torch.save(full, out_dir / f"{name}.pt")


if __name__ == "__main__":
    out, mode = Path(sys.argv[1]), sys.argv[2]
    if mode == "probe":
        probe(out)
    else:
        pretrained = out / "llama" if mode == "lora" else None
        fit(out, "capped", int(sys.argv[3]), lora=pretrained)
        fit(out, "plain", None, lora=pretrained)
    exit_cleanly()
