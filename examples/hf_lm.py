"""Fine-tuning-style training of a Hugging Face transformers causal LM with Lightning, from its config.

The model is built from a transformers config (random weights: nothing is downloaded), so that the
example runs anywhere; a real fine-tune would call ``AutoModelForCausalLM.from_pretrained`` instead. The
batches are padded (``input_ids``, ``attention_mask``, ``labels`` with -100 on padding), as a tokenizer's
``padding="max_length"`` would give. ``use_cache`` stays at the config's default (on): AutoCheckpoint
turns the KV cache off in training itself.

Example:
    >>> model = HFCausalLM("llama", {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
    ...                              "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 256})
    >>> batch = {"input_ids": torch.ones(2, 8, dtype=torch.long), "attention_mask": torch.ones(2, 8, dtype=torch.long)}
    >>> batch["labels"] = batch["input_ids"]
    >>> bool(torch.isfinite(model.training_step(batch, 0)))
    True
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch


class HFCausalLM(L.LightningModule):
    """A transformers causal LM (any ``model_type`` AutoConfig knows), trained with AdamW.

    Args:
        model_type: the transformers architecture, e.g. ``"llama"``, ``"gpt2"``, ``"qwen2"``.
        config: arguments of that architecture's config (sizes, vocabulary, ...).
        learning_rate: AdamW learning rate.
        weight_decay: AdamW weight decay.

    Raises:
        ValueError: if transformers does not know ``model_type``.
    """

    def __init__(
        self,
        model_type: str = "llama",
        config: dict[str, Any] | None = None,
        learning_rate: float = 1e-3,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        import transformers  # here: the GPT example does not need transformers

        self.save_hyperparameters()
        try:
            model_config = transformers.AutoConfig.for_model(model_type, **(config or {}))
        except ValueError as error:
            raise ValueError(
                f"`model_type` must be a transformers architecture, got {model_type!r}"
            ) from error
        self.model = transformers.AutoModelForCausalLM.from_config(model_config)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.model(**batch).loss
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", self.model(**batch).loss, prog_bar=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        hp = self.hparams
        return torch.optim.AdamW(self.parameters(), lr=hp.learning_rate, weight_decay=hp.weight_decay)
