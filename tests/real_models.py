"""Models this project did not write, as people train them: tiny transformers models built from configs
(random weights, nothing downloaded) with padded batches and their default KV cache, and a ResNet-style
CNN with BatchNorm (written here: torchvision's wheels in the registry are CUDA builds)."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def padded_token_loader(num_batches: int = 6, batch_size: int = 4, length: int = 32) -> DataLoader:
    """(input_ids, attention_mask) batches; each row is padded after a random length of at least half."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 256, (num_batches * batch_size, length), generator=generator)
    lengths = torch.randint(length // 2, length + 1, (num_batches * batch_size, 1), generator=generator)
    mask = (torch.arange(length) < lengths).long()
    return DataLoader(TensorDataset(ids * mask, mask), batch_size=batch_size)


def image_loader(num_batches: int = 4, batch_size: int = 8, size: int = 16) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(num_batches * batch_size, 3, size, size, generator=generator)
    labels = torch.randint(0, 10, (num_batches * batch_size,), generator=generator)
    return DataLoader(TensorDataset(images, labels), batch_size=batch_size)


def hf_model(kind: str, layers: int = 4) -> nn.Module:
    """A tiny ``kind`` model (gpt2, llama, t5, bert) from its config, with the config's own defaults."""
    transformers = pytest.importorskip("transformers")
    small = dict(vocab_size=256, num_attention_heads=4)
    if kind == "gpt2":
        config = transformers.GPT2Config(n_positions=64, n_embd=64, n_layer=layers, **small)
        return transformers.GPT2LMHeadModel(config)
    if kind == "llama":
        config = transformers.LlamaConfig(
            hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_key_value_heads=2, **small
        )
        return transformers.LlamaForCausalLM(config)
    if kind == "t5":
        config = transformers.T5Config(
            d_model=64, d_kv=16, d_ff=128, num_layers=layers, num_decoder_layers=layers,
            num_heads=4, vocab_size=256, decoder_start_token_id=0, pad_token_id=0,
        )  # fmt: skip
        return transformers.T5ForConditionalGeneration(config)
    if kind == "bert":
        config = transformers.BertConfig(
            hidden_size=64,
            num_hidden_layers=layers,
            intermediate_size=128,
            max_position_embeddings=64,
            **small,
        )
        return transformers.BertForMaskedLM(config)
    raise ValueError(f"unknown kind {kind!r}")


class PaddedCausalLM(L.LightningModule):
    """``self.model`` (a transformers LM) trained on padded batches, the padding left out of the loss, by
    AdamW on what trains (every parameter, or only the adapters of a LoRA model)."""

    def training_step(self, batch, batch_idx):
        ids, mask = batch
        labels = ids.masked_fill(mask == 0, -100)
        return self.model(input_ids=ids, attention_mask=mask, labels=labels).loss

    def configure_optimizers(self):
        return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=1e-3)


