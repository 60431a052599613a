"""Try AutoCheckpoint on many transformers language models built from tiny configs (decoders, encoders
and encoder-decoders), each under a memory cap equal to its budget (the CPU stand-in of a GPU with that
much memory).

Run from the repository root (CPU, a few minutes; nothing downloaded)::

    python scripts/model_sweep.py                      # every architecture below
    python scripts/model_sweep.py Llama Bloom --precision bf16-mixed
    python scripts/model_sweep.py --family seq2seq    # T5 and BART only

Per architecture, in its own process: one probe step at a budget of 1000 GB (the step's profile), then
3 steps at the least budget (every block checkpointed) and 3 at the middle of least and unchecked, each
under ``memory_cap`` equal to the budget. A row shows the blocks checkpointed, the predicted peak, the
peak counted under the cap and their ratio, or the out-of-memory error; ``warnings`` are the callback's.
The batches are 4 x 32 tokens, padded after a random length (made before the cap); the labels are the
tokens (a causal LM shifts them, an encoder-decoder's decoder takes them shifted, a masked LM predicts
them where it sees them: the loss is not the point, the memory of the step is).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import warnings

ARCHITECTURES = (
    "Llama Mistral Gemma Gemma2 Gemma3Text Phi Phi3 GPTNeoX Falcon OPT Bloom GPTJ Qwen2 Qwen3 Qwen2Moe "
    "Qwen3Moe Mixtral Olmo Olmo2 Olmoe StableLm Cohere Granite Starcoder2 SmolLM3 GptOss "
    "Llama4Text Qwen3Next Jamba Mamba FalconMamba"
).split()
"""Decoders: ``<name>Config`` in transformers, each with ``AutoModelForCausalLM``."""
ENCODERS = "Bert Roberta Electra ModernBert".split()
"""Encoders, with ``AutoModelForMaskedLM``."""
SEQ2SEQ = "T5 Bart".split()
"""Encoder-decoders, with ``AutoModelForSeq2SeqLM``: their encoder's and their decoder's blocks are candidates."""
FAMILIES = {"causal": ARCHITECTURES, "masked": ENCODERS, "seq2seq": SEQ2SEQ}
_AUTO = {
    "causal": "AutoModelForCausalLM",
    "masked": "AutoModelForMaskedLM",
    "seq2seq": "AutoModelForSeq2SeqLM",
}

_COMMON = dict(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=128, num_experts=4, num_local_experts=4,
    num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=64, pad_token_id=0,
    bos_token_id=1, eos_token_id=2,
)  # fmt: skip
_SPECIAL = {
    "Falcon": {"head_dim": None},  # a property there
    "GPTJ": {"rotary_dim": 8},  # its default (64) is wider than a head of 16
    "ModernBert": {"cls_token_id": 1, "sep_token_id": 2},  # its defaults are past a vocabulary of 256
    "T5": {"d_ff": 128, "d_kv": 16, "num_decoder_layers": 4, "decoder_start_token_id": 0},
    "Bart": {
        "decoder_layers": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128,
        "decoder_start_token_id": 2,
    },
}  # fmt: skip


def config_of(name: str):
    """The tiny config of architecture ``name`` (see ``ARCHITECTURES``)."""
    import transformers

    options = {key: value for key, value in (_COMMON | _SPECIAL.get(name, {})).items() if value is not None}
    return getattr(transformers, f"{name}Config")(**options)


def _loader():
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 256, (24, 32), generator=generator)
    lengths = torch.randint(16, 33, (24, 1), generator=generator)
    mask = (torch.arange(32) < lengths).long()
    return DataLoader(TensorDataset(ids * mask, mask), batch_size=4)


def family_of(name: str) -> str:
    """``"causal"``, ``"masked"`` or ``"seq2seq"``: which of ``FAMILIES`` lists architecture ``name``.

    Raises:
        ValueError: for a name no family lists.
    """
    for family, names in FAMILIES.items():
        if name in names:
            return family
    raise ValueError(f"`models` must be architectures of {sorted(FAMILIES)}, got {name!r}")


def model_of(name: str):
    """Architecture ``name``'s model, from its tiny config, with the auto class of its family."""
    import transformers

    return getattr(transformers, _AUTO[family_of(name)]).from_config(config_of(name))


def _module(name: str):
    import lightning as L
    import torch

    class LanguageModel(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.model = model_of(name)

        def training_step(self, batch, batch_idx):
            ids, mask = batch
            return self.model(
                input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)
            ).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    return LanguageModel()


def _fit(name: str, precision: str, budget_bytes: int, cap: bool):
    import lightning as L

    from lightning_ckpt import AutoCheckpoint
    from lightning_ckpt.testing import memory_cap

    model, loader = _module(name), _loader()
    callback = AutoCheckpoint(budget_gb=budget_bytes / 1e9, measure=cap)
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=3 if cap else 1, precision=precision, callbacks=[callback],
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    if not cap:
        trainer.fit(model, train_dataloaders=loader)
        return callback, 0
    with memory_cap(budget_bytes, model=model) as counted:
        trainer.fit(model, train_dataloaders=loader)
    return callback, counted.peak_bytes


def sweep_one(name: str, precision: str) -> dict:
    """One architecture's row (see the module docstring)."""
    from lightning_ckpt.planning.peak import fixed_peak_bytes, predict_peak_bytes

    row = {"model": name}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        probe, _ = _fit(name, precision, 10**12, cap=False)
        row["warnings"] = sorted({str(w.message)[:120] for w in caught if "AutoCheckpoint" in str(w.message)})
    least, unchecked = fixed_peak_bytes(probe.profile), predict_peak_bytes(probe.profile, [])
    for label, budget in (("least", least), ("middle", (least + unchecked) // 2)):
        try:
            callback, peak = _fit(name, precision, budget, cap=True)
            predicted = callback.plan.predicted_peak_bytes
            row[label] = (
                f"{len(callback.plan.checkpointed)} ckpt {predicted:,} / {peak:,} ({predicted / peak - 1:+.3%})"
            )
        except Exception as error:  # out of memory under the cap, or the model's own failure
            row[label] = f"{type(error).__name__}: {str(error)[:90]}"
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python scripts/model_sweep.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument("models", nargs="*", help="architectures (default: every one of --family)")
    parser.add_argument(
        "--family", choices=[*FAMILIES, "all"], default="causal", help="which list to run (causal)"
    )
    parser.add_argument("--precision", default="32-true", help="Lightning precision (32-true)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.models:
        args.models = [n for f, names in FAMILIES.items() if args.family in (f, "all") for n in names]
    for name in args.models:
        try:
            family_of(name)
        except ValueError as error:
            parser.error(str(error))
    if args.child:
        print(json.dumps(sweep_one(args.models[0], args.precision)))
        return 0
    print(f"{'model':<12} least budget: ckpt predicted / counted           middle budget")
    for name in args.models:
        command = [sys.executable, __file__, name, "--precision", args.precision, "--child"]
        done = subprocess.run(command, capture_output=True, text=True)
        lines = done.stdout.strip().splitlines()
        if done.returncode or not lines:
            print(f"{name:<12} failed: {(done.stderr.strip().splitlines() or ['?'])[-1][:150]}")
            continue
        row = json.loads(lines[-1])
        print(f"{name:<12} {row['least']:<44} {row['middle']}")
        for text in row["warnings"]:
            print(f"{'':<12} warning: {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