class PaddedLM(PaddedCausalLM):
    """A tiny transformers model of ``kind`` (see ``hf_model``), optionally with its own checkpointing on."""

    def __init__(self, kind: str, layers: int = 4, own_checkpointing: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = hf_model(kind, layers)
        if own_checkpointing:
            self.model.gradient_checkpointing_enable()


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with BatchNorm, and a shortcut."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), nn.BatchNorm2d(out_channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(L.LightningModule):
    """A small ResNet: a stem, three stages of two basic blocks each, pooling and a linear classifier."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        widths = [width, 2 * width, 4 * width]
        self.layer1 = nn.Sequential(BasicBlock(width, widths[0]), BasicBlock(widths[0], widths[0]))
        self.layer2 = nn.Sequential(BasicBlock(widths[0], widths[1], 2), BasicBlock(widths[1], widths[1]))
        self.layer3 = nn.Sequential(BasicBlock(widths[1], widths[2], 2), BasicBlock(widths[2], widths[2]))
        self.fc = nn.Linear(widths[2], 10)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.layer3(self.layer2(self.layer1(self.stem(images))))
        return self.fc(x.mean(dim=(2, 3)))

    def training_step(self, batch, batch_idx):
        images, labels = batch
        return nn.functional.cross_entropy(self(images), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class LoRALinear(nn.Module):
    """A LoRA adapter around a frozen ``nn.Linear``: ``base(x) + (x A^T) B^T``, rank ``rank``."""

    def __init__(self, base: nn.Linear, rank: int = 8) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.a = nn.Parameter(torch.randn(rank, base.in_features) * 0.01)
        self.b = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + (x @ self.a.t()) @ self.b.t()


class PretrainedLM(PaddedCausalLM):
    """A causal LM read by ``from_pretrained`` from ``path`` (written there by ``save_pretrained``), as
    people fine-tune: transformers returns it in eval mode, and Lightning keeps each submodule's mode, so it
    trains in eval mode (dropout off) unless the user calls ``train()``."""

    def __init__(self, path: str) -> None:
        super().__init__()
        transformers = pytest.importorskip("transformers")
        self.model = transformers.AutoModelForCausalLM.from_pretrained(path)


class Qwen2LM(PaddedCausalLM):
    """A tiny Qwen2 from its config on padded batches: full fine-tuning, or LoRA on the attention's q and
    v projections with every other weight frozen (``lora=True``)."""

    def __init__(self, lora: bool = False, width: int = 64, layers: int = 3) -> None:
        super().__init__()
        transformers = pytest.importorskip("transformers")
        torch.manual_seed(0)
        config = transformers.Qwen2Config(
            vocab_size=256,
            hidden_size=width,
            intermediate_size=2 * width,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
        self.model = transformers.Qwen2ForCausalLM(config)
        if lora:
            self.model.requires_grad_(False)
            for layer in self.model.model.layers:
                layer.self_attn.q_proj = LoRALinear(layer.self_attn.q_proj)
                layer.self_attn.v_proj = LoRALinear(layer.self_attn.v_proj)


class Qwen2MoeLM(PaddedCausalLM):
    """A tiny Qwen2-MoE from its config (4 experts, 2 per token, a shared expert) on padded batches: its
    experts run ``torch._grouped_mm`` (transformers' default on torch 2.9 and later)."""

    def __init__(self, layers: int = 4) -> None:
        super().__init__()
        transformers = pytest.importorskip("transformers")
        torch.manual_seed(0)
        config = transformers.Qwen2MoeConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            num_experts=4,
            num_experts_per_tok=2,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
        self.model = transformers.Qwen2MoeForCausalLM(config)


class PeftLoRA(PaddedCausalLM):
    """A tiny Llama from its config with LoRA adapters from the ``peft`` library on the attention's q and v
    projections (``get_peft_model``: the base frozen, its dropout on the adapters' input), as people
    fine-tune with it."""

    def __init__(self, layers: int = 4, dropout: float = 0.1, zero_b: bool = True) -> None:
        super().__init__()
        peft = pytest.importorskip("peft")
        torch.manual_seed(0)
        config = peft.LoraConfig(  # zero_b=False: B random too, so that A has gradients from the first step
            r=8,
            lora_alpha=16,
            target_modules=["q_proj", "v_proj"],
            lora_dropout=dropout,
            init_lora_weights=zero_b,
        )
        self.model = peft.get_peft_model(hf_model("llama", layers), config)


class HFVision(L.LightningModule):
    """A tiny transformers image classifier from its config (random weights): Swin (windowed attention,
    shifted windows, patch merging) or ResNet (basic layers with BatchNorm), on ``image_loader`` batches."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        transformers = pytest.importorskip("transformers")
        torch.manual_seed(0)
        if kind == "swin":
            config = transformers.SwinConfig(
                image_size=16, patch_size=2, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4,
                num_labels=10,
            )  # fmt: skip
            self.model = transformers.SwinForImageClassification(config)
        elif kind == "resnet":
            config = transformers.ResNetConfig(
                embedding_size=16, hidden_sizes=[16, 32], depths=[2, 2], layer_type="basic", num_labels=10
            )
            self.model = transformers.ResNetForImageClassification(config)
        else:
            raise ValueError(f"`kind` must be 'swin' or 'resnet', got {kind!r}")

    def training_step(self, batch, batch_idx):
        images, labels = batch
        return self.model(pixel_values=images, labels=labels).loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)
